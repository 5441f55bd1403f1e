"""Streams through servers of several builds side by side, against direct Switchyard: CPU per stream and streams/s.

Usage: python bench/ab_streams.py NAME=CHECKOUT[:YAML-FLOW-SETTINGS] ... [--rounds N] [--kinds captured,uncaptured,paced]

Each NAME=CHECKOUT starts a server from that checkout (a `git worktree`, or this one) on one mock
upstream, with optional extra settings, e.g. `queued=.:{capture_before_answer: false}`. The kinds:
`captured` and `uncaptured` are the stream_load section's c=64 chat streams (32 tokens, one write
per request; captured ones carry a new session id each); `paced` is its long-stream load, smaller
(384 streams of 200 chunks 50 ms apart, all open at once). Direct Switchyard (the first server's)
gets the same calls asking for the token fields itself. Rounds are interleaved, the order flipping
each round; CPU is read per process and per thread from /proc, and the CPU-based ratio (direct's
CPU per stream over the server's, every process of the chain counted) is the figure that moves least
when other tenants load the machine.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import yaml  # noqa: E402

import bench.chain as chain  # noqa: E402
from bench.ab_cpu import thread_cpu  # noqa: E402
from bench.chain import LoadGen, Mock, Server, make_log_dir  # noqa: E402
from bench.run import CHAT, CHAT_TOKEN_MARK, chat_body, template  # noqa: E402

SHORT = "Explain the plan step by step. [[mock:tokens 32]]"
PACED = "Tell the long story. [[mock:tokens 200]] [[mock:slow 50]]"
PACED_STREAMS = 384


def _short(port: int, body: str, headers, fresh: bool, seconds: float) -> Callable[[int], dict[str, Any]]:
    return lambda r: {
        "port": port,
        "templates": [template(CHAT, body, headers)],
        "concurrency": 64,
        "duration": seconds,
        "warmup": 0.5,
        "timeout": 60,
        "stream": True,
        "marker": CHAT_TOKEN_MARK,
        "fresh": fresh,
        "vars": {"run": f"{int(time.time())}-{r}"},
    }


def _paced(port: int, body: str, headers) -> Callable[[int], dict[str, Any]]:
    return lambda r: {
        "port": port,
        "templates": [template(CHAT, body, headers)],
        "concurrency": PACED_STREAMS,
        "count": PACED_STREAMS,
        "stream": True,
        "fresh": True,
        "timeout": 120,
        "ramp": 1.0,
        "marker": CHAT_TOKEN_MARK,
        "vars": {"run": f"{int(time.time())}-{r}"},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/ab_streams.py", description=__doc__.splitlines()[0])
    parser.add_argument("builds", nargs="+", help="NAME=CHECKOUT[:YAML flow mapping of settings]")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--kinds", default="captured,uncaptured")
    args = parser.parse_args(argv)
    kinds = args.kinds.split(",")
    log_dir = make_log_dir()
    procs = []
    try:
        gen = LoadGen(log_dir)
        mock = Mock(log_dir)
        procs += [gen.proc, mock.proc]
        servers: dict[str, Server] = {}
        for build in args.builds:
            name, _, rest = build.partition("=")
            checkout, _, extra = rest.partition(":")
            settings = {"upstream_max_connections": 2048, **(yaml.safe_load(extra) if extra else {})}
            chain.REPO = Path(checkout).resolve()  # the server process runs that checkout's code
            servers[name] = Server(f"s-{name}", mock, log_dir, capture_dir=log_dir / f"cap-{name}", settings=settings)
            procs.append(servers[name].proc)
        first = next(iter(servers.values()))
        session = [("x-session-id", "ab-{run}-{conn}-{seq}")]
        series: dict[str, tuple[Server, Callable[[int], dict[str, Any]]]] = {}
        if {"captured", "uncaptured"} & set(kinds):
            direct = chat_body(SHORT, stream=True, token_fields=True)
            series["direct"] = (first, _short(first.proxy_port, direct, None, True, args.seconds))
        if "paced" in kinds:
            series["direct_paced"] = (
                first,
                _paced(first.proxy_port, chat_body(PACED, stream=True, token_fields=True), None),
            )
        for name, server in servers.items():
            for kind in kinds:
                if kind == "paced":
                    series[f"{name}_paced"] = (server, _paced(server.port, chat_body(PACED, stream=True), session))
                else:
                    headers = session if kind == "captured" else None
                    body = chat_body(SHORT, stream=True)
                    series[f"{name}_{kind}"] = (server, _short(server.port, body, headers, False, args.seconds))
        for server in servers.values():  # warm up: connections, caches, the session directory
            gen.run({**_short(server.port, chat_body(SHORT, stream=True), session, False, 1.0)(0), "warmup": 0.2})
        results: dict[str, list[dict[str, float]]] = {name: [] for name in series}
        for r in range(args.rounds):
            for name in list(series) if r % 2 == 0 else list(reversed(series)):
                server, spec = series[name]
                watched = [server.proc, mock.proc, gen.proc]
                cpu0, threads0 = [p.cpu_s() for p in watched], thread_cpu(server.proc.pid)
                out = gen.run(spec(r))
                cpu1, threads1 = [p.cpu_s() for p in watched], thread_cpu(server.proc.pid)
                n = max(1, out["ok"])
                loop = threads1.get(server.proc.pid, 0.0) - threads0.get(server.proc.pid, 0.0)
                row = {
                    "streams_s": out["throughput"] if "paced" not in name else out["ok"] / out["elapsed"],
                    "chain_ms": (sum(cpu1) - sum(cpu0)) * 1000 / n,
                    "server_ms": (cpu1[0] - cpu0[0]) * 1000 / n,
                    "loop_ms": loop * 1000 / n,
                    "errors": out["errors"],
                }
                results[name].append(row)
                print(name, r, {k: round(v, 3) for k, v in row.items()}, flush=True)
                if name.endswith(("_captured", "_paced")) and not name.startswith("direct"):
                    server.wait_capture_idle()
        print()

        def med(name: str, key: str) -> float:
            return statistics.median(x[key] for x in results[name])

        for name in series:
            base = "direct_paced" if name.endswith("paced") else "direct"
            ratios = [a["streams_s"] / b["streams_s"] for a, b in zip(results[name], results[base]) if b["streams_s"]]
            print(
                f"{name:24s} {med(name, 'streams_s'):7.1f} streams/s, ratio {statistics.median(ratios):.2f} "
                f"(rounds {min(ratios):.2f}-{max(ratios):.2f}); CPU per stream {med(name, 'chain_ms'):.3f} ms "
                f"(server {med(name, 'server_ms'):.3f}, event loop {med(name, 'loop_ms'):.3f}); CPU-based "
                f"{med(base, 'chain_ms') / med(name, 'chain_ms'):.2f}; errors {sum(x['errors'] for x in results[name])}"
            )
    finally:
        for proc in reversed(procs):
            proc.stop()
    shutil.rmtree(log_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
