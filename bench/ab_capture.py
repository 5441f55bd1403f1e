"""Capture on/off at 8k-token prompts (issue 16, point 2) for several builds or settings side by side.

Usage: python bench/ab_capture.py NAME=CHECKOUT[:YAML-FLOW-SETTINGS] ... [--rounds N] [--seconds S]

Each NAME=CHECKOUT starts a capturing server from that checkout with optional extra settings, e.g.
`batch=. never=.:{capture_fsync: never}`; an uncaptured server from the first checkout is the
baseline ("off"). All get `bench/run.py capture`'s load (c=64, 8k-token prompts, 200-token answers,
the token fields asked for) in interleaved rounds, the order flipping each round. Printed per build:
calls/s, the ratio to "off" (median of the rounds), and the CPU per call of the whole chain and of
the server by thread role (event loop, other Python threads: the capture writer and committer,
Rust workers: the hosted Switchyard). CPU per call is what moves least when the machine is shared.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import yaml  # noqa: E402

import bench.chain as chain  # noqa: E402
from bench.chain import LoadGen, Mock, Server, make_log_dir  # noqa: E402
from bench.run import CHAT, capture_bodies, template  # noqa: E402
from bench.threads import thread_cpu_by_role  # noqa: E402


def role_cpu(pid: int) -> dict[str, float]:
    totals: dict[str, float] = {}
    for role, seconds in thread_cpu_by_role(pid).values():
        totals[role] = totals.get(role, 0.0) + seconds
    return totals


def measured_run(gen: LoadGen, server: Server, mock: Mock, spec: dict) -> dict[str, float]:
    """One series of `spec` against `server`: calls/s, and CPU seconds per call of the chain and of each server thread role."""
    watched = [server.proc, mock.proc, gen.proc]
    cpu0, roles0 = [p.cpu_s() for p in watched], role_cpu(server.proc.pid)
    out = gen.run({**spec, "port": server.port})
    cpu1, roles1 = [p.cpu_s() for p in watched], role_cpu(server.proc.pid)
    calls = max(1, out["ok"])
    row = {"calls_s": out["throughput"], "chain": (sum(cpu1) - sum(cpu0)) / calls}
    row.update({role: (roles1[role] - roles0.get(role, 0.0)) / calls for role in roles1})
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/ab_capture.py", description=__doc__.splitlines()[0])
    parser.add_argument("builds", nargs="+", help="NAME=CHECKOUT[:YAML flow mapping of settings]")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args(argv)
    log_dir = make_log_dir()
    procs = []
    try:
        gen, mock = LoadGen(log_dir), Mock(log_dir)
        procs += [gen.proc, mock.proc]
        servers: dict[str, Server] = {}
        for i, build in enumerate(args.builds):
            name, _, rest = build.partition("=")
            checkout, _, extra = rest.partition(":")
            chain.REPO = Path(checkout).resolve()  # the server process runs that checkout's code
            settings = yaml.safe_load(extra) if extra else None
            if i == 0:
                servers["off"] = Server("s-off", mock, log_dir, capture_dir=None)
                procs.append(servers["off"].proc)
            servers[name] = Server(f"s-{name}", mock, log_dir, capture_dir=log_dir / f"cap-{name}", settings=settings)
            procs.append(servers[name].proc)
        corr = [("x-session-id", "ab-capture-{run}-{conn}")]
        templates = [template(CHAT, body, corr) for body in capture_bodies()]
        rows: dict[str, list[dict[str, float]]] = {name: [] for name in servers}
        for r in range(args.rounds):
            for name in list(servers) if r % 2 == 0 else list(reversed(servers)):
                server = servers[name]
                spec = {
                    "templates": templates,
                    "concurrency": 64,
                    "duration": args.seconds,
                    "warmup": 0.7,
                    "timeout": 60,
                    "vars": {"run": f"{name}-{r}"},
                }
                row = measured_run(gen, server, mock, spec)
                rows[name].append({key: value if key == "calls_s" else value * 1000 for key, value in row.items()})
                if server.capture_dir is not None:
                    server.wait_capture_idle()  # the next series starts with the writer idle

        def med(name: str, key: str) -> float:
            return statistics.median(row.get(key, 0.0) for row in rows[name])

        print(f"c=64, 8k-token prompts, {args.rounds} rounds of {args.seconds:.0f} s; CPU in ms per call")
        for name in servers:
            ratios = [a["calls_s"] / b["calls_s"] for a, b in zip(rows[name], rows["off"]) if b["calls_s"]]
            print(
                f"{name:10s} {med(name, 'calls_s'):6.0f} calls/s, on/off {statistics.median(ratios):.2f} (rounds "
                f"{min(ratios):.2f}-{max(ratios):.2f}), CPU-based {med('off', 'chain') / med(name, 'chain'):.2f}; "
                f"chain {med(name, 'chain'):.2f}: event loop {med(name, 'event loop'):.2f}, other Python threads "
                f"{med(name, 'other threads'):.2f}, Rust workers {med(name, 'Rust workers'):.2f}"
            )
    finally:
        for proc in reversed(procs):
            proc.stop()
        shutil.rmtree(log_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
