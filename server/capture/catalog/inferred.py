"""Sessions for calls that name none: a bounded map, per key, from a conversation so far to the session that continues it.

A call without a session id joins the session whose conversation it continues: its chat messages
start with an earlier call's messages followed by that call's answer, as the client sent them
back. Each completed call registers the digest of its messages + answer under its session; a later
call looks up the digests of its own prefixes that end in an assistant message, longest first, and
claims the session found there. A claim takes the session off the map, so each registered answer is
continued by one call only: identical conversations (a GRPO group: many first calls alike, answered
alike) stay apart, the earliest registered session going to the first call that continues one. A
call that does not complete gives its claim back. Nothing found: the call starts a new session,
`inferred-<random hex>`.

The map lives in one process (each `--workers` worker has its own) and is bounded: at most
`max_sessions` open sessions, the least recently registered dropped first, and an entry older than
`ttl_s` is not joined (its conversation's next call starts a new session).
"""

from __future__ import annotations

import hashlib
import json
import secrets
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

# The name of a session this server made up for calls that came without an id.
INFERRED_PREFIX = "inferred-"
# Open sessions kept per process (about 200 bytes each: digest, owner tag, id, time).
MAX_SESSIONS = 65_536
# A conversation whose next call comes later than this starts a new session.
TTL_S = 3600.0

_TEXT_PARTS = ("text", "input_text", "output_text")


def new_session_id() -> str:
    """A fresh id in the header charset, unguessable, that names where it came from."""
    return INFERRED_PREFIX + secrets.token_hex(12)


def _text(content: object) -> str:
    """A message's content as one comparable string: text parts joined, other parts (images) as sorted JSON."""
    if isinstance(content, str):
        return content.strip()
    if not isinstance(content, list):
        return ""
    out = []
    for part in content:
        if isinstance(part, dict) and part.get("type") in _TEXT_PARTS and isinstance(part.get("text"), str):
            out.append(part["text"])
        else:
            out.append(_json(part).decode())
    return "".join(out).strip()


def _arguments(raw: object) -> object:
    if isinstance(raw, str):
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            return raw
    return raw


def _json(value: object) -> bytes:
    """Canonical JSON (sorted keys), fast; the standard library's for what orjson refuses (huge ints)."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS, default=str)
    except TypeError:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str).encode()


def canonical(message: object) -> bytes:
    """One chat message as the bytes its digest is taken over.

    Only what every client sends back unchanged: the role, the text, and tool calls by name and
    parsed arguments. Clients drop reasoning, re-serialise arguments (spacing, key order) and some
    renumber tool-call ids on the way back (the Messages translation does), so those are left out.
    """
    if not isinstance(message, dict):
        return _json(message)
    calls = message.get("tool_calls")
    shaped = [
        message.get("role"),
        _text(message.get("content")),
        [
            [call.get("function", {}).get("name"), _arguments(call.get("function", {}).get("arguments"))]
            for call in calls
            if isinstance(call, dict) and isinstance(call.get("function"), dict)
        ]
        if isinstance(calls, list)
        else [],
    ]
    return _json(shaped)


@dataclass(slots=True)
class Prompt:
    """A call's messages digested once: the digest of each prefix that ends in an assistant message
    (what the call may continue), longest first, and the running digest of all of them (what its
    answer extends)."""

    continues: list[bytes]
    running: Any  # hashlib's sha256 after every message


def digest_prompt(messages: object) -> Prompt:
    running = hashlib.sha256()
    continues: list[bytes] = []
    for message in messages if isinstance(messages, list) else ():
        piece = canonical(message)
        running.update(len(piece).to_bytes(8, "little"))
        running.update(piece)
        if isinstance(message, dict) and message.get("role") == "assistant":
            continues.append(running.copy().digest())
    continues.reverse()
    return Prompt(continues, running)


def digest_answer(prompt: Prompt, answer: object) -> bytes:
    """The digest of the prompt's messages followed by the answer (the next call's prefix)."""
    running = prompt.running.copy()
    piece = canonical(answer)
    running.update(len(piece).to_bytes(8, "little"))
    running.update(piece)
    return bytes(running.digest())


@dataclass(slots=True)
class Claim:
    """A session taken off the map by the call continuing it; given back if the call does not complete."""

    owner: str
    key: bytes
    session_id: str
    registered_at: float


@dataclass(slots=True)
class _Open:
    """The sessions whose last completed call ended a conversation with this digest, oldest first."""

    sessions: deque[tuple[str, float]] = field(default_factory=deque)


class ConversationMap:
    """Open conversations by (owner tag, digest): who continues what. Thread-safe; every operation O(1)
    in the map's size (a lookup hashes the call's messages once, outside the lock)."""

    def __init__(
        self, max_sessions: int = MAX_SESSIONS, ttl_s: float = TTL_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._max = max_sessions
        self._ttl = ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        # Least recently registered first: eviction and expiry take from the front.
        self._open: OrderedDict[tuple[str, bytes], _Open] = OrderedDict()
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def claim(self, owner: str, prompt: Prompt) -> Claim | None:
        """The session this prompt continues, taken off the map (the longest registered prefix wins;
        among identical conversations, the earliest registered); None: a new conversation."""
        now = self._clock()
        with self._lock:
            self._expire(now)
            for key in prompt.continues:
                entry = self._open.get((owner, key))
                if entry is None:
                    continue
                while entry.sessions and now - entry.sessions[0][1] > self._ttl:
                    entry.sessions.popleft()  # past its time, though its key was registered again since
                    self._count -= 1
                if not entry.sessions:
                    del self._open[(owner, key)]
                    continue
                session_id, at = entry.sessions.popleft()
                self._count -= 1
                if not entry.sessions:
                    del self._open[(owner, key)]
                return Claim(owner, key, session_id, at)
        return None

    def give_back(self, claim: Claim) -> None:
        """A claiming call that did not complete: its session is open again, first in line (a retry finds it)."""
        if self._clock() - claim.registered_at > self._ttl:
            return
        with self._lock:
            entry = self._open.get((claim.owner, claim.key))
            if entry is None:
                entry = self._open[(claim.owner, claim.key)] = _Open()
                self._open.move_to_end((claim.owner, claim.key), last=False)  # as old as it was
            entry.sessions.appendleft((claim.session_id, claim.registered_at))
            self._count += 1
            self._evict()

    def register(self, owner: str, key: bytes, session_id: str) -> None:
        """A call of `session_id` completed; the conversation it ended (digest `key`) is open to continue."""
        now = self._clock()
        with self._lock:
            entry = self._open.get((owner, key))
            if entry is None:
                entry = self._open[(owner, key)] = _Open()
            else:
                self._open.move_to_end((owner, key))
            entry.sessions.append((session_id, now))
            self._count += 1
            self._expire(now)
            self._evict()

    def _expire(self, now: float) -> None:
        # The front holds the least recently registered key; its oldest session is its first.
        while self._open:
            key, entry = next(iter(self._open.items()))
            while entry.sessions and now - entry.sessions[0][1] > self._ttl:
                entry.sessions.popleft()
                self._count -= 1
            if entry.sessions:
                return
            del self._open[key]

    def _evict(self) -> None:
        while self._count > self._max and self._open:
            key, entry = next(iter(self._open.items()))
            entry.sessions.popleft()
            self._count -= 1
            if not entry.sessions:
                del self._open[key]
