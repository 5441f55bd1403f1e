"""How injection's added cost grows with the context: the injection section's sessions with longer tool results.

Usage: python bench/injection_context.py [--words 50,1000,4400] [--rounds R] [--sessions S] [--tree NAME=PATH]

For each tool-result length (in mock tokens; 8-turn sessions, so the last call's prompt is about
1,100 + 7 x that many ids), the sessions of `bench/run.py --only injection` go to a capture-only
server and to injection servers with the `vllm` and `nemo_rl` transports, rounds interleaved, the
order rotating. Printed per length: the last call's prompt length (as the engine logged it), the
p50 latency of calls 2..8 on each server, and what injection adds to it, with the server's and
the mock's CPU per call. Every injected call sends the whole history's ids through Switchyard,
which parses a request body twice ("Token injection" in docs/benchmarks.md), so this shows what
that costs at the context lengths RL runs use. `--tree NAME=PATH` (repeatable) adds a `vllm`
injection server run from another source tree, side by side.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402

from bench.chain import Mock, Server, make_log_dir  # noqa: E402
from bench.injection import _rust_threads_cpu_s, _session  # noqa: E402

TURNS = 8


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/injection_context.py", description=__doc__.splitlines()[0])
    parser.add_argument("--words", default="50,1000,4400", help="tool-result lengths in mock tokens, comma-separated")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--sessions", type=int, default=5)
    parser.add_argument("--tree", action="append", default=[], help="NAME=PATH: a vllm server from another tree")
    args = parser.parse_args(argv)
    log_dir = make_log_dir()
    mock = Mock(log_dir)
    servers: dict[str, Server] = {}
    try:
        for name, settings in (
            ("capture", None),
            ("vllm", {"token_injection": True}),
            ("nemo_rl", {"token_injection": True, "injection_transport": "nemo_rl"}),
        ):
            servers[name] = Server(f"s-{name}", mock, log_dir, capture_dir=log_dir / f"cap-{name}", settings=settings)
        for spec in args.tree:
            name, _, tree = spec.partition("=")
            servers[name] = Server(
                f"s-{name}",
                mock,
                log_dir,
                capture_dir=log_dir / f"cap-{name}",
                settings={"token_injection": True},
                tree=Path(tree),
            )
        engine = mock.v1.removesuffix("/v1")
        print(f"{TURNS}-turn sessions; p50 of calls 2..{TURNS}; {args.rounds} rounds x {args.sessions} sessions a side")
        with httpx.Client(trust_env=False, timeout=120) as client:
            for words in (int(w) for w in args.words.split(",")):
                for name, server in servers.items():  # warm-up, and the last prompt's length
                    httpx.post(engine + "/mock/reset", trust_env=False)
                    _session(client, server.url, f"ctx-warm-{words}-{name}", TURNS, words)
                logged = client.get(engine + "/mock/requests").json()["requests"]
                prompt_len = len([r for r in logged if "prompt_token_ids" in r][-1]["prompt_token_ids"])
                lat: dict[str, list[float]] = {name: [] for name in servers}
                cpu = {name: 0.0 for name in servers}
                loop_cpu = {name: 0.0 for name in servers}
                rust_cpu = {name: 0.0 for name in servers}
                mock_cpu = {name: 0.0 for name in servers}
                order = list(servers)
                for r in range(args.rounds):
                    for name in order[r % len(order) :] + order[: r % len(order)]:
                        server = servers[name]
                        before, mock_before = server.proc.cpu_s(), mock.proc.cpu_s()
                        loop_before, rust_before = server.proc.main_thread_cpu_s(), _rust_threads_cpu_s(server)
                        for s in range(args.sessions):
                            lat[name] += _session(client, server.url, f"ctx-{words}-{name}-{r}-{s}", TURNS, words)[1:]
                        cpu[name] += server.proc.cpu_s() - before
                        loop_cpu[name] += server.proc.main_thread_cpu_s() - loop_before
                        rust_cpu[name] += _rust_threads_cpu_s(server) - rust_before
                        mock_cpu[name] += mock.proc.cpu_s() - mock_before
                calls = args.rounds * args.sessions * (TURNS - 1)
                p50 = {name: statistics.median(values) * 1000 for name, values in lat.items()}
                line = [
                    f"tool results {words:5d} tokens, last prompt {prompt_len:6d} ids: capture only {p50['capture']:.2f} ms"
                ]
                for name in [n for n in servers if n != "capture"]:

                    def added(kind: dict[str, float], side: str = name, n: int = calls) -> float:
                        return (kind[side] - kind["capture"]) / n * 1000

                    line.append(
                        f"{name} {p50[name] - p50['capture']:+.2f} ms (CPU per call: server {added(cpu):+.2f}, its event "
                        f"loop {added(loop_cpu):+.2f}, Switchyard {added(rust_cpu):+.2f}; mock {added(mock_cpu):+.2f})"
                    )
                print("; ".join(line), flush=True)
    finally:
        for server in servers.values():
            server.proc.stop()
        mock.proc.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
