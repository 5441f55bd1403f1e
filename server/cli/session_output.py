"""What `sessions` prints: JSON, the session table, the session tree, and the export's JSON lines and account."""

from __future__ import annotations

import sys
from typing import IO, Any

import orjson

from server.capture.catalog.runs import ALL, LATEST, LEGACY, with_dispatch
from server.cli.exits import EXIT_FAILED, EXIT_OK
from server.cli.session_sources import Failed, NotFound, SessionSource
from server.files import atomic_writer

# `export_rollouts`' default: every dispatch of each root, each its own line (not a dispatch number).
EVERY_DISPATCH = 0


def export_rollouts(
    source: SessionSource,
    out: str | None,
    *,
    allow_partial: bool,
    run: str = LATEST,
    chains: bool = False,
    dispatch: int | None = EVERY_DISPATCH,
) -> int:
    """One JSON line per root session's rollout (`chains`: per chain of the root and its sub-agents,
    with its session, root, run, dispatch and position), and an account of what could not be exported.

    A session id reused for new tasks (an RL loop's rollout ids) holds several dispatches
    (docs/capture.md#dispatches): each is exported as a rollout of its own, in order, its `dispatch`
    field saying which (`dispatches`: of how many). `dispatch` picks one instead (None: the latest).

    A root is a session without a parent, or whose parent has no records (`parent_missing`). A root
    whose rollout cannot be rebuilt is reported and left out; so is a session no root reaches (only
    a parent cycle does that). Either makes the exit code 1. Each rollout covers the server run
    `run` picks (the latest of each root by default); with a run id (or `legacy`), only the roots
    that run wrote are exported.
    """
    everything = source.list_sessions(parent=None, roots_only=False, limit=None)
    all_roots = [entry for entry in everything if entry.get("parent_session_id") is None or entry.get("parent_missing")]
    roots = all_roots
    if run not in (LATEST, ALL):
        wanted = None if run == LEGACY else run
        roots = [entry for entry in all_roots if wanted in entry.get("runs", [None])]
    failures = 0

    def write_all(handle: IO[bytes]) -> None:
        nonlocal failures
        view = "chains" if chains else "rollout"
        for entry in roots:
            session_id = entry["session_id"]
            try:
                if run == ALL or dispatch != EVERY_DISPATCH:
                    one = None if dispatch == EVERY_DISPATCH else dispatch  # `--run all`: every record, unsplit
                    bodies = [
                        source.rollout(session_id, allow_partial=allow_partial, run=with_dispatch(run, one), view=view)
                    ]
                else:
                    latest = source.rollout(session_id, allow_partial=allow_partial, run=run, view=view)
                    count = latest.get("dispatches")
                    count = count if isinstance(count, int) else 1
                    bodies = [
                        source.rollout(session_id, allow_partial=allow_partial, run=with_dispatch(run, n), view=view)
                        for n in range(1, count)
                    ] + [latest]
            except (NotFound, Failed) as exc:
                failures += 1
                print(f"session {session_id}: {exc}", file=sys.stderr)
                continue
            for rollout in bodies:
                if chains:
                    for line in _chain_lines(rollout, session_id):
                        handle.write(orjson.dumps(line) + b"\n")
                    continue
                if isinstance(rollout, dict) and "session_id" not in rollout:
                    rollout = {"session_id": session_id, **rollout}
                handle.write(orjson.dumps(rollout) + b"\n")

    if out is None:
        write_all(sys.stdout.buffer)
        sys.stdout.buffer.flush()
    else:
        # Written beside the target and renamed, so a trainer never reads half a file.
        with atomic_writer(out, mode=0o644) as handle:
            write_all(handle)
    summary = f"exported {len(roots) - failures} of {len(roots)} root sessions"
    if roots is not all_roots:
        summary += f" of server run {run}"
    if failures:
        summary += f"; {failures} could not be rebuilt (above)"
    unreached = _unreached(everything, all_roots)
    if unreached:
        shown = ", ".join(unreached[:20]) + (", ..." if len(unreached) > 20 else "")
        summary += (
            f"; {len(unreached)} sessions could not be exported: no root reaches them "
            f"(their parents form a cycle): {shown}"
        )
    print(summary, file=sys.stderr)
    return EXIT_FAILED if failures or unreached else EXIT_OK


def _chain_lines(body: dict[str, Any], root: str) -> list[dict[str, Any]]:
    """Each chain of a `/chains` answer (root and sub-agents) as one export line."""
    lines = []
    for session in [body, *body.get("subagents", [])]:
        for chain in session.get("chains", []):
            where = {
                "session_id": session["session_id"],
                "root_session_id": root,
                "run": chain.get("server_run"),
                "dispatch": body.get("dispatch"),
            }
            lines.append({**where, "position": chain["chain_index"], **chain})
    return lines


def _unreached(sessions: list[dict[str, Any]], roots: list[dict[str, Any]]) -> list[str]:
    """Ids of the sessions that are in no root's tree, sorted."""
    children: dict[str, list[str]] = {}
    for entry in sessions:
        parent = entry.get("parent_session_id")
        if parent is not None:
            children.setdefault(parent, []).append(entry["session_id"])
    reached = {entry["session_id"] for entry in roots}
    pending = list(reached)
    while pending:
        for child in children.get(pending.pop(), ()):
            if child not in reached:
                reached.add(child)
                pending.append(child)
    return sorted(entry["session_id"] for entry in sessions if entry["session_id"] not in reached)


def emit_json(obj: Any) -> None:
    sys.stdout.buffer.write(orjson.dumps(obj, option=orjson.OPT_INDENT_2) + b"\n")
    sys.stdout.buffer.flush()


def session_table(sessions: list[dict[str, Any]]) -> str:
    if not sessions:
        return "no sessions"
    header = ("SESSION_ID", "PARENT", "RECORDS", "RUNS", "ID_FROM", "FIRST_CAPTURED_AT", "LAST_CAPTURED_AT")
    rows = [
        (
            s["session_id"],
            s.get("parent_session_id") or "-",
            str(s.get("record_count", "")),
            str(len(s.get("runs") or [None])),  # more than 1: the id was used again by a later server run
            s.get("identified_by") or "-",  # header, path, body, stored or inferred
            s.get("first_captured_at") or "-",
            s.get("last_captured_at") or "-",
        )
        for s in sessions
    ]
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in (header, *rows)]
    return "\n".join(lines)


def tree_lines(node: dict[str, Any]) -> list[str]:
    lines = [_tree_label(node)]
    # Explicit stack of (node, prefix, is_last): a long chain of sub-agents must not hit the recursion limit.
    stack = [(child, "", i == len(node["children"]) - 1) for i, child in enumerate(node["children"])][::-1]
    while stack:
        current, prefix, last = stack.pop()
        lines.append(f"{prefix}{'└── ' if last else '├── '}{_tree_label(current)}")
        child_prefix = prefix + ("    " if last else "│   ")
        children = current.get("children") or []
        stack.extend((child, child_prefix, i == len(children) - 1) for i, child in reversed(list(enumerate(children))))
    return lines


def _tree_label(node: dict[str, Any]) -> str:
    count = node.get("record_count", 0)
    runs = len(node.get("runs") or [None])
    spans = f", {runs} server runs" if runs > 1 else ""
    return f"{node['session_id']}  ({count} record{'s' if count != 1 else ''}{spans})"
