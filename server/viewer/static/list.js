// The sessions list: filters in the URL hash, one page at a time from the API (never everything).

import { getJSON } from "./api.js";
import { badge, clear, fmtInt, fmtMs, fmtTime, h } from "./dom.js";

const PAGE_SIZES = ["25", "50", "100", "200"];
const FILTERS = ["q", "kind", "since", "until", "model", "route", "status", "limit"];
// Cursors of the pages before this one, for "Previous" (kept per filter set, in memory).
let trail = [];
let trailFilters = "";

function filterKey(params) {
  return FILTERS.map((name) => `${name}=${params.get(name) || ""}`).join("&");
}

function toHash(params) {
  const clean = new URLSearchParams();
  for (const [name, value] of params) if (value) clean.set(name, value);
  const query = clean.toString();
  return `#/${query ? `?${query}` : ""}`;
}

// datetime-local inputs hold local wall time; the API takes ISO 8601 (UTC here).
function localToIso(value) {
  if (!value) return "";
  const d = new Date(value);
  return Number.isNaN(d.getTime()) ? "" : d.toISOString();
}

function isoToLocal(value) {
  if (!value) return "";
  const d = new Date(value);
  if (Number.isNaN(d.getTime())) return "";
  const pad = (n) => String(n).padStart(2, "0");
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}T${pad(d.getHours())}:${pad(d.getMinutes())}`;
}

function select(name, label, options, current) {
  return h(
    "label",
    {},
    `${label} `,
    h(
      "select",
      { name, id: `f-${name}` },
      options.map(([value, text]) => h("option", { value, selected: value === current }, text)),
    ),
  );
}

function filterForm(params) {
  const input = (name, label, attrs = {}) =>
    h("label", {}, `${label} `, h("input", { name, id: `f-${name}`, value: params.get(name) || "", ...attrs }));
  const form = h(
    "form",
    {
      class: "filters",
      onsubmit: (event) => {
        event.preventDefault();
        const data = new FormData(form);
        const next = new URLSearchParams();
        for (const name of FILTERS) {
          let value = (data.get(name) || "").toString().trim();
          if (name === "since" || name === "until") value = localToIso(value);
          if (value) next.set(name, value);
        }
        location.hash = toHash(next);
      },
    },
    input("q", "Session id", { type: "search", placeholder: "part of an id", size: 18 }),
    select("kind", "Kind", [["", "all"], ["root", "roots"], ["child", "sub-agents"]], params.get("kind") || ""),
    h("label", {}, "From ", h("input", { type: "datetime-local", name: "since", id: "f-since", value: isoToLocal(params.get("since")) })),
    h("label", {}, "To ", h("input", { type: "datetime-local", name: "until", id: "f-until", value: isoToLocal(params.get("until")) })),
    input("model", "Model", { size: 12 }),
    input("route", "Route", { size: 12 }),
    select(
      "status",
      "Rollout",
      [["", "any"], ["whole", "whole"], ["partial", "partial"], ["masked", "masked"]],
      params.get("status") || "",
    ),
    select("limit", "Per page", PAGE_SIZES.map((n) => [n, n]), params.get("limit") || "50"),
    h("button", { type: "submit" }, "Apply"),
    h("button", { type: "button", onclick: () => (location.hash = "#/") }, "Reset"),
  );
  return form;
}

function statusBadge(summary) {
  if (!summary) return badge("?", "");
  // A large session not yet rebuilt: the server fills it in on a later request (see refreshPending).
  if (summary.rollout === "pending" || (summary.rollout === "whole" && summary.mask_sample === null))
    return badge("…", "pending");
  if (summary.rollout === "whole" && !summary.mask_sample) return badge("whole", "ok");
  if (summary.rollout === "partial") return badge("partial", "warn");
  if (summary.rollout === "failed") return badge("failed", "bad");
  return badge("masked", "warn");
}

function finishText(reasons) {
  return Object.entries(reasons || {})
    .map(([reason, count]) => `${reason}×${count}`)
    .join(" ");
}

// A session more than one server run wrote: its status and rollout cover its latest conversation.
function runsNote(session) {
  const runs = session.runs || [];
  if (runs.length < 2) return null;
  return h(
    "span",
    { class: "badge warn runs", title: `written by ${runs.length} server runs; the rollout covers its latest conversation (?run= picks a run)` },
    `${runs.length} runs`,
  );
}

function row(session) {
  const s = session.summary || {};
  return h(
    "tr",
    { dataset: { sessionId: session.session_id } },
    h(
      "td",
      { class: "id" },
      h("a", { href: `#/s/${encodeURIComponent(session.session_id)}` }, session.session_id),
      runsNote(session),
    ),
    h(
      "td",
      { class: "id" },
      session.parent_session_id
        ? h("a", { href: `#/s/${encodeURIComponent(session.parent_session_id)}` }, session.parent_session_id)
        : "–",
    ),
    h("td", { class: "num" }, fmtInt(s.calls ?? session.record_count)),
    h("td", { class: "num" }, fmtInt(s.tokens_in)),
    h("td", { class: "num" }, fmtInt(s.tokens_out)),
    h("td", { class: "num" }, fmtMs(s.duration_ms)),
    h("td", {}, fmtTime(s.started_at || session.first_captured_at)),
    h("td", {}, finishText(s.finish_reasons)),
    h("td", {}, (s.models || []).join(", ")),
    h("td", { class: "status" }, statusBadge(session.summary)),
  );
}

export async function renderList(main, params) {
  const filters = filterKey(params);
  if (filters !== trailFilters) {
    trail = [];
    trailFilters = filters;
  }
  const limit = params.get("limit") || "50";
  const query = { summary: "true", limit };
  for (const name of ["q", "kind", "since", "until", "model", "route", "status", "after"]) query[name] = params.get(name);
  const page = await getJSON("/v1/sessions", query);

  const table = h(
    "table",
    { class: "sessions", id: "sessions" },
    h(
      "thead",
      {},
      h(
        "tr",
        {},
        ["Session", "Parent", "Calls", "Tokens in", "Tokens out", "Duration", "Started (UTC)", "Finish", "Model", "Rollout"].map(
          (title) => h("th", {}, title),
        ),
      ),
    ),
    h("tbody", {}, page.sessions.map(row)),
  );
  const pageNumber = trail.length + 1;
  const pager = h(
    "nav",
    { class: "pager" },
    h(
      "button",
      {
        type: "button",
        id: "prev-page",
        disabled: trail.length === 0,
        onclick: () => {
          const previous = trail.pop();
          const next = new URLSearchParams(params);
          if (previous) next.set("after", previous);
          else next.delete("after");
          location.hash = toHash(next);
        },
      },
      "← Previous",
    ),
    h("span", { id: "page-info" }, `page ${pageNumber} · ${page.sessions.length} sessions`),
    h(
      "button",
      {
        type: "button",
        id: "next-page",
        disabled: !page.has_more,
        onclick: () => {
          trail.push(params.get("after") || "");
          const next = new URLSearchParams(params);
          next.set("after", page.next_after);
          location.hash = toHash(next);
        },
      },
      "Next →",
    ),
  );
  clear(main).append(
    h("h1", {}, "Sessions"),
    filterForm(params),
    page.sessions.length ? table : h("p", { class: "muted", id: "no-sessions" }, "No sessions match."),
    pager,
  );
  refreshPending(table, query, page.sessions);
}

const isPending = (summary) => !!summary && (summary.rollout === "pending" || summary.mask_sample === null);

// Rows whose rollout status was still pending are asked for again until the server has them,
// while the same page is on screen.
async function refreshPending(table, query, sessions, delayMs = 500) {
  if (!sessions.some((s) => isPending(s.summary))) return;
  await new Promise((resolve) => setTimeout(resolve, delayMs));
  if (!table.isConnected) return;
  let page;
  try {
    page = await getJSON("/v1/sessions", query);
  } catch {
    return; // the badges stay pending; reloading the page asks again
  }
  if (!table.isConnected) return;
  for (const session of page.sessions) {
    const cell = table.querySelector(`tr[data-session-id="${CSS.escape(session.session_id)}"] td.status`);
    if (cell) clear(cell).append(statusBadge(session.summary));
  }
  refreshPending(table, query, page.sessions, Math.min(delayMs * 2, 4000));
}
