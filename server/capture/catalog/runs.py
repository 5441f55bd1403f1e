"""Server runs and dispatches in a session: which run wrote each record, and which records a rollout or tree covers.

Every record carries `server_run`, the id of the server run that wrote it (one per `serve`, shared by
its workers; records written before the field existed have none and count as one "legacy" run).
A session id used again (by a later run, or by a new dispatch of the same rollout ids) would
otherwise mix two conversations into one chain, so by default a rollout covers the session's latest
dispatch (`dispatches`); a point where a new run began the conversation afresh is a dispatch
boundary too. A run that went on with the conversation (a restart mid-session) or that served it
alongside another (two servers on one directory) belongs to the same conversation.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from server.capture.catalog.dispatches import split
from server.capture.read.contiguity import first_difference
from server.capture.write.record import CaptureRecord, RecordHead

if TYPE_CHECKING:
    from server.capture.catalog.index_view import IndexView

# The `run` parameter's words; anything else names a run id.
LATEST = "latest"
ALL = "all"
LEGACY = "legacy"  # the records without a run id (written before records carried one)

# What a run id may look like in the `run` parameter: ours are `<UTC start time>-<8 hex>`.
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,99}")
# A dispatch's number in the `dispatch` parameter: from 1, no leading zero.
_DISPATCH = re.compile(r"[1-9][0-9]{0,8}")


class UnknownRun(LookupError):
    """The `run` asked for is not among the session's runs."""


def new_run_id() -> str:
    """A fresh server run id: its start time (so ids sort by start) and random bits (so two starts
    in the same second differ)."""
    return f"{datetime.now(UTC):%Y%m%dT%H%M%SZ}-{secrets.token_hex(4)}"


def is_valid_run_id(value: object) -> bool:
    return isinstance(value, str) and _RUN_ID.fullmatch(value) is not None and value not in (LATEST, ALL, LEGACY)


def parse_run(value: str | None) -> str:
    """The `run` parameter as given: `latest` (also when unset), `all`, `legacy` or a run id.

    Raises ValueError for anything else (the caller names the parameter in its 400).
    """
    if value is None or value == "":
        return LATEST
    if value in (LATEST, ALL, LEGACY) or is_valid_run_id(value):
        return value
    raise ValueError("run must be latest, all, legacy or a run id from the session's `runs`")


@dataclass(frozen=True, slots=True)
class RunChoice:
    """Which records of a session: with `of_run`, those of one run (`run`; None for the legacy
    records without one), else those of every run; of these, one dispatch (`dispatch`, counted from
    1; None: the latest). See `dispatches` for how a session splits into dispatches."""

    run: str | None = None
    of_run: bool = False
    dispatch: int | None = None


def choose(runs: Sequence[str | None], wanted: str) -> RunChoice | None:
    """What `wanted` (`parse_run`'s value, with `with_dispatch`'s `#<n>` when a dispatch is named)
    picks among a session's `runs` (in order of first record); None means every record, unsplit
    (`all`; `all` with a dispatch picks among every run's dispatches, as `latest` does).

    Raises UnknownRun when a named run (or `legacy`) is not among them. Whether a named dispatch
    exists is known only from the records (`narrow` raises UnknownDispatch).
    """
    wanted, _, number = wanted.partition("#")
    dispatch = int(number) if number else None
    if wanted == ALL and dispatch is None:
        return None
    if wanted in (LATEST, ALL):
        return RunChoice(dispatch=dispatch)
    run = None if wanted == LEGACY else wanted
    if run not in runs:
        raise UnknownRun(wanted)
    return RunChoice(run, of_run=True, dispatch=dispatch)


def with_dispatch(run: str, dispatch: int | None) -> str:
    """The one value the views pass around for a `run` and a `dispatch` (None: the latest)."""
    return run if dispatch is None else f"{run}#{dispatch}"


def parse_dispatch(value: str | None) -> int | None:
    """The `dispatch` parameter: `latest` (also when unset: None) or a dispatch's number, from 1.

    Raises ValueError for anything else (the caller names the parameter in its 400).
    """
    if value is None or value in ("", LATEST):
        return None
    if _DISPATCH.fullmatch(value):
        return int(value)
    raise ValueError("dispatch must be latest or a dispatch number from 1 (the session summary's `dispatches`)")


class UnknownDispatch(UnknownRun):
    """The `dispatch` asked for is not among the dispatches of the records the run picks."""


def run_of(record: RecordHead) -> str | None:
    run = record.get("server_run")
    return run if isinstance(run, str) else None


def runs_in_order(records: Iterable[RecordHead]) -> list[str | None]:
    """The runs of records already in `(captured_at, uuid)` order, each once, in order of its first record."""
    return list(dict.fromkeys(run_of(record) for record in records))


def started_at(record: RecordHead) -> str | None:
    """When the call began: `captured_at` (its end) minus its latency, in the same ISO format."""
    end = parse_time(record.get("captured_at"))
    if end is None:
        return None
    latency = record.get("latency_ms")
    if isinstance(latency, (int, float)) and latency > 0:
        end -= timedelta(milliseconds=latency)
    return format_time(end)


def parse_time(value: object) -> datetime | None:
    """An ISO 8601 time as an aware UTC datetime (a naive one is taken as UTC); None if unreadable."""
    if not isinstance(value, str) or not value:
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)


def format_time(moment: datetime) -> str:
    """The capture record's own format (fixed-width microseconds, +00:00), so strings sort as times."""
    return moment.astimezone(UTC).isoformat(timespec="microseconds")


def fresh_run_starts(records: list[CaptureRecord]) -> list[int]:
    """The indices (in records in `(captured_at, uuid)` order) where a new server run began a new
    conversation under the session's id: each is a dispatch boundary (`dispatches`).

    A run's first record begins one afresh unless an earlier run still writes after it (two servers
    serving the session in turn) or its prompt extends an earlier record's prompt + generation (the
    conversation went on across a restart).
    """
    last_of: dict[str | None, int] = {}
    for index, record in enumerate(records):
        last_of[run_of(record)] = index
    if len(last_of) <= 1:
        return []
    starts: list[int] = []
    start = 0
    seen: set[str | None] = set()
    for index, record in enumerate(records):
        run = run_of(record)
        if run in seen:
            continue
        seen.add(run)
        if index == 0 or any(last_of[other] > index for other in seen - {run}):
            continue
        if not _continues_any(record, records[start:index]):
            start = index
            starts.append(index)
    return starts


def _continues_any(record: CaptureRecord, earlier: list[CaptureRecord]) -> bool:
    prompt = record.get("prompt_token_ids")
    if not isinstance(prompt, list) or not prompt:
        return False
    for before in reversed(earlier):
        head, tail = before.get("prompt_token_ids"), before.get("generation_token_ids")
        if isinstance(head, list) and isinstance(tail, list) and head and len(prompt) >= len(head) + len(tail):
            if first_difference(prompt, head, tail) is None:
                return True
    return False


@dataclass(frozen=True, slots=True)
class Scope:
    """Which records of the sub-agent sessions go with a narrowed session: those of `runs` (None: any
    run) captured after `since` and before `until` (None: no bound), the dispatch's time."""

    runs: frozenset[str | None] | None = None
    since: str | None = None
    until: str | None = None

    def holds(self, record: RecordHead) -> bool:
        if self.runs is not None and run_of(record) not in self.runs:
            return False
        at = record.get("captured_at")
        if not isinstance(at, str):
            return self.since is None and self.until is None
        return (self.since is None or at >= self.since) and (self.until is None or at < self.until)

    def overlaps(self, info: dict[str, Any] | None) -> bool:
        """Whether a session (its index entry) may have records in the scope (its runs, and its first
        to last capture time against the bounds)."""
        if info is None:
            return False
        if self.runs is not None and self.runs.isdisjoint(info.get("runs", (None,))):
            return False
        first, last = info.get("first_captured_at"), info.get("last_captured_at")
        if self.since is not None and isinstance(last, str) and last < self.since:
            return False
        return not (self.until is not None and isinstance(first, str) and first >= self.until)


@dataclass(frozen=True, slots=True)
class Narrowed:
    """A session's records as a choice narrowed them, and where they sit among its dispatches."""

    records: list[CaptureRecord]
    dispatch: int | None  # which dispatch they are, from 1 (None: every record, unsplit)
    dispatches: int  # how many dispatches the records the run picks hold
    scope: Scope | None  # the sub-agents' records that go with them (None: all)


def narrow(records: list[CaptureRecord], choice: RunChoice | None) -> Narrowed:
    """A session's records (in `(captured_at, uuid)` order) narrowed to the choice: the run's (or
    every run's) records, split into dispatches, and the one asked for (raises UnknownDispatch);
    for None, every record unsplit."""
    if choice is None:
        return Narrowed(records, None, len(dispatches_of(records)), None)
    if not records:  # nothing to split (the caller says what a session without records is)
        return Narrowed(records, None, 0, None)
    if choice.of_run:
        picked = [record for record in records if run_of(record) == choice.run]
        parts = split(picked)
    else:
        parts = dispatches_of(records)
    number = choice.dispatch if choice.dispatch is not None else len(parts)
    if not 1 <= number <= len(parts):
        raise UnknownDispatch(f"dispatch {number}")
    chosen = parts[number - 1]
    runs = frozenset({choice.run}) if choice.of_run else None
    if len(parts) == 1:
        return Narrowed(chosen, number, 1, Scope(runs) if runs is not None else None)
    # A sub-agent belongs to the dispatch its parent started it in: from that dispatch's first call
    # on, before the next dispatch's first call (a dispatch's sub-agents may outlast its own calls).
    since = started_at(chosen[0]) if number > 1 else None
    until = started_at(parts[number][0]) if number < len(parts) else None
    return Narrowed(chosen, number, len(parts), Scope(runs, since, until))


def dispatches_of(records: list[CaptureRecord]) -> list[list[CaptureRecord]]:
    """A session's records (every run) as its dispatches, in order."""
    return split(records, fresh_run_starts(records))


def latest_dispatch(records: list[CaptureRecord]) -> list[CaptureRecord]:
    """The records of the session's latest dispatch (every run): what a rollout covers by default."""
    return narrow(records, RunChoice()).records if records else records


def runs_of(records: Iterable[RecordHead]) -> frozenset[str | None]:
    return frozenset(run_of(record) for record in records)


def children_in(index: IndexView, session_id: str, scope: Scope | None) -> list[str]:
    """The session's children that may have records in `scope` (None: all of them): a sub-agent
    belongs to the dispatch (and runs) its parent's rollout covers."""
    children = index.children(session_id)
    if scope is None:
        return children
    return [child for child in children if scope.overlaps(index.session_info(child))]
