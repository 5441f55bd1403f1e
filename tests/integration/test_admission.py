"""Slow and surplus clients through a real server: bodies have a deadline, calls beyond a worker's limit get a fast 503.

Clients that send a request head and then trickle its body hold a connection each and no call
place: while they hold, `/health` and a fresh call still answer, and each trickler gets a 408 at the
body deadline. The negative control gives the server fewer connections than tricklers: `/health`
then waits behind them until the deadline frees some, which is what the real test would see
without room for others. Calls beyond `max_calls_in_flight` get a 503 with `Retry-After` in their
API's error shape, at once, and the places come back when calls end.
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import httpx

from tests.support.procs import start_attached, wait_for

TRICKLERS = 64
BODY_DEADLINE_S = 5


class Tricklers:
    """`n` connections that each send a chat request's head (a 1,000-byte body announced), then one
    body byte every 0.5 s; each records the status line it gets back and when (in a thread of its own)."""

    def __init__(self, url: str, n: int) -> None:
        parts = urlsplit(url)
        self.host, self.port, self.n = parts.hostname or "127.0.0.1", parts.port or 80, n
        self.answers: list[tuple[float, bytes]] = []
        self.connected = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self._thread.start()

    async def _one(self, opened: list[int]) -> None:
        reader, writer = await asyncio.open_connection(self.host, self.port)
        head = (
            "POST /v1/chat/completions HTTP/1.1\r\n"
            f"host: {self.host}:{self.port}\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{{"
        )
        writer.write(head.encode())
        opened[0] += 1
        if opened[0] == self.n:
            self.connected.set()
        reply = asyncio.ensure_future(reader.readline())
        try:
            while not reply.done() and not self._stop.is_set():
                await asyncio.wait([reply], timeout=0.5)
                if not reply.done():
                    writer.write(b" ")
                    await writer.drain()
            if reply.done():
                self.answers.append((time.monotonic(), reply.result()))
        except (ConnectionError, OSError):
            self.answers.append((time.monotonic(), b"(connection lost)"))
        finally:
            reply.cancel()
            writer.close()

    async def _run(self) -> None:
        opened = [0]
        await asyncio.gather(*(self._one(opened) for _ in range(self.n)), return_exceptions=True)

    def wait_answered(self, timeout: float) -> bool:
        return bool(wait_for(lambda: len(self.answers) == self.n, timeout=timeout, interval=0.1))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


def chat(url: str, content: str = "quick", timeout: float = 30.0, **kw) -> httpx.Response:
    return httpx.post(
        url + "/v1/chat/completions",
        json={"model": "x", "messages": [{"role": "user", "content": content}], **kw},
        timeout=timeout,
    )


def test_trickling_bodies_leave_health_and_fresh_calls_answering_then_get_408(mock_upstream, tmp_path):
    # Fewer call places than tricklers: a trickler holds a connection, never a call's place.
    proc, url = start_attached(tmp_path, mock_upstream, request_body_timeout_s=BODY_DEADLINE_S, max_calls_in_flight=16)
    tricklers = Tricklers(url, TRICKLERS)
    try:
        assert tricklers.connected.wait(20)
        time.sleep(0.5)  # their heads are in; the server is reading their bodies
        health = httpx.get(url + "/health", timeout=30)
        fresh = chat(url)
        held = len(tricklers.answers)
        assert health.status_code == 200
        assert fresh.status_code == 200, fresh.text
        assert held == 0, "the tricklers were answered before /health and the fresh call: nothing was held"
        assert tricklers.wait_answered(BODY_DEADLINE_S + 30)
        statuses = {line.split(b" ", 2)[1] for _, line in tricklers.answers if line.startswith(b"HTTP/1.1")}
        assert statuses == {b"408"}, tricklers.answers[:5]
        admission = httpx.get(url + "/health", timeout=30).json()["admission"]
        assert admission["body_timeouts"] == TRICKLERS
        assert admission["calls_in_flight"] == 0
    finally:
        tricklers.stop()
        proc.stop()


def test_negative_control_without_room_for_others_health_waits_for_the_deadline(mock_upstream, tmp_path):
    # Fewer connections than tricklers: /health queues behind them until deadlines free connections.
    proc, url = start_attached(
        tmp_path, mock_upstream, request_body_timeout_s=BODY_DEADLINE_S, max_connections_per_worker=TRICKLERS // 2
    )
    tricklers = Tricklers(url, TRICKLERS)
    try:
        assert tricklers.connected.wait(20)
        time.sleep(0.5)
        health = httpx.get(url + "/health", timeout=BODY_DEADLINE_S * 4 + 30)
        assert health.status_code == 200
        assert tricklers.answers, "/health answered while every connection was held: the control shows nothing"
    finally:
        tricklers.stop()
        proc.stop()


def test_calls_beyond_the_limit_get_a_fast_503_with_retry_after(mock_upstream, tmp_path):
    proc, url = start_attached(tmp_path, mock_upstream, max_calls_in_flight=3)
    try:
        with ThreadPoolExecutor(3) as pool:
            held = [pool.submit(chat, url, "hold [[mock:sleep 6000]]", 60) for _ in range(3)]
            assert wait_for(
                lambda: httpx.get(url + "/health", timeout=30).json()["admission"]["calls_in_flight"] == 3, timeout=30
            )
            refused = chat(url)
            assert refused.status_code == 503, refused.text
            assert refused.headers["retry-after"] == "1"
            assert refused.json()["error"]["code"] == "server_overloaded"
            assert set(refused.json()["error"]) == {"message", "type", "param", "code"}
            messages = httpx.post(
                url + "/v1/messages",
                json={"model": "x", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]},
                timeout=30,
            )
            assert messages.status_code == 503
            assert messages.headers["retry-after"] == "1"
            assert messages.json()["type"] == "error"
            assert messages.json()["error"]["type"] == "overloaded_error"
            health = httpx.get(url + "/health", timeout=30)
            assert health.status_code == 200
            assert health.json()["admission"]["refused_calls"] == 2
            assert [f.result().status_code for f in held] == [200, 200, 200]
        # The places come back when calls end.
        assert chat(url).status_code == 200
        assert httpx.get(url + "/health", timeout=30).json()["admission"]["calls_in_flight"] == 0
    finally:
        proc.stop()
