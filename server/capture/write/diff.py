"""Diff-encoded record files (`.delta`): a record stored as what it adds to an earlier record of its session.

Each call of a conversation repeats the whole conversation: its messages and prompt token ids start
with those of a call before it. Under `capture_encoding: delta` the writer stores a record as
`<uuid>.delta`:

    line 1  the record's leading fields (schema_version ... token_count) as plain JSON, byte for
            byte as a full record starts: the index and the session list read only this line
    line 2  how to rebuild the rest: {"base": uuid or null, "base_sha256", "messages": k,
            "prompt_token_ids": m, "tools": bool}
    rest    the record's other fields, zstd-compressed JSON; `messages` holds only what follows the
            base's first k messages, `prompt_token_ids` only what follows the first m ids of the
            base's prompt + generation, and `tools` is null when it is the base's

The writer matches a record against the last few records it wrote for the session by comparing
their serialised bytes (digests of byte prefixes), so a rebuilt record serialises exactly as the
full record would have. `base_sha256` is the digest of the base's file bytes: a missing, damaged
or replaced base is detected, and since each file's bytes name its own base's digest, a chain is
checked end to end. Reading them back is `diff_read`'s job.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections import OrderedDict
from typing import Any

import orjson
import zstandard

from server.capture.write.record import CaptureRecord

DIFF_SUFFIX = ".delta"
# zstd level for the body: most bodies are a few KiB (one turn), where level 3 is cheap; a record
# with no base (a first call, say an 8k-token prompt) is larger, and level 1 keeps it near 0.3 ms.
_LEVEL_SMALL, _LEVEL_LARGE, _LARGE = 3, 1, 64 * 1024


# The first field that goes to the compressed body; every field before it stays in the plain header line.
_BODY_FIELDS = frozenset(
    {
        "usage",
        "tools",
        "tool_choice",
        "messages",
        "prompt_token_ids",
        "generation_token_ids",
        "generation_log_probs",
        "generation_token_texts",
        "injection",
    }
)
# How many recent records of a session the writer keeps as candidate bases (a side call, such as a
# title request, must not cost the conversation its base), and of how many sessions, the most
# recently written: about 4 KiB a session of four records (digests, offsets, its files' paths), so
# 16,384 sessions could hold some 70 MiB, and a few minutes of short sessions reach that. 4,096 is four
# times the concurrent streams the server is measured with; a session written again after 4,096
# others were has its next record stored whole.
BASES_PER_SESSION = 4
SESSIONS_REMEMBERED = 4096


def _digest(data: bytes | memoryview) -> bytes:
    return hashlib.sha256(data).digest()


@dataclasses.dataclass(frozen=True, slots=True)
class _Prefix:
    """A prefix of a serialised JSON list: how many elements, where its bytes end, and their digest."""

    count: int
    end: int
    digest: bytes


@dataclasses.dataclass(frozen=True, slots=True)
class _Base:
    """What the writer remembers of a record it wrote, enough to let a later record extend it."""

    uuid: str
    path: str
    stat: tuple[int, int, int]  # (inode, size, mtime_ns) of its file: is it still the file we wrote?
    sha256: str
    ids: tuple[_Prefix, ...]  # prompt + generation, then prompt alone
    messages: tuple[_Prefix, ...]  # all messages, then all but the last (the generated turn)
    tools: bytes | None


@dataclasses.dataclass(slots=True)
class Encoded:
    """A record's file bytes; `commit` makes it a base for later records once its file is in place."""

    data: bytes
    has_base: bool
    _encoder: DiffEncoder
    _session_id: str
    _base: _Base | None  # what it will be as a base (None: it cannot be one)

    def commit(self, path: str) -> None:
        if self._base is not None:
            self._encoder.remember(self._session_id, self._base, path)


class _Matcher:
    """Digests of prefixes of one serialised list, by byte offset: one running hash serves offsets
    asked in increasing order (the usual case: a base's prefix, then this record's own), so a long
    conversation is hashed about once per record."""

    def __init__(self, blob: bytes) -> None:
        self.blob = blob
        self.view = memoryview(blob)
        self._hasher = hashlib.sha256()
        self._at = 0
        self._seen: dict[int, bytes] = {}

    def hasher_at(self, end: int) -> Any:
        """A hash of the first `end` bytes, to be continued by the caller."""
        if end < self._at:
            return hashlib.sha256(self.view[:end])
        self._hasher.update(self.view[self._at : end])
        self._at = end
        return self._hasher.copy()

    def digest_at(self, end: int) -> bytes:
        digest = self._seen.get(end)
        if digest is None:
            digest = self._seen[end] = self.hasher_at(end).digest()
        return digest

    def extends(self, prefix: _Prefix) -> bool:
        # The prefix must end at an element boundary of this list too: a comma or the closing bracket.
        if prefix.end >= len(self.blob) or self.blob[prefix.end] not in b",]":
            return False
        return self.digest_at(prefix.end) == prefix.digest


def _list_prefixes(items: object, matcher: _Matcher, counts: list[int]) -> tuple[_Prefix, ...]:
    """Prefixes of the serialised list holding the first `counts` elements of `items`, longest first.

    orjson writes a list as `[` + elements joined by `,` + `]`, so the first k elements end where
    the last len-k elements (each serialised alone) begin.
    """
    if not isinstance(items, list) or not items:
        return ()
    end = len(matcher.blob) - 1  # without the closing bracket
    out = []
    for count in sorted({c for c in counts if 0 < c <= len(items)}):
        # The bytes of the elements after the first `count`, each with its separating comma.
        stop = end - sum(len(orjson.dumps(item)) + 1 for item in items[count:])
        out.append(_Prefix(count, stop, matcher.digest_at(stop)))
    return tuple(reversed(out))


def _seq_prefixes(prompt: object, generation: object, matcher: _Matcher) -> tuple[_Prefix, ...]:
    """Prefixes of the token sequence prompt + generation, as its serialised list would have them."""
    if not (isinstance(prompt, list) and prompt):
        return ()
    head = len(matcher.blob) - 1  # "[1,2,3"
    prompt_only = _Prefix(len(prompt), head, matcher.digest_at(head))
    if not (isinstance(generation, list) and generation):
        return (prompt_only,)
    gen_blob = orjson.dumps(generation)
    hasher = matcher.hasher_at(head)
    hasher.update(b",")
    hasher.update(memoryview(gen_blob)[1:-1])
    whole = _Prefix(len(prompt) + len(generation), head + len(gen_blob) - 1, hasher.digest())
    return (whole, prompt_only)


class DiffEncoder:
    """The writer's side: encodes each record against the best recent record of its session.

    Used by the writer thread only. What it remembers is small (digests and offsets, not the
    records), bounded by `SESSIONS_REMEMBERED` sessions of `BASES_PER_SESSION` records each.
    """

    def __init__(self) -> None:
        self._sessions: OrderedDict[str, list[_Base]] = OrderedDict()
        # Its own compressors: one encoder is used by one writer thread, and they are not shareable.
        self._compressors = {level: zstandard.ZstdCompressor(level=level) for level in (_LEVEL_SMALL, _LEVEL_LARGE)}

    def forget(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)

    def remember(self, session_id: str, base: _Base, path: str) -> None:
        try:
            st = os.stat(path, follow_symlinks=False)
        except OSError:
            return
        base = dataclasses.replace(base, path=path, stat=(st.st_ino, st.st_size, st.st_mtime_ns))
        bases = [b for b in self._sessions.pop(session_id, []) if b.uuid != base.uuid]
        bases.insert(0, base)
        self._sessions[session_id] = bases[:BASES_PER_SESSION]
        while len(self._sessions) > SESSIONS_REMEMBERED:
            self._sessions.popitem(last=False)

    def _live_bases(self, session_id: str) -> list[_Base]:
        """The session's remembered bases whose files are still the ones written (another process may
        have deleted the session, or replaced a record)."""
        bases = self._sessions.get(session_id)
        if not bases:
            return []
        live = []
        for base in bases:
            try:
                st = os.stat(base.path, follow_symlinks=False)
            except OSError:
                continue
            if (st.st_ino, st.st_size, st.st_mtime_ns) == base.stat:
                live.append(base)
        if len(live) != len(bases):
            self._sessions[session_id] = live
        return live

    def encode(self, record: CaptureRecord) -> Encoded:
        """The `.delta` file bytes of `record`, against the session's best base (or none)."""
        session_id = record["session_id"]
        messages = record.get("messages")
        prompt = record.get("prompt_token_ids")
        tools = record.get("tools")
        message_blob = orjson.dumps(messages)
        prompt_blob = orjson.dumps(prompt)
        tools_blob = orjson.dumps(tools)

        best: tuple[int, _Base, int, int, bool] | None = None  # (bytes saved, base, k, m, tools)
        message_match, prompt_match = _Matcher(message_blob), _Matcher(prompt_blob)
        tools_digest = _digest(tools_blob)

        def most_saved(base: _Base) -> int:
            return sum(p[0].end for p in (base.messages, base.ids) if p) + len(tools_blob)

        # The base that could save the most first; stop once none of the rest could beat the best.
        for base in sorted(self._live_bases(session_id), key=most_saved, reverse=True):
            if best is not None and best[0] >= most_saved(base):
                break
            shared_messages = next((p for p in base.messages if message_match.extends(p)), None)
            shared_ids = next((p for p in base.ids if prompt_match.extends(p)), None)
            same_tools = base.tools == tools_digest and isinstance(tools, list)
            saved = sum(p.end for p in (shared_messages, shared_ids) if p) + (len(tools_blob) if same_tools else 0)
            if saved > 0 and (best is None or saved > best[0]):
                counts = [p.count if p else 0 for p in (shared_messages, shared_ids)]
                best = (saved, base, counts[0], counts[1], same_tools)

        header: dict[str, Any] = {}
        body: dict[str, Any] = {}
        for key, value in record.items():
            if not body and key not in _BODY_FIELDS:
                header[key] = value
            else:
                body[key] = value
        if best is None:
            meta: dict[str, Any] = {"base": None}
        else:
            _, base, k, m, same_tools = best
            meta = {
                "base": base.uuid,
                "base_sha256": base.sha256,
                "messages": k,
                "prompt_token_ids": m,
                "tools": same_tools,
            }
            if k:
                body["messages"] = messages[k:]
            if m:
                body["prompt_token_ids"] = prompt[m:]  # type: ignore[index]
            if same_tools:
                body["tools"] = None
        packed = orjson.dumps(body)
        level = _LEVEL_LARGE if len(packed) > _LARGE else _LEVEL_SMALL
        body_bytes = self._compressors[level].compress(packed)
        data = b"".join((orjson.dumps(header), b"\n", orjson.dumps(meta), b"\n", body_bytes))

        as_base = None
        if isinstance(messages, list) or isinstance(prompt, list):
            as_base = _Base(
                record["uuid"],
                "",
                (0, 0, 0),
                hashlib.sha256(data).hexdigest(),
                _seq_prefixes(prompt, record.get("generation_token_ids"), prompt_match),
                _list_prefixes(messages, message_match, [len(messages), len(messages) - 1])
                if isinstance(messages, list)
                else (),
                tools_digest if isinstance(tools, list) else None,
            )
        return Encoded(data, best is not None, self, session_id, as_base)
