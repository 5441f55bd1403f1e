"""Bench section `injection`: the added cost per call of token injection against capture only, on the mock.

Sequential agent sessions (a tool call per turn, the history growing) go to two servers side by
side, one with `token_injection` on and one capture-only, rounds interleaved. Every call from the
second on is injected (one `/tokenize` round trip to the mock, the chain lookup and the commit),
which the injection server's /metrics confirms; the mock's /tokenize count shows one round trip per
call (each session's messages are its own, so none is answered from the client's cache). The
server's CPU is also given for its event loop and for its Rust threads (the hosted Switchyard,
which relays the ~1,500 injected ids; granian's I/O workers are Rust threads too, alike on both
sides) (docs/benchmarks.md gives the parts of the added cost).

A third server injects through the `nemo_rl` transport (`required_prefix_token_ids`: the history
only; the mock, like NeMo-RL's worker, renders its template and splices the tail), which needs no
`/tokenize` at all: its row shows what injection costs without the round trip.

`--injection-tree NAME=PATH` adds injection servers run from other source trees, side by side
against the same capture-only server; `--mock-tree PATH` runs the mock from another tree.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench.harness import Bench
from bench.procs import Server, thread_cpu_by_role

TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
SYSTEM = "You are a coding agent. " + " ".join(["Follow the repository's conventions."] * 100)


def _task(turns: int) -> str:
    steps = " [[mock:next]] ".join(f'[[mock:tool bash {{"command": "step {i}"}}]]' for i in range(turns - 1))
    return f"fix it [[mock:reasoning]] {steps} [[mock:next]] [[mock:say done]]"


def _session(client: httpx.Client, url: str, session: str, turns: int, tool_words: int = 50) -> list[float]:
    """Latency of each call of one agent session (each tool result `tool_words` mock tokens long)."""
    # The session's name in its task makes every session's messages (and so every /tokenize request)
    # its own, as sampled rollouts are: no call of one session is answered from another's cached render.
    task = f"({session}) {_task(turns)}"
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task}]
    out = []
    for _ in range(turns):
        body = orjson.dumps({"model": "demo", "messages": messages, "tools": TOOLS})
        t0 = time.perf_counter()
        reply = client.post(
            url + "/v1/chat/completions",
            content=body,
            headers={"content-type": "application/json", "x-switchyard-session-id": session},
        )
        out.append(time.perf_counter() - t0)
        reply.raise_for_status()
        message = reply.json()["choices"][0]["message"]
        calls = message.get("tool_calls") or []
        messages.append({"role": "assistant", "content": message.get("content") or "", "tool_calls": calls or None})
        messages += [{"role": "tool", "tool_call_id": c["id"], "content": "ok " * tool_words} for c in calls]
    return out


def _injected_calls(server: Server) -> int:
    text = httpx.get(server.url + "/metrics", trust_env=False, timeout=10).text
    total = 0
    for line in text.splitlines():
        if line.startswith("switchyard_model_injection_calls_total") and 'outcome="injected"' in line:
            total += int(float(line.rsplit(" ", 1)[1]))
    return total


def _injection_server(bench: Any, name: str, tree: Path | None, transport: str = "vllm") -> Server:
    server = Server(
        name,
        bench.mock,
        bench.log_dir,
        capture_dir=bench.log_dir / f"captures-{name}",
        settings={"token_injection": True, "injection_transport": transport},
        tree=tree,
    )
    bench.procs.append(server.proc)
    return server


def _tokenizes(bench: Any) -> int:
    return int(
        httpx.get(bench.mock.v1.removesuffix("/v1") + "/mock/stats", trust_env=False, timeout=10).json()["tokenize"]
    )


def _rust_threads_cpu_s(server: Server) -> float:
    """CPU of the server's Rust threads: the hosted Switchyard (and granian's I/O workers)."""

    return sum(seconds for role, seconds in thread_cpu_by_role(server.proc.pid).values() if role == "Rust workers")


def injection(bench: Bench) -> None:
    bench.log("injection on vs capture only: sequential agent sessions")
    sides: dict[str, Server] = {
        "capture": bench.cap,
        "injection": _injection_server(bench, "server-injection", None),
        # NeMo-RL's transport: the engine splices its template after the history, so no /tokenize at all.
        "injection:nemo_rl": _injection_server(bench, "server-injection-nemo-rl", None, "nemo_rl"),
    }
    for spec in bench.injection_trees:  # A/B: the same figures for other source trees, side by side
        name, _, tree = spec.partition("=")
        sides[f"injection:{name}"] = _injection_server(bench, f"server-injection-{name}", Path(tree))
    rounds, sessions, turns = (2, 4, 6) if bench.quick else (6, 10, 8)
    lat: dict[str, list[float]] = {name: [] for name in sides}
    cpu: dict[str, float] = {name: 0.0 for name in sides}
    mock_cpu: dict[str, float] = {name: 0.0 for name in sides}
    tokenizes: dict[str, int] = {name: 0 for name in sides}
    loop_cpu: dict[str, float] = {name: 0.0 for name in sides}  # the server's event-loop thread alone
    rust_cpu: dict[str, float] = {name: 0.0 for name in sides}  # its Rust threads (Switchyard relays the ids)
    with httpx.Client(trust_env=False, timeout=60) as client:
        for name, server in sides.items():  # warm-up: first connections, lazy imports, the template's generation prompt
            _session(client, server.url, f"bench-inj-warm-{name}", turns)
        order = list(sides)
        for r in range(rounds):
            rotated = order[r % len(order) :] + order[: r % len(order)]  # each side goes first in turn
            for name in rotated if r % 2 == 0 else reversed(rotated):
                server = sides[name]
                before, mock_before, tokenize_before = server.proc.cpu_s(), bench.mock.proc.cpu_s(), _tokenizes(bench)
                loop_before, rust_before = server.proc.main_thread_cpu_s(), _rust_threads_cpu_s(server)
                for s in range(sessions):
                    # Calls after the first of each session: the ones injection works on.
                    lat[name] += _session(client, server.url, f"bench-inj-{name}-{r}-{s}", turns)[1:]
                cpu[name] += server.proc.cpu_s() - before
                mock_cpu[name] += bench.mock.proc.cpu_s() - mock_before
                tokenizes[name] += _tokenizes(bench) - tokenize_before
                loop_cpu[name] += server.proc.main_thread_cpu_s() - loop_before
                rust_cpu[name] += _rust_threads_cpu_s(server) - rust_before
    calls = rounds * sessions * (turns - 1)
    p50 = {name: statistics.median(values) for name, values in lat.items()}
    data: dict[str, Any] = {
        "calls_per_side": calls,
        "p50_ms": {k: round(v * 1000, 3) for k, v in p50.items()},
        "p90_ms": {k: round(statistics.quantiles(v, n=10)[-1] * 1000, 3) for k, v in lat.items()},
        "server_cpu_ms_per_call": {k: round(v / calls * 1000, 3) for k, v in cpu.items()},
        "event_loop_cpu_ms_per_call": {k: round(v / calls * 1000, 3) for k, v in loop_cpu.items()},
        "rust_threads_cpu_ms_per_call": {k: round(v / calls * 1000, 3) for k, v in rust_cpu.items()},
        "mock_cpu_ms_per_call": {k: round(v / calls * 1000, 3) for k, v in mock_cpu.items()},
        # Sessions of `turns` calls, calls 2.. timed: every call of a session asks /tokenize once.
        "tokenize_per_call": {k: round(v / (rounds * sessions * turns), 3) for k, v in tokenizes.items()},
    }
    for name, server in sides.items():
        if name == "capture":
            continue
        added = p50[name] - p50["capture"]
        cpu_added = (cpu[name] - cpu["capture"]) / calls
        mock_added = (mock_cpu[name] - mock_cpu["capture"]) / calls
        loop_added = (loop_cpu[name] - loop_cpu["capture"]) / calls
        rust_added = (rust_cpu[name] - rust_cpu["capture"]) / calls
        injected = _injected_calls(server)
        key = "" if name == "injection" else name.partition(":")[2]
        data.update(
            {
                f"added_p50_ms{'_' + key if key else ''}": round(added * 1000, 3),
                f"added_server_cpu_ms_per_call{'_' + key if key else ''}": round(cpu_added * 1000, 3),
                f"added_mock_cpu_ms_per_call{'_' + key if key else ''}": round(mock_added * 1000, 3),
                f"added_event_loop_cpu_ms_per_call{'_' + key if key else ''}": round(loop_added * 1000, 3),
                f"added_rust_threads_cpu_ms_per_call{'_' + key if key else ''}": round(rust_added * 1000, 3),
                f"injected_calls{'_' + key if key else ''}": injected,
            }
        )
        bench.row(
            "injection" if not key else f"injection ({key})",
            f"latency per call, p50 (sequential sessions, {turns} turns, calls 2..{turns})",
            f"capture only {p50['capture'] * 1000:.2f} ms",
            f"injection {p50[name] * 1000:.2f} ms",
            f"{added * 1000:+.2f} ms; CPU per call: server {cpu_added * 1000:+.2f} ms (event loop {loop_added * 1000:+.2f}, "
            f"Switchyard's Rust threads {rust_added * 1000:+.2f}), "
            f"mock {mock_added * 1000:+.2f} ms; "
            f"{injected} calls injected, {tokenizes[name] / (rounds * sessions * turns):.2f} /tokenize per call",
            "<= 1 ms added",
            "met" if added <= 0.001 and injected >= calls else "NOT MET",
        )
    bench.data["injection"] = data
