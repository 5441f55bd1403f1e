"""Why a call does not continue its chain: the kind of break in plain words, where the tokens part, and the calls on both sides."""

from __future__ import annotations

import json
from typing import Any, TypedDict

from server.capture.read.contiguity import compare_calls
from server.capture.rollout.records import generated_texts, quotes_any
from server.capture.write.record import CaptureRecord

# Each kind names what the client (or engine) did, so a user knows what to change.
KINDS: dict[str, str] = {
    "rewrote_history": "the client rewrote an earlier message",
    "tool_call_as_text": "the client re-sent a tool call as text",
    "history_sent_twice": "the client sent previous_response_id and the history together",
    "dropped_history": "the client dropped earlier history",
    "compacted": "the client compacted the history",
    "new_conversation": "the client began a new conversation under the same session id",
    "inserted_message": "the client added a message the model did not write",
    "no_new_message": "the client sent the history back with no new message",
    "template_changed": "the engine's template changed earlier tokens",
    "injection_fell_back": "the engine rendered the prompt itself (token injection fell back)",
    "model_or_tools_changed": "the call's model, tools or tool_choice differ from the chain's",
    "incomplete_record": "the record is incomplete",
    "unusable_record": "the record's messages or tokens cannot be used",
}

# Tokens shown on each side of a break (the viewer's windows).
WINDOW = 8


class Break(TypedDict):
    """The account of one break (`describe_break`): its kind in plain words, the calls on both sides
    (sorted record indices), and where the tokens part (None and empty lists when the token lists
    cannot be compared)."""

    kind: str  # a key of KINDS
    summary: str
    detail: str  # the reconstruction's own message
    index: int
    uuid: str | None
    previous_index: int | None
    previous_uuid: str | None
    invalid_reason: str | None
    position: int | None
    expected_length: int | None
    in_previous_generation: bool | None
    before: list[int]
    expected: list[int]
    actual: list[int]


def describe_break(
    kind: str,
    record: object,
    index: int,
    previous: CaptureRecord | None,
    previous_index: int | None,
    detail: str,
    *,
    window: int = WINDOW,
) -> Break:
    """The one account of a break that the rollout, the chains and the viewer all show.

    `previous` is the record the call was expected to continue (the chain's last call), None when
    the break has no such call. Token fields come from `compare_calls` against that record.
    """
    summary = KINDS[kind]
    invalid_reason = record.get("invalid_reason") if isinstance(record, dict) else None
    if kind == "incomplete_record" and isinstance(invalid_reason, str) and invalid_reason:
        summary = f"{summary}: {invalid_reason}"
    out: Break = {
        "kind": kind,
        "summary": summary,
        "detail": detail,
        "index": index,
        "uuid": record.get("uuid") if isinstance(record, dict) else None,
        "previous_index": previous_index,
        "previous_uuid": previous.get("uuid") if previous is not None else None,
        "invalid_reason": invalid_reason if isinstance(invalid_reason, str) else None,
        "position": None,
        "expected_length": None,
        "in_previous_generation": None,
        "before": [],
        "expected": [],
        "actual": [],
    }
    tokens = _token_lists(previous, record)
    if tokens is not None:
        compared = compare_calls(*tokens, window=window)
        out["position"] = compared["position"]
        out["expected_length"] = compared["expected_length"]
        out["in_previous_generation"] = compared["in_previous_generation"]
        out["before"] = compared["before"]
        out["expected"] = compared["expected"]
        out["actual"] = compared["actual"]
    return out


def _token_lists(previous: CaptureRecord | None, record: object) -> tuple[list[int], list[int], list[int]] | None:
    if previous is None or not isinstance(record, dict):
        return None
    lists = (previous.get("prompt_token_ids"), previous.get("generation_token_ids"), record.get("prompt_token_ids"))
    if not all(isinstance(value, list) for value in lists):
        return None
    return lists  # type: ignore[return-value]


# What the reconstruction says when a record does not continue its chain (its messages or tokens).
_CHAIN_ERRORS = ("do not extend", "does not extend", "adds no environment", "suffix contains non-environment")


def break_kind(record: object, previous_messages: list[Any] | None, detail: str) -> str:
    """The kind of break `record` makes after a call whose messages (prompt + reply) were
    `previous_messages`, given the reconstruction's error `detail`."""
    if not isinstance(record, dict):
        return "unusable_record"
    if record.get("is_valid") is not True:
        return "incomplete_record"
    if "without token injection" in detail or "token injection fell back" in detail:
        return "injection_fell_back"
    if "tools/tool_choice differ" in detail or "!= session model" in detail:
        return "model_or_tools_changed"
    messages = record.get("messages")
    if previous_messages is None or not isinstance(messages, list) or not any(e in detail for e in _CHAIN_ERRORS):
        return "unusable_record"
    return message_break_kind(previous_messages, messages[:-1])


def message_break_kind(history: list[Any], prompt: list[Any]) -> str:
    """The kind of a break the messages show: `history` is what the chain said so far (its last call's
    prompt and reply), `prompt` the new call's request messages; both raw chat messages.

    Compared loosely (role, text, tool calls with canonical arguments), as clients re-serialize what
    they resend. Called only once a call is known not to continue its chain.
    """
    said = [_loose(m) for m in history]
    asked = [_loose(m) for m in prompt]
    shared = 0
    for mine, theirs in zip(asked, said):
        if mine != theirs:
            break
        shared += 1
    if shared == len(said):
        suffix = prompt[shared:]
        if not suffix:
            return "no_new_message"
        repeat = said[: min(len(said), 2)]
        if any(asked[k : k + len(repeat)] == repeat for k in range(shared, len(asked) - len(repeat) + 1)):
            return "history_sent_twice"  # the conversation's opening comes again after the history
        roles = [m.get("role") if isinstance(m, dict) else None for m in suffix]
        if "assistant" in roles:
            plain_assistant = any(
                isinstance(m, dict) and m.get("role") == "assistant" and not m.get("tool_calls") for m in suffix
            )
            return "tool_call_as_text" if plain_assistant and "user" in roles else "inserted_message"
        if any(role not in ("user", "tool") for role in roles):
            return "inserted_message"
        return "template_changed"  # the messages extend the chain: the tokens did not
    if not any(isinstance(m, dict) and m.get("role") == "assistant" for m in prompt) and not quotes_any(
        prompt, generated_texts(history)
    ):
        return "new_conversation"  # nothing of the conversation so far: not a compaction of it
    theirs, mine = history[shared], prompt[shared] if shared < len(prompt) else None
    if (
        isinstance(theirs, dict)
        and isinstance(mine, dict)
        and theirs.get("role") == mine.get("role") == "assistant"
        and theirs.get("tool_calls")
        and not mine.get("tool_calls")
    ):
        return "tool_call_as_text"
    if len(asked) <= len(said):
        # Shorter. A window that dropped older messages keeps the turn just generated; a compaction
        # replaced it too (with a summary).
        return "dropped_history" if said[-1] in asked else "compacted"
    return "rewrote_history"


def _loose(message: object) -> object:
    if not isinstance(message, dict):
        return message
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    calls = message.get("tool_calls")
    return (
        message.get("role"),
        content or "",
        message.get("tool_call_id"),
        tuple(_loose_call(call) for call in calls) if isinstance(calls, list) else (),
    )


def _loose_call(call: object) -> object:
    if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
        return json.dumps(call, sort_keys=True, default=str)
    function = call["function"]
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            pass
    return (call.get("id"), function.get("name"), json.dumps(arguments, sort_keys=True, default=str))
