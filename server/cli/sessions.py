"""`switchyard-model sessions ...`: inspect and export captured sessions from a server or a capture directory."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import IO, Any, cast
from urllib.parse import quote, urlsplit

import httpx
import orjson

from server.capture.catalog.runs import ALL, LATEST, LEGACY, UnknownRun, parse_run
from server.capture.catalog.sessions import build_rollout, build_tree, lost_session_envelope, lost_session_node
from server.capture.read.store import CaptureStore, UnknownSession
from server.capture.rollout import RolloutError, lost_session_rollout
from server.cli.exits import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from server.config import ConfigError, server_url
from server.files import atomic_writer
from server.ids import is_valid_session_id
from server.urls import root_url

_PAGE = 1000
_LOOPBACK = {"127.0.0.1", "localhost", "::1"}


class _NotFound(Exception):
    pass


class _Failed(Exception):
    pass


def add_sessions_parser(subparsers: Any) -> None:
    """Add `sessions` (with list/tree/show/rollout/export) to an argparse subparsers object."""
    source = argparse.ArgumentParser(add_help=False)
    where = source.add_argument_group(
        "where the sessions are (at most one; default: the server at the address `serve` uses, "
        "http://127.0.0.1:8080 unless --config moves it)"
    )
    where.add_argument("--url", help="a running switchyard-model server, e.g. http://127.0.0.1:8000")
    where.add_argument("--capture-dir", help="a capture directory, read directly (read-only, no server)")
    where.add_argument("--config", help="the settings YAML the server runs with: its host and port give the default")
    source.add_argument("--timeout", type=float, default=60.0, help="HTTP timeout in seconds (default 60)")
    which_run = argparse.ArgumentParser(add_help=False)
    which_run.add_argument(
        "--run",
        help="which server runs' records, for a session id used again by a later run: latest (its latest "
        "conversation; the default for rollouts), a run id from the listing's `runs`, legacy (records without "
        "a run id) or all",
    )

    parser = subparsers.add_parser(
        "sessions",
        help="list, show and export captured sessions",
        description="Inspect captured agent sessions and export their token-exact rollouts.",
    )
    commands = parser.add_subparsers(dest="sessions_command", metavar="COMMAND")
    commands.required = True

    listing = commands.add_parser("list", parents=[source], help="list sessions")
    listing.add_argument("--parent", help="only the children of this session")
    listing.add_argument("--roots-only", action="store_true", help="only sessions without a parent")
    listing.add_argument("--limit", type=int, default=None, help="at most this many sessions")
    listing.add_argument("--json", action="store_true", help="print JSON instead of a table")

    tree = commands.add_parser("tree", parents=[source, which_run], help="show a session and its sub-agent sessions")
    tree.add_argument("session_id")
    tree.add_argument("--json", action="store_true", help="print JSON instead of a tree")

    show = commands.add_parser("show", parents=[source], help="print a session's records (JSON envelope)")
    show.add_argument("session_id")

    rollout = commands.add_parser(
        "rollout", parents=[source, which_run], help="print a session's reconstructed rollout"
    )
    rollout.add_argument("session_id")
    rollout.add_argument("--strict", action="store_true", help="fail instead of returning a partial rollout")

    chains = commands.add_parser(
        "chains", parents=[source, which_run], help="print a session's chains: every call in a token-contiguous sample"
    )
    chains.add_argument("session_id")

    export = commands.add_parser(
        "export", parents=[source, which_run], help="write one JSON line per root session's rollout"
    )
    export.add_argument("--out", help="output file (default: stdout); written atomically")
    export.add_argument("--strict", action="store_true", help="fail a session instead of exporting a partial rollout")
    export.add_argument(
        "--chains", action="store_true", help="one line per chain (sub-agents' too) instead of per root rollout"
    )

    view = commands.add_parser(
        "view",
        help="serve a capture directory read-only in the browser viewer",
        description="Serve one capture directory read-only on 127.0.0.1: the viewer at /ui/ and the GET session API.",
    )
    view.add_argument("--capture-dir", required=True, help="the capture directory to serve (never written)")
    view.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default 0: a free port, printed)")
    view.add_argument(
        "--summary-read-limit-mb",
        type=float,
        default=4.0,
        help="a list page shows a session with more MB of records than this as pending, summarised in the background",
    )

    parser.set_defaults(func=run_sessions)


def run_sessions(args: argparse.Namespace) -> int:
    """Run one `sessions` subcommand; 0 ok, 1 not found or failed, 2 usage."""
    if args.sessions_command == "view":
        return _view(args.capture_dir, args.port, args.summary_read_limit_mb)
    if sum(bool(x) for x in (args.url, args.capture_dir, args.config)) > 1:
        print("error: give at most one of --url, --capture-dir or --config", file=sys.stderr)
        return EXIT_USAGE
    url = args.url
    if not url and not args.capture_dir:
        try:
            url = server_url(args.config)
        except ConfigError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_USAGE
    session_id = getattr(args, "session_id", None)
    if session_id is not None and not is_valid_session_id(session_id):
        print(f"error: {session_id!r} is not a valid session id", file=sys.stderr)
        return EXIT_USAGE
    if getattr(args, "parent", None) and not is_valid_session_id(args.parent):
        print(f"error: --parent {args.parent!r} is not a valid session id", file=sys.stderr)
        return EXIT_USAGE
    if getattr(args, "limit", None) is not None and args.limit < 1:
        print("error: --limit must be at least 1", file=sys.stderr)
        return EXIT_USAGE
    run = getattr(args, "run", None)
    if run is not None:
        try:
            parse_run(run)
        except ValueError as exc:
            print(f"error: --run: {exc}", file=sys.stderr)
            return EXIT_USAGE

    try:
        source: _ServerSource | _DirectorySource = (
            _ServerSource(url, args.timeout) if url else _DirectorySource(args.capture_dir)
        )
    except _Failed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    try:
        command = args.sessions_command
        if command == "list":
            sessions = source.list_sessions(parent=args.parent, roots_only=args.roots_only, limit=args.limit)
            if args.json:
                _emit_json({"schema_version": 1, "sessions": sessions})
            else:
                print(_session_table(sessions))
        elif command == "tree":
            node = source.tree(args.session_id, run=run or ALL)
            if args.json:
                _emit_json(node)
            else:
                print("\n".join(_tree_lines(node)))
        elif command == "show":
            _emit_json(source.completions(args.session_id))
        elif command in ("rollout", "chains"):
            strict = getattr(args, "strict", False)
            _emit_json(source.rollout(args.session_id, allow_partial=not strict, run=run or LATEST, view=command))
        elif command == "export":
            return _export(source, args.out, allow_partial=not args.strict, run=run or LATEST, chains=args.chains)
        else:
            print(f"error: unknown sessions command {command!r}", file=sys.stderr)
            return EXIT_USAGE
    except _NotFound as exc:
        print(f"not found: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except _Failed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        source.close()
    return EXIT_OK


def _view(capture_dir: str, port: int, summary_read_limit_mb: float = 4.0) -> int:
    if not 0 <= port <= 65535:
        print("error: --port must be from 0 to 65535", file=sys.stderr)
        return EXIT_USAGE
    if not summary_read_limit_mb >= 0:
        print("error: --summary-read-limit-mb must be 0 or more", file=sys.stderr)
        return EXIT_USAGE
    if not Path(capture_dir).is_dir():
        print(f"error: no such capture directory: {capture_dir}", file=sys.stderr)
        return EXIT_FAILED
    from server.viewer.offline import serve  # the web stack loads only for this command

    try:
        serve(capture_dir, port=port, summary_full_read_bytes=int(summary_read_limit_mb * 1_000_000))
    except OSError as exc:
        print(f"error: cannot serve on 127.0.0.1:{port}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        pass
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    """Standalone entry (`python -m server.cli.sessions ...`), same as `switchyard-model sessions ...`."""
    parser = argparse.ArgumentParser(prog="switchyard-model")
    add_sessions_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return run_sessions(args)


# ---- sources: a running server, or a capture directory read in place -------------------------


class _ServerSource:
    def __init__(self, url: str, timeout: float) -> None:
        base = root_url(url)
        parts = urlsplit(base)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise _Failed(f"--url must be an http(s) URL, got {url!r}")
        # Proxy variables would otherwise route even loopback calls through a proxy.
        self._client = httpx.Client(base_url=base, timeout=timeout, trust_env=parts.hostname not in _LOOPBACK)

    def close(self) -> None:
        self._client.close()

    def _get(self, path: str, params: dict[str, str] | None = None) -> Any:
        try:
            response = self._client.get(path, params=params)
        except httpx.HTTPError as exc:
            raise _Failed(f"cannot reach {self._client.base_url}: {exc}") from None
        if response.status_code == 200:
            try:
                return orjson.loads(response.content)
            except orjson.JSONDecodeError:
                raise _Failed(f"{path}: the server did not return JSON") from None
        message = _error_message(response)
        if response.status_code == 404:
            raise _NotFound(message)
        raise _Failed(f"{path}: HTTP {response.status_code}: {message}")

    def list_sessions(self, *, parent: str | None, roots_only: bool, limit: int | None) -> list[dict]:
        sessions: list[dict] = []
        after = None
        while limit is None or len(sessions) < limit:
            params = {"limit": str(_PAGE)}
            if parent:
                params["parent"] = parent
            if roots_only:
                params["roots_only"] = "true"
            if after:
                params["after"] = after
            page = self._get("/v1/sessions", params)
            sessions.extend(page.get("sessions") or [])
            after = page.get("next_after")
            if not page.get("has_more") or not after:
                break
        return sessions if limit is None else sessions[:limit]

    def tree(self, session_id: str, *, run: str = ALL) -> dict:
        return self._get(f"/v1/sessions/{_segment(session_id)}/tree", {"run": run})

    def completions(self, session_id: str) -> dict:
        return self._get(f"/v1/sessions/{_segment(session_id)}/completions")

    def rollout(self, session_id: str, *, allow_partial: bool, run: str = LATEST, view: str = "rollout") -> dict:
        return self._get(
            f"/v1/sessions/{_segment(session_id)}/{view}",
            {"allow_partial": "true" if allow_partial else "false", "run": run},
        )


def _segment(session_id: str) -> str:
    """A session id as one URL path segment: ids may hold `/`, `?`, `#` or `%`."""
    return quote(session_id, safe="")


class _DirectorySource:
    def __init__(self, capture_dir: str) -> None:
        if not Path(capture_dir).is_dir():
            raise _Failed(f"no capture directory at {capture_dir}")
        self._store = CaptureStore.open_read_only(capture_dir)

    def close(self) -> None:
        pass

    def list_sessions(self, *, parent: str | None, roots_only: bool, limit: int | None) -> list[dict]:
        return self._store.list_sessions(
            parent=parent, roots_only=roots_only, limit=limit if limit is not None else sys.maxsize
        )

    def tree(self, session_id: str, *, run: str = ALL) -> dict:
        try:
            return build_tree(self._store, session_id, run=run)
        except UnknownSession:
            if lost := self._store.lost_records(session_id):  # every record lost: it ran
                return lost_session_node(session_id, lost)
            raise _NotFound(f"unknown session: {session_id!r}") from None
        except UnknownRun:
            raise _NotFound(f"session {session_id!r} has no records from server run {run!r}") from None

    def completions(self, session_id: str) -> dict:
        try:
            records, skipped = self._store.read_completions(session_id)
        except UnknownSession:
            records, skipped = [], 0
        if not records:
            if lost := self._store.lost_records(session_id):
                return lost_session_envelope(session_id, lost, skipped=skipped)
            raise _NotFound(f"unknown session: {session_id!r}")
        return {
            "schema_version": 1,
            "session_id": session_id,
            "completions": records,
            "skipped": skipped,
            "lost_records": self._store.lost_records(session_id),
        }

    def rollout(self, session_id: str, *, allow_partial: bool, run: str = LATEST, view: str = "rollout") -> dict:
        try:
            # The same JSON body the remote source reads off the server.
            return cast(
                dict[str, Any], build_rollout(self._store, session_id, allow_partial=allow_partial, run=run, view=view)
            )
        except UnknownSession:
            lost = self._store.lost_records(session_id)
            if not lost:
                raise _NotFound(f"unknown session: {session_id!r}") from None
            try:
                return cast(dict[str, Any], lost_session_rollout(session_id, lost, allow_partial))
            except RolloutError as exc:
                raise _Failed(f"session {session_id}: {exc}") from None
        except UnknownRun:
            raise _NotFound(f"session {session_id!r} has no records from server run {run!r}") from None
        except RolloutError as exc:
            raise _Failed(f"session {session_id}: {exc}") from None


# ---- output ----------------------------------------------------------------------------------


def _export(
    source: _ServerSource | _DirectorySource,
    out: str | None,
    *,
    allow_partial: bool,
    run: str = LATEST,
    chains: bool = False,
) -> int:
    """One JSON line per root session's rollout (`chains`: per chain of the root and its sub-agents,
    with its session, root, run and position), and an account of what could not be exported.

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
        for entry in roots:
            session_id = entry["session_id"]
            try:
                rollout = source.rollout(
                    session_id, allow_partial=allow_partial, run=run, view="chains" if chains else "rollout"
                )
            except (_NotFound, _Failed) as exc:
                failures += 1
                print(f"session {session_id}: {exc}", file=sys.stderr)
                continue
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


def _chain_lines(body: dict, root: str) -> list[dict]:
    """Each chain of a `/chains` answer (root and sub-agents) as one export line."""
    lines = []
    for session in [body, *body.get("subagents", [])]:
        for chain in session.get("chains", []):
            where = {"session_id": session["session_id"], "root_session_id": root, "run": chain.get("server_run")}
            lines.append({**where, "position": chain["chain_index"], **chain})
    return lines


def _unreached(sessions: list[dict], roots: list[dict]) -> list[str]:
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


def _emit_json(obj: Any) -> None:
    sys.stdout.buffer.write(orjson.dumps(obj, option=orjson.OPT_INDENT_2) + b"\n")
    sys.stdout.buffer.flush()


def _session_table(sessions: list[dict]) -> str:
    if not sessions:
        return "no sessions"
    header = ("SESSION_ID", "PARENT", "RECORDS", "RUNS", "FIRST_CAPTURED_AT", "LAST_CAPTURED_AT")
    rows = [
        (
            s["session_id"],
            s.get("parent_session_id") or "-",
            str(s.get("record_count", "")),
            str(len(s.get("runs") or [None])),  # more than 1: the id was used again by a later server run
            s.get("first_captured_at") or "-",
            s.get("last_captured_at") or "-",
        )
        for s in sessions
    ]
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in (header, *rows)]
    return "\n".join(lines)


def _tree_lines(node: dict) -> list[str]:
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


def _tree_label(node: dict) -> str:
    count = node.get("record_count", 0)
    runs = len(node.get("runs") or [None])
    spans = f", {runs} server runs" if runs > 1 else ""
    return f"{node['session_id']}  ({count} record{'s' if count != 1 else ''}{spans})"


def _error_message(response: httpx.Response) -> str:
    try:
        body = orjson.loads(response.content)
        return str(body["error"]["message"])
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return response.text[:500] or response.reason_phrase


if __name__ == "__main__":
    sys.exit(main())
