"""A session as a whole: its tree of sub-agent sessions, and its rollout with theirs, assembled from the capture store."""

from __future__ import annotations

from collections.abc import Callable

from server.capture.rollout import reconstruct_tree
from server.capture.store import CaptureStore, UnknownSession


def build_tree(store: CaptureStore, session_id: str) -> dict:
    """The session and its descendants as nested `{session_id, parent_session_id, parent_missing, record_count,
    children}`."""
    index = store.index_view()  # one snapshot of the disk for the whole tree
    info = index.session_info(session_id)
    if info is None:
        raise UnknownSession(session_id)

    def node(entry: dict) -> dict:
        return {
            "session_id": entry["session_id"],
            "parent_session_id": entry["parent_session_id"],
            "parent_missing": entry["parent_missing"],
            "record_count": entry["record_count"],
            "children": [],
        }

    root = node(info)
    seen = {session_id}
    pending = [root]
    # Iterative, with a visited set: crafted parent ids could otherwise form a cycle or a deep chain.
    while pending:
        current = pending.pop()
        for child_id in index.children(current["session_id"]):
            child_info = index.session_info(child_id)
            if child_id in seen or child_info is None:
                continue
            seen.add(child_id)
            child = node(child_info)
            current["children"].append(child)
            pending.append(child)
    return root


def tree_records(read: Callable[[str], tuple[list[dict], int]], session_id: str) -> Callable[[str], list[dict]]:
    """A record loader for a session's tree from `read(session_id) -> (records, skipped)`.

    The root must have records (UnknownSession otherwise, read now); a sub-agent without any loads
    as empty, which reconstruction reports.
    """
    root_records, _ = read(session_id)
    if not root_records:
        raise UnknownSession(session_id)

    def load_records(sid: str) -> list[dict]:
        if sid == session_id:
            return root_records
        try:
            return read(sid)[0]
        except UnknownSession:
            return []

    return load_records


def build_rollout(store: CaptureStore, session_id: str, *, allow_partial: bool = True) -> dict:
    """Reconstruct the session's rollout with its sub-agent sessions (raises RolloutError, UnknownSession)."""
    load_records = tree_records(store.read_completions, session_id)
    return reconstruct_tree(
        session_id,
        load_records,
        store.index_view().children,
        allow_partial=allow_partial,
        lost_records=store.lost_records,
    )
