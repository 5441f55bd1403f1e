"""Decide, per correlated call, whether to inject the session's token history, and commit what happened.

`prepare` runs before the upstream call: one `/tokenize` of the call's messages (or, with a local
renderer, a bridge of its new messages; with `nemo_rl`, whose engine renders, nothing), the chain
it extends (from memory, or rebuilt from the capture records), the ids attached through the
transport, the output budget clamped. `finish` runs on the answer, before the client sees its
end: it checks the engine's echo, advances (or seeds) the chain, and returns the record's
`injection` object. No lock is held across the upstream call: a chain that moved meanwhile is not
overwritten (the call forks a chain of its own instead).

Every way injection can fail ends in a plain call: the client never sees an injection error.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from server.capture.write.record import INJECTION_BREAKING_FALLBACKS, CaptureRecord
from server.injection.breaker import RouteBreaker
from server.injection.histories import (
    HistoryCache,
    NoEndOfTurn,
    TokenHistory,
    end_of_turn,
    env_suffix,
    histories_from_records,
    history_hash,
    longest_history_match,
    longest_match,
    new_history_id,
)
from server.injection.id_fields import IdField
from server.injection.id_lists import begins_with, id_list_json, json_digest
from server.injection.tokenize import Render, TokenizeClient, TokenizeError, template_options

log = logging.getLogger("switchyard_model.injection")

# Why a call went out plain (the record's `fallback_reason`; /metrics counts each).
FIRST_CALL = "first_call"  # the session has no chain yet
NO_MATCHING_CHAIN = "no_matching_chain"  # a side call, rewritten history, or a new conversation
NO_EOT = "no_end_of_turn"  # the last generation hit its length limit, or the template has no end-of-turn
ECHO_MISMATCH = "echo_mismatch"  # the engine did not use the ids (served plain by the engine itself)
UPSTREAM_REJECTED = "upstream_rejected"  # the engine refused the field; re-sent without it
TOKENIZE_FAILED = "tokenize_failed"
PAUSED = "paused"  # too many fallbacks in a row on this route
UNSUPPORTED = "unsupported"  # n > 1, or a request /tokenize cannot render
INCOMPLETE = "incomplete"  # the call failed or was cut off: nothing to commit
# The fallbacks that break a chain that was there to extend: reconstruction reports these as breaks.
BREAKING_FALLBACKS = INJECTION_BREAKING_FALLBACKS
assert BREAKING_FALLBACKS == {NO_EOT, ECHO_MISMATCH, UPSTREAM_REJECTED, TOKENIZE_FAILED, PAUSED}

# Margin for `max_tokens` under the context: the engine's chat render may be a few ids longer than /tokenize's.
_CONTEXT_MARGIN = 8
_POLL_S = 0.01


@dataclass(slots=True)
class Plan:
    """One call's injection decision, carried from `prepare` to `finish`."""

    session_id: str
    route: str
    body: dict[str, Any]  # what to send upstream
    plain: dict[str, Any]  # the same call without the ids, for a re-issue
    n_messages: int
    render: Render | None = None
    chain: TokenHistory | None = None  # the chain this call extends or replaces
    version: int = -1
    sent: list[int] | None = None  # the ids attached, when injected
    sent_json: bytes | None = None  # ... as compact JSON: spliced into the payload, compared with the echo
    reason: str | None = None
    record: dict[str, Any] | None = None  # the record's `injection` object, once finished
    # The render's prefix digest (for the record), worked out while the upstream call is in flight.
    prefix_digest: str | None = None
    # The body is the request plus the transport's field and nothing else (the payload can be spliced).
    adds_field_only: bool = False
    # When chains are matched by messages (nemo_rl, a local renderer): what `history_hash` digests.
    history: tuple[list[Any], Any, dict[str, Any]] | None = None

    def digest_prefix(self) -> None:
        if self.prefix_digest is None and self.render is not None:
            self.prefix_digest = json_digest(self.render.prefix_json)

    @property
    def injected(self) -> bool:
        return self.sent is not None


class Injector:
    def __init__(
        self,
        *,
        id_field: IdField,
        tokenizer_for: Callable[[str], TokenizeClient | None],
        read_records: Callable[[str], list[CaptureRecord]] | None,
        max_model_len_for: Callable[[str], int | None] = lambda route: None,
        cache: HistoryCache | None = None,
        breaker: RouteBreaker | None = None,
        rebuild_wait_s: float = 0.25,
    ) -> None:
        self.id_field = id_field
        self._tokenizer_for = tokenizer_for
        self._read_records = read_records
        self._max_model_len_for = max_model_len_for
        self.cache = cache if cache is not None else HistoryCache()
        self.breaker = breaker if breaker is not None else RouteBreaker(3, 300.0)
        self.rebuild_wait_s = rebuild_wait_s
        self.injected_total = 0
        self.fallbacks: Counter[str] = Counter()

    # ---- before the upstream call ----------------------------------------------------------

    async def prepare(self, session_id: str, route: str, request: dict[str, Any]) -> Plan:
        messages = request.get("messages") or []
        plan = Plan(session_id, route, request, request, len(messages))
        if request.get("n") not in (None, 1) or request.get("echo"):
            plan.reason = UNSUPPORTED
            return plan
        tools, template = request.get("tools"), template_options(request)
        if self.id_field.sends_history_only:
            # NeMo-RL's engine renders its template and splices the tail after the history we send:
            # nothing needs rendering here, so no /tokenize round trip at all.
            plan.history = (messages, tools, template)
            _, chain = await self._history_chain(plan)
            if chain is not None and plan.reason is None:
                self._inject(plan, chain, [])
            return plan
        tokenizer = self._tokenizer_for(route)
        if tokenizer is None:
            plan.reason = TOKENIZE_FAILED
            return plan
        try:
            # A local renderer (the `renderers` bridge) bridges a call that goes on from a chain.
            if hasattr(tokenizer, "bridge"):
                plan.history = (messages, tools, template)
                if await self._bridge(plan, tokenizer):
                    return plan
            plan.render = await tokenizer.render(messages, tools, template)
        except TokenizeError as exc:
            log.debug("tokenize failed: %s", exc)
            plan.reason = TOKENIZE_FAILED
            return plan
        render = plan.render
        # Not needed before the answer: runs once this call yields to the loop, i.e. while it is upstream.
        asyncio.get_running_loop().call_soon(plan.digest_prefix)
        chains, chain = await self._find_chain(
            session_id, messages, lambda chains: longest_match(chains, render.prefix_json, render.prefix_len)
        )
        self._plan_on(plan, chains, chain)
        if chain is not None and plan.reason is None:
            assert chain.prefix_json is not None  # the match learnt it
            try:
                tail = render.prompt_after(chain.prefix_json)
            except ValueError:  # an answer of digits and commas that are not plain JSON integers (`01`)
                plan.reason = TOKENIZE_FAILED
            else:
                self._cut(plan, chain, tail)
        if not plan.injected:
            self._clamp(plan, None, render.prompt_len)
        return plan

    async def _bridge(self, plan: Plan, tokenizer: Any) -> bool:
        """Decide a call that goes on from a chain with the local renderer; False for any other call.

        The new messages are rendered onto the chain's prompt + generation. Where the renderer will
        not vouch for that (Qwen3 at a new user turn), and for plain calls, the call is rendered
        whole, and a declined bridge is cut after the chain's last request like a /tokenize render.
        """
        _, chain = await self._history_chain(plan)
        if chain is None:
            return False  # a first call, a side call or new history: rendered whole, and it seeds a chain
        assert plan.history is not None
        messages, tools, template = plan.history
        if plan.reason is None:
            history, generation = chain.accumulated, chain.last_generation
            prompt = history[: len(history) - len(generation)]
            bridged = await tokenizer.bridge(prompt, generation, messages[chain.n_messages :], tools, template)
            if bridged is not None and bridged[: len(history)] == history:
                self._inject(plan, chain, bridged[len(history) :])
                return True
        plan.render = await tokenizer.render(messages, tools, template)
        if plan.reason is None:
            previous = await tokenizer.render_prefix(messages[: chain.n_messages - 1], tools, template)
            if plan.render.prompt[: len(previous)] == previous:
                self._cut(plan, chain, plan.render.prompt[len(previous) :])
            else:
                plan.reason = NO_MATCHING_CHAIN  # the template renders the earlier turns differently now
        if not plan.injected:
            self._clamp(plan, None, plan.render.prompt_len)
        return True

    async def _history_chain(self, plan: Plan) -> tuple[list[TokenHistory], TokenHistory | None]:
        """The chain whose last request the call resends unchanged (`plan.history`), planned on."""
        assert plan.history is not None
        messages, tools, template = plan.history
        chains, chain = await self._find_chain(
            plan.session_id, messages, lambda chains: longest_history_match(chains, messages, tools, template)
        )
        self._plan_on(plan, chains, chain)
        return chains, chain

    def _plan_on(self, plan: Plan, chains: list[TokenHistory], chain: TokenHistory | None) -> None:
        """Record the chain the call would extend, and why it cannot (`plan.reason`), if so."""
        plan.chain, plan.version = chain, chain.version if chain is not None else -1
        plan.reason = None
        if chain is None:
            plan.reason = NO_MATCHING_CHAIN if chains else FIRST_CALL
        elif self.breaker.paused(plan.route):
            plan.reason = PAUSED
        elif chain.eot is None:
            plan.reason = NO_EOT

    def _cut(self, plan: Plan, chain: TokenHistory, tail: list[int]) -> None:
        """Inject the chain's history plus the environment suffix of `tail`, a whole render cut after the
        chain's last request."""
        assert chain.eot is not None
        try:
            suffix = env_suffix(tail, chain.last_generation, chain.eot)
        except NoEndOfTurn:
            plan.reason = NO_EOT
        else:
            self._inject(plan, chain, suffix)

    def _inject(self, plan: Plan, chain: TokenHistory, suffix: list[int]) -> None:
        request = plan.plain
        body = copy.copy(request)
        plan.sent = self.id_field.attach(body, chain.accumulated, suffix)
        plan.sent_json = orjson.dumps(plan.sent)
        plan.body = body
        self._clamp(plan, body, len(chain.accumulated) + len(suffix))
        plan.adds_field_only = plan.body is body and self.id_field.field_path[0] not in request

    async def _find_chain(
        self, session_id: str, messages: list[Any], match: Callable[[list[TokenHistory]], TokenHistory | None]
    ) -> tuple[list[TokenHistory], TokenHistory | None]:
        """The chain this call continues (`match` picks it): from memory, else from the records (waiting
        briefly for a record another process is still writing when the call plainly continues a conversation)."""
        chains = self.cache.get(session_id)
        chain = match(chains) if chains else None
        if chain is not None and chain.continues(messages):
            return chains or [], chain
        if chains is not None and chain is None:
            return chains, None  # memory is current and nothing matches: a side call or new history
        # A miss (restart, another worker, eviction) or a stale chain (another process moved it on).
        deadline = time.monotonic() + self.rebuild_wait_s
        continues_a_turn = any(isinstance(m, dict) and m.get("role") == "assistant" for m in messages)
        while True:
            chains = await self._rebuild(session_id)
            chain = match(chains)
            if chain is not None and chain.continues(messages):
                return chains, chain
            if not continues_a_turn or time.monotonic() >= deadline:
                return chains, None
            await asyncio.sleep(_POLL_S)

    async def _rebuild(self, session_id: str) -> list[TokenHistory]:
        """Merge the records' chains into memory's: per chain, the further-advanced head wins.

        Memory may be ahead of the disk (this process's records are written behind the answer),
        and the disk ahead of memory (another process served the session meanwhile).
        """
        records: list[CaptureRecord] = []
        if self._read_records is not None:
            try:
                records = await asyncio.to_thread(self._read_records, session_id)
            except Exception:  # an unknown session, or an unreadable directory: nothing to rebuild
                records = []
        merged = {chain.id: chain for chain in self.cache.get(session_id) or ()}
        for chain in histories_from_records(records):
            known = merged.get(chain.id)
            if known is None or len(chain.accumulated) > len(known.accumulated):
                merged[chain.id] = chain
        return self.cache.put(session_id, list(merged.values()))

    def _clamp(self, plan: Plan, body: dict[str, Any] | None, prompt_len: int) -> None:
        """`max_tokens` ≤ max_model_len − prompt − margin, so the engine never rejects prompt + budget."""
        limit = (plan.render.max_model_len if plan.render else None) or self._max_model_len_for(plan.route)
        source = body if body is not None else plan.plain
        requested = [v for k in ("max_tokens", "max_completion_tokens") if type(v := source.get(k)) is int]
        if limit is None or not requested:
            return
        remaining = limit - prompt_len - _CONTEXT_MARGIN
        if remaining <= 0 or remaining >= min(requested):
            return
        clamped = copy.copy(source)
        clamped.pop("max_completion_tokens", None)
        clamped["max_tokens"] = remaining
        if body is not None:
            plan.body = clamped
        else:
            plan.plain = plan.body = clamped

    def reissue(self, plan: Plan) -> dict[str, Any]:
        """The engine refused the injected call: the same call, plain."""
        plan.sent = plan.sent_json = None
        plan.adds_field_only = False
        plan.reason = UPSTREAM_REJECTED
        self.breaker.failed(plan.route, UPSTREAM_REJECTED)
        if plan.render is not None:
            self._clamp(plan, None, plan.render.prompt_len)
        plan.body = plan.plain
        return plan.plain

    # ---- after the answer ------------------------------------------------------------------

    def finish(self, plan: Plan, chat: dict[str, Any] | None, completed: bool = True) -> dict[str, Any]:
        """Verify, commit, count; returns the record's `injection` object (also kept on the plan)."""
        if plan.record is not None:
            return plan.record
        echo_ok: bool | None = None
        head: TokenHistory | None = None
        prompt, generation, finish_reason = _token_fields(chat) if completed and chat else (None, None, None)
        if prompt is None or generation is None:
            if plan.injected or plan.reason is None:
                plan.reason = INCOMPLETE
        elif plan.injected:
            assert plan.sent_json is not None
            echo_ok = self.id_field.echo_ok(plan.sent_json, prompt)
            if echo_ok:
                self.breaker.succeeded(plan.route)
                head = self._commit(plan, prompt, generation, finish_reason)
            else:
                plan.reason = ECHO_MISMATCH
                self.breaker.failed(plan.route, ECHO_MISMATCH)
                head = self._commit(plan, prompt, generation, finish_reason)
        elif self._seeds(plan, prompt):
            head = self._commit(plan, prompt, generation, finish_reason)
        injected = plan.injected and echo_ok is True
        if injected:
            self.injected_total += 1
        else:
            self.fallbacks[plan.reason or INCOMPLETE] += 1
        plan.record = {
            "transport": self.id_field.name,
            "chain": head.id if head is not None else (plan.chain.id if plan.chain is not None else None),
            "injected_len": len(plan.sent) if plan.sent is not None else 0,
            "echo_ok": echo_ok,
            "fallback_reason": None if injected else plan.reason,
            # 0 and "" on a chain that a call not rendered here heads (bridged, or nemo_rl): no cut point.
            "prefix_len": (head.prefix_len or None) if head is not None else None,
            "prefix_hash": (head.prefix_hash or None) if head is not None else None,
            "eot_token_id": head.eot if head is not None else None,
            "history_hash": head.history_hash if head is not None else None,
        }
        return plan.record

    def _seeds(self, plan: Plan, prompt: list[int]) -> bool:
        """A plain answer seeds (or replaces) a chain when the engine's render agrees with ours; with
        nothing rendered here (nemo_rl: the engine splices its own template), the engine's prompt is it."""
        if plan.render is not None:
            encoded = id_list_json(prompt)
            return encoded is not None and begins_with(encoded, plan.render.prefix_json)
        return self.id_field.sends_history_only and plan.history is not None

    def _commit(self, plan: Plan, prompt: list[int], generation: list[int], finish_reason: Any) -> TokenHistory:
        """Advance the planned chain in place when it did not move meanwhile; otherwise start a new one.

        A call not rendered here (bridged, or nemo_rl) has no cut point: its chain is found by
        `history_hash` alone until a call renders.
        """
        render = plan.render
        fields = {
            "accumulated": prompt + generation,
            "last_generation": generation,
            "eot": end_of_turn(generation, finish_reason),
            "n_messages": plan.n_messages + 1,
            "prefix_len": render.prefix_len if render is not None else 0,
            "prefix_hash": "" if render is None else plan.prefix_digest or json_digest(render.prefix_json),
            "prefix_json": render.prefix_json if render is not None else None,
            "history_hash": history_hash(*plan.history) if plan.history is not None else None,
        }
        chain = plan.chain
        if chain is not None and chain.version == plan.version and self._cached(plan.session_id, chain):
            for name, value in fields.items():
                setattr(chain, name, value)
            chain.version += 1
            return chain
        fresh = TokenHistory(id=new_history_id(), **fields)  # type: ignore[arg-type]
        self.cache.add(plan.session_id, fresh)
        return fresh

    def _cached(self, session_id: str, chain: TokenHistory) -> bool:
        chains = self.cache.get(session_id)
        return chains is not None and any(c is chain for c in chains)

    def stats(self) -> dict[str, Any]:
        return {"injected": self.injected_total, "fallbacks": dict(self.fallbacks), "sessions": len(self.cache)}


def _token_fields(chat: dict[str, Any]) -> tuple[list[int] | None, list[int] | None, Any]:
    choices = chat.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    prompt = chat.get("prompt_token_ids")
    if prompt is None:
        prompt = choice.get("prompt_token_ids")
    generation = choice.get("token_ids")
    ok = isinstance(prompt, list) and prompt and isinstance(generation, list) and generation
    if not ok:
        return None, None, None
    return prompt, generation, choice.get("finish_reason")
