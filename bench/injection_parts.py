"""The parts of an injected call's added cost, each measured alone: the /tokenize round trip, and the
~1,500 injected ids through the mock and through the hosted Switchyard.

Usage: python bench/injection_parts.py [--rounds R] [--calls N]

One injection server runs one agent session (bench/injection.py's) so that the mock has logged a
real injected chat request and its /tokenize request. Those bodies are then sent again and again
from this process over one kept-alive connection (this server's own HTTP/1.1 client), each series
N times a round, rounds interleaved, and the figures are medians over rounds:

- `/tokenize` to the mock: the round trip injection adds (p50, and the mock's CPU per request);
- the chat request with and without the ids, straight to the mock: what the larger body costs the
  engine stand-in;
- the same two straight to the server's hosted Switchyard (its port, not this server's), plus the
  same ids in an unknown field and the same bytes as one JSON string: Switchyard's CPU per call
  (its `tokio-rt-worker` threads), and whether that cost follows the ids' count or their bytes.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402
import orjson  # noqa: E402

from bench.chain import Mock, Server, make_log_dir  # noqa: E402
from bench.injection import _session  # noqa: E402
from bench.threads import thread_cpu_by_role  # noqa: E402
from server.upstream import http1  # noqa: E402


def _logged_bodies(mock: Mock, server: Server) -> tuple[dict[str, Any], dict[str, Any]]:
    """The last injected chat request and the last /tokenize request the mock saw."""
    with httpx.Client(trust_env=False, timeout=60) as client:
        _session(client, server.url, "parts", 8)
        logged = client.get(mock.v1.removesuffix("/v1") + "/mock/requests").json()["requests"]
    chat = [r["body"] for r in logged if r["path"] == "/v1/chat/completions"][-1]
    tokenize = [r["body"] for r in logged if r["path"] == "/tokenize"][-1]
    if "kv_transfer_params" not in chat:
        raise SystemExit("the session's last call was not injected")
    return chat, tokenize


def _cpu(mock: Mock, server: Server) -> dict[str, float]:
    out = {"mock": mock.proc.cpu_s(), "Switchyard": 0.0}
    for role, seconds in thread_cpu_by_role(server.proc.pid).values():
        if role == "Rust workers":
            out["Switchyard"] += seconds
    return out


async def _series(
    base: str, path: str, payload: bytes, calls: int, mock: Mock, server: Server
) -> tuple[float, dict[str, float]]:
    """p50 seconds and CPU seconds per call (mock, Switchyard) of `calls` sequential POSTs."""
    pool = http1.Pool(
        base, connect_timeout=5, read_timeout=30, max_connections=1, headers={"content-type": "application/json"}
    )
    try:
        status, _, answer = await pool.fetch(path, payload, {}, 30)  # the connection, and a check
        if status != 200:
            raise SystemExit(f"{base}{path} answered {status}: {answer[:300]!r}")
        before, latencies = _cpu(mock, server), []
        for _ in range(calls):
            t0 = time.perf_counter()
            await pool.fetch(path, payload, {}, 30)
            latencies.append(time.perf_counter() - t0)
        after = _cpu(mock, server)
    finally:
        pool.close()
    return statistics.median(latencies), {k: (after[k] - before[k]) / calls for k in after}


async def _measure(mock: Mock, server: Server, rounds: int, calls: int) -> None:
    chat, tokenize = _logged_bodies(mock, server)
    ids = chat["kv_transfer_params"]["prompt_token_ids"]
    plain = {k: v for k, v in chat.items() if k != "kv_transfer_params"}
    routed = {**plain, "model": "demo"}  # Switchyard routes by the route's name; the mock saw the target's
    engine, switchyard = mock.v1.removesuffix("/v1"), server.proxy_url
    series = {
        "/tokenize -> mock": (engine, "/tokenize", tokenize),
        "chat, no ids -> mock": (engine, "/v1/chat/completions", plain),
        "chat, ids -> mock": (engine, "/v1/chat/completions", chat),
        "chat, no ids -> Switchyard": (switchyard, "/v1/chat/completions", routed),
        "chat, ids -> Switchyard": (switchyard, "/v1/chat/completions", {**chat, "model": "demo"}),
        "chat, ids in an unknown field -> Switchyard": (switchyard, "/v1/chat/completions", {**routed, "x_ids": ids}),
        "chat, ids as one string -> Switchyard": (
            switchyard,
            "/v1/chat/completions",
            {**routed, "x_ids": orjson.dumps(ids).decode()},
        ),
    }
    print(
        f"{len(ids)} injected ids; chat body {len(orjson.dumps(plain))} B without them, {len(orjson.dumps(chat))} B with"
    )
    results: dict[str, list[tuple[float, dict[str, float]]]] = {name: [] for name in series}
    for r in range(rounds):
        names = list(series) if r % 2 == 0 else list(reversed(series))
        for name in names:
            base, path, body = series[name]
            results[name].append(await _series(base, path, orjson.dumps(body), calls, mock, server))
    print(
        f"{'series':46s} {'p50':>9s} {'mock CPU':>10s} {'Switchyard CPU':>15s}  (per call, median of {rounds} rounds)"
    )
    for name, rows in results.items():
        p50 = statistics.median(row[0] for row in rows) * 1e3
        mock_us = statistics.median(row[1]["mock"] for row in rows) * 1e6
        switchyard_us = statistics.median(row[1]["Switchyard"] for row in rows) * 1e6
        print(f"{name:46s} {p50:7.3f} ms {mock_us:7.0f} µs {switchyard_us:12.0f} µs")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--calls", type=int, default=400, help="calls per series per round")
    args = parser.parse_args()
    log_dir = make_log_dir()
    mock = Mock(log_dir)
    server = Server(
        "server-injection", mock, log_dir, capture_dir=log_dir / "captures", settings={"token_injection": True}
    )
    try:
        asyncio.run(_measure(mock, server, args.rounds, args.calls))
    finally:
        server.proc.stop()
        mock.proc.stop()


if __name__ == "__main__":
    main()
