"""A session as a whole: its tree of sub-agent sessions, and its rollout with theirs, assembled from the capture store."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, overload

from server.capture.catalog.index_view import IndexView
from server.capture.catalog.runs import ALL, LATEST, Narrowed, RunChoice, Scope, children_in, choose, narrow
from server.capture.rollout import reconstruct_tree
from server.capture.rollout.chains import ChainsEnvelope, chains_tree
from server.capture.rollout.items import Rollout
from server.capture.store import CaptureStore, UnknownSession
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
    runs, children}`; with a `run` other than `all`, only the sub-agents with records in the runs and
    the dispatch it covers (raises UnknownSession, UnknownRun, UnknownDispatch)."""
    index = store.index_view()  # one snapshot of the disk for the whole tree
    info = index.session_info(session_id)
    choice = pick(index, session_id, run)
    assert info is not None  # pick raised otherwise
    scope: Scope | None = None
    if choice is not None:
        # Which dispatch's time (and runs) the sub-agents must share is known only from the root's records.
        scope = tree_records(store.read_completions, session_id, choice)[1].scope

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
        for child_id in children_in(index, current["session_id"], scope):
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
) -> tuple[Callable[[str], list[CaptureRecord]], Narrowed]:
    """A record loader for a session's tree from `read(session_id) -> (records, skipped)`, and the
    root's records as the choice narrowed them (`runs.narrow`: its dispatch, and the scope of the
    sub-agents' records that go with it).

    The root's records are narrowed to the choice (its latest dispatch, or one run's); the
    sub-agents' to the scope (the runs, and the time of the dispatch). The root must have records
    (UnknownSession otherwise, read now); a sub-agent without any loads as empty, which
    reconstruction reports. Each session is read once.
    """
    narrowed = narrow(read(session_id)[0], choice)
    if not narrowed.records:
        raise UnknownSession(session_id)
    scope = narrowed.scope
    loaded: dict[str, list[CaptureRecord]] = {session_id: narrowed.records}

    def load_records(sid: str) -> list[CaptureRecord]:
        if sid not in loaded:
            try:
                records = read(sid)[0]
            except UnknownSession:
                records = []
            loaded[sid] = records if scope is None else [record for record in records if scope.holds(record)]
        return loaded[sid]

    return load_records, narrowed


def in_scope(
    children: Callable[[str], list[str]], load_records: Callable[[str], list[CaptureRecord]], narrowed: Narrowed
) -> Callable[[str], list[str]]:
    """`children` less the sub-agents with no records in the narrowed scope: the index's first and last
    times only bound a reused sub-agent id, its records say whether it ran in this dispatch."""
    if narrowed.scope is None:
        return children
    return lambda sid: [child for child in children(sid) if load_records(child)]


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
    """Reconstruct the session's rollout with its sub-agent sessions, from the records `run` picks
    (`latest`, a run id, `legacy`, each with `#<n>` for dispatch n, else its latest dispatch; or `all`)
    (raises RolloutError, UnknownSession, UnknownRun, UnknownDispatch). `view="chains"`: every
    session's chains instead (`chains_tree`). Either says which dispatch it is (`dispatch_fields`)."""
    index = store.index_view()
    choice = pick(index, session_id, run)
    load_records, narrowed = tree_records(store.read_completions, session_id, choice)
    children = in_scope(lambda sid: children_in(index, sid, narrowed.scope), load_records, narrowed)
    if view == "chains":
        body = chains_tree(session_id, load_records, children, lost_records=store.lost_records)
        envelope: ChainsEnvelope = {
            "schema_version": 1,
            **body,
            "dispatch": narrowed.dispatch,
            "dispatches": narrowed.dispatches,
        }
        return envelope
    rollout = reconstruct_tree(
        session_id, load_records, children, allow_partial=allow_partial, lost_records=store.lost_records
    )
    rollout["dispatch"], rollout["dispatches"] = narrowed.dispatch, narrowed.dispatches
    return rollout


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
