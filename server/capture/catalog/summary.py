"""Per-session summaries (calls, tokens, time, finish reasons, rollout status), cached, and the filtered session list."""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from server.capture.catalog.index_view import IndexView, SessionEntry
from server.capture.catalog.runs import (
    Narrowed,
    RunChoice,
    Scope,
    children_in,
    dispatches_of,
    narrow,
    parse_time,
    started_at,
)
from server.capture.rollout import RolloutError
from server.capture.rollout.chains import SessionChains, session_chains
from server.capture.rollout.reconstruct import CAPTURE_FAILED
from server.capture.store import CaptureStore, UnknownSession
from server.capture.write.record import CaptureRecord, RecordHead

# What `status=` may ask for. `whole`: the rollout is not masked; `partial`: a valid prefix was kept
# and the rest cut (partial_reason); `masked`: mask_sample would be true (partial, not
# reconstructable at all, or a sub-agent session below it is).
STATUSES = ("whole", "partial", "masked")
KINDS = ("root", "child")

log = logging.getLogger("switchyard_model.capture")


def _token_total(record: RecordHead, count_key: str, ids_key: str) -> int:
    """The usage count when the upstream gave one, else the length of the captured token ids (a head
    is read only when its counts are set, so only a whole record falls back to its lists)."""
    counts = record.get("token_count")
    value = counts.get(count_key) if isinstance(counts, dict) else None
    if type(value) is int and value > 0:
        return value
    ids = record.get(ids_key)
    return len(ids) if isinstance(ids, list) else 0


def tokens_in(record: RecordHead) -> int:
    return _token_total(record, "prompt_tokens", "prompt_token_ids")


def tokens_out(record: RecordHead) -> int:
    return _token_total(record, "completion_tokens", "generation_token_ids")


def reply_has_tool_calls(record: CaptureRecord) -> bool:
    messages = record.get("messages")
    if not isinstance(messages, list) or not messages or not isinstance(messages[-1], dict):
        return False
    return bool(messages[-1].get("tool_calls"))


def chain_outcome(
    session_id: str, records: list[CaptureRecord], narrowed: Narrowed | None = None
) -> tuple[SessionChains | None, str | None]:
    """The session's chains and per-call decisions (`session_chains`, no flat token lists) over its
    latest dispatch (as GET /rollout covers by default; see `runs.narrow`; `narrowed` when the caller
    has it already); None and why when nothing can be read."""
    try:
        latest = narrowed if narrowed is not None else narrow(records, RunChoice())
        return session_chains(session_id, latest.records, flat_tokens=False), None
    except RolloutError as exc:
        return None, str(exc)


@dataclass(slots=True)
class SessionFacts:
    """What the list and the tree need of one session, kept small: no messages, no token lists."""

    summary: dict[str, Any]
    # (captured_at, started_at, uuid, reply has tool calls) per call, in record order: links children to calls.
    calls: list[tuple[str | None, str | None, str | None, bool]]
    # The sub-agents' records its latest dispatch covers (None: all).
    scope: Scope | None = None


# A summary lists at most this many dispatches (the latest): an RL loop may reuse an id thousands of times.
DISPATCHES_LISTED = 100


def dispatch_list(records: list[CaptureRecord]) -> tuple[list[dict[str, Any]], int]:
    """The session's latest dispatches (`runs.dispatches_of`, at most DISPATCHES_LISTED), each with
    its number, calls and times, and how many there are in all."""
    parts = dispatches_of(records)
    first = max(0, len(parts) - DISPATCHES_LISTED)
    listed = [
        {
            "dispatch": number,
            "calls": len(part),
            "first_captured_at": part[0].get("captured_at"),
            "last_captured_at": part[-1].get("captured_at"),
        }
        for number, part in enumerate(parts[first:], start=first + 1)
    ]
    return listed, len(parts)


def session_facts(
    session_id: str,
    records: list[CaptureRecord],
    outcome: tuple[SessionChains | None, str | None] | None = None,
) -> SessionFacts:
    """Summarise one session's records (already in `(captured_at, uuid)` order); `outcome` is
    `chain_outcome(session_id, records)` if the caller has it already."""
    summary = summary_columns(records)
    latest = narrow(records, RunChoice())
    chains, error = outcome if outcome is not None else chain_outcome(session_id, records, latest)
    if chains is None:
        status, reason = "failed", error
    else:
        status, reason = chains["rollout"]["status"], chains["rollout"]["partial_reason"]
        summary.update(
            chains=len(chains["chains"]),
            trainable_fraction=chains["trainable_fraction"],
            rollout_fraction=chains["rollout_fraction"],
        )
    summary.update(rollout=status, partial_reason=reason, mask_sample=status != "whole")
    summary["dispatches"], summary["dispatch_count"] = dispatch_list(records)
    calls: list[tuple[str | None, str | None, str | None, bool]] = [
        (record.get("captured_at"), started_at(record), record.get("uuid"), reply_has_tool_calls(record))
        for record in records
    ]
    return SessionFacts(summary, calls, latest.scope)


def lost_session_facts() -> SessionFacts:
    """The facts of a session every record of which was lost to capture failures: no calls, masked."""
    summary = summary_columns([])
    summary.update(rollout="partial", partial_reason=CAPTURE_FAILED, mask_sample=True)
    return SessionFacts(summary, [])


def summary_columns(records: Sequence[RecordHead]) -> dict[str, Any]:
    """The list's columns for one session from its records, or from just their leading fields (see
    `CaptureStore.read_record_heads`): everything but the rollout status, which is left pending."""
    finish_reasons: dict[str, int] = {}
    models: set[str] = set()
    routes: set[str] = set()
    total_in = total_out = invalid = 0
    first_start: str | None = None
    last_end: str | None = None
    for record in records:
        total_in += tokens_in(record)
        total_out += tokens_out(record)
        reason = record.get("finish_reason")
        key = reason if isinstance(reason, str) else "none"
        finish_reasons[key] = finish_reasons.get(key, 0) + 1
        if isinstance(model := record.get("model"), str):
            models.add(model)
        if isinstance(record.get("route"), str) and record["route"]:
            routes.add(record["route"])
        if record.get("is_valid") is not True:
            invalid += 1
        begin = started_at(record)
        end = record.get("captured_at")
        if begin is not None and (first_start is None or begin < first_start):
            first_start = begin
        if isinstance(end, str) and (last_end is None or end > last_end):
            last_end = end
    duration_ms = None
    begin_time, end_time = parse_time(first_start), parse_time(last_end)
    if begin_time is not None and end_time is not None:
        duration_ms = round((end_time - begin_time).total_seconds() * 1000.0, 3)
    summary = {
        "calls": len(records),
        "tokens_in": total_in,
        "tokens_out": total_out,
        "started_at": first_start,
        "ended_at": last_end,
        "duration_ms": duration_ms,
        "finish_reasons": finish_reasons,
        "models": sorted(models),
        "routes": sorted(routes),
        "invalid_calls": invalid,
        # This session's own chain: whole, partial (a prefix kept) or failed (nothing usable);
        # "pending" while not yet rebuilt (only on a list page's display, never under `status=`).
        "rollout": "pending",
        "partial_reason": None,
        # What GET /rollout would say, sub-agents included (None while pending).
        "mask_sample": None,
        "degraded_reason": None,
        # Generated tokens of completed calls that are in some trainable chain, and in the rollout
        # alone (0 when it is masked); None while pending or with no generated tokens.
        "chains": None,
        "trainable_fraction": None,
        "rollout_fraction": None,
        # The session's dispatches (a reused session id: docs/capture.md#dispatches): the latest
        # DISPATCHES_LISTED, each with its number, calls and times, and how many in all; None while pending.
        "dispatches": None,
        "dispatch_count": None,
    }
    return summary


class SummaryCache:
    """Session facts by id, rebuilt only when the session gained records; bounded (least recently used goes)."""

    def __init__(self, max_sessions: int = 100_000, *, full_read_bytes: int = 4_000_000) -> None:
        self._max = max_sessions
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, tuple[tuple[int, str | None], SessionFacts]] = OrderedDict()
        # A list page shows a session whose records exceed this (not yet summarised) from the leading
        # fields of its records, rollout "pending", and rebuilds it here in the background, one at a time.
        self._full_read_bytes = full_read_bytes
        self._background = ThreadPoolExecutor(max_workers=1, thread_name_prefix="session-summary")
        self._pending: set[str] = set()

    def facts(self, store: CaptureStore, view: IndexView, session_id: str) -> SessionFacts | None:
        """The session's facts (from cache when `view` shows it unchanged), or None if it is gone.

        `view` is one `store.index_view()` for the whole request: each fresh view revalidates the
        index against the disk, which costs a stat per session directory.
        """
        info = view.session_info(session_id)
        if info is None:
            return None
        key = (info["record_count"], info["last_captured_at"])
        with self._lock:
            cached = self._entries.get(session_id)
            if cached is not None and cached[0] == key:
                self._entries.move_to_end(session_id)
                return cached[1]
        try:
            records, _ = store.read_completions(session_id)
        except UnknownSession:
            records = []
        if not records:
            # Listed with no records: its mark says every record was lost (see `index`).
            return lost_session_facts() if info["record_count"] == 0 else None
        facts = session_facts(session_id, records)
        with self._lock:
            self._entries[session_id] = (key, facts)
            self._entries.move_to_end(session_id)
            while len(self._entries) > self._max:
                self._entries.popitem(last=False)
        return facts

    def remember_facts(self, view: IndexView, session_id: str, facts: SessionFacts) -> None:
        """Cache facts made elsewhere (the rollout worker, with a timeline) from the records `view`
        counts, so they are not read twice."""
        info = view.session_info(session_id)
        if info is None:
            return
        with self._lock:
            self._entries[session_id] = ((info["record_count"], info["last_captured_at"]), facts)
            self._entries.move_to_end(session_id)

    def quick_summary(self, store: CaptureStore, view: IndexView, session_id: str) -> dict[str, Any] | None:
        """The session's facts' summary if cached or cheap to make; for a session with many MB of
        records, its columns from the records' leading fields with rollout "pending", while the full
        facts are made in the background (a later request finds them cached)."""
        info = view.session_info(session_id)
        if info is None:
            return None
        with self._lock:
            cached = self._entries.get(session_id)
            if cached is not None and cached[0] == (info["record_count"], info["last_captured_at"]):
                return cached[1].summary
        try:
            heads = (
                store.read_record_heads(session_id) if store.session_bytes(session_id) > self._full_read_bytes else None
            )
        except UnknownSession:
            return None
        if not heads:
            facts = self.facts(store, view, session_id)
            return facts.summary if facts is not None else None
        with self._lock:
            if session_id in self._pending:
                return summary_columns(heads)
            self._pending.add(session_id)
        self._background.submit(self._summarise_later, store, session_id)
        return summary_columns(heads)

    def _summarise_later(self, store: CaptureStore, session_id: str) -> None:
        try:
            self.facts(store, store.index_view(), session_id)
        except Exception:  # a failed background summary only leaves the row pending; the next page retries
            log.exception("summarising session %r failed", session_id)
        finally:
            with self._lock:
                self._pending.discard(session_id)

    def _covered_scope(self, view: IndexView, session_id: str, own: SessionFacts | None) -> Scope | None:
        """The sub-agents' records the session's default rollout covers: from its facts, else (not
        yet read) its latest run's."""
        if own is None:
            with self._lock:
                cached = self._entries.get(session_id)
            own = cached[1] if cached is not None else None
        if own is not None:
            return own.scope
        info = view.session_info(session_id)
        runs = info["runs"] if info is not None else []
        return Scope(frozenset(runs[-1:])) if len(runs) > 1 else None

    def summary(
        self, store: CaptureStore, view: IndexView, session_id: str, *, wait: bool = True
    ) -> dict[str, Any] | None:
        """The session's summary with sub-agent sessions folded in: masked when any session below is.

        `wait=False` (a list page's display) may answer with the rollout status "pending" (and
        `mask_sample` None) rather than read a large session's records now; see `quick_summary`.
        """
        own = self.facts(store, view, session_id) if wait else None
        summary = dict(own.summary if own is not None else self.quick_summary(store, view, session_id) or {})
        if not summary:
            return None
        # The sub-agents of the dispatch the default rollout covers, as GET /rollout has them.
        for descendant in descendants(view, session_id, self._covered_scope(view, session_id, own)):
            if wait:
                below_facts = self.facts(store, view, descendant)
                below = below_facts.summary if below_facts is not None else None
            else:
                below = self.quick_summary(store, view, descendant)
            if below is None:
                continue
            if below["rollout"] == "pending":
                if summary["mask_sample"] is False:
                    summary["mask_sample"] = None  # unknown until that one is rebuilt, unless another is partial
            elif below["rollout"] != "whole":
                summary["mask_sample"] = True
                summary["degraded_reason"] = f"subagent session {descendant!r} is partial"
                break
        return summary


def descendants(view: IndexView, session_id: str, scope: Scope | None = None) -> list[str]:
    """Every session below `session_id` that may have records in `scope` (None: any), depth first; a visited
    set stops crafted cycles."""
    out: list[str] = []
    seen = {session_id}
    stack = list(reversed(children_in(view, session_id, scope)))
    while stack:
        child = stack.pop()
        if child in seen:
            continue
        seen.add(child)
        out.append(child)
        stack.extend(reversed(children_in(view, child, scope)))
    return out


@dataclass(frozen=True, slots=True)
class ListQuery:
    """Filters of `GET /v1/sessions`; every field optional. Times are normalised with `format_time`."""

    parent: str | None = None
    kind: str | None = None  # "root" or "child"
    q: str | None = None  # a piece of the session id, any case
    since: str | None = None  # sessions active at or after this time
    until: str | None = None  # sessions active at or before this time
    model: str | None = None  # a piece of a model name, any case
    route: str | None = None  # a piece of a route name, any case
    status: str | None = None  # one of STATUSES
    summary: bool = False  # attach each session's summary
    visible: Callable[[str], bool] | None = None  # the sessions the caller's key may see (None: all)

    def needs_summary(self) -> bool:
        return bool(self.model or self.route or self.status)


def list_page(
    store: CaptureStore, cache: SummaryCache, query: ListQuery, *, limit: int, after: str | None
) -> tuple[list[dict[str, Any]], str | None]:
    """One page of sessions in id order after `after`, and the id to pass as `after` for the next
    page (None when no more follow).

    Filters on the index (parent, kind, id, time) cost nothing per session; filters on the summary
    (model, route, status) read a session's records once, then come from the cache. Without
    summaries the rows are made from the entries alone.
    """
    view = store.index_view()  # one snapshot for the whole page (each fresh view revalidates the disk)
    entries = view.iter_entries(parent=query.parent, roots_only=query.kind == "root", after=after)
    needle = query.q.lower() if query.q else None
    picked: list[tuple[SessionEntry, bool, dict[str, Any] | None]] = []
    for entry, missing in entries:
        if query.kind == "child" and (entry.parent_session_id is None or missing):
            continue
        if needle is not None and needle not in entry.session_id.lower():
            continue
        if query.visible is not None and not query.visible(entry.session_id):
            continue
        if query.since is not None and (entry.last_captured_at or "") < query.since:
            continue
        # The index keeps when the first call ended; a session that began just before `until` still counts.
        if query.until is not None and (entry.first_captured_at or "") > query.until:
            continue
        summary = None
        if query.needs_summary():
            summary = cache.summary(store, view, entry.session_id)
            if summary is None or not _summary_matches(summary, query):
                continue
        picked.append((entry, missing, summary))
        if len(picked) > limit:
            break
    next_after = picked[limit - 1][0].session_id if len(picked) > limit and limit > 0 else None
    picked = picked[:limit]
    rows: list[dict[str, Any]] = []
    for entry, missing, summary in picked:
        row = entry.as_dict(missing)
        if summary is None and query.summary:
            summary = cache.summary(store, view, entry.session_id, wait=False)
        if summary is not None:
            row["summary"] = summary
        rows.append(row)
    return rows, next_after


def _summary_matches(summary: dict[str, Any], query: ListQuery) -> bool:
    if query.model and not any(query.model.lower() in name.lower() for name in summary["models"]):
        return False
    if query.route and not any(query.route.lower() in name.lower() for name in summary["routes"]):
        return False
    if query.status == "whole" and summary["mask_sample"]:
        return False
    if query.status == "partial" and summary["rollout"] != "partial":
        return False
    if query.status == "masked" and not summary["mask_sample"]:
        return False
    return True
