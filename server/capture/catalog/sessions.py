"""A session as a whole: its tree of sub-agent sessions, and its rollout with theirs, assembled from the capture store."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, overload

from server.capture.catalog.index_view import IndexView
from server.capture.catalog.runs import ALL, LATEST, RunChoice, children_in, choose, narrow, run_of, runs_of
from server.capture.read.store import CaptureStore, UnknownSession
from server.capture.rollout import reconstruct_tree
from server.capture.rollout.chains import ChainsEnvelope, chains_tree
from server.capture.rollout.items import Rollout
from server.capture.write.record import SCHEMA_VERSION, CaptureRecord


def pick(index: IndexView, session_id: str, wanted: str) -> RunChoice | None:
    """The run `wanted` picks among a session's runs (None: all), from one index snapshot (raises
    UnknownSession when the session has no records, UnknownRun)."""
    info = index.session_info(session_id)
    if info is None:
        raise UnknownSession(session_id)
    return choose(info["runs"], wanted)


def build_tree(store: CaptureStore, session_id: str, *, run: str = ALL) -> dict[str, Any]:
    """The session and its descendants as nested `{session_id, parent_session_id, parent_missing, record_count,
    runs, children}`; with a `run` other than `all`, only the sub-agents with records in the runs it
    covers (raises UnknownSession, UnknownRun)."""
    index = store.index_view()  # one snapshot of the disk for the whole tree
    info = index.session_info(session_id)
    choice = pick(index, session_id, run)
    assert info is not None  # pick raised otherwise
    runs: frozenset[str | None] | None = None
    if choice is not None:
        # Which runs the latest conversation spans is known only from the root's records.
        runs = tree_records(store.read_completions, session_id, choice)[1]

    def node(entry: dict[str, Any]) -> dict[str, Any]:
        return {
            "session_id": entry["session_id"],
            "parent_session_id": entry["parent_session_id"],
            "parent_missing": entry["parent_missing"],
            "record_count": entry["record_count"],
            "runs": entry["runs"],
            "children": [],
        }

    root = node(info)
    seen = {session_id}
    pending = [root]
    # Iterative, with a visited set: crafted parent ids could otherwise form a cycle or a deep chain.
    while pending:
        current = pending.pop()
        for child_id in children_in(index, current["session_id"], runs):
            child_info = index.session_info(child_id)
            if child_id in seen or child_info is None:
                continue
            seen.add(child_id)
            child = node(child_info)
            current["children"].append(child)
            pending.append(child)
    return root


def tree_records(
    read: Callable[[str], tuple[list[CaptureRecord], int]], session_id: str, choice: RunChoice | None = None
) -> tuple[Callable[[str], list[CaptureRecord]], frozenset[str | None] | None]:
    """A record loader for a session's tree from `read(session_id) -> (records, skipped)`, and the
    server runs it covers (None: all of them).

    The root's records are narrowed to the choice (its latest conversation, or one run); the
    sub-agents' to the runs the root's narrowed records came from. The root must have records
    (UnknownSession otherwise, read now); a sub-agent without any loads as empty, which
    reconstruction reports.
    """
    root_records = narrow(read(session_id)[0], choice)
    if not root_records:
        raise UnknownSession(session_id)
    runs = runs_of(root_records) if choice is not None else None

    def load_records(sid: str) -> list[CaptureRecord]:
        if sid == session_id:
            return root_records
        try:
            records = read(sid)[0]
        except UnknownSession:
            return []
        return records if runs is None else [record for record in records if run_of(record) in runs]

    return load_records, runs


@overload
def build_rollout(
    store: CaptureStore,
    session_id: str,
    *,
    allow_partial: bool = True,
    run: str = LATEST,
    view: Literal["rollout"] = "rollout",
) -> Rollout: ...
@overload
def build_rollout(
    store: CaptureStore, session_id: str, *, allow_partial: bool = True, run: str = LATEST, view: Literal["chains"]
) -> ChainsEnvelope: ...
@overload
def build_rollout(
    store: CaptureStore, session_id: str, *, allow_partial: bool = True, run: str = LATEST, view: str
) -> Rollout | ChainsEnvelope: ...
def build_rollout(
    store: CaptureStore, session_id: str, *, allow_partial: bool = True, run: str = LATEST, view: str = "rollout"
) -> Rollout | ChainsEnvelope:
    """Reconstruct the session's rollout with its sub-agent sessions, from the records of one server
    run (`latest`, a run id, `legacy`) or of `all` (raises RolloutError, UnknownSession, UnknownRun).
    `view="chains"`: every session's chains instead (`chains_tree`)."""
    index = store.index_view()
    choice = pick(index, session_id, run)
    load_records, runs = tree_records(store.read_completions, session_id, choice)
    if view == "chains":
        body = chains_tree(
            session_id, load_records, lambda sid: children_in(index, sid, runs), lost_records=store.lost_records
        )
        envelope: ChainsEnvelope = {"schema_version": 1, **body}
        return envelope
    return reconstruct_tree(
        session_id,
        load_records,
        lambda sid: children_in(index, sid, runs),
        allow_partial=allow_partial,
        lost_records=store.lost_records,
    )


def lost_session_envelope(session_id: str, lost: int, *, skipped: int = 0) -> dict[str, Any]:
    """The `/completions` envelope of a session whose every record was lost to capture failures."""
    return {
        "schema_version": SCHEMA_VERSION,
        "session_id": session_id,
        "completions": [],
        "skipped": skipped,
        "lost_records": lost,
    }


def lost_session_node(session_id: str, lost: int) -> dict[str, Any]:
    """The tree of a session whose every record was lost: itself, with no records (its parent is not
    known: that was in the lost records)."""
    return {
        "session_id": session_id,
        "parent_session_id": None,
        "parent_missing": False,
        "record_count": 0,
        "lost_records": lost,
        "runs": [],
        "children": [],
    }
