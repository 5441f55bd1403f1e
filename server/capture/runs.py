"""Server runs in a session: which run wrote each record, and which run's records a rollout or tree covers.

Every record carries `server_run`, the id of the server run that wrote it (one per `serve`, shared by
its workers; records written before the field existed have none and count as one "legacy" run).
A session id used again by a later run would otherwise mix two conversations into one chain, so a
rollout covers one run: the latest by default, another when asked, or all of them merged.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from server.capture.index import IndexView

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
    """One run's records: those whose `server_run` is `run` (None: the legacy records without one)."""

    run: str | None

    def keeps(self, record: dict) -> bool:
        return run_of(record) == self.run


def choose(runs: Sequence[str | None], wanted: str) -> RunChoice | None:
    """The run `wanted` picks among a session's `runs` (in order of first record); None means all.

    Raises UnknownRun when a named run (or `legacy`) is not among them.
    """
    if wanted == ALL:
        return None
    if wanted == LATEST:
        return RunChoice(runs[-1]) if runs else None
    run = None if wanted == LEGACY else wanted
    if run not in runs:
        raise UnknownRun(wanted)
    return RunChoice(run)


def run_of(record: dict) -> str | None:
    run = record.get("server_run")
    return run if isinstance(run, str) else None


def runs_in_order(records: Iterable[dict]) -> list[str | None]:
    """The runs of records already in `(captured_at, uuid)` order, each once, in order of its first record."""
    return list(dict.fromkeys(run_of(record) for record in records))


def latest_run_records(records: list[dict]) -> list[dict]:
    """The records of the latest run (what a rollout covers by default), in their order."""
    runs = runs_in_order(records)
    if len(runs) <= 1:
        return records
    latest = runs[-1]
    return [record for record in records if run_of(record) == latest]


def keep(records: list[dict], choice: RunChoice | None) -> list[dict]:
    """`records` narrowed to the chosen run (all of them for None)."""
    if choice is None:
        return records
    return [record for record in records if choice.keeps(record)]


def in_run(info: dict[str, Any] | None, choice: RunChoice | None) -> bool:
    """Whether a session (its index entry) has records in the chosen run; every session is in "all"."""
    if info is None:
        return False
    return choice is None or choice.run in info.get("runs", (None,))


def children_in(index: IndexView, session_id: str, choice: RunChoice | None) -> list[str]:
    """The session's children with records in the chosen run: a sub-agent belongs to the run its
    parent's rollout covers (one a later run spawned under a reused id is not part of an earlier run)."""
    return [child for child in index.children(session_id) if in_run(index.session_info(child), choice)]
