"""Per-session token histories: what each conversation really sent and got, how a new call extends one.

A chain holds the canonical history of one conversation in a session (the last prompt the engine
used plus what it generated), and the template render of that call's messages without the
generation prompt (`prefix`), which is where a re-rendered next prompt is cut. Sessions may hold
several chains (opencode's title generator shares the main agent's session id); a call extends the
chain whose prefix is the longest prefix of its own render. With the `renderers` bridge, and with
the `nemo_rl` transport (whose engine renders and splices), a call is matched by its messages
instead (`history_hash`: the chain's last request, before any render), so that the common call
needs no render of the whole conversation here at all.

The capture records are the source of truth: `histories_from_records` rebuilds a session's chains
from them, so memory here is only a bounded cache (LRU + TTL).
"""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import orjson

from server.capture.write.record import CaptureRecord
from server.injection.id_lists import begins_with, json_digest

# Finish reasons after which the last generated token is the template's end-of-turn token.
NATURAL_STOPS = frozenset({"stop", "tool_calls", "stop_sequence"})


class NoEndOfTurn(ValueError):
    """The re-rendered tail has no end-of-turn token where the last assistant turn should close."""


def prefix_hash(ids: list[int]) -> str:
    """A digest of a token list, stored in records so a chain's prefix can be matched without the ids."""
    return json_digest(orjson.dumps(ids))


def history_hash(messages: list[Any], tools: Any, template: dict[str, Any]) -> str:
    """A digest of what a request asks the template to render: its messages, tools and template options."""
    doc = {"messages": messages, "tools": tools or None, "template": template}
    return json_digest(orjson.dumps(doc, option=orjson.OPT_SORT_KEYS))


def new_history_id() -> str:
    return "chain_" + uuid.uuid4().hex[:16]


@dataclass(slots=True)
class TokenHistory:
    """One conversation's token history; `version` moves on every commit (optimistic concurrency)."""

    id: str
    accumulated: list[int]  # the last prompt the engine used + the ids it generated
    last_generation: list[int]
    eot: int | None  # the end-of-turn token that closed the last generation; None after a length stop
    n_messages: int  # messages of the last request + its reply
    # 0 (and prefix_hash "") when the call that heads the chain was not rendered here (bridged, nemo_rl).
    prefix_len: int
    prefix_hash: str
    # The prefix's ids as compact JSON (server.injection.id_lists); None when rebuilt from records until a call matches it.
    prefix_json: bytes | None = None
    version: int = 0
    # The key by messages (nemo_rl, the `renderers` bridge): the last request's messages, tools, template options.
    history_hash: str | None = None

    def prefix_of(self, rendered_json: bytes, n_rendered: int) -> bool:
        """True when this chain's prefix is a strict prefix of a render (`rendered_json`: its ids as
        compact JSON, `n_rendered` of them)."""
        n = self.prefix_len
        if n >= n_rendered or n == 0:
            return False
        if self.prefix_json is None:  # rebuilt from the records: only the digest is known
            try:
                head = orjson.dumps(orjson.loads(rendered_json)[:n])
            except ValueError:  # not plain JSON integers: nothing to match
                return False
            if json_digest(head) != self.prefix_hash:
                return False
            self.prefix_json = head
            return True
        return begins_with(rendered_json, self.prefix_json)

    def continues(self, messages: list[dict[str, Any]]) -> bool:
        """The call's messages go on from this chain's last reply with environment turns only.

        A later assistant message means another process (or an evicted entry) moved the
        conversation on past this chain: extending it would splice a re-rendered turn in.
        """
        n = self.n_messages
        if len(messages) <= n or not isinstance(messages[n - 1], dict) or messages[n - 1].get("role") != "assistant":
            return False
        return all(isinstance(m, dict) and m.get("role") != "assistant" for m in messages[n:])


def extends_history(chain: TokenHistory, messages: list[Any], tools: Any, template: dict[str, Any]) -> bool:
    """The call resends this chain's last request unchanged, then its reply, then environment turns."""
    n = chain.n_messages
    return (
        chain.history_hash is not None
        and chain.continues(messages)
        and history_hash(messages[: n - 1], tools, template) == chain.history_hash
    )


def env_suffix(tail: list[int], last_generation: list[int], eot: int) -> list[int]:
    """What follows the re-rendered last assistant turn: tool results, user turn, generation prompt.

    The tail starts with the template's re-render of the last assistant turn (reasoning usually
    stripped); its first end-of-turn token closes it. A generation that ended on the end-of-turn
    token already holds it, so only what follows is new; otherwise the turn is closed here.
    """
    try:
        k = tail.index(eot)
    except ValueError:
        raise NoEndOfTurn("the re-rendered prompt has no end-of-turn token after the chain's prefix") from None
    if last_generation and last_generation[-1] == eot:
        return tail[k + 1 :]
    return tail[k:]


def longest_match(chains: Iterable[TokenHistory], rendered_json: bytes, n_rendered: int) -> TokenHistory | None:
    """The chain whose prefix is the longest prefix of a render (its ids' compact JSON, and how many), if any."""
    best = None
    for chain in chains:
        if (best is None or chain.prefix_len > best.prefix_len) and chain.prefix_of(rendered_json, n_rendered):
            best = chain
    return best


def longest_history_match(
    chains: Iterable[TokenHistory], messages: list[Any], tools: Any, template: dict[str, Any]
) -> TokenHistory | None:
    """The chain whose last request is the longest the call resends unchanged, if any."""
    best = None
    for chain in chains:
        if (best is None or chain.n_messages > best.n_messages) and extends_history(chain, messages, tools, template):
            best = chain
    return best


def end_of_turn(generation: list[int], finish_reason: Any) -> int | None:
    """The end-of-turn token of a generation that stopped on its own; None after a length stop."""
    if finish_reason in NATURAL_STOPS and generation:
        return generation[-1]
    return None


def histories_from_records(records: Iterable[CaptureRecord]) -> list[TokenHistory]:
    """Rebuild a session's chains from its capture records: the newest valid record of each chain.

    Records are read in `(captured_at, uuid)` order, so with two writers the later head wins.
    """
    heads: dict[str, CaptureRecord] = {}
    for record in records:
        info = record.get("injection") if isinstance(record, dict) else None
        if not isinstance(info, dict) or not isinstance(info.get("chain"), str):
            continue
        if record.get("is_valid") is not True or record.get("status", "completed") != "completed":
            continue
        rendered = isinstance(info.get("prefix_len"), int) and isinstance(info.get("prefix_hash"), str)
        if not rendered and not isinstance(info.get("history_hash"), str):
            continue
        key = (record.get("captured_at") or "", record.get("uuid") or "")
        current = heads.get(info["chain"])
        if current is None or key >= (current.get("captured_at") or "", current.get("uuid") or ""):
            heads[info["chain"]] = record
    chains = []
    for chain_id, head in heads.items():
        info = head["injection"]
        # A head is valid (checked above), so it holds both lists.
        prompt, generation = head["prompt_token_ids"] or [], head["generation_token_ids"] or []
        eot = info.get("eot_token_id")
        chains.append(
            TokenHistory(
                id=chain_id,
                accumulated=list(prompt) + list(generation),
                last_generation=list(generation),
                eot=eot if isinstance(eot, int) else None,
                n_messages=len(head.get("messages") or ()),
                prefix_len=info.get("prefix_len") or 0,
                prefix_hash=info.get("prefix_hash") or "",
                history_hash=info.get("history_hash"),
            )
        )
    return chains


@dataclass(slots=True)
class _Entry:
    chains: list[TokenHistory]
    touched: float


class HistoryCache:
    """Sessions' chains in memory: least recently used sessions go first, idle ones expire."""

    def __init__(
        self,
        *,
        max_sessions: int = 10000,
        ttl_s: float = 3600.0,
        max_chains_per_session: int = 16,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_sessions = max_sessions
        self.ttl_s = ttl_s
        self.max_chains = max_chains_per_session
        self._clock = clock
        self._sessions: OrderedDict[str, _Entry] = OrderedDict()

    def __len__(self) -> int:
        return len(self._sessions)

    def get(self, session_id: str) -> list[TokenHistory] | None:
        entry = self._sessions.get(session_id)
        if entry is None:
            return None
        now = self._clock()
        if now - entry.touched > self.ttl_s:
            del self._sessions[session_id]
            return None
        entry.touched = now
        self._sessions.move_to_end(session_id)
        return entry.chains

    def put(self, session_id: str, chains: list[TokenHistory]) -> list[TokenHistory]:
        """Install a session's chains (replacing what was there); returns the list now cached."""
        self._sessions[session_id] = _Entry(chains[-self.max_chains :], self._clock())
        self._sessions.move_to_end(session_id)
        while len(self._sessions) > self.max_sessions:
            self._sessions.popitem(last=False)
        return self._sessions[session_id].chains

    def add(self, session_id: str, chain: TokenHistory) -> None:
        """Add a chain to a session (creating the session's entry); the oldest chains beyond the cap go."""
        chains = self.get(session_id)
        if chains is None:
            self.put(session_id, [chain])
            return
        chains.append(chain)
        if len(chains) > self.max_chains:
            del chains[: len(chains) - self.max_chains]

    def drop(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)
