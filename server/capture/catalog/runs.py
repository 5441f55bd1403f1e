"""Server runs in a session: which run wrote each record, and which run's records a rollout or tree covers.

Every record carries `server_run`, the id of the server run that wrote it (one per `serve`, shared by
its workers; records written before the field existed have none and count as one "legacy" run).
A session id used again by a later run would otherwise mix two conversations into one chain, so by
default a rollout covers the session's latest conversation: the records from the last point where a
new run began one afresh. A run that went on with the conversation (a restart mid-session) or that
served it alongside another (two servers on one directory) belongs to the same conversation.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

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
    """Which records of a session: those of one run (`run`; None for the legacy records without
    one), or with `latest`, those of its latest conversation (`latest_conversation`)."""

    run: str | None = None
    latest: bool = False


def choose(runs: Sequence[str | None], wanted: str) -> RunChoice | None:
    """What `wanted` picks among a session's `runs` (in order of first record); None means every record.

    `latest` of a session one run wrote is all of it. Raises UnknownRun when a named run (or
    `legacy`) is not among them.
    """
    if wanted == ALL:
        return None
    if wanted == LATEST:
        return RunChoice(latest=True) if len(runs) > 1 else None
    run = None if wanted == LEGACY else wanted
    if run not in runs:
        raise UnknownRun(wanted)
    return RunChoice(run)


def run_of(record: RecordHead) -> str | None:
    run = record.get("server_run")
    return run if isinstance(run, str) else None


def runs_in_order(records: Iterable[RecordHead]) -> list[str | None]:
    """The runs of records already in `(captured_at, uuid)` order, each once, in order of its first record."""
    return list(dict.fromkeys(run_of(record) for record in records))


def latest_conversation(records: list[CaptureRecord]) -> list[CaptureRecord]:
    """The records (in `(captured_at, uuid)` order) from the last point where a new run began a new
    conversation under the session's id: what a rollout covers by default.

    A run's first record begins one afresh unless an earlier run still writes after it (two servers
    serving the session in turn) or its prompt extends an earlier record's prompt + generation (the
    conversation went on across a restart).
    """
    last_of: dict[str | None, int] = {}
    for index, record in enumerate(records):
        last_of[run_of(record)] = index
    if len(last_of) <= 1:
        return records
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
    return records[start:]


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


def narrow(records: list[CaptureRecord], choice: RunChoice | None) -> list[CaptureRecord]:
    """A session's records narrowed to the choice (all of them for None)."""
    if choice is None:
        return records
    if choice.latest:
        return latest_conversation(records)
    return [record for record in records if run_of(record) == choice.run]


def runs_of(records: Iterable[RecordHead]) -> frozenset[str | None]:
    return frozenset(run_of(record) for record in records)


def in_runs(info: dict[str, Any] | None, runs: frozenset[str | None] | None) -> bool:
    """Whether a session (its index entry) has records in any of `runs`; every session is in None (all)."""
    if info is None:
        return False
    return runs is None or not runs.isdisjoint(info.get("runs", (None,)))


def children_in(index: IndexView, session_id: str, runs: frozenset[str | None] | None) -> list[str]:
    """The session's children with records in `runs` (None: all of them): a sub-agent belongs to the
    runs its parent's rollout covers (one a later run spawned under a reused id is not part of an
    earlier run's rollout)."""
    return [child for child in index.children(session_id) if in_runs(index.session_info(child), runs)]
