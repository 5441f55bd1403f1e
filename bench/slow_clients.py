"""Slow clients against admission: N connections trickle request bodies while `/health` and fresh calls are timed.

Usage: python bench/slow_clients.py [--clients 4000] [--hold 20] [--body-timeout 30] [--connections N]

Starts the mock engine and this server (hosted Switchyard, defaults but `request_body_timeout_s`),
opens N connections that each send a chat request's head announcing a 1,000-byte body and then
one byte a second, and, while they hold, times `/health` and a fresh chat call every 0.25 s, each on
a new connection. Then it waits for the tricklers' answers (408 at the body deadline). Target:
4,000 tricklers leave `/health` and a fresh call answering within 1 s. `--connections 2048` gives
the server the connection count granian had before admission (its backpressure default), the
state in which ~2,100 tricklers timed out every other request.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import httpx  # noqa: E402

from bench.loadgen import raise_fd_limit  # noqa: E402
from bench.procs import Mock, Server, make_log_dir  # noqa: E402
from bench.stats import pct  # noqa: E402

PROBE_EVERY_S = 0.25
PROBE_TIMEOUT_S = 10.0


async def _trickle(port: int, n: int, answers: list[bytes], opened: list[int], stop: threading.Event) -> None:
    async def one() -> None:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError as exc:
            answers.append(f"(connect failed: {exc})".encode())
            return
        writer.write(
            f"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\ncontent-type: application/json\r\n"
            "content-length: 1000\r\n\r\n{".encode()
        )
        opened[0] += 1
        reply = asyncio.ensure_future(reader.readline())
        try:
            while not reply.done() and not stop.is_set():
                await asyncio.wait([reply], timeout=1.0)
                if not reply.done():
                    writer.write(b" ")
                    await writer.drain()
            answers.append(reply.result() if reply.done() else b"(stopped)")
        except (ConnectionError, OSError):
            answers.append(b"(connection lost)")
        finally:
            reply.cancel()
            writer.close()

    # Opened over about a second, as a crowd would arrive, not in one burst into the listen backlog.
    tasks = []
    for i in range(n):
        tasks.append(asyncio.ensure_future(one()))
        if i % 100 == 99:
            await asyncio.sleep(0.025)
    await asyncio.gather(*tasks, return_exceptions=True)


def _probe(url: str, health: list[float], fresh: list[float], stop: threading.Event) -> None:
    body = {"model": "demo", "messages": [{"role": "user", "content": "fresh call [[mock:tokens 4]]"}]}
    # A new connection for every probe (none kept alive), from one client (a client per probe would
    # time its own TLS context's making).
    limits = httpx.Limits(max_keepalive_connections=0)
    with httpx.Client(timeout=PROBE_TIMEOUT_S, trust_env=False, limits=limits) as client:
        while not stop.wait(PROBE_EVERY_S):
            for kind, out in (("health", health), ("fresh", fresh)):
                t0 = time.perf_counter()
                try:
                    if kind == "health":
                        ok = client.get(url + "/health").status_code == 200
                    else:
                        ok = client.post(url + "/v1/chat/completions", json=body).status_code == 200
                except httpx.HTTPError:
                    ok = False
                out.append(time.perf_counter() - t0 if ok else float("inf"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/slow_clients.py", description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=4000)
    parser.add_argument("--hold", type=float, default=20.0, help="seconds of probing while the tricklers hold")
    parser.add_argument("--body-timeout", type=float, default=30.0, help="the server's request_body_timeout_s")
    parser.add_argument("--connections", type=int, help="the server's max_connections_per_worker (default: derived)")
    args = parser.parse_args(argv)
    raise_fd_limit()
    log_dir = make_log_dir()
    mock = Mock(log_dir)
    settings: dict[str, object] = {"request_body_timeout_s": args.body_timeout}
    if args.connections:
        settings["max_connections_per_worker"] = args.connections
    server = Server("server-slow-clients", mock, log_dir, capture_dir=log_dir / "captures", settings=settings)
    answers: list[bytes] = []
    opened = [0]
    stop_trickle, stop_probe = threading.Event(), threading.Event()
    health: list[float] = []
    fresh: list[float] = []
    trickler = threading.Thread(
        target=lambda: asyncio.run(_trickle(server.port, args.clients, answers, opened, stop_trickle)), daemon=True
    )
    try:
        trickler.start()
        started = time.monotonic()
        while opened[0] < args.clients and time.monotonic() - started < 30:
            time.sleep(0.1)
        probe = threading.Thread(target=_probe, args=(server.url, health, fresh, stop_probe), daemon=True)
        probe.start()
        time.sleep(args.hold)
        stop_probe.set()
        probe.join(PROBE_TIMEOUT_S * 2 + 5)
        held = args.clients - len(answers)
        trickler.join(args.body_timeout + 30)
        stop_trickle.set()
        trickler.join(10)
        admission = server.health().get("admission", {})
    finally:
        server.proc.stop()
        mock.proc.stop()
    statuses: dict[str, int] = {}
    for line in answers:
        key = line.split(b" ", 2)[1].decode() if line.startswith(b"HTTP/1.1 ") else line.decode(errors="replace")
        statuses[key] = statuses.get(key, 0) + 1

    def fmt(values: list[float]) -> str:
        failed = sum(1 for v in values if v == float("inf"))
        done = [v for v in values if v != float("inf")]
        return (
            f"{len(values)} probes, {failed} failed or over {PROBE_TIMEOUT_S:g} s; "
            f"p50 {pct(done, 0.5) * 1000:.0f} ms, p99 {pct(done, 0.99) * 1000:.0f} ms, max {max(done, default=0) * 1000:.0f} ms"
        )

    print(f"{args.clients} trickling clients ({opened[0]} opened), {held} still held when probing ended")
    print(f"/health:    {fmt(health)}")
    print(f"fresh call: {fmt(fresh)}")
    print(f"tricklers' answers: {statuses}; server's admission counters: {admission}")
    within = all(v <= 1.0 for v in health + fresh) and health and fresh
    print(f"target (/health and a fresh call within 1 s throughout): {'met' if within else 'NOT met'}")
    return 0 if within else 1


if __name__ == "__main__":
    sys.exit(main())
