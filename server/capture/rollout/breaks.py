"""Why a call does not continue its chain: the kind of break in plain words, where the tokens part, and the calls on both sides."""

from __future__ import annotations

import json
import os
from typing import Any, TypedDict

from server.capture.read.contiguity import compare_calls
from server.capture.rollout.records import generated_texts, quotes_any
from server.capture.write.record import CaptureRecord

# Each kind names what the client (or engine) did, so a user knows what to change. The one list of
# kinds: docs/capture.md#break-kinds describes each with the client behaviour behind it (a test checks
# that table against this one).
KINDS: dict[str, str] = {
    "rewrote_history": "the client rewrote an earlier message",
    "tool_call_as_text": "the client re-sent a tool call as text",
    "history_sent_twice": "the client sent the history twice (previous_response_id and the history together)",
    "dropped_history": "the client dropped earlier history",
    "compacted": "the client compacted the history: earlier turns replaced by fewer, shorter ones",
    "prompt_rebuilt": "the client rebuilt the prompt, re-rendering the history into new messages",
    "retried_with_new_system_prompt": "the client asked the same question again under a changed system prompt",
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
        return _extension_kind(said, asked, prompt[shared:], shared)
    theirs, mine = history[shared], prompt[shared] if shared < len(prompt) else None
    if (
        isinstance(theirs, dict)
        and isinstance(mine, dict)
        and theirs.get("role") == mine.get("role") == "assistant"
        and theirs.get("tool_calls")
        and not mine.get("tool_calls")
    ):
        return "tool_call_as_text"
    said_set = set(said)
    if _answer_rendered_into(history, said, asked, said_set):
        return "prompt_rebuilt"
    if _same_question_new_system_prompt(said[:-1], asked):
        return "retried_with_new_system_prompt"
    if (
        not any(_role(m) == "assistant" for m in asked)
        and not any(m in said_set for m in asked if _role(m) not in _SYSTEM_ROLES)
        and not quotes_any(prompt, generated_texts(history))
    ):
        return "new_conversation"  # nothing of the conversation so far, not even quoted: not a compaction of it
    # What the client took out of the history, and what it put in its place: before the latest turn it
    # kept (what follows that is the next turn's), or all it added when it kept no later turn.
    asked_set = set(asked)
    removed = [m for m in said[shared:] if m not in asked_set]
    kept = [k for k in range(shared, len(asked)) if asked[k] in said_set]
    inserted = [m for m in asked[shared : kept[-1] + 1 if kept else len(asked)] if m not in said_set]
    if removed and not inserted:
        return "dropped_history"  # a window: older messages gone, nothing in their place
    if removed and inserted and len(inserted) < len(removed) and _chars(inserted) < _chars(removed):
        return "compacted"
    return "rewrote_history"


def _extension_kind(said: list[Any], asked: list[Any], suffix: list[Any], shared: int) -> str:
    """The kind of break a prompt makes that starts with the whole history (its tokens or the new
    messages are what break)."""
    if not suffix:
        return "no_new_message"
    # The conversation's opening (its first messages after any system prompt, which may travel apart
    # from the history, as Responses `instructions`) coming again after the history: sent twice.
    opening = [m for m in said if _role(m) not in _SYSTEM_ROLES][:2]
    if opening and any(asked[k : k + len(opening)] == opening for k in range(shared, len(asked) - len(opening) + 1)):
        return "history_sent_twice"
    roles = [m.get("role") if isinstance(m, dict) else None for m in suffix]
    if "assistant" in roles:
        plain_assistant = any(
            isinstance(m, dict) and m.get("role") == "assistant" and not m.get("tool_calls") for m in suffix
        )
        return "tool_call_as_text" if plain_assistant and "user" in roles else "inserted_message"
    if any(role not in ("user", "tool") for role in roles):
        return "inserted_message"
    return "template_changed"  # the messages extend the chain: the tokens did not


_SYSTEM_ROLES = ("system", "developer")
# A line of an answer shorter than this proves nothing when it shows up again (a field marker, "ok").
_TELLING_LINE = 8


def _role(loose: object) -> object:
    return loose[0] if isinstance(loose, tuple) else None


def _text_of(loose: object) -> str:
    return loose[1] if isinstance(loose, tuple) and isinstance(loose[1], str) else ""


def _chars(messages: list[Any]) -> int:
    return sum(len(_text_of(m)) + sum(len(str(c)) for c in m[3]) for m in messages if isinstance(m, tuple))


def _answer_rendered_into(history: list[Any], said: list[Any], asked: list[Any], said_set: set[Any]) -> bool:
    """The last answer is not sent back as an assistant message, but its words are inside a message the
    client wrote anew: the whole history re-rendered into a fresh prompt (DSPy's ReAct trajectory)."""
    if not said or _role(said[-1]) != "assistant" or said[-1] in set(asked):
        return False
    before = "\n".join(_text_of(m) for m in said[:-1])
    lines = [line.strip() for line in _text_of(said[-1]).splitlines()]
    telling = [line for line in lines if len(line) >= _TELLING_LINE and line not in before]
    # Written anew by the client (an edited assistant turn is a rewrite, not a re-render).
    fresh = [_text_of(m) for m in asked if m not in said_set and _role(m) != "assistant"]
    return any(line in text for line in telling for text in fresh)


def _same_question_new_system_prompt(previous_prompt: list[Any], asked: list[Any]) -> bool:
    """The previous call's prompt asked again (its answer not sent back) under another system prompt
    (DSPy's adapter retry: the same fields, formatted for JSON this time)."""
    if len(previous_prompt) != len(asked) or [_role(m) for m in previous_prompt] != [_role(m) for m in asked]:
        return False
    system_changed = False
    for before, now in zip(previous_prompt, asked):
        if before == now:
            continue
        if _role(now) in _SYSTEM_ROLES:
            system_changed = True
        elif not _same_question(_text_of(before), _text_of(now)):
            return False
    return system_changed


def _same_question(before: str, now: str) -> bool:
    """Two texts that open alike for at least half the shorter one (a question re-asked with other
    closing instructions)."""
    common = len(os.path.commonprefix([before, now]))
    return common > 0 and common * 2 >= min(len(before), len(now))


def _loose(message: object) -> object:
    """A message as a hashable tuple (role, text, tool_call_id, tool calls); anything odd as its JSON."""
    if not isinstance(message, dict):
        return json.dumps(message, sort_keys=True, default=str)
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    elif content is not None and not isinstance(content, str):
        content = json.dumps(content, sort_keys=True, default=str)
    calls = message.get("tool_calls")
    call_id = message.get("tool_call_id")
    return (
        message.get("role") if isinstance(message.get("role"), str) else None,
        content or "",
        call_id if isinstance(call_id, str) else None,
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
