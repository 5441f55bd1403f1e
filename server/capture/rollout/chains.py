"""Every captured call in a trainable chain: a session split at each break into whole token-contiguous chains, one decision per call.

The rollout keeps the calls before the first break and masks the sample. Here the same pass goes on:
at each break the current chain ends and the breaking call starts the next one, so every completed
call lands in exactly one chain whose every prompt extends the previous prompt + generation. Side
calls and retried attempts the conversation did not continue from are chains of their own. The
first chain is the rollout's, decided by the very same steps, so the two cannot disagree.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, Literal, NotRequired, TypedDict

from server.capture.rollout.breaks import KINDS
from server.capture.rollout.breaks import Break as Break
from server.capture.rollout.items import map_tools
from server.capture.rollout.messages import RolloutError
from server.capture.rollout.reconstruct import CAPTURE_FAILED, _Call, _Reconstruction
from server.capture.rollout.records import signature, split_items
from server.capture.write.record import CaptureRecord

ChainKind = Literal["main", "continuation", "side", "retry"]
MAIN: Final = "main"
CONTINUATION: Final = "continuation"
SIDE: Final = "side"
RETRY: Final = "retry"


class ChainBody(TypedDict):
    """One chain: its calls' items in the rollout's shape (token triple on each generated turn) and,
    unless left out for summaries, the chain as one token sequence."""

    chain_index: int
    kind: ChainKind
    session_id: str
    model: Any  # as the first call's record names it
    tools: list[dict[str, Any]]
    input: list[dict[str, Any]]
    output: list[dict[str, Any]]
    server_run: str | None
    record_uuids: list[str]
    call_indices: list[int]  # sorted record indices
    starts_after: Break | None  # the break that began it
    generated_tokens: int
    token_ids: NotRequired[list[int]]  # the last prompt + generation
    generation_mask: NotRequired[list[int]]  # 1 where the policy generated the token
    log_probs: NotRequired[list[float]]  # 0.0 at prompt positions


# How a call relates to the chain it is in (or why it is in none).
Relation = Literal["first", "extends", "breaks", "side", "discarded", "incomplete", "unusable"]

# One decision per record; `break` is a keyword, hence the functional form.
CallDecision = TypedDict(
    "CallDecision",
    {
        "index": int,
        "uuid": str | None,
        "chain": int | None,  # its chain's index, None when it is in none
        "relation": Relation,
        "previous_index": int | None,  # the call it extends
        "break": Break | None,
    },
)


class RolloutVerdict(TypedDict):
    """What `/rollout` says of the same records (status `failed` when it cannot be rebuilt at all)."""

    status: Literal["whole", "partial", "failed"]
    partial_reason: str | None
    partial_break: Break | None
    record_uuids: list[str]
    mask_sample: bool


class SessionChains(TypedDict):
    """A session's chains, one decision per call, its breaks, its rollout's verdict and the trainable
    fractions (`session_chains`); the tree's root also has `lost_records` and `subagents`."""

    session_id: str
    parent_session_id: str | None
    chains: list[ChainBody]
    calls: list[CallDecision]
    breaks: list[Break]
    rollout: RolloutVerdict
    generated_tokens: int
    chain_tokens: int
    trainable_fraction: float | None
    rollout_fraction: float | None
    lost_records: NotRequired[int]
    subagents: NotRequired[list[SessionChains | UnreadableChains]]


class ChainsEnvelope(SessionChains):
    """`GET /chains`: the session's chains with its sub-agents', and the answer's schema version."""

    schema_version: int
    # Which dispatch of a reused session id (from 1; None: every record unsplit), of how many.
    dispatch: int | None
    dispatches: int


class UnreadableChains(TypedDict):
    """A sub-agent session whose chains cannot be rebuilt: why, in the place of its chains."""

    session_id: str
    parent_session_id: str | None
    chains: list[ChainBody]  # empty
    calls: list[CallDecision]  # empty
    error: str
    lost_records: NotRequired[int]


def session_chains(session_id: str, records: list[CaptureRecord], *, flat_tokens: bool = True) -> SessionChains:
    """The session's chains, the per-call decisions, the breaks and the trainable fractions.

    - `chains`: every completed call lands in exactly one, of kind main (the rollout's),
      continuation (after a break), side or retry;
    - `calls`: one decision per record, in sorted `(captured_at, uuid)` order;
    - `rollout`: what `/rollout` says of the same records.
    Fractions are of the generated tokens of completed (valid) calls; `rollout_fraction` counts the
    rollout's tokens only when it is not masked. `flat_tokens=False` leaves out each chain's
    `token_ids`, `generation_mask` and `log_probs` (for summaries, which only count).
    """
    if not isinstance(records, list) or not records:
        raise RolloutError("envelope has no completions")
    return _Splitter(session_id, records, flat_tokens).split()


def chains_tree(
    session_id: str,
    load_records: Callable[[str], list[CaptureRecord]],
    children_of: Callable[[str], list[str]],
    *,
    lost_records: Callable[[str], int] | None = None,
) -> SessionChains:
    """The session's chains plus `subagents`: every descendant session's chains, flat, depth first.

    A session that lost records to a capture failure says so (`lost_records`), its chains stand.
    """
    lost = lost_records or (lambda _sid: 0)
    root = session_chains(session_id, load_records(session_id))
    root["lost_records"] = lost(session_id)
    subagents: list[SessionChains | UnreadableChains] = []
    root["subagents"] = subagents
    seen = {session_id}
    stack = [(child, session_id) for child in reversed(children_of(session_id))]
    while stack:  # explicit, with a visited set: crafted parent ids may form deep trees or cycles
        child, parent = stack.pop()
        if child in seen:
            continue
        seen.add(child)
        body: SessionChains | UnreadableChains
        try:
            body = session_chains(child, load_records(child))
        except RolloutError as exc:
            body = {"session_id": child, "parent_session_id": parent, "chains": [], "calls": [], "error": str(exc)}
        body["parent_session_id"] = body.get("parent_session_id") or parent
        body["lost_records"] = lost(child)
        subagents.append(body)
        stack.extend((grandchild, child) for grandchild in reversed(children_of(child)))
    return root


class _Splitter(_Reconstruction):
    """The reconstruction, carried on past every break (see the module docstring)."""

    def __init__(self, session_id: str, records: list[CaptureRecord], flat_tokens: bool) -> None:
        super().__init__(session_id, records, allow_partial=True)
        self.flat_tokens = flat_tokens
        self.unbuildable: str | None = None  # why no rollout can be rebuilt before any call is placed
        self.closed: list[tuple[list[_Call], Break | None]] = []  # (steps, the break before them)
        self.starts_after: Break | None = None
        # Sorted index -> (relation, break), for records that did not extend.
        self.decisions: dict[int, tuple[Relation, Break]] = {}
        self.unusable: set[int] = set()
        self.rollout: RolloutVerdict | None = None
        self.fresh = False  # a chain has ended: the next chain's first call sets its signature

    def split(self) -> SessionChains:
        try:
            self._prepare()
        except RolloutError as exc:
            self.unbuildable = str(exc)
            self.conversation = []  # only side calls: each is a chain of its own
        for position, i in enumerate(self.conversation):
            self._take(position, i)
        self._close(None)
        return self._result()

    # -- the pass ------------------------------------------------------------------------

    def _take(self, position: int, i: int) -> None:
        try:
            call = self._validate(i, self.ordered[i], position)
        except RolloutError as exc:
            account = self.explain(i, exc)
            relation: Relation = "incomplete" if account["kind"] == "incomplete_record" else "unusable"
            self._note_break(i, exc, account)
            self._close(account)
            self.decisions[i] = (relation, account)
            self.unusable.add(i)
            return
        if call is None:
            return  # a failed attempt beside a valid one: listed with the discarded calls
        try:
            self._place(call, position)
            return
        except RolloutError as exc:
            account = self.explain(i, exc)
            self._note_break(i, exc, account)
            self._close(account)
        self.decisions[i] = ("breaks", account)
        try:
            self._place(call, position)  # the first call of the next chain
        except RolloutError as exc:
            self.decisions[i] = ("unusable", self.explain(i, exc))
            self.unusable.add(i)

    def _note_break(self, i: int, exc: RolloutError, account: Break) -> None:
        """The first break is the rollout's: its reason is written exactly as `/rollout` writes it."""
        if self.rollout is not None:
            return
        if not (self.steps or self.pending):
            self.rollout = _verdict("failed", str(exc), account)
            return
        reason = f"record {i} of {self.total}: {exc} ({KINDS[account['kind']]})"
        self.rollout = _verdict("partial", reason, account)

    def _close(self, account: Break | None) -> None:
        if self.pending:
            self._commit(self.pending[-1])
        if self.steps:
            if self.rollout is None:
                self.rollout = _verdict("whole", None, None)
            if not self.closed and self.rollout["status"] != "failed":
                self.rollout["record_uuids"] = [step.uuid for step in self.steps]
            self.closed.append((self.steps, self.starts_after))
        self.steps, self.history = [], []
        self.starts_after = account
        self.fresh = True

    def _check_signature(self, call: _Call) -> None:
        # After a break the next chain is its own sample: its first call sets what the rest must share.
        if self.fresh and not self.pending and not self.steps:
            self.chain_signature = signature(call.record)
        super()._check_signature(call)

    # -- the answer ------------------------------------------------------------------------

    def _result(self) -> SessionChains:
        chains: list[tuple[ChainKind, list[_Call], Break | None]] = []
        for n, (steps, starts_after) in enumerate(self.closed):
            chains.append((MAIN if n == 0 else CONTINUATION, steps, starts_after))
        side = {i for i, _ in self.side_calls}
        retried = {i for i, _ in self.discarded}
        for i in sorted(side | retried):
            lone = self._lone_call(i)
            if lone is not None:
                chains.append((SIDE if i in side else RETRY, [lone], None))
        main = chains[:1]
        chains = main + sorted(chains[1:], key=lambda chain: chain[1][0].index)

        calls = self._decisions(chains, side, retried)
        bodies = [
            self._chain_body(n, kind, steps, starts_after) for n, (kind, steps, starts_after) in enumerate(chains)
        ]
        generated = sum(
            len(ids)
            for record in self.ordered
            if isinstance(record, dict)
            and record.get("is_valid") is True
            and isinstance(ids := record.get("generation_token_ids"), list)
        )
        in_chains = sum(body["generated_tokens"] for body in bodies)
        rollout = self.rollout or _verdict("failed", self.unbuildable or "no call could be used", None)
        in_rollout = bodies[0]["generated_tokens"] if bodies and rollout["status"] == "whole" else 0
        return {
            "session_id": self.session_id,
            "parent_session_id": self._parent_session_id(),
            "chains": bodies,
            "calls": calls,
            "breaks": [call["break"] for call in calls if call["break"] is not None],
            "rollout": rollout,
            "generated_tokens": generated,
            "chain_tokens": in_chains,
            "trainable_fraction": _fraction(in_chains, generated),
            "rollout_fraction": _fraction(in_rollout, generated),
        }

    def _lone_call(self, i: int) -> _Call | None:
        """A side call or a retried attempt as a one-call chain, when it is a complete, readable call."""
        record = self.ordered[i]
        if not isinstance(record, dict) or record.get("is_valid") is not True:
            return None
        alone = _Reconstruction(self.session_id, [record], True)
        alone.conversation = [0]
        try:
            call = alone._validate(0, record, 0)
            if call is None:
                return None
            alone._check_messages(call, base=[], partner=None)
        except RolloutError:
            return None
        call.index = i
        return call

    def _decisions(
        self, chains: list[tuple[ChainKind, list[_Call], Break | None]], side: set[int], retried: set[int]
    ) -> list[CallDecision]:
        chain_of: dict[int, int] = {}
        relation: dict[int, Relation] = {}
        previous: dict[int, int] = {}
        for n, (chain_kind, steps, _) in enumerate(chains):
            for k, step in enumerate(steps):
                chain_of[step.index] = n
                if chain_kind in (SIDE, RETRY):
                    relation[step.index] = "side" if chain_kind == SIDE else "discarded"
                else:
                    relation[step.index] = "first" if k == 0 else "extends"
                    if k:
                        previous[step.index] = steps[k - 1].index
        calls: list[CallDecision] = []
        for i, record in enumerate(self.ordered):
            decided, account = self.decisions.get(i, (None, None))
            kind: Relation
            if i in chain_of and decided == "breaks":
                kind = "breaks"
            elif i in chain_of:
                kind = relation[i]
            elif i in side:
                kind = "side"
            elif i in retried:
                kind = "discarded"
            else:
                kind = decided or "unusable"
            uuid = record.get("uuid") if isinstance(record, dict) else None
            calls.append(
                {
                    "index": i,
                    "uuid": uuid,
                    "chain": chain_of.get(i),
                    "relation": kind,
                    "previous_index": previous.get(i),
                    "break": account,
                }
            )
        return calls

    def _chain_body(self, n: int, kind: ChainKind, steps: list[_Call], starts_after: Break | None) -> ChainBody:
        first = steps[0].record
        model, tools, _ = signature(first)
        items = split_items(self._items(steps))
        body: ChainBody = {
            "chain_index": n,
            "kind": kind,
            "session_id": self.session_id,
            "model": model,
            "tools": map_tools(tools),
            "input": items["input"],
            "output": items["output"],
            "server_run": first.get("server_run"),
            "record_uuids": [step.uuid for step in steps],
            "call_indices": [step.index for step in steps],
            "starts_after": starts_after,
            "generated_tokens": sum(len(step.generation_ids) for step in steps),
        }
        if self.flat_tokens:
            body["token_ids"], body["generation_mask"], body["log_probs"] = flat_sample(steps)
        return body


def flat_sample(steps: list[_Call]) -> tuple[list[int], list[int], list[float]]:
    """The chain as one token sequence: the last prompt + generation, with a mask that is 1 on every
    token a call generated (each call's prompt extends the one before, so positions line up)."""
    last = steps[-1]
    token_ids = last.prompt_ids + last.generation_ids
    mask = [0] * len(token_ids)
    log_probs = [0.0] * len(token_ids)
    for step in steps:
        start, count = len(step.prompt_ids), len(step.generation_ids)
        mask[start : start + count] = [1] * count
        log_probs[start : start + count] = step.log_probs
    return token_ids, mask, log_probs


def lost_session_chains(session_id: str, lost: int) -> SessionChains:
    """The chains of a session whose every record was lost to capture failures: none, and the masked
    `capture_failed` rollout, so a trainer sees a session that ran and cannot be used."""
    return {
        "session_id": session_id,
        "parent_session_id": None,
        "chains": [],
        "calls": [],
        "breaks": [],
        "rollout": _verdict("partial", CAPTURE_FAILED, None),
        "generated_tokens": 0,
        "chain_tokens": 0,
        "trainable_fraction": None,
        "rollout_fraction": None,
        "lost_records": lost,
        "subagents": [],
    }


def _verdict(
    status: Literal["whole", "partial", "failed"], reason: str | None, account: Break | None
) -> RolloutVerdict:
    """The rollout's verdict; its record uuids are filled in when its chain closes."""
    return {
        "status": status,
        "partial_reason": reason,
        "partial_break": account,
        "record_uuids": [],
        "mask_sample": status != "whole",
    }


def _fraction(part: int, whole: int) -> float | None:
    return round(part / whole, 6) if whole else None
