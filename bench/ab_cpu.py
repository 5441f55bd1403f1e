"""Two builds of the server side by side: CPU per call of the whole server process and of its event loop.

Usage: python bench/ab_cpu.py OTHER_CHECKOUT [--this CHECKOUT] [--rounds N] [--kinds chat,responses]
       [--settings-a YAML] [--concurrency C] [--session]

Starts this checkout's server ("a") and the one in OTHER_CHECKOUT ("b", e.g. a `git worktree` or a
`git archive` of another commit) on one mock upstream, sends each the same load (c=64) in interleaved
rounds (the order flips each round), and reads each process's CPU from /proc per thread: the server
as a whole and its event-loop (main) thread. CPU per call moves far less than throughput when other
tenants load the machine, so it is what this prints first. `--settings-a`/`--settings-b` give
either server extra settings (a YAML mapping), e.g. `response_store: false`. `--concurrency 1`
compares sequential latency (the p50 is printed too); `--session` sends a session id with every
call, so each is captured (its record in its file before the answer). `--this` runs "a" from another
checkout too (bisecting two older commits with this one's load generator and mock).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import yaml  # noqa: E402

import bench.procs as bench_procs  # noqa: E402
from bench.calls import CHAT, RESPONSES, SMALL, chat_body, responses_body, template  # noqa: E402
from bench.procs import LoadGen, Mock, Server, make_log_dir, thread_cpu_by_role  # noqa: E402

BODIES = {"chat": (CHAT, chat_body(SMALL)), "responses": (RESPONSES, responses_body(SMALL))}


def thread_cpu(pid: int) -> dict[int, tuple[str, float]]:
    """(role, CPU seconds user + system) of each thread of `pid`."""
    return thread_cpu_by_role(pid)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/ab_cpu.py", description=__doc__.splitlines()[0])
    parser.add_argument("other", help="the other checkout's directory (its server is 'b')")
    parser.add_argument("--this", default="", help="the checkout whose server is 'a' (default: this one)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--kinds", default="chat,responses")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--session", action="store_true", help="a session id on every call: captured calls")
    parser.add_argument("--settings-a", default="", help="YAML mapping of extra settings for a")
    parser.add_argument("--settings-b", default="", help="YAML mapping of extra settings for b")
    args = parser.parse_args(argv)
    log_dir = make_log_dir()
    procs = []
    try:
        gen = LoadGen(log_dir)
        procs.append(gen.proc)
        mock = Mock(log_dir)
        procs.append(mock.proc)
        servers = {}
        this = Path(args.this) if args.this else bench_procs.REPO
        for name, directory, extra in (("a", this, args.settings_a), ("b", Path(args.other), args.settings_b)):
            settings = yaml.safe_load(extra) if extra else None
            servers[name] = Server(
                f"server-{name}", mock, log_dir, capture_dir=log_dir / name, settings=settings, tree=directory.resolve()
            )  # each server runs from its checkout's code
            procs.append(servers[name].proc)
        for server in servers.values():  # warm-up: lazy imports and first connections
            templates = [template(path, body) for path, body in BODIES.values()]
            gen.run({"port": server.port, "templates": templates, "concurrency": 8, "count": 300})
        headers = [("x-session-id", "ab-{run}-{conn}")] if args.session else None
        totals: dict[tuple[str, str], dict] = {}
        for r in range(args.rounds):
            for kind in args.kinds.split(","):
                order = list(servers.items()) if r % 2 == 0 else list(servers.items())[::-1]
                for name, server in order:
                    pid = server.proc.pid
                    before = thread_cpu(pid)
                    path, body = BODIES[kind]
                    result = gen.run(
                        {
                            "port": server.port,
                            "templates": [template(path, body, headers)],
                            "concurrency": args.concurrency,
                            "vars": {"run": str(r)},
                            "duration": args.seconds,
                            "warmup": 0.5,
                            "timeout": 60,
                        }
                    )
                    after = thread_cpu(pid)
                    acc = totals.setdefault(
                        (kind, name), {"ok": 0, "rps": [], "event loop": 0.0, "all": 0.0, "errors": 0, "lat": []}
                    )
                    acc["lat"] += result["lat"]
                    acc["ok"] += result["ok"]
                    acc["errors"] += result["errors"]
                    acc["rps"].append(round(result["throughput"]))
                    for tid, (role, cpu) in after.items():
                        used = cpu - before.get(tid, (role, 0.0))[1]
                        acc["all"] += used
                        acc[role] = acc.get(role, 0.0) + used
        print(
            f"a = {this.resolve()}, b = {Path(args.other).resolve()}; c={args.concurrency}, {args.rounds} rounds of"
            f" {args.seconds:.0f} s{', captured' if args.session else ''}"
        )
        for (kind, name), acc in sorted(totals.items()):
            calls = max(1, acc["ok"])
            print(
                f"{kind:<10} {name}  server CPU {acc['all'] / calls * 1e6:5.0f} us/call, event loop"
                f" {acc['event loop'] / calls * 1e6:4.0f} us/call (Rust workers"
                f" {acc.get('Rust workers', 0.0) / calls * 1e6:.0f}, other threads"
                f" {acc.get('other threads', 0.0) / calls * 1e6:.0f}); p50 {statistics.median(acc['lat'] or [0]) * 1e3:.2f} ms;"
                f" calls/s by round {acc['rps']}; errors {acc['errors']}"
            )
    finally:
        for proc in reversed(procs):
            try:
                proc.stop()
            except Exception as exc:  # keep stopping the others
                print(f"stopping {proc.name}: {exc}", file=sys.stderr)
        shutil.rmtree(log_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
