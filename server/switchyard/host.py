"""Host Switchyard's native server in a process of its own (attach mode without a cargo build).

`python -m server.switchyard.host --config deploy.toml --port 4000` serves until SIGTERM/SIGINT. It
is what the tests launch as `switchyard_command`, and a way to run a shared Switchyard that several
switchyard-model servers attach to.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from server.config import ConfigError, resolve_deployment
from server.switchyard import profiles
from server.switchyard.runtime import ensure_no_proxy_for_loopback, switchyard_threads


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m server.switchyard.host", description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="Switchyard TOML deployment or shipped profile name")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)

    from switchyard_rust.server import Server

    ensure_no_proxy_for_loopback()
    try:
        switchyard_threads(None, hosted=False)  # a bad TOKIO_WORKER_THREADS: one line, not a panic
        source = resolve_deployment(args.config)
        rendered = profiles.write_private(profiles.render(source))
    except ConfigError as exc:
        print(f"switchyard_host: {exc}", file=sys.stderr)
        return 2
    try:
        server = Server(str(rendered), port=args.port)
    except RuntimeError as exc:
        print(f"switchyard_host: {str(exc).replace(str(rendered), str(source))}", file=sys.stderr)
        return 2
    finally:
        profiles.remove_private(rendered)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    print(f"switchyard listening on {server.base_url}", flush=True)
    while not stop.wait(0.5):
        pass
    server.close(timeout_secs=2.0)  # same (main) thread that created it
    return 0


if __name__ == "__main__":
    sys.exit(main())
