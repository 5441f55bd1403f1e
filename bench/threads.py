"""Where the stack's CPU goes per call, by process and by thread, for each c=64 load of the open targets.

Usage: python bench/threads.py [--seconds S] [--capture-root DIR]

One stack (the mock, this server hosting Switchyard, the load generator); each load runs for S seconds
at concurrency 64 and prints the CPU per call of: the server's event loop (its main thread), its other
Python-started threads together (the capture writer and committer, the response store, granian's I/O
thread), its Rust workers (`tokio-rt-worker`: the hosted Switchyard), the mock, and the load generator.
The direct loads go straight to the hosted Switchyard, asking for the token fields capture asks for.
`--capture-root /dev/shm` puts the capture folder on a RAM filesystem, to take the disk's file
creation out (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.calls import (  # noqa: E402
    CHAT,
    CHAT_TOKEN_MARK,
    RESPONSES,
    SMALL,
    chat_body,
    responses_body,
    template,
)
from bench.procs import LoadGen, Mock, Server, make_log_dir, thread_cpu_by_role  # noqa: E402

STREAM = "Explain the plan step by step. [[mock:tokens 32]]"


def loads(server: Server) -> list[tuple[str, int, dict]]:
    session = [("x-session-id", "threads-{conn}-{seq}")]
    stream = {"stream": True, "marker": CHAT_TOKEN_MARK}
    return [
        ("direct chat", server.proxy_port, {"templates": [template(CHAT, chat_body(SMALL))]}),
        ("chat", server.port, {"templates": [template(CHAT, chat_body(SMALL))]}),
        ("Responses (stored)", server.port, {"templates": [template(RESPONSES, responses_body(SMALL))]}),
        (
            "direct chat streams",
            server.proxy_port,
            {"templates": [template(CHAT, chat_body(STREAM, stream=True, token_fields=True))], **stream},
        ),
        (
            "chat streams, uncaptured",
            server.port,
            {"templates": [template(CHAT, chat_body(STREAM, stream=True))], **stream},
        ),
        (
            "chat streams, captured",
            server.port,
            {"templates": [template(CHAT, chat_body(STREAM, stream=True), session)], **stream},
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/threads.py", description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--capture-root", help="where the capture folder goes (default: the log folder)")
    args = parser.parse_args(argv)
    log_dir = make_log_dir()
    capture_dir = Path(tempfile.mkdtemp(prefix="threads-", dir=args.capture_root or log_dir))
    gen = LoadGen(log_dir)
    procs = [gen.proc]
    try:
        mock = Mock(log_dir)
        procs.append(mock.proc)
        server = Server("server", mock, log_dir, capture_dir=capture_dir)
        procs.append(server.proc)
        print(f"c=64, {args.seconds:.0f} s per load; capture folder {capture_dir}; CPU in µs per call")
        print(
            f"{'load':<26} {'calls/s':>7} {'loop':>6} {'other':>6} {'Rust':>6} {'mock':>6} {'loadgen':>7} {'total':>6}"
        )
        for name, port, load in loads(server):
            spec = {"port": port, "concurrency": 64, "timeout": 60, **load}
            gen.run({**spec, "count": 300})  # warm: first connections, lazy imports
            before, mock0, gen0 = thread_cpu_by_role(server.proc.pid), mock.proc.cpu_s(), gen.proc.cpu_s()
            result = gen.run({**spec, "duration": args.seconds, "warmup": 0.5})
            after = thread_cpu_by_role(server.proc.pid)
            calls = max(1, result["ok"])
            roles = {"event loop": 0.0, "other threads": 0.0, "Rust workers": 0.0}
            for tid, (role, cpu) in after.items():
                roles[role] += cpu - before.get(tid, (role, 0.0))[1]
            figures = [*roles.values(), mock.proc.cpu_s() - mock0, gen.proc.cpu_s() - gen0]
            per_call = [f / calls * 1e6 for f in figures]
            print(
                f"{name:<26} {result['throughput']:>7.0f} "
                + " ".join(f"{x:>6.0f}" for x in per_call[:4])
                + f" {per_call[4]:>7.0f} {sum(per_call):>6.0f}"
                + (f"  errors {result['errors']}" if result["errors"] else "")
            )
    finally:
        for proc in reversed(procs):
            try:
                gen.stop() if proc is gen.proc else proc.stop()
            except Exception as exc:  # keep stopping the others
                print(f"stopping {proc.name}: {exc}", file=sys.stderr)
        shutil.rmtree(log_dir, ignore_errors=True)
        shutil.rmtree(capture_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
