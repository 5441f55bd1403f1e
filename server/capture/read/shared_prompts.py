"""Parsing a session's full records without re-parsing the prompt token ids each one repeats from an earlier one.

In a full-record session every call's `prompt_token_ids` starts with an earlier call's prompt and
generation: a 200-call agent session holds 42 MB of ids of which a few hundred KB are new, and
turning that text into Python ints was half of a rollout rebuild's CPU. `SharedPrompts.loads`
parses a record with its prompt ids cut out, compares the ids' text byte for byte with the prompts
and generations already read, and parses only what follows the longest match; the list it builds
shares the earlier lists' int objects. The answer is always exactly `orjson.loads(data)`: identical
text parses to identical values, and anything unusual (another layout, a record that is not an
object, a key that also appears nested) takes the plain parse.
"""

from __future__ import annotations

import bisect
import secrets
from dataclasses import dataclass
from typing import Any, cast

import orjson

_KEY = b'"prompt_token_ids":['
_DELIMITERS = (ord(","), ord("]"))
# Earlier prompts compared per record, longest first: enough for a chain read in any order (every
# shorter prompt of a chain is its prefix), and it keeps a session of unrelated calls linear.
MAX_CANDIDATES = 8


@dataclass(slots=True, frozen=True)
class _Known:
    """A prompt already read: its ids' text without the closing bracket, its ids, and the
    generation that followed it (its text without brackets, and its ids)."""

    open_text: bytes
    prompt: list[Any]
    generation_text: bytes
    generation: list[Any]


class SharedPrompts:
    """One session read: remembers each record's prompt ids so the next records parse only what they add."""

    def __init__(self) -> None:
        # Stands in for the ids while the rest of a record is parsed; no file can predict it.
        self._marker = secrets.token_hex(16)
        self._lengths: list[int] = []  # len(open_text) of each known prompt, sorted
        self._known: list[_Known] = []  # in the same order

    def loads(self, data: bytes) -> Any:
        """`orjson.loads(data)`, reusing the ids of prompts read before (raises orjson.JSONDecodeError)."""
        start = data.find(_KEY)
        if start < 0:
            return orjson.loads(data)
        open_at = start + len(_KEY) - 1
        close_at = data.find(b"]", open_at)
        if close_at < 0:
            return orjson.loads(data)
        try:
            record = orjson.loads(data[:open_at] + b'"' + self._marker.encode() + b'"' + data[close_at + 1 :])
        except orjson.JSONDecodeError:
            return orjson.loads(data)
        # The marker must be the record's own prompt_token_ids (not a nested key's, not inside a string).
        if not isinstance(record, dict) or record.get("prompt_token_ids") != self._marker:
            return orjson.loads(data)
        text = data[open_at : close_at + 1]
        prompt = self._parse_ids(text)
        if prompt is None:
            return orjson.loads(data)
        record["prompt_token_ids"] = prompt
        self._remember(text, prompt, record.get("generation_token_ids"))
        return record

    def _parse_ids(self, text: bytes) -> list[Any] | None:
        """The list `text` (`[...]`, cut at its first `]`) holds, or None if it is not a whole flat array."""
        for known in self._candidates(len(text)):
            reused = _extend(text, known)
            if reused is not None:
                return reused
        try:
            ids = orjson.loads(text)
        except orjson.JSONDecodeError:
            return None
        return ids if isinstance(ids, list) else None

    def _candidates(self, text_length: int) -> list[_Known]:
        end = bisect.bisect_left(self._lengths, text_length)
        return self._known[max(0, end - MAX_CANDIDATES) : end][::-1]

    def _remember(self, text: bytes, prompt: list[Any], generation: object) -> None:
        if len(prompt) == 0:
            return
        generation_text = b""
        if isinstance(generation, list) and generation:
            try:
                generation_text = orjson.dumps(generation)[1:-1]
            except orjson.JSONEncodeError:  # ints too large for JSON numbers orjson writes
                generation = []
        else:
            generation = []
        known = _Known(text[:-1], prompt, generation_text, generation)
        at = bisect.bisect_right(self._lengths, len(known.open_text))
        self._lengths.insert(at, len(known.open_text))
        self._known.insert(at, known)


def _extend(text: bytes, known: _Known) -> list[Any] | None:
    """The ids of `text` if it starts with `known`'s prompt (and, where it follows, its generation)."""
    cut = len(known.open_text)
    if not text.startswith(known.open_text) or text[cut] not in _DELIMITERS:
        return None
    prefix = known.prompt
    generation_text = known.generation_text
    after = cut + 1 + len(generation_text)
    if (
        generation_text
        and text[cut] == ord(",")
        and len(text) > after
        and text[after] in _DELIMITERS
        and text.startswith(generation_text, cut + 1)
    ):
        prefix, cut = known.prompt + known.generation, after
    if text[cut] == ord("]"):
        return list(prefix) if cut == len(text) - 1 else None  # a list of its own, as the plain parse gives
    try:
        rest = orjson.loads(b"[" + text[cut + 1 :])
    except orjson.JSONDecodeError:
        return None
    if not rest:  # "[1,2,]" is not an array; the plain parse says so
        return None
    return prefix + cast(list[Any], rest)
