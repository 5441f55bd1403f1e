"""One session laid out for reading: its calls in order, what each added, token contiguity, and its sub-agent tree."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from server.capture.catalog.index_view import IndexView
from server.capture.catalog.runs import dispatches_of, started_at
from server.capture.catalog.summary import (
    SessionFacts,
    SummaryCache,
    chain_outcome,
    lost_session_facts,
    session_facts,
    tokens_in,
    tokens_out,
)
from server.capture.read.contiguity import compare_calls
from server.capture.rollout.chains import Break, CallDecision, ChainBody, SessionChains
from server.capture.rollout.reconstruct import CAPTURE_FAILED
from server.capture.store import CaptureStore, read_session_records
from server.capture.write.record import CaptureRecord

CONTEXT_WINDOW = 8
# A chain call's index turned into the timeline's (all records, all runs).
_TimelineIndex = Callable[[int | None], int | None]


def timeline_parts(sessions_dir: str, session_id: str) -> tuple[dict[str, Any] | None, SessionFacts | None, int]:
    """What reading the session's records gives the timeline: its calls laid out, its facts for the
    summary cache, and how many files were skipped ((None, None, skipped) when none is readable).

    Needs only the directory, so it runs where rollouts are rebuilt (a worker process): parsing and
    comparing a long session's records holds an interpreter for seconds. The tree and summary are
    added by the server, from its index.
    """
    records, skipped = read_session_records(sessions_dir, session_id)
    if not records:
        return None, None, skipped
    outcome = chain_outcome(session_id, records)  # rebuilt once, for the timeline and the facts
    return build_timeline(session_id, records, outcome=outcome), session_facts(session_id, records, outcome), skipped


def lost_session_timeline(session_id: str, lost: int) -> dict[str, Any]:
    """The timeline of a session whose every record was lost to capture failures: no calls, and a
    rollout that says why (the server adds nothing to it: there is no tree to read)."""
    return {
        "session_id": session_id,
        "parent_session_id": None,
        "calls": [],
        "rollout": {"status": "partial", "partial_reason": CAPTURE_FAILED, "mask_sample": True, "record_uuids": []},
        "tree": None,
        "summary": lost_session_facts().summary,
        "lost_records": lost,
        "skipped": 0,
    }


def build_timeline(
    session_id: str,
    records: list[CaptureRecord],
    *,
    window: int = CONTEXT_WINDOW,
    outcome: tuple[SessionChains | None, str | None] | None = None,
) -> dict[str, Any]:
    """The session's calls, each with the messages it added since the previous call, its reply,
    timing, tokens, and how its prompt relates to the call it continues, as the chains decided it.

    `records` are in `(captured_at, uuid)` order, as the store returns them. No token lists are
    included (a 200-call session would carry its whole history 200 times); ask for one call's
    record to see its tokens. `outcome` is `chain_outcome(session_id, records)` if already known.
    """
    chains, error = outcome if outcome is not None else chain_outcome(session_id, records)
    parts = dispatches_of(records)
    dispatch_of = {id(record): number for number, part in enumerate(parts, start=1) for record in part}
    index_of: dict[str | None, int] = {record.get("uuid"): index for index, record in enumerate(records)}
    decisions: dict[str | None, CallDecision] = {}
    rollout_uuids: set[str | None] = set()
    if chains is not None:
        decisions = {call["uuid"]: call for call in chains["calls"]}
        if chains["rollout"]["status"] != "failed":
            rollout_uuids = set(chains["rollout"]["record_uuids"])

    def timeline_index(chain_call_index: int | None) -> int | None:
        if chains is None or chain_call_index is None:
            return None
        return index_of.get(chains["calls"][chain_call_index]["uuid"])

    calls = []
    previous: CaptureRecord | None = None
    for index, record in enumerate(records):
        messages = record.get("messages") if isinstance(record.get("messages"), list) else []
        request, reply = (messages[:-1], messages[-1]) if messages else ([], {})
        shared = 0
        if previous is not None:
            shared = _shared_prefix(request, previous.get("messages") or [])
        prompt = record.get("prompt_token_ids")
        generation = record.get("generation_token_ids")
        uuid = record.get("uuid")
        decision = decisions.get(uuid)
        calls.append(
            {
                "index": index,
                "uuid": uuid,
                "started_at": started_at(record),
                "captured_at": record.get("captured_at"),
                "server_run": record.get("server_run"),
                "dispatch": dispatch_of.get(id(record)),
                "latency_ms": record.get("latency_ms"),
                "ttft_ms": record.get("ttft_ms"),
                "tokens_in": tokens_in(record),
                "tokens_out": tokens_out(record),
                "prompt_length": len(prompt) if isinstance(prompt, list) else None,
                "generation_length": len(generation) if isinstance(generation, list) else None,
                "finish_reason": record.get("finish_reason"),
                "route": record.get("route"),
                "model": record.get("model"),
                "api": record.get("api"),
                "stream": record.get("stream"),
                "status": record.get("status"),
                "is_valid": record.get("is_valid"),
                "invalid_reason": record.get("invalid_reason"),
                "injection": record.get("injection"),
                "in_rollout": _role(decision, uuid in rollout_uuids),
                "chain": decision["chain"] if decision is not None else None,
                "kept_messages": shared,
                "added_messages": request[shared:],
                "reply": reply,
                "contiguity": _contiguity(decision, records, timeline_index, record, window),
                "spawned": [],
            }
        )
        previous = record

    rollout = chains["rollout"] if chains is not None else None
    return {
        "session_id": session_id,
        "parent_session_id": _parent(records),
        "calls": calls,
        "dispatches": len(parts),  # the rollout and chains are the last one's (docs/capture.md#dispatches)
        "rollout": {
            "status": "failed" if rollout is None else rollout["status"],
            "partial_reason": error if rollout is None else rollout["partial_reason"],
            "partial_break": None if rollout is None else _located(rollout["partial_break"], timeline_index),
            "mask_sample": True if rollout is None else rollout["mask_sample"],
            "record_uuids": [] if rollout is None else rollout["record_uuids"],
        },
        "chains": []
        if chains is None
        else [_chain_view(chain, index_of, timeline_index) for chain in chains["chains"]],
        "generated_tokens": None if chains is None else chains["generated_tokens"],
        "trainable_fraction": None if chains is None else chains["trainable_fraction"],
        "rollout_fraction": None if chains is None else chains["rollout_fraction"],
    }


def _role(decision: CallDecision | None, in_rollout: bool) -> str:
    if in_rollout:
        return "step"
    relation: str | None = decision["relation"] if decision is not None else None
    if relation in ("side", "discarded"):
        return relation
    return "unused"


def _located(account: Break | None, timeline_index: _TimelineIndex) -> dict[str, Any] | None:
    """A break account with its call indices turned into this timeline's (all records, all runs)."""
    if account is None:
        return None
    return {
        **account,
        "index": timeline_index(account["index"]),
        "previous_index": timeline_index(account["previous_index"]),
    }


def _chain_view(chain: ChainBody, index_of: dict[str | None, int], timeline_index: _TimelineIndex) -> dict[str, Any]:
    return {
        "chain_index": chain["chain_index"],
        "kind": chain["kind"],
        "record_uuids": chain["record_uuids"],
        "call_indices": [index_of.get(uuid) for uuid in chain["record_uuids"]],
        "generated_tokens": chain["generated_tokens"],
        "starts_after": _located(chain["starts_after"], timeline_index),
    }


def _parent(records: list[CaptureRecord]) -> str | None:
    for record in records:
        if isinstance(record.get("parent_session_id"), str):
            return record["parent_session_id"]
    return None


def _contiguity(
    decision: CallDecision | None,
    records: list[CaptureRecord],
    timeline_index: _TimelineIndex,
    record: CaptureRecord,
    window: int,
) -> dict[str, Any]:
    """The call's relation to the call it continues, from the chains' decision; token windows for a break."""
    if decision is None:
        return {"kind": "other_run"}  # outside the dispatch the rollout covers (an earlier one, or another run's)
    relation = decision["relation"]
    if relation == "discarded":
        return {"kind": "retry"}
    if relation in ("first", "side"):
        return {"kind": relation}
    if relation == "extends":
        return {"kind": "extends", "previous_index": timeline_index(decision["previous_index"])}
    account = _located(decision["break"], timeline_index) or {}
    result = {**account, "kind": "breaks", "break_kind": account.get("kind")}
    previous_index = account.get("previous_index")
    previous = records[previous_index] if previous_index is not None else None
    prior_prompt = previous.get("prompt_token_ids") if previous is not None else None
    prior_generation = previous.get("generation_token_ids") if previous is not None else None
    prompt = record.get("prompt_token_ids")
    if previous is None or not (
        isinstance(prior_prompt, list) and isinstance(prior_generation, list) and isinstance(prompt, list)
    ):
        return result
    result.update(compare_calls(prior_prompt, prior_generation, prompt, window=window))
    result["kind"] = "breaks"
    if result["position"] is not None:
        # Text is known only for tokens the previous call generated (the upstream's token strings).
        texts = previous.get("generation_token_texts")
        position = result["position"]
        result["before_text"] = _texts(
            texts, len(prior_prompt), position - len(result["before"]), len(result["before"])
        )
        result["expected_text"] = _texts(texts, len(prior_prompt), position, len(result["expected"]))
    return result


def _texts(texts: object, generation_start: int, start: int, count: int) -> list[str | None]:
    out: list[str | None] = []
    for position in range(start, start + count):
        offset = position - generation_start
        if isinstance(texts, list) and 0 <= offset < len(texts) and isinstance(texts[offset], str):
            out.append(texts[offset])
        else:
            out.append(None)
    return out


def _shared_prefix(request: list[Any], prior_messages: list[Any]) -> int:
    """How many leading request messages repeat the previous call's conversation (its reply included)."""
    shared = 0
    for mine, theirs in zip(request, prior_messages):
        # Most resent messages are identical: compare as is first, canonicalise only when not.
        if mine != theirs and _canonical(mine) != _canonical(theirs):
            break
        shared += 1
    return shared


def _canonical(message: Any) -> Any:
    """A message for comparison only. Clients resend history loosely: reasoning dropped, `content: null`
    for an absent content, tool-call arguments respaced, extra keys on tool calls."""
    if not isinstance(message, dict):
        return message
    calls = message.get("tool_calls")
    return (
        message.get("role"),
        message.get("content") or "",
        message.get("tool_call_id"),
        tuple(_canonical_call(call) for call in calls) if isinstance(calls, list) else (),
    )


def _canonical_call(call: Any) -> Any:
    if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
        return json.dumps(call, sort_keys=True)
    name, arguments = call["function"].get("name"), call["function"].get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            pass
    return (call.get("id"), name, json.dumps(arguments, sort_keys=True))


def spawning_call(
    parent_calls: list[tuple[str | None, str | None, str | None, bool]], child_start: str | None
) -> str | None:
    """The parent call that spawned a child session: the last one that ended before the child began,
    preferring one whose reply asked for tools (the sub-agent is a tool call's work). Inferred from
    times: the records carry no explicit link."""
    if child_start is None:
        return None
    before = [call for call in parent_calls if isinstance(call[0], str) and call[0] <= child_start]
    if not before:
        return None
    with_tools = [call for call in before if call[3]]
    return (with_tools or before)[-1][2]


def build_tree(store: CaptureStore, view: IndexView, cache: SummaryCache, session_id: str) -> dict[str, Any] | None:
    """The session and every session below it: own and rolled-up tokens, and the call that spawned each child."""
    root_facts = cache.facts(store, view, session_id)
    if root_facts is None:
        return None
    root = _node(session_id, root_facts, spawned_by=None)
    seen = {session_id}
    stack: list[tuple[dict[str, Any], SessionFacts]] = [(root, root_facts)]
    order = [root]
    while stack:
        node, facts = stack.pop()
        for child_id in view.children(node["session_id"]):
            if child_id in seen:
                continue
            child_facts = cache.facts(store, view, child_id)
            if child_facts is None:
                continue
            seen.add(child_id)
            spawned_by = spawning_call(facts.calls, child_facts.summary["started_at"])
            child = _node(child_id, child_facts, spawned_by=spawned_by)
            node["children"].append(child)
            order.append(child)
            stack.append((child, child_facts))
    # Children were appended after their parents, so walking backwards rolls every subtree up once.
    for node in reversed(order):
        for child in node["children"]:
            node["total_tokens_in"] += child["total_tokens_in"]
            node["total_tokens_out"] += child["total_tokens_out"]
            node["total_calls"] += child["total_calls"]
    return root


def _node(session_id: str, facts: SessionFacts, *, spawned_by: str | None) -> dict[str, Any]:
    summary = facts.summary
    return {
        "session_id": session_id,
        "spawned_by": spawned_by,
        "calls": summary["calls"],
        "tokens_in": summary["tokens_in"],
        "tokens_out": summary["tokens_out"],
        "total_calls": summary["calls"],
        "total_tokens_in": summary["tokens_in"],
        "total_tokens_out": summary["tokens_out"],
        "rollout": summary["rollout"],
        "children": [],
    }


def link_children(timeline: dict[str, Any], tree: dict[str, Any]) -> None:
    """Mark on each call of the timeline the child sessions it spawned (from the tree's links)."""
    by_uuid = {call["uuid"]: call for call in timeline["calls"]}
    for child in tree["children"]:
        call = by_uuid.get(child["spawned_by"])
        if call is not None:
            call["spawned"].append(child["session_id"])
