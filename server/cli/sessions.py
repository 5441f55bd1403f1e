"""`switchyard-model sessions ...`: the commands that inspect and export captured sessions (parsing, checks, exit codes).

The sessions come from session_sources.py (a server or a capture directory); what is printed, from
session_output.py.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from server.capture.catalog.runs import ALL, LATEST, parse_dispatch, parse_run, with_dispatch
from server.cli.exits import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from server.cli.session_output import EVERY_DISPATCH, emit_json, export_rollouts, session_table, tree_lines
from server.cli.session_sources import DirectorySource, Failed, NotFound, ServerSource, SessionSource
from server.config import ConfigError, server_url
from server.ids import is_valid_session_id


def add_sessions_parser(subparsers: argparse._SubParsersAction[Any]) -> None:
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
    which_run.add_argument(
        "--dispatch",
        help="which dispatch, for a session id reused for a new task (an RL loop's rollout ids): latest (the "
        "default) or its number from 1 (the summary's `dispatches`); export writes every dispatch unless given",
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
    view.add_argument(
        "--all-tenants",
        action="store_true",
        help="on a folder written with API keys, serve every key's sessions with no key (default: each key sees its own)",
    )

    parser.set_defaults(func=run_sessions)


def run_sessions(args: argparse.Namespace) -> int:
    """Run one `sessions` subcommand; 0 ok, 1 not found or failed, 2 usage."""
    if args.sessions_command == "view":
        return _view(args.capture_dir, args.port, args.summary_read_limit_mb, args.all_tenants)
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
    dispatch_arg = getattr(args, "dispatch", None)
    try:
        dispatch = parse_dispatch(dispatch_arg)
    except ValueError as exc:
        print(f"error: --dispatch: {exc}", file=sys.stderr)
        return EXIT_USAGE

    try:
        source: SessionSource = ServerSource(url, args.timeout) if url else DirectorySource(args.capture_dir)
    except Failed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    try:
        command = args.sessions_command
        if command == "list":
            sessions = source.list_sessions(parent=args.parent, roots_only=args.roots_only, limit=args.limit)
            if args.json:
                emit_json({"schema_version": 1, "sessions": sessions})
            else:
                print(session_table(sessions))
        elif command == "tree":
            node = source.tree(args.session_id, run=with_dispatch(run or ALL, dispatch))
            if args.json:
                emit_json(node)
            else:
                print("\n".join(tree_lines(node)))
        elif command == "show":
            emit_json(source.completions(args.session_id))
        elif command in ("rollout", "chains"):
            strict = getattr(args, "strict", False)
            emit_json(
                source.rollout(
                    args.session_id, allow_partial=not strict, run=with_dispatch(run or LATEST, dispatch), view=command
                )
            )
        elif command == "export":
            return export_rollouts(
                source,
                args.out,
                allow_partial=not args.strict,
                run=run or LATEST,
                chains=args.chains,
                dispatch=dispatch if dispatch_arg else EVERY_DISPATCH,
            )
        else:
            print(f"error: unknown sessions command {command!r}", file=sys.stderr)
            return EXIT_USAGE
    except NotFound as exc:
        print(f"not found: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except Failed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        source.close()
    return EXIT_OK


def _view(capture_dir: str, port: int, summary_read_limit_mb: float = 4.0, all_tenants: bool = False) -> int:
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
        serve(
            capture_dir,
            port=port,
            summary_full_read_bytes=int(summary_read_limit_mb * 1_000_000),
            all_tenants=all_tenants,
        )
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


if __name__ == "__main__":
    sys.exit(main())
