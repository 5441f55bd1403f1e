"""A session's rollout with all its sub-agent sessions' rollouts, partial ones masking their ancestors."""

from __future__ import annotations

from collections.abc import Callable

from server.capture.rollout.items import Rollout, failed_rollout
from server.capture.rollout.messages import RolloutError
from server.capture.rollout.reconstruct import mark_lost_records, reconstruct_session
from server.capture.write.record import CaptureRecord


def reconstruct_tree(
    session_id: str,
    load_records: Callable[[str], list[CaptureRecord]],
    children_of: Callable[[str], list[str]],
    *,
    allow_partial: bool = True,
    lost_records: Callable[[str], int] | None = None,
) -> Rollout:
    """The session's rollout plus `subagents`: every descendant session's rollout, flat, depth first.

    A descendant that cannot be reconstructed at all appears with empty items, its error as
    `partial_reason`, and `mask_sample` true (with `allow_partial=False` it raises instead).
    A session that `lost_records` says lost records to a capture failure is partial too
    (`partial_reason: "capture_failed"`). A rollout is masked when it, or any session below it, is partial.
    """
    lost = lost_records or (lambda _sid: 0)
    root = reconstruct_session(session_id, load_records(session_id), allow_partial=allow_partial)
    mark_lost_records(root, lost(session_id), allow_partial)
    root["subagents"] = subagents = []
    parent_of: dict[str, str] = {}
    by_id: dict[str, Rollout] = {session_id: root}
    # An explicit stack instead of recursion: a bad store could make the tree arbitrarily deep,
    # and `by_id` stops a cycle (a session listed as its own descendant) from looping forever.
    stack = [(child, session_id) for child in reversed(children_of(session_id))]
    while stack:
        child, parent = stack.pop()
        if child in by_id:
            continue
        try:
            rollout = reconstruct_session(child, load_records(child), allow_partial=allow_partial)
            mark_lost_records(rollout, lost(child), allow_partial)
        except RolloutError as exc:
            if not allow_partial:
                raise RolloutError(f"session {child!r}: {exc}") from exc
            rollout = failed_rollout(child, parent, str(exc))
        if not rollout["parent_session_id"]:
            rollout["parent_session_id"] = parent
        parent_of[child] = parent
        by_id[child] = rollout
        subagents.append(rollout)
        stack.extend((grandchild, child) for grandchild in reversed(children_of(child)))

    for rollout in subagents:
        if rollout["partial_reason"] is None:
            continue
        reason = f"subagent session {rollout['session_id']!r} is partial"
        ancestor = parent_of.get(rollout["session_id"])
        while ancestor is not None:
            above = by_id[ancestor]
            above["mask_sample"] = True
            if above["degraded_reason"] is None:
                above["degraded_reason"] = reason
            ancestor = parent_of.get(ancestor)
    return root
