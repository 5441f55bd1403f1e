"""Dispatches in a session: a reused session id's records split into the separate tasks it was given, at read time.

An RL loop sends the same rollout ids on every dispatch (NeMo Gym's `<task>-<repeat>`), and any agent
may reuse a session id for a new task; the records of all of them land in one session, in
`(captured_at, uuid)` order. Nothing in a record says which dispatch it belongs to, so the split is
made from the records alone, the same way by every reader (workers, restarts, old capture folders).

An *opening* is a call whose request holds no assistant turn: a conversation's first call. Each
opening after the first record is judged against the dispatch it would join:

1. A compaction stays: an opening that quotes, in a non-system message, what the dispatch's calls
   generated (an answer's text or a tool call's arguments, 5 characters or more, or a line of 32 or
   more of a longer answer) carries the conversation on as its summary. (An opening that repeats one of the dispatch's first calls word
   for word is never taken for one: a model may echo its task.)
2. Once the dispatch's conversation went on (it holds a call that carries an assistant turn), the
   opening begins a new dispatch unless it is a side call beside that conversation (opencode's
   title, Claude Code's small calls): the first later call that goes on from an earlier call tells
   which conversation continues (the newest call it goes on from lies before the opening: the old
   one), and when no later call says, an opening that shares neither the model/tools/tool_choice
   nor the leading system prompt of the calls that went on is a side call.
3. Before that (the dispatch holds only first calls), it begins a new dispatch when a completed
   first call of the dispatch has the same request word for word, the same leading
   system/developer prompt (both none counts), or the same model, tools and tool_choice: the
   task, or another task of the same agent, asked again. A title call (`records.is_title_call`)
   never does, nor counts as an asked first call; a failed first call does not count either, so
   its retry stays.

A server run that began the conversation afresh (`runs.fresh_run_starts`) is a boundary too. Within a
dispatch the chains and the rollout are rebuilt as for any session; nothing is joined across two.
Cost: one look at each record's request messages (up to its first assistant turn); the later calls
are looked at only for an opening after the conversation went on.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

import orjson

from server.capture.read.contiguity import first_difference
from server.capture.rollout.records import generated_texts, is_title_call, quotes_any, signature
from server.capture.write.record import CaptureRecord

# How many later calls (first calls aside) the side-call test looks at; only an opening after the
# conversation went on is tested at all.
LOOKAHEAD = 8
# How many of a dispatch's latest generated texts (answers, their long lines) a compaction is looked for in.
ANSWERS_KEPT = 256


def request_messages(record: object) -> list[Any] | None:
    """What the call sent: its messages without the answer the record appends (None if unreadable)."""
    messages = record.get("messages") if isinstance(record, dict) else None
    return messages[:-1] if isinstance(messages, list) and messages else None


def _assistant_in_request(record: object) -> bool | None:
    """Whether the call's request holds an assistant turn (None when its messages are unreadable);
    looks no further than the first one, without copying the messages."""
    messages = record.get("messages") if isinstance(record, dict) else None
    if not isinstance(messages, list) or not messages:
        return None
    return any(
        isinstance(messages[k], dict) and messages[k].get("role") == "assistant" for k in range(len(messages) - 1)
    )


def carries_assistant_turn(record: object) -> bool:
    return _assistant_in_request(record) is True


def is_opening(record: object) -> bool:
    """A conversation's first call: readable request messages with no assistant turn among them."""
    return _assistant_in_request(record) is False


def leading_prompt(record: object) -> str | None:
    """The text of the leading system/developer message (None when the request has none)."""
    messages = request_messages(record)
    first = messages[0] if messages else None
    if not isinstance(first, dict) or first.get("role") not in ("system", "developer"):
        return None
    content = first.get("content")
    if isinstance(content, list):
        content = "".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return content if isinstance(content, str) else repr(content)


def _continues(later: CaptureRecord, earlier: CaptureRecord) -> bool:
    """`later` goes on from `earlier`: its prompt extends `earlier`'s prompt + generation (by its
    request messages where either lacks token ids)."""
    prompt = later.get("prompt_token_ids")
    head, tail = earlier.get("prompt_token_ids"), earlier.get("generation_token_ids")
    if isinstance(prompt, list) and prompt and isinstance(head, list) and head and isinstance(tail, list):
        return len(prompt) >= len(head) + len(tail) and first_difference(prompt, head, tail) is None
    asked, said = request_messages(later), earlier.get("messages")
    return asked is not None and isinstance(said, list) and bool(said) and asked[: len(said)] == said


def _asked(record: CaptureRecord) -> bytes:
    try:
        return orjson.dumps(request_messages(record), option=orjson.OPT_SORT_KEYS)
    except TypeError:  # a number or key JSON cannot hold as orjson does: compared as text instead
        return repr(request_messages(record)).encode()


class _Dispatch:
    """What the rule needs to know about the dispatch being read: kept small, no messages."""

    def __init__(self, begin: int) -> None:
        self.begin = begin
        self.asked_prompts: set[str | None] = set()  # leading prompts of its completed openings
        self.asked: set[bytes] = set()  # its completed openings' request messages, serialised
        self.asked_signatures: list[tuple[Any, Any, Any]] = []  # of its completed non-title openings
        self.went_on: list[int] = []  # its calls that carry an assistant turn
        self.answers: deque[str] = deque(maxlen=ANSWERS_KEPT)  # what its calls generated, newest last

    def add(self, index: int, record: CaptureRecord) -> None:
        messages = record.get("messages")
        if isinstance(messages, list) and messages:
            self.answers.extend(generated_texts(messages[-1:]))
        if is_opening(record):
            if record.get("is_valid") is True and not is_title_call(record):
                self.asked.add(_asked(record))
                self.asked_prompts.add(leading_prompt(record))
                self.asked_signatures.append(signature(record))
        elif carries_assistant_turn(record):
            self.went_on.append(index)


def dispatch_starts(records: Sequence[CaptureRecord], fresh_starts: Sequence[int] = ()) -> list[int]:
    """The index of each dispatch's first record in `records` (in `(captured_at, uuid)` order; [] for
    none). `fresh_starts` are further boundaries (where a new server run began afresh)."""
    if not records:
        return []
    fresh = set(fresh_starts)
    starts = [0]
    current = _Dispatch(0)
    for index, record in enumerate(records):
        if index and (index in fresh or _begins_dispatch(records, index, current)):
            starts.append(index)
            current = _Dispatch(index)
        current.add(index, record)
    return starts


def _begins_dispatch(records: Sequence[CaptureRecord], index: int, current: _Dispatch) -> bool:
    record = records[index]
    if not is_opening(record):
        return False
    repeated = _asked(record) in current.asked
    if not repeated and current.answers and quotes_any(request_messages(record) or [], list(current.answers)):
        return False  # a compaction: its summary carries on what this dispatch produced
    if current.went_on:
        return not _is_side_call(records, index, current)
    if is_title_call(record):
        return False  # beside the first call of its conversation
    return (
        repeated  # the same task asked again, word for word
        or leading_prompt(record) in current.asked_prompts
        or signature(record) in current.asked_signatures
    )


def _is_side_call(records: Sequence[CaptureRecord], index: int, current: _Dispatch) -> bool:
    """An opening after the conversation went on that sits beside it rather than starting anew.

    The calls after it decide: the first later call that goes on from any earlier call tells which
    conversation continues (the newest call it goes on from is before the opening: the old one).
    When none does, the opening is a side call only if it looks like none of the calls that went on.
    """
    seen = 0
    for later in range(index + 1, len(records)):
        record = records[later]
        if is_opening(record):
            continue
        seen += 1
        if seen > LOOKAHEAD:
            break
        for earlier in range(later - 1, current.begin - 1, -1):
            if _continues(record, records[earlier]):
                return earlier < index
    opening = records[index]
    went_on = [records[i] for i in current.went_on]
    return signature(opening) not in [signature(r) for r in went_on] and leading_prompt(opening) not in {
        leading_prompt(r) for r in went_on
    }


def split(records: list[CaptureRecord], fresh_starts: Sequence[int] = ()) -> list[list[CaptureRecord]]:
    """`records` as their dispatches, in order (each a slice; [] for no records)."""
    starts = dispatch_starts(records, fresh_starts)
    ends = [*starts[1:], len(records)] if starts else []
    return [records[start:end] for start, end in zip(starts, ends, strict=True)]
