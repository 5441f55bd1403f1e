// One session: summary and export, sub-agent tree, contiguity strip, call timeline, tokens, rollout.

import { getJSON, ID_PATTERN, sessionPath } from "./api.js";
import { append, badge, clear, contentText, fmtInt, fmtMs, fmtTime, h, prettyArgs } from "./dom.js";
import { renderTokens, tokenChip } from "./tokens.js";

const sessionLink = (id) => h("a", { href: `#/s/${encodeURIComponent(id)}`, class: "id" }, id);

function rolloutBadge(status, masked) {
  if (status === "whole" && !masked) return badge("whole", "ok");
  if (status === "partial") return badge("partial", "warn");
  if (status === "failed") return badge("failed", "bad");
  return badge("masked", "warn");
}

function download(name, text, type) {
  const url = URL.createObjectURL(new Blob([text], { type }));
  const a = h("a", { href: url, download: name, hidden: true });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}

function exportButtons(sessionId) {
  const run = (label, id, action) =>
    h(
      "button",
      {
        type: "button",
        id,
        onclick: async (event) => {
          const button = event.currentTarget;
          button.disabled = true;
          try {
            await action();
          } catch (error) {
            button.after(h("span", { class: "error inline" }, ` ${error.message}`));
          } finally {
            button.disabled = false;
          }
        },
      },
      label,
    );
  return h(
    "div",
    { class: "export" },
    "Export: ",
    run("rollout (JSON)", "export-rollout", async () => {
      const rollout = await getJSON(sessionPath(sessionId, "/rollout"));
      download(`${sessionId}.rollout.json`, JSON.stringify(rollout, null, 2), "application/json");
    }),
    run("records (JSONL)", "export-jsonl", async () => {
      const envelope = await getJSON(sessionPath(sessionId, "/completions"));
      const lines = envelope.completions.map((record) => JSON.stringify(record)).join("\n");
      download(`${sessionId}.records.jsonl`, `${lines}\n`, "application/x-ndjson");
    }),
    run("records (JSON)", "export-json", async () => {
      const envelope = await getJSON(sessionPath(sessionId, "/completions"));
      download(`${sessionId}.records.json`, JSON.stringify(envelope, null, 2), "application/json");
    }),
  );
}

// A share of the generated tokens, as a percentage ("–" when there is none to share).
function fmtFraction(value) {
  return typeof value === "number" ? `${(value * 100).toFixed(1)}%` : "–";
}

function header(data) {
  const s = data.summary || {};
  const reasons = Object.entries(s.finish_reasons || {}).map(([r, n]) => `${r}×${n}`).join(" ");
  return h(
    "section",
    { class: "session-head" },
    h("h1", {}, "Session ", h("span", { class: "id", id: "session-id" }, data.session_id)),
    data.parent_session_id ? h("p", {}, "Sub-agent of ", sessionLink(data.parent_session_id)) : null,
    h(
      "dl",
      { class: "facts" },
      [
        ["Calls", fmtInt(s.calls)],
        ["Tokens in", fmtInt(s.tokens_in)],
        ["Tokens out", fmtInt(s.tokens_out)],
        ["Duration", fmtMs(s.duration_ms)],
        ["Started", fmtTime(s.started_at)],
        ["Finish", reasons || "–"],
        ["Model", (s.models || []).join(", ") || "–"],
        ["Route", (s.routes || []).join(", ") || "–"],
        ["Trainable tokens", fmtFraction(data.trainable_fraction)],
        ["In the rollout alone", fmtFraction(data.rollout_fraction)],
      ].map(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]),
      h("dt", {}, "Rollout"),
      h("dd", { id: "rollout-status" }, rolloutBadge(data.rollout.status, s.mask_sample), " ", data.rollout.partial_reason || s.degraded_reason || ""),
    ),
    exportButtons(data.session_id),
  );
}

function treeNode(node, currentId, calls) {
  const spawnIndex = node.spawned_by ? calls.get(node.spawned_by) : undefined;
  return h(
    "li",
    { dataset: { session: node.session_id } },
    node.session_id === currentId ? h("strong", { class: "id" }, node.session_id) : sessionLink(node.session_id),
    " ",
    rolloutBadge(node.rollout, false),
    h(
      "span",
      { class: "muted" },
      ` ${fmtInt(node.calls)} calls · ${fmtInt(node.tokens_in)} in / ${fmtInt(node.tokens_out)} out`,
      node.children.length
        ? ` · with sub-agents ${fmtInt(node.total_calls)} calls · ${fmtInt(node.total_tokens_in)} in / ${fmtInt(node.total_tokens_out)} out`
        : "",
    ),
    node.spawned_by && node.session_id !== currentId
      ? h(
          "span",
          { class: "spawned-by" },
          " · spawned by ",
          spawnIndex !== undefined
            ? h("a", { href: `#call-${spawnIndex}`, class: "call-link", onclick: (e) => openCall(e, spawnIndex) }, `call #${spawnIndex}`)
            : h("span", { class: "id" }, `call ${node.spawned_by.slice(0, 8)}`),
        )
      : null,
    // Call numbers are known for this page's session only; deeper links name the call by its uuid.
    node.children.length
      ? h("ul", {}, node.children.map((child) => treeNode(child, currentId, node.session_id === currentId ? calls : new Map())))
      : null,
  );
}

function openCall(event, index) {
  event.preventDefault();
  const details = document.getElementById(`call-${index}`);
  if (details) {
    details.open = true;
    details.scrollIntoView({ block: "start" });
  }
}

const CONTIGUITY_LABEL = {
  first: "first call",
  side: "a side call (a chain of its own)",
  other_run: "outside the dispatch the rollout covers (an earlier dispatch or server run)",
  extends: "extends the previous prompt + generation",
  retry: "same prompt as the previous call (a retry)",
  breaks: "does not extend the previous prompt + generation",
  unknown: "no token ids to compare",
};

function strip(calls) {
  const cells = calls.map((call) => {
    const c = call.contiguity;
    const title =
      `call #${call.index}: ${CONTIGUITY_LABEL[c.kind] || c.kind}` +
      (c.kind === "breaks" ? `: ${c.summary || "?"}${c.position == null ? "" : ` at position ${c.position}`}` : "") +
      (call.in_rollout !== "step" ? ` · ${call.in_rollout}` : "");
    return h("a", {
      href: `#call-${call.index}`,
      class: `cell ${c.kind} role-${call.in_rollout}`,
      title,
      "aria-label": title,
      dataset: { index: String(call.index), kind: c.kind },
      onclick: (e) => openCall(e, call.index),
    });
  });
  const breaks = calls.filter((call) => call.contiguity.kind === "breaks");
  return h(
    "section",
    { class: "contiguity", id: "contiguity" },
    h("h2", {}, "Token contiguity"),
    h("div", { class: "strip", id: "strip" }, cells),
    h(
      "p",
      { class: "legend" },
      h("span", { class: "cell extends" }), " extends ",
      h("span", { class: "cell breaks" }), " breaks ",
      h("span", { class: "cell retry" }), " retry ",
      h("span", { class: "cell first" }), " first / no ids · outlined: not in the rollout",
    ),
    breaks.length
      ? h("div", { class: "breaks" }, breaks.map(breakDetail))
      : h("p", { class: "muted", id: "no-breaks" }, "Every call's prompt extends the call it continues."),
  );
}

function windowRow(label, ids, texts, cls) {
  return h(
    "div",
    { class: `window ${cls}` },
    h("span", { class: "window-label" }, label),
    ids.length ? ids.map((id, i) => tokenChip(id, texts ? texts[i] : undefined, undefined)) : h("span", { class: "muted" }, "(end)"),
  );
}

function breakDetail(call) {
  const c = call.contiguity;
  const where = c.in_previous_generation ? "inside the previous call's generated tokens" : "inside the previous call's prompt";
  const previous = c.previous_index;
  const previousLink =
    previous == null ? "no earlier call" : h("a", { href: `#call-${previous}`, onclick: (e) => openCall(e, previous) }, `call #${previous}`);
  return h(
    "div",
    { class: "break", dataset: { index: String(call.index), position: String(c.position), kind: c.break_kind || "" } },
    h("p", { class: "break-kind" }, h("strong", {}, `Call #${call.index}: `), c.summary || c.break_kind || "breaks the chain", "."),
    c.position == null
      ? h(
          "p",
          {},
          h("a", { href: `#call-${call.index}`, onclick: (e) => openCall(e, call.index) }, `Call #${call.index}`),
          "'s tokens carry on from ",
          previousLink,
          ", but its messages do not",
          c.detail ? [" (", h("code", {}, c.detail), ")"] : "",
          ".",
        )
      : h(
          "p",
          {},
          h("a", { href: `#call-${call.index}`, onclick: (e) => openCall(e, call.index) }, `Call #${call.index}`),
          " differs from ",
          previousLink,
          "'s prompt + generation at position ",
          h("strong", { class: "position" }, String(c.position)),
          ` (${where}; expected ${fmtInt(c.expected_length)} tokens to carry over).`,
        ),
    c.invalid_reason ? h("p", { class: "error inline" }, `The record says: ${c.invalid_reason}`) : null,
    c.position == null ? null : windowRow("before", c.before, c.before_text, "shared"),
    c.position == null ? null : windowRow("expected", c.expected, c.expected_text, "expected"),
    c.position == null ? null : windowRow("actual", c.actual, undefined, "actual"),
  );
}

const CHAIN_KIND = {
  main: "main (the rollout's)",
  continuation: "continues after a break",
  side: "a side call",
  retry: "an attempt the conversation did not continue from",
};

function chainsSection(data) {
  const chains = data.chains || [];
  const callLink = (index) =>
    index == null ? "?" : h("a", { href: `#call-${index}`, class: "call-link", onclick: (e) => openCall(e, index) }, `#${index}`);
  return h(
    "section",
    { class: "chains", id: "chains" },
    h("h2", {}, `Trainable chains (${chains.length})`),
    h(
      "p",
      { class: "muted" },
      "Each chain is a whole token-contiguous sample; together they hold every completed call once. ",
      `${fmtFraction(data.trainable_fraction)} of generated tokens are in a chain, ${fmtFraction(data.rollout_fraction)} in the rollout alone.`,
    ),
    h(
      "ol",
      { start: "0" },
      chains.map((chain) =>
        h(
          "li",
          { dataset: { chain: String(chain.chain_index), kind: chain.kind } },
          badge(chain.kind, chain.kind === "main" ? "ok" : "warn"),
          ` ${CHAIN_KIND[chain.kind] || chain.kind} · calls `,
          chain.call_indices.map((index, i) => [i ? ", " : "", callLink(index)]),
          ` · ${fmtInt(chain.generated_tokens)} generated tokens`,
          chain.starts_after
            ? h("span", { class: "starts-after" }, " · starts after call ", callLink(chain.starts_after.index), ": ", chain.starts_after.summary)
            : null,
        ),
      ),
    ),
  );
}

function messageView(message, label) {
  const role = message && message.role ? message.role : "?";
  const parts = [];
  if (message.reasoning_content) {
    parts.push(h("details", { class: "reasoning" }, h("summary", {}, "reasoning"), h("pre", {}, contentText(message.reasoning_content))));
  }
  const text = contentText(message.content);
  if (text) parts.push(h("pre", { class: "content" }, text));
  for (const call of message.tool_calls || []) {
    const fn = call.function || {};
    parts.push(
      h(
        "div",
        { class: "tool-call" },
        h("span", { class: "tool-name" }, `→ ${fn.name || "?"}`),
        call.id ? h("span", { class: "muted" }, ` ${call.id}`) : null,
        h("pre", { class: "args" }, prettyArgs(fn.arguments)),
      ),
    );
  }
  return h(
    "div",
    { class: `msg role-${role.replace(/[^a-z]/g, "")}` },
    h("div", { class: "msg-head" }, label || role, message.tool_call_id ? h("span", { class: "muted" }, ` result of ${message.tool_call_id}`) : null),
    parts.length ? parts : h("span", { class: "muted" }, "(empty)"),
  );
}

function injectionText(injection) {
  if (!injection || typeof injection !== "object") return null;
  if (injection.fallback_reason) return `injection fell back: ${injection.fallback_reason}`;
  if (injection.echo_ok === false) return "injection echo mismatch";
  return `injected ${fmtInt(injection.injected_len)} tokens (${injection.transport || "?"})`;
}

function callBody(sessionId, call) {
  const tokens = h("div", { class: "token-panel" });
  const body = h(
    "div",
    { class: "call-body" },
    call.kept_messages ? h("p", { class: "muted" }, `${call.kept_messages} earlier messages carried over.`) : null,
    call.added_messages.length
      ? call.added_messages.map((m) => messageView(m))
      : h("p", { class: "muted" }, "No new messages."),
    messageView(call.reply || {}, "assistant (reply)"),
    call.spawned.length ? h("p", { class: "spawned" }, "Spawned: ", call.spawned.map((id) => [sessionLink(id), " "])) : null,
    call.invalid_reason ? h("p", { class: "error inline" }, `Not trainable: ${call.invalid_reason}`) : null,
    h(
      "button",
      {
        type: "button",
        class: "show-tokens",
        onclick: async (event) => {
          event.currentTarget.disabled = true;
          try {
            await renderTokens(tokens, sessionId, call.uuid);
          } catch (error) {
            tokens.replaceChildren(h("p", { class: "error" }, error.message));
          }
        },
      },
      "Show tokens",
    ),
    tokens,
  );
  return body;
}

function callView(sessionId, call, sessionStart, isLast) {
  const c = call.contiguity;
  const offset = sessionStart && call.started_at ? new Date(call.started_at) - sessionStart : null;
  const details = h(
    "details",
    { class: `call role-${call.in_rollout}`, id: `call-${call.index}`, open: isLast, dataset: { uuid: call.uuid || "" } },
    h(
      "summary",
      {},
      h("span", { class: "call-index" }, `#${call.index}`),
      h("span", { class: "when", title: fmtTime(call.started_at) }, offset === null ? "–" : `+${fmtMs(offset)}`),
      h("span", {}, fmtMs(call.latency_ms)),
      h("span", { title: "time to first token" }, call.ttft_ms == null ? "" : `ttft ${fmtMs(call.ttft_ms)}`),
      h("span", {}, `${fmtInt(call.tokens_in)} in · ${fmtInt(call.tokens_out)} out`),
      h("span", {}, call.finish_reason || call.status || "–"),
      h("span", { class: "muted" }, [call.route, call.model].filter(Boolean).join(" → ")),
      c.kind === "breaks" ? badge(`breaks @${c.position}`, "bad") : null,
      call.in_rollout !== "step" ? badge(call.in_rollout === "unused" ? "masked" : call.in_rollout, "warn") : null,
      call.is_valid === false ? badge("invalid", "bad") : null,
      injectionText(call.injection) ? h("span", { class: "muted" }, injectionText(call.injection)) : null,
    ),
  );
  // Bodies are built when first opened: a 200-call session renders its headers only.
  let built = false;
  const build = () => {
    if (!built && details.open) {
      built = true;
      details.append(callBody(sessionId, call));
    }
  };
  details.addEventListener("toggle", build);
  build();
  return details;
}

function rolloutItemText(item) {
  if (item.type === "message") return contentText(item.content);
  if (item.type === "function_call") return `→ ${item.name}(${prettyArgs(item.arguments)})`;
  if (item.type === "function_call_output") return contentText(item.output);
  if (Array.isArray(item.summary)) return item.summary.map((s) => s.text || "").join("\n");
  return JSON.stringify(item);
}

// One item of a rollout or chain: who said it, and whether a trainer learns from its tokens (the
// token triple sits on the last item of each generated turn) or masks it (prompt, tool output).
function rolloutItems(items, kind) {
  return items.map((item) => {
    const generatedTurn = item.type === "reasoning" || item.type === "function_call" || item.role === "assistant";
    const hasTriple = Array.isArray(item.generation_token_ids);
    const who = item.role || (item.type === "function_call_output" ? "tool" : "assistant");
    return h(
      "div",
      { class: `item ${kind} ${generatedTurn ? "trained" : "masked"}`, dataset: { type: item.type, role: who, trained: String(generatedTurn) } },
      h(
        "div",
        { class: "msg-head" },
        `${who} · ${item.type}`,
        h("span", { class: "muted" }, generatedTurn ? " · generated (trained)" : " · prompt (masked)"),
        hasTriple
          ? h("span", { class: "muted" }, ` · prompt ${fmtInt(item.prompt_token_ids.length)} + generated ${fmtInt(item.generation_token_ids.length)} tokens`)
          : null,
      ),
      h("pre", {}, rolloutItemText(item)),
    );
  });
}

async function renderRollout(container, sessionId) {
  const rollout = await getJSON(sessionPath(sessionId, "/rollout"));
  const masked = rollout.mask_sample;
  const why = rollout.partial_break;
  // `append` flattens nested lists and skips null; replaceChildren would print them as text.
  append(clear(container), [
    h(
      "p",
      { id: "rollout-verdict" },
      masked ? badge("mask_sample", "bad") : badge("trainable", "ok"),
      " ",
      why ? h("strong", { id: "partial-kind" }, `${why.summary}. `) : "",
      rollout.partial_reason ? ["partial_reason: ", h("code", { id: "partial-reason" }, rollout.partial_reason)] : "",
      rollout.degraded_reason ? [" degraded_reason: ", h("code", {}, rollout.degraded_reason)] : "",
    ),
    h("p", { class: "muted" }, `${rollout.record_uuids.length} calls used; side calls ${rollout.side_calls.length}; discarded ${rollout.discarded_record_uuids.length}.`),
    h("div", { class: "items", id: "rollout-items" }, rolloutItems(rollout.input, "input"), rolloutItems(rollout.output, "output")),
    (rollout.subagents || []).length
      ? h(
          "div",
          {},
          h("h3", {}, "Sub-agent rollouts"),
          h(
            "ul",
            {},
            rollout.subagents.map((sub) =>
              h("li", {}, sessionLink(sub.session_id), " ", sub.mask_sample ? badge("masked", "warn") : badge("whole", "ok"), " ", sub.partial_reason || ""),
            ),
          ),
        )
      : null,
  ]);
}

export async function renderSession(main, sessionId) {
  if (!ID_PATTERN.test(sessionId)) throw new Error(`not a valid session id: ${sessionId.slice(0, 200)}`);
  const data = await getJSON(sessionPath(sessionId, "/timeline"));
  const callIndex = new Map(data.calls.map((call) => [call.uuid, call.index]));
  const start = data.summary && data.summary.started_at ? new Date(data.summary.started_at) : null;
  const rolloutBox = h("div", { class: "rollout-box" });
  const frag = document.createDocumentFragment();
  frag.append(
    h("p", {}, h("a", { href: "#/" }, "← all sessions")),
    header(data),
    data.tree
      ? h("section", { class: "tree", id: "tree" }, h("h2", {}, "Sub-agent tree"), h("ul", {}, treeNode(data.tree, sessionId, callIndex)))
      : null,
    strip(data.calls),
    chainsSection(data),
    h(
      "section",
      { class: "timeline", id: "timeline" },
      h("h2", {}, `Calls (${data.calls.length})`),
      h("div", { class: "call-head muted" }, ["#", "start", "duration", "ttft", "tokens", "finish", "route → model"].map((t) => h("span", {}, t))),
      data.calls.map((call, i) => callView(sessionId, call, start, i === data.calls.length - 1)),
    ),
    h(
      "section",
      { class: "rollout", id: "rollout" },
      h("h2", {}, "Reconstructed rollout"),
      h(
        "button",
        {
          type: "button",
          id: "show-rollout",
          onclick: async (event) => {
            event.currentTarget.disabled = true;
            try {
              await renderRollout(rolloutBox, sessionId);
            } catch (error) {
              append(clear(rolloutBox), [h("p", { class: "error" }, error.message)]);
            }
          },
        },
        "Show rollout",
      ),
      rolloutBox,
    ),
  );
  clear(main).append(frag);
}
