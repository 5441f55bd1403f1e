"""The `switchyard-model` command: serve, demo, sessions, profiles, mock-upstream, gym-dir."""

from __future__ import annotations

import argparse
import logging
import socket
import sys
from typing import Any

from server.cli.exits import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE
from server.dev.mock_upstream import command as mock_upstream

# Imports stay light here, and heavy ones happen inside main(): a Ctrl-C while they load is then
# caught by main() like any other, rather than ending in a traceback from the import machinery.


class _Parser(argparse.ArgumentParser):
    """argparse, but usage errors exit 2 with one line (argparse prints the whole usage otherwise)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _add_serve(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "serve",
        help="run the model server in front of Switchyard",
        description="Run the OpenAI-compatible model server. Launch mode hosts Switchyard from a TOML "
        "deployment (--deployment FILE or a shipped profile name); attach mode uses a running Switchyard "
        "(--switchyard-base-url URL).",
    )
    p.add_argument(
        "--config", help="YAML settings (flat, or Gym-shaped policy_model.responses_api_models.switchyard_model)"
    )
    p.add_argument("--deployment", help="Switchyard TOML deployment, or a shipped profile name (demo, vllm, router)")
    p.add_argument("--switchyard-base-url", help="attach to this Switchyard (e.g. http://127.0.0.1:4000/v1)")
    p.add_argument("--switchyard-model", help="the route every call is sent to (default: Switchyard's default route)")
    p.add_argument(
        "--switchyard-command", help="launch Switchyard as a child process: a command with {deployment} and {port}"
    )
    p.add_argument("--proxy-port", type=int, help="port for the hosted or launched Switchyard (default: a free one)")
    p.add_argument("--host", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port to bind (default 8080; 0 picks a free one)")
    p.add_argument(
        "--port-file", help="once ready, write the bound port to this file (atomically): how a parent learns port 0"
    )
    p.add_argument(
        "--workers",
        type=int,
        help="worker processes on one port, sharing the capture directory and one Switchyard (default 1)",
    )
    p.add_argument("--capture-dir", help="where captured records are written (default ./switchyard-captures)")
    p.add_argument("--no-capture", action="store_true", help="do not record calls")
    p.add_argument(
        "--token-injection",
        action="store_true",
        help="send the engine each session's token history (reasoning models; see docs/injection.md)",
    )
    p.add_argument("--log-level", help="debug, info, warning, error")
    p.add_argument("--http-server", help="the HTTP server that carries the app: granian (default) or uvicorn")
    p.add_argument("--otel-console", action="store_true", help="print OpenTelemetry spans to stdout")


def _serve_overrides(args: argparse.Namespace) -> dict[str, Any]:
    overrides = {
        "deployment": args.deployment,
        "switchyard_base_url": args.switchyard_base_url,
        "switchyard_model": args.switchyard_model,
        "switchyard_command": args.switchyard_command,
        "proxy_port": args.proxy_port,
        "host": args.host,
        "port": args.port,
        "port_file": args.port_file,
        "workers": args.workers,
        "capture_dir": args.capture_dir,
        "log_level": args.log_level,
        "http_server": args.http_server,
    }
    if args.no_capture:
        overrides["capture"] = False
    if args.otel_console:
        overrides["otel_console"] = True
    if args.token_injection:
        overrides["token_injection"] = True
    return overrides


def _bind(host: str, port: int) -> socket.socket:
    from server.config import ConfigError

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP, not 0: asyncio turns Nagle off only on sockets that say they are TCP, and the
    # connections accepted from this one inherit its protocol (and, on Linux, its TCP_NODELAY).
    # Without it a server on asyncio's own loop left Nagle on: ~40 ms per call to a keep-alive client.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    # Listen now: uvicorn only starts accepting after the lifespan, and a client told the port at
    # the end of the lifespan must queue in the backlog, not be refused.
    sock.listen(4096)  # Linux caps it at net.core.somaxconn
    sock.set_inheritable(True)
    return sock


def run_serve(args: argparse.Namespace) -> int:
    from server.app import create_app
    from server.config import ConfigError, load_settings
    from server.process import die_with_parent_from_env
    from server.state import AppState

    die_with_parent_from_env()  # a LocalServer's child never outlives its parent
    try:
        settings = load_settings(args.config, _serve_overrides(args))
        workers = settings.workers
        logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per upstream call is noise
        sock = _bind(settings.host, settings.port)
        host, port = sock.getsockname()[:2]

        def announce(mode: str, switchyard_url: str | None, route: str, extra: str = "") -> None:
            print(
                f"switchyard-model listening on http://{host}:{port} (mode {mode}, "
                f"Switchyard {switchyard_url}, route {route!r}{extra})",
                flush=True,
            )
            if settings.port_file:
                from server.files import write_atomic

                write_atomic(settings.port_file, f"{port}\n".encode(), fsync=False)

        if workers > 1:
            from server.cli.workers import run_workers

            def workers_ready(note: dict[str, Any]) -> None:
                announce(settings.mode, note["switchyard"], note["route"], f", {workers} workers sharing it")

            return run_workers(settings, sock, workers, workers_ready)

        def ready(state: AppState) -> None:
            from server.process import calm_the_collector

            calm_the_collector()
            announce(state.proxy.mode, state.proxy.root_url, state.route)

        app = create_app(settings, on_ready=ready)
    except ConfigError as exc:
        print(f"switchyard-model: {exc}", file=sys.stderr)
        return EXIT_USAGE
    state = app.state.switchyard
    from server.http.admission import limits
    from server.http.servers import ConnectionLimits, serve

    connection_limits = ConnectionLimits(limits(settings).connections, settings.http_header_timeout_s)
    # A failed startup is reported below in one line; the HTTP server would also log the whole traceback.
    try:
        serve(
            app,
            sock,
            settings.http_server,
            quiet=lambda: state.startup_error is not None,
            limits=connection_limits,
        )
    except KeyboardInterrupt:
        # uvicorn re-raises Ctrl-C once its graceful shutdown has finished (records flushed,
        # Switchyard closed): the stop asked for is done, so it is a clean exit, not a traceback.
        pass
    if state.startup_error is not None:
        print(f"switchyard-model: startup failed: {state.startup_error}", file=sys.stderr)
        return EXIT_USAGE if isinstance(state.startup_error, (ConfigError, RuntimeError)) else EXIT_FAILED
    return EXIT_OK


def _add_mock(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "mock-upstream",
        help="run the deterministic vLLM-compatible mock model server",
        description="Run the mock upstream used by the demo, the tests and the benchmarks: a deterministic "
        "vLLM-compatible /v1/chat/completions with token ids, logprobs and scripted behaviours "
        "(see docs/mock-upstream.md).",
    )
    mock_upstream.add_arguments(p, port=8001)


def _add_demo(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "demo",
        help="run the demo stack (mock upstream + hosted Switchyard + this server) and a scripted agent",
        description="Start the mock upstream, this server hosting Switchyard from profiles/demo.toml, run a "
        "scripted multi-turn agent with a tool call and a sub-agent through the openai SDK, and print "
        "where each call went and the captured session tree.",
    )
    p.add_argument("--serve", action="store_true", help="keep the stack up afterwards and print curl examples")
    p.add_argument("--port", type=int, default=0, help="port for this server (default: a free one)")
    p.add_argument("--capture-dir", help="keep the captured records here (default: a temporary directory)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="switchyard-model",
        description="An OpenAI-compatible model server in front of a Switchyard routing proxy, with "
        "token-exact capture of agent sessions.",
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_serve(sub)
    _add_demo(sub)
    _add_mock(sub)
    from server.cli.sessions import add_sessions_parser

    add_sessions_parser(sub)
    from server.cli.profiles import add_profiles_parser

    add_profiles_parser(sub)
    from server.cli.gym_dir import add_gym_dir_parser

    add_gym_dir_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        return _run_command(argv)
    except KeyboardInterrupt:
        # Ctrl-C before the command finished (while starting, mid-demo, mid-export): one line.
        print("switchyard-model: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def _run_command(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        return run_serve(args)
    if args.command == "mock-upstream":
        mock_upstream.serve(args)
        return EXIT_OK
    if args.command == "demo":
        from server.dev.demo import run_demo

        return run_demo(args)
    if args.command == "sessions":
        from server.cli.sessions import run_sessions

        return run_sessions(args)
    if args.command == "profiles":
        from server.cli.profiles import run_profiles

        return run_profiles(args)
    if args.command == "gym-dir":
        from server.cli.gym_dir import run_gym_dir

        return run_gym_dir(args)
    return EXIT_USAGE
