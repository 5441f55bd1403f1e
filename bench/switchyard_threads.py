"""The hosted Switchyard's worker threads (`switchyard_threads`) side by side: CPU, throughput, memory.

Usage: python bench/switchyard_threads.py [--threads 1,2,4,16,64] [--rounds N] [--seconds S]

One capturing server per thread count, all up at once, each hosting its Switchyard with that many
Tokio workers; counts above this machine's cores stand in for the one-per-core default on a bigger
node. Each round gives every server, in turn (the order flipping each round), c=64 small chat calls
and then c=64 chat calls with 8k-token prompts (bench/run.py's capture load). Printed per count:
calls/s and the CPU per call of the whole chain and of Switchyard's threads (median of the rounds),
and the server's threads and RSS after the last round (memory that grew under load and stayed).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.ab_capture import measured_run  # noqa: E402
from bench.chain import LoadGen, Mock, Server, make_log_dir  # noqa: E402
from bench.run import CHAT, SMALL, capture_bodies, chat_body, template  # noqa: E402

RUST = "Rust workers"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/switchyard_threads.py", description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default="1,2,4,16,64", help="comma-separated thread counts")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args(argv)
    counts = [int(n) for n in args.threads.split(",")]
    log_dir = make_log_dir()
    procs = []
    try:
        gen, mock = LoadGen(log_dir), Mock(log_dir)
        procs += [gen.proc, mock.proc]
        servers = {}
        for n in counts:
            servers[n] = Server(
                f"s-threads-{n}", mock, log_dir, capture_dir=log_dir / f"cap-{n}", settings={"switchyard_threads": n}
            )
            procs.append(servers[n].proc)
        loads = {
            "small": [template(CHAT, chat_body(SMALL), [("x-session-id", "threads-{run}-{conn}")])],
            "8k": [template(CHAT, body, [("x-session-id", "threads-{run}-{conn}")]) for body in capture_bodies()],
        }
        rows: dict[tuple[int, str], list[dict[str, float]]] = {(n, load): [] for n in counts for load in loads}
        for r in range(args.rounds):
            for n in counts if r % 2 == 0 else list(reversed(counts)):
                server = servers[n]
                for load, templates in loads.items():
                    spec = {
                        "templates": templates,
                        "concurrency": 64,
                        "duration": args.seconds,
                        "warmup": 0.5,
                        "timeout": 60,
                        "vars": {"run": f"{n}-{load}-{r}"},
                    }
                    row = measured_run(gen, server, mock, spec)
                    rows[(n, load)].append(
                        {"calls_s": row["calls_s"], "chain": row["chain"] * 1e6, RUST: row.get(RUST, 0.0) * 1e6}
                    )
                    server.wait_capture_idle()

        def med(n: int, load: str, key: str) -> float:
            return statistics.median(row[key] for row in rows[(n, load)])

        print(f"c=64, {args.rounds} rounds of {args.seconds:.0f} s per load; CPU in µs per call (Switchyard's share)")
        print(
            f"{'threads':>7}  {'small calls/s':>13} {'chain':>6} {'Switchyard':>10}  {'8k calls/s':>10} "
            f"{'chain':>6} {'Switchyard':>10}  {'server threads':>14} {'RSS MiB':>8}"
        )
        for n in counts:
            proc = psutil.Process(servers[n].proc.pid)
            print(
                f"{n:>7}  {med(n, 'small', 'calls_s'):>13.0f} {med(n, 'small', 'chain'):>6.0f} "
                f"{med(n, 'small', RUST):>10.0f}  {med(n, '8k', 'calls_s'):>10.0f} {med(n, '8k', 'chain'):>6.0f} "
                f"{med(n, '8k', RUST):>10.0f}  {proc.num_threads():>14} {proc.memory_info().rss / 2**20:>8.0f}"
            )
    finally:
        for proc in reversed(procs):
            proc.stop()
        shutil.rmtree(log_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
