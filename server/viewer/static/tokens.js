// One call's generated tokens, shaded by log probability: the less sure the model, the redder.

import { getJSON, sessionPath } from "./api.js";
import { h } from "./dom.js";

// exp(logprob) mapped to a background: certain tokens stay clear, unlikely ones go red.
export function shade(logprob) {
  if (typeof logprob !== "number" || !Number.isFinite(logprob)) return "transparent";
  const p = Math.exp(logprob);
  const alpha = Math.min(0.85, Math.max(0, 1 - p) * 0.85);
  return `rgba(220, 38, 38, ${alpha.toFixed(3)})`;
}

export function tokenChip(id, text, logprob) {
  const shown = typeof text === "string" ? text : `#${id}`;
  const title =
    typeof logprob === "number"
      ? `id ${id} · logprob ${logprob.toFixed(4)} · p ${Math.exp(logprob).toFixed(4)}`
      : `id ${id}`;
  return h(
    "span",
    {
      class: typeof text === "string" ? "tok" : "tok id-only",
      title,
      style: `background-color: ${shade(logprob)}`,
      dataset: { id: String(id), logprob: typeof logprob === "number" ? String(logprob) : "" },
    },
    shown === "" ? "∅" : shown,
  );
}

export async function renderTokens(container, sessionId, callUuid) {
  const record = await getJSON(sessionPath(sessionId, `/completions/${encodeURIComponent(callUuid)}`));
  const ids = Array.isArray(record.generation_token_ids) ? record.generation_token_ids : [];
  const logprobs = Array.isArray(record.generation_log_probs) ? record.generation_log_probs : [];
  const texts = Array.isArray(record.generation_token_texts) ? record.generation_token_texts : [];
  const finite = logprobs.filter((x) => typeof x === "number" && Number.isFinite(x));
  const mean = finite.length ? finite.reduce((a, b) => a + b, 0) / finite.length : null;
  const lowest = finite.length ? Math.min(...finite) : null;
  container.replaceChildren(
    h(
      "p",
      { class: "muted" },
      `${ids.length} generated tokens`,
      texts.length ? "" : " (ids only: the upstream gave no token text)",
      mean === null ? "" : ` · mean logprob ${mean.toFixed(3)} · lowest ${lowest.toFixed(3)}`,
      ` · prompt ${Array.isArray(record.prompt_token_ids) ? record.prompt_token_ids.length : "–"} tokens`,
    ),
    h(
      "div",
      { class: "tokens", dataset: { call: callUuid } },
      ids.map((id, i) => tokenChip(id, texts[i], logprobs[i])),
    ),
    h(
      "p",
      { class: "legend" },
      "Shading: ",
      [0, -0.1, -0.7, -2.3, -6].map((lp) =>
        h("span", { class: "tok", style: `background-color: ${shade(lp)}` }, `p ${Math.exp(lp).toFixed(2)}`),
      ),
    ),
  );
}
