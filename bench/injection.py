"""Bench section `injection`: the added cost per call of token injection against capture only, on the mock.

Sequential agent sessions (a tool call per turn, the history growing) go to two servers side by
side, one with `token_injection` on and one capture-only, rounds interleaved. Every call from the
second on is injected (one `/tokenize` round trip to the mock, the chain lookup and the commit),
which the injection server's /metrics confirms.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import httpx
import orjson

from bench.chain import Server

TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
SYSTEM = "You are a coding agent. " + " ".join(["Follow the repository's conventions."] * 100)


def _task(turns: int) -> str:
    steps = " [[mock:next]] ".join(f'[[mock:tool bash {{"command": "step {i}"}}]]' for i in range(turns - 1))
    return f"fix it [[mock:reasoning]] {steps} [[mock:next]] [[mock:say done]]"


def _session(client: httpx.Client, url: str, session: str, turns: int) -> list[float]:
    """Latency of each call of one agent session."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": _task(turns)}]
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
        messages += [{"role": "tool", "tool_call_id": c["id"], "content": "ok " * 50} for c in calls]
    return out


def _injected_calls(server: Server) -> int:
    text = httpx.get(server.url + "/metrics", trust_env=False, timeout=10).text
    total = 0
    for line in text.splitlines():
        if line.startswith("switchyard_model_injection_calls_total") and 'outcome="injected"' in line:
            total += int(float(line.rsplit(" ", 1)[1]))
    return total


def run(bench: Any) -> None:
    bench.log("injection on vs capture only: sequential agent sessions")
    inj = Server(
        "server-injection",
        bench.mock,
        bench.log_dir,
        capture_dir=bench.log_dir / "captures-injection",
        settings={"token_injection": True},
    )
    bench.procs.append(inj.proc)
    rounds, sessions, turns = (2, 4, 6) if bench.quick else (6, 10, 8)
    sides = {"capture": bench.cap, "injection": inj}
    lat: dict[str, list[float]] = {name: [] for name in sides}
    cpu: dict[str, float] = {name: 0.0 for name in sides}
    with httpx.Client(trust_env=False, timeout=60) as client:
        for name, server in sides.items():  # warm-up: first connections, lazy imports, the template's generation prompt
            _session(client, server.url, f"bench-inj-warm-{name}", turns)
        for r in range(rounds):
            for name in sides if r % 2 == 0 else reversed(list(sides)):
                server = sides[name]
                before = server.proc.cpu_s()
                for s in range(sessions):
                    # Calls after the first of each session: the ones injection works on.
                    lat[name] += _session(client, server.url, f"bench-inj-{name}-{r}-{s}", turns)[1:]
                cpu[name] += server.proc.cpu_s() - before
    calls = rounds * sessions * (turns - 1)
    p50 = {name: statistics.median(values) for name, values in lat.items()}
    added = p50["injection"] - p50["capture"]
    cpu_added = (cpu["injection"] - cpu["capture"]) / calls
    injected = _injected_calls(inj)
    bench.data["injection"] = {
        "calls_per_side": calls,
        "p50_ms": {k: round(v * 1000, 3) for k, v in p50.items()},
        "p90_ms": {k: round(statistics.quantiles(v, n=10)[-1] * 1000, 3) for k, v in lat.items()},
        "added_p50_ms": round(added * 1000, 3),
        "added_server_cpu_ms_per_call": round(cpu_added * 1000, 3),
        "injected_calls": injected,
    }
    bench.row(
        "injection",
        f"latency per call, p50 (sequential sessions, {turns} turns, calls 2..{turns})",
        f"capture only {p50['capture'] * 1000:.2f} ms",
        f"injection {p50['injection'] * 1000:.2f} ms",
        f"+{added * 1000:.2f} ms; server CPU +{cpu_added * 1000:.2f} ms/call; {injected} calls injected",
        "<= 1 ms added",
        "met" if added <= 0.001 and injected >= calls else "NOT MET",
    )
