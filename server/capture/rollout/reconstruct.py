"""The reconstruction: the longest trustworthy chain of a session's calls (contiguous tokens, consistent history), as Gym items.

Long because it is one algorithm: validation, placement of each call, retries and side calls all
share the chain state held by `_Reconstruction`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

from server.capture.rollout.breaks import KINDS, Break, break_kind, describe_break
from server.capture.rollout.continuation import ContinuationIndex
from server.capture.rollout.continuation import extends as _extends
from server.capture.rollout.items import Rollout, failed_rollout, map_tools, message_items
from server.capture.rollout.messages import ENVIRONMENT_ROLES, RolloutError, canonical, normalize
from server.capture.rollout.records import (
    injection_break,
    is_title_call,
    order_key,
    prompt_of,
    same_prompt,
    signature,
    split_items,
    uuid_or_index,
)
from server.capture.tokens import TokenTriple, is_finite_numbers, is_token_ids
from server.capture.write.record import SCHEMA_VERSION, CaptureRecord


def reconstruct_envelope(envelope: object, session_id: str, *, allow_partial: bool = True) -> Rollout:
    """Reconstruct from a `GET /v1/sessions/{id}/completions` envelope, validated as Gym does."""
    if not isinstance(envelope, dict):
        raise RolloutError(f"envelope is not an object: {type(envelope).__name__}")
    version = envelope.get("schema_version")
    if version != SCHEMA_VERSION:
        raise RolloutError(f"unsupported envelope schema_version: {version!r}")
    if envelope.get("session_id") != session_id:
        raise RolloutError(f"envelope session_id {envelope.get('session_id')!r} != requested {session_id!r}")
    completions = envelope.get("completions")
    if not isinstance(completions, list):
        raise RolloutError(f"envelope has no completions list: {type(completions).__name__}")
    lost = envelope.get("lost_records")
    lost = lost if isinstance(lost, int) else 0
    if not completions and lost > 0:
        return lost_session_rollout(session_id, lost, allow_partial)
    rollout = reconstruct_session(session_id, completions, allow_partial=allow_partial)
    return mark_lost_records(rollout, lost, allow_partial)


CAPTURE_FAILED = "capture_failed"


def mark_lost_records(rollout: Rollout, lost: int, allow_partial: bool) -> Rollout:
    """A session missing records (a capture write failed) must never look whole, whatever its records say."""
    if lost > 0:
        if not allow_partial:
            raise RolloutError(f"session {rollout['session_id']!r} lost {lost} record(s) to capture failures")
        rollout["partial_reason"] = CAPTURE_FAILED
        rollout["mask_sample"] = True
    return rollout


def lost_session_rollout(session_id: str, lost: int, allow_partial: bool) -> Rollout:
    """The rollout of a session whose every record was lost to capture failures (a full disk): empty
    and masked, so a trainer sees a session that ran and cannot be used, not one that never ran."""
    rollout = failed_rollout(session_id, None, CAPTURE_FAILED)
    mark_lost_records(rollout, lost, allow_partial)
    rollout["subagents"] = []
    return rollout


def reconstruct_session(session_id: str, records: list[CaptureRecord], *, allow_partial: bool = True) -> Rollout:
    """One session's rollout: the longest trustworthy chain of its calls, as Gym Responses items.

    Records are put in `(captured_at, uuid)` order first, so any input order gives one answer.
    Indices in error messages and `partial_reason` refer to that sorted list (side calls included).
    A failure before any call was accepted raises; later failures end the rollout there
    (`partial_reason`, `mask_sample`) unless `allow_partial` is false, which raises instead.

    The `Rollout`: tools as FunctionTool dicts, record_uuids the calls used in order, side_calls
    the uuids set aside (opencode title calls, one-off calls with other model/tools),
    discarded_record_uuids the retried attempts not used, degraded_reason set by reconstruct_tree
    when a sub-session is partial. Token lists in the items are the records' own lists, not copies.
    Records come from a client's envelope too: each is checked before it is read.
    """
    if not isinstance(records, list) or not records:
        raise RolloutError("envelope has no completions")
    return _Reconstruction(session_id, records, allow_partial).run()


@dataclass(slots=True, eq=False)
class _Call:
    """One validated record, and what its messages contribute once it is placed in the chain."""

    index: int
    uuid: str
    record: CaptureRecord
    prompt_ids: list[int]
    generation_ids: list[int]
    log_probs: list[float]
    raw: list[Any]  # the record's messages, untouched
    # (message index, normalized message, raw message) for the messages this call adds before its reply.
    context: list[tuple[int, dict[str, Any], Any]] = field(default_factory=list)
    context_canon: list[dict[str, Any]] = field(default_factory=list)
    reply: dict[str, Any] | None = None
    reply_canon: dict[str, Any] | None = None

    @property
    def triple(self) -> TokenTriple:
        return TokenTriple(self.prompt_ids, self.generation_ids, self.log_probs)


def _developer_messages(record: CaptureRecord) -> frozenset[int]:
    """The indices of a record's messages the client sent as `developer` (sent upstream as `system`)."""
    indices = record.get("developer_messages")
    if not isinstance(indices, list):
        return frozenset()
    return frozenset(i for i in indices if isinstance(i, int) and not isinstance(i, bool))


class _Reconstruction:
    def __init__(self, session_id: str, records: list[CaptureRecord], allow_partial: bool) -> None:
        self.session_id = session_id
        self.allow_partial = allow_partial
        self.ordered = sorted(records, key=order_key)
        self.total = len(self.ordered)
        # (sorted index, uuid): reported in record order whatever the order they were found in.
        self.side_calls: list[tuple[int, str]] = []
        self.discarded: list[tuple[int, str]] = []
        self.seen_uuids: set[str] = set()
        self.steps: list[_Call] = []  # the accepted calls, in order
        self.history: list[dict[str, Any]] = []  # canonical messages of the accepted steps
        self.step_by_prompt_len: dict[int, _Call] = {}
        # The newest step is held open: a retry of it (same prompt tokens) may still arrive, and
        # only the record after it shows which attempt the conversation continued from.
        self.pending: list[_Call] = []

    # -- driver ---------------------------------------------------------------------------

    def _prepare(self) -> None:
        """Set title calls aside and find the session's signature (raises when nothing is left)."""
        conversation: list[int] = []
        for i, record in enumerate(self.ordered):
            if is_title_call(record):
                self.side_calls.append((i, uuid_or_index(record, i)))
            else:
                conversation.append(i)
        if not conversation:
            raise RolloutError(f"session {self.session_id!r} has only side calls ({len(self.side_calls)})")
        self.conversation = conversation
        self.continuations = ContinuationIndex([prompt_of(self.ordered[i]) for i in conversation])
        self.signature = signature(self.ordered[self._anchor()])
        self.chain_signature = self.signature  # what the current chain's calls must share

    def run(self) -> Rollout:
        self._prepare()
        conversation = self.conversation

        partial_reason = None
        partial_break = None
        for position, i in enumerate(conversation):
            try:
                self._consider(position, i)
            except RolloutError as exc:
                if not self.allow_partial or not (self.steps or self.pending):
                    raise
                partial_break = self.explain(i, exc)
                partial_reason = f"record {i} of {self.total}: {exc} ({KINDS[partial_break['kind']]})"
                break
        if self.pending:
            self._commit(self.pending[-1])

        model, tools, _ = self.signature
        items = split_items(self._items(self.steps))
        return {
            "session_id": self.session_id,
            "parent_session_id": self._parent_session_id(),
            "model": model,
            "tools": map_tools(tools),
            "input": items["input"],
            "output": items["output"],
            "record_uuids": [step.uuid for step in self.steps],
            "partial_reason": partial_reason,
            "partial_break": partial_break,
            "mask_sample": partial_reason is not None,
            "degraded_reason": None,
            "side_calls": [uuid for _, uuid in sorted(self.side_calls)],
            "discarded_record_uuids": [uuid for _, uuid in sorted(self.discarded)],
        }

    def _consider(self, position: int, i: int) -> None:
        """Validate and place one conversation record (raises RolloutError where it breaks the chain)."""
        call = self._validate(i, self.ordered[i], position)
        if call is not None:
            self._place(call, position)

    def last_call(self) -> _Call | None:
        """The call a new record is expected to continue: the open step's latest attempt, else the last step."""
        if self.pending:
            return self.pending[-1]
        return self.steps[-1] if self.steps else None

    def explain(self, i: int, exc: RolloutError) -> Break:
        """The account of why record `i` does not continue the chain (`exc` is what stopped it)."""
        record = self.ordered[i]
        previous = self.last_call()
        kind = break_kind(record, previous.raw if previous is not None else None, str(exc))
        return describe_break(
            kind,
            record if isinstance(record, dict) else {},
            i,
            previous.record if previous is not None else None,
            previous.index if previous is not None else None,
            str(exc),
        )

    def _anchor(self) -> int:
        """The record whose model/tools/tool_choice define the session.

        Gym takes the first record. Here it is the first record some later record continues from,
        so an unrecognised one-off side call that happens to come first cannot define the session
        (and so turn every real turn into a "side call"). When nothing continues anything, the
        first record it is, as in Gym.
        """
        for position, i in enumerate(self.conversation):
            record = self.ordered[i]
            if isinstance(record, dict) and not self._dead_end(record, position):
                return i
        return self.conversation[0]

    def _dead_end(self, record: CaptureRecord, position: int) -> bool:
        """True when no later record's prompt extends this record's prompt+generation."""
        prompt, generation = record.get("prompt_token_ids"), record.get("generation_token_ids")
        if not isinstance(prompt, list) or not isinstance(generation, list):
            return True
        return not self.continuations.continued(position, prompt, generation)

    # -- placing one call -------------------------------------------------------------------

    def _place(self, call: _Call, position: int) -> None:
        if not self.pending:
            if self._is_side_call(call, position):
                return
            self._check_signature(call)
            self._check_messages(call, base=[], partner=None)
            self.pending = [call]
            return

        head = self.pending[0]
        prompt = call.prompt_ids
        if len(prompt) == len(head.prompt_ids) and prompt == head.prompt_ids:
            # A transport retry or a client re-ask of the open step: another candidate for it.
            self._check_signature(call)
            self._check_messages(call, base=self.history, partner=head)
            self.pending.append(call)
            return

        earlier = self.step_by_prompt_len.get(len(prompt))
        if earlier is not None and earlier.prompt_ids == prompt:
            # A retry of a step the conversation has already moved past (it finished late).
            self.discarded.append((call.index, call.uuid))
            return

        # Latest attempt first: with several that fit, the last one is the one we would keep anyway.
        continued = [c for c in reversed(self.pending) if _extends(prompt, c.prompt_ids, c.generation_ids)]
        fallback = injection_break(call.record)
        if not continued:
            if self._is_side_call(call, position):
                return
            self._commit(self.pending[-1])
            why = f" (token injection fell back: {fallback})" if fallback else ""
            raise RolloutError(
                f"record {call.index} prompt_token_ids do not extend the prior prompt+generation tokens{why}"
            )
        if fallback:
            # The engine rendered this prompt itself: even if its ids happen to line up, the
            # chain the session was built on was not extended, so the rollout ends here.
            self._commit(continued[0])
            raise RolloutError(f"record {call.index} was served without token injection ({fallback})")
        first_error: RolloutError | None = None
        for candidate in continued:
            try:
                self._check_signature(call)
                assert candidate.reply_canon is not None, "a pending call's messages were checked"
                base = self.history + candidate.context_canon + [candidate.reply_canon]
                self._check_messages(call, base=base, partner=candidate)
            except RolloutError as exc:
                first_error = first_error or exc
                continue
            self._commit(candidate)
            self.pending = [call]
            return
        self._commit(continued[0])
        assert first_error is not None
        raise first_error

    def _is_side_call(self, call: _Call, position: int) -> bool:
        """A call beside the conversation, set aside rather than treated as a break.

        All three must hold: its model/tools/tool_choice differ from the session's, its prompt
        does not continue the conversation (the caller has checked), and no later record
        continues from it. Setting such a call aside cannot make the rollout wrong: every call
        kept is still checked token by token against the one before it. A call that differs but
        does continue the conversation stays an error (Gym's session-consistency rule), and a
        "side" conversation that later calls build on is a break, not a side call.
        """
        if signature(call.record) == self.signature or not self._dead_end(call.record, position):
            return False
        self.side_calls.append((call.index, call.uuid))
        return True

    def _commit(self, chosen: _Call) -> None:
        for other in self.pending:
            if other is not chosen:
                self.discarded.append((other.index, other.uuid))
        self.pending = []
        self.steps.append(chosen)
        self.history.extend(chosen.context_canon)
        assert chosen.reply_canon is not None, "a call is only committed once its reply is canonicalised"
        self.history.append(chosen.reply_canon)
        self.step_by_prompt_len[len(chosen.prompt_ids)] = chosen

    # -- checks, in Gym's order ---------------------------------------------------------------

    def _validate(self, i: int, record: object, position: int) -> _Call | None:
        """Gym's record checks, in Gym's order; None for a failed attempt that was retried."""
        if not isinstance(record, dict):
            raise RolloutError(f"record {i} is not an object")
        if record.get("schema_version") != SCHEMA_VERSION:
            raise RolloutError(f"record {i} has unsupported schema_version: {record.get('schema_version')!r}")
        if record.get("session_id") != self.session_id:
            raise RolloutError(f"record {i} session_id {record.get('session_id')!r} != requested {self.session_id!r}")
        uuid = record.get("uuid")
        if not isinstance(uuid, str) or not uuid:
            raise RolloutError(f"record {i} has no uuid")
        if uuid in self.seen_uuids:
            raise RolloutError(f"record {i} duplicates uuid {uuid}")
        self.seen_uuids.add(uuid)
        if record.get("is_valid") is not True:
            if self._is_failed_attempt(cast(CaptureRecord, record), position):
                self.discarded.append((i, uuid))
                return None
            why = record.get("invalid_reason")
            raise RolloutError(
                f"record {uuid} is_valid is not true" + (f": {why}" if isinstance(why, str) and why else "")
            )
        for name in ("request_id", "model"):
            value = record.get(name)
            if not isinstance(value, str) or not value:
                raise RolloutError(f"record {uuid} has empty {name}")
        for name in ("prompt_token_ids", "generation_token_ids"):
            if not is_token_ids(record.get(name)):
                raise RolloutError(f"record {uuid} {name} is not a non-empty list of ints")
        log_probs = record.get("generation_log_probs")
        if not is_finite_numbers(log_probs):
            raise RolloutError(f"record {uuid} generation_log_probs is not a list of finite floats")
        if len(log_probs) != len(record["generation_token_ids"]):
            raise RolloutError(f"record {uuid} generation token ids and log probs have different lengths")
        messages = record.get("messages")
        if not isinstance(messages, list) or not messages:
            raise RolloutError(f"record {uuid} has no messages")
        return _Call(
            index=i,
            uuid=uuid,
            record=cast(CaptureRecord, record),  # its fields the chain reads were checked above
            prompt_ids=record["prompt_token_ids"],
            generation_ids=record["generation_token_ids"],
            log_probs=log_probs,
            raw=messages,
        )

    def _is_failed_attempt(self, record: CaptureRecord, position: int) -> bool:
        """An invalid record with a valid attempt at the same prompt beside it: a retried call.

        Calls that fail or are cut off are recorded too (invalid, often without token ids), and
        clients retry them (the openai SDK does by default). Nothing can build on a call whose
        answer never fully arrived, so when a valid attempt at the same prompt exists, just
        before (the open step, or an accepted one) or just after (past any further failed
        attempts), this record is set aside. Any other invalid record ends the rollout.
        """
        if self.pending and same_prompt(record, self.pending[0].record):
            return True
        prompt = record.get("prompt_token_ids")
        if isinstance(prompt, list):
            earlier = self.step_by_prompt_len.get(len(prompt))
            if earlier is not None and earlier.prompt_ids == prompt:
                return True
        for i in self.conversation[position + 1 :]:
            later = self.ordered[i]
            if not isinstance(later, dict) or not same_prompt(record, later):
                return False
            if later.get("is_valid") is True:
                return True
        return False

    def _check_signature(self, call: _Call) -> None:
        model, tools, tool_choice = self.chain_signature
        if call.record["model"] != model:
            raise RolloutError(f"record {call.index} model {call.record['model']!r} != session model {model!r}")
        if call.record.get("tools") != tools or call.record.get("tool_choice") != tool_choice:
            raise RolloutError(f"record {call.index} tools/tool_choice differ from the session's first record")

    def _check_messages(self, call: _Call, *, base: list[dict[str, Any]], partner: _Call | None) -> None:
        """Validate the call's messages and check its prompt extends `base` (canonical history).

        `partner` is an accepted call whose messages line up with `base`: a message here equal to
        the partner's at the same index is already known valid and, within `base`, already known
        to match the history. Only the others are normalized and compared, so each record costs
        roughly its new messages, not its whole history.
        """
        i = call.index
        raw = call.raw
        last = len(raw) - 1
        normalized: list[dict[str, Any] | None] = [None] * len(raw)
        theirs: list[Any] = partner.raw if partner is not None else []
        limit = min(len(base), len(theirs), last)
        # The partner's own reply rarely comes back byte-identical (clients re-serialize it), so
        # the one-shot prefix comparison stops short of it and the rest goes message by message.
        start = max(limit - 1, 0)
        if raw[:start] != theirs[:start]:
            start = 0
        for j in range(start, len(raw)):
            if j < limit and raw[j] == theirs[j]:
                continue
            normalized[j] = normalize(i, raw[j])
        reply = normalized[last]
        assert reply is not None
        if reply["role"] != "assistant":
            raise RolloutError(f"record {i} messages do not end with an assistant message")

        # An empty base means this is the session's first call (or a retry of it): its whole
        # prompt is context, whatever the roles.
        first_new = len(base)
        if base:
            if last < len(base):
                raise RolloutError(f"record {i} prompt does not extend the reconstructed history")
            for j in range(len(base)):
                message = normalized[j]
                if message is not None and canonical(message) != base[j]:
                    raise RolloutError(f"record {i} prompt does not extend the reconstructed history")
            if first_new == last:
                raise RolloutError(f"record {i} prompt adds no environment messages")
            odd = {normalized[j]["role"] for j in range(first_new, last)} - ENVIRONMENT_ROLES  # type: ignore[index]
            if odd:
                raise RolloutError(f"record {i} suffix contains non-environment roles: {sorted(odd)}")
        # Every message past `base` was normalized above (only messages within it are skipped).
        call.context = [(j, cast(dict[str, Any], normalized[j]), raw[j]) for j in range(first_new, last)]
        call.context_canon = [canonical(message) for _, message, _ in call.context]
        call.reply = reply
        call.reply_canon = canonical(reply)

    # -- output -----------------------------------------------------------------------------

    def _items(self, steps: list[_Call]) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        for step in steps:
            developer = _developer_messages(step.record)
            for j, message, raw in step.context:
                if j in developer and message["role"] == "system":
                    message = {**message, "role": "developer"}  # as the client sent it
                items.extend(message_items(message, raw, f"{step.uuid}_{j}", None))
            assert step.reply is not None, "a step is only accepted once its reply is normalized"
            items.extend(message_items(step.reply, step.raw[-1], step.uuid, step.triple))
        return items

    def _parent_session_id(self) -> str | None:
        for record in self.ordered:
            if isinstance(record, dict):
                parent = record.get("parent_session_id")
                if isinstance(parent, str) and parent:
                    return parent
        return None
