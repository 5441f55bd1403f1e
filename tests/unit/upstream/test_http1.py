"""The lean HTTP/1.1 client against raw loopback servers: framing, pooling, retries and failures."""

from __future__ import annotations

import asyncio
import gc

import pytest

from server.upstream import http1
from tests.support.raw_http import RawServer, fixed
from tests.support.tcp import NaglingStreamServer, delayed_acks


def pool(port: int, **kw) -> http1.Pool:
    return http1.Pool(
        f"http://127.0.0.1:{port}/v1",
        connect_timeout=kw.pop("connect_timeout", 2.0),
        read_timeout=kw.pop("read_timeout", 2.0),
        max_connections=kw.pop("max_connections", 8),
        headers={"authorization": "Bearer k"},
        **kw,
    )


def hang_up_on_the_second_request():
    """A reply function for RawServer: `{}`, except that the second request's connection is closed
    unanswered (a kept-alive connection that dies just as it is reused)."""
    calls = 0

    async def reply(request):
        nonlocal calls
        calls += 1
        return None if calls == 2 else fixed(b"{}")

    return reply


def run(coro):
    return asyncio.run(coro)


def test_fixed_length_answers_reuse_one_kept_alive_connection():
    async def scenario():
        async def reply(request):
            return fixed(b'{"ok": true}')

        async with RawServer(reply) as server:
            client = pool(server.port)
            for _ in range(3):
                response = await client.request("/chat/completions", b'{"a": 1}', {"x-request-id": "r1"})
                assert response.status_code == 200 and response.headers["content-type"] == "application/json"
                assert await response.read() == b'{"ok": true}'
            assert server.connections == 1
            first = server.requests[0]
            assert first.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
            assert b"authorization: Bearer k\r\n" in first and b"x-request-id: r1\r\n" in first
            assert first.endswith(b'\r\n\r\n{"a": 1}')
            client.close()

    run(scenario())


def test_chunked_stream_arrives_chunk_by_chunk():
    async def scenario():
        release = asyncio.Event()

        async def reply(request):
            return None

        async with RawServer(reply) as server:
            # A server that sends the head and first chunk, waits, then the rest.
            async def streaming(reader, writer):
                await reader.readuntil(b"\r\n\r\n")
                writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n")
                await writer.drain()
                await release.wait()
                writer.write(b"6\r\nsecond\r\n0\r\n\r\n")
                await writer.drain()
                writer.close()

            server.server.close()
            stream_server = await asyncio.start_server(streaming, "127.0.0.1", 0)
            client = pool(stream_server.sockets[0].getsockname()[1])
            response = await client.request("/chat/completions", b"{}", {})
            chunks = response.iter_raw()
            assert await chunks.__anext__() == b"first"  # before the rest was even sent
            release.set()
            assert [c async for c in chunks] == [b"second"]
            stream_server.close()

    run(scenario())


def test_chunks_that_arrived_together_are_read_as_one_piece():
    # Switchyard writes one HTTP chunk per SSE event; those already in when the reader looks are
    # handed over joined, so a relay sends them as one write.
    async def scenario():
        release = asyncio.Event()

        async def streaming(reader, writer):
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n6\r\nsecond\r\n")
            await writer.drain()
            await release.wait()
            writer.write(b"5\r\nthird\r\n0\r\n\r\n")
            await writer.drain()
            writer.close()

        stream_server = await asyncio.start_server(streaming, "127.0.0.1", 0)
        client = pool(stream_server.sockets[0].getsockname()[1])
        response = await client.request("/chat/completions", b"{}", {})
        chunks = response.iter_raw()
        # One write, so one read: the parser delivers both chunks before the reader resumes.
        assert await chunks.__anext__() == b"firstsecond"
        release.set()
        assert [c async for c in chunks] == [b"third"]
        stream_server.close()

    run(scenario())


def test_a_stale_kept_alive_connection_is_retried_once_on_a_new_one():
    async def scenario():
        async with RawServer(hang_up_on_the_second_request()) as server:
            client = pool(server.port)
            assert (await (await client.request("/x", b"{}", {})).read()) == b"{}"
            assert (await (await client.request("/x", b"{}", {})).read()) == b"{}"
            assert server.connections == 2 and len(server.requests) == 3

    run(scenario())


def test_failures_map_to_their_errors():
    async def scenario():
        async def silent(request):
            await asyncio.sleep(5)
            return fixed(b"{}")

        async with RawServer(silent) as server:
            with pytest.raises(http1.TimeoutError_):
                await pool(server.port, read_timeout=0.2).request("/x", b"{}", {})

        async def cut(request):
            return b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\npartial"

        async with RawServer(cut) as server:
            response = await pool(server.port).request("/x", b"{}", {"connection": "close"})
            with pytest.raises(http1.ProtocolError):
                await response.read()

        async with RawServer(silent) as server:
            port = server.port
        with pytest.raises(http1.ConnectError):  # nothing listens there any more
            await pool(port).request("/x", b"{}", {})

    run(scenario())


def test_header_injection_is_refused():
    with pytest.raises(ValueError, match="line break"):
        http1.Pool(
            "http://127.0.0.1:1",
            connect_timeout=1,
            read_timeout=1,
            max_connections=1,
            headers={"x-bad": "a\r\ninjected: 1"},
        )
    with pytest.raises(ValueError, match="plain http"):
        http1.Pool("https://example.invalid", connect_timeout=1, read_timeout=1, max_connections=1, headers={})


async def within(awaitable, seconds: float = 10.0):
    """A generous bound, so a regression fails the test instead of hanging the suite."""
    return await asyncio.wait_for(awaitable, seconds)


class HeldServer:
    """Replies to the first request only when `release` is set; every later one at once."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.arrived = asyncio.Condition()
        self.count = 0

    async def reply(self, request: bytes) -> bytes:
        async with self.arrived:
            self.count += 1
            self.arrived.notify_all()
        if self.count == 1:
            await self.release.wait()
        return fixed(b"{}")

    async def wait_for_requests(self, n: int) -> None:
        async with self.arrived:
            await self.arrived.wait_for(lambda: self.count >= n)


@pytest.mark.parametrize("max_connections", [1, 2])
def test_calls_beyond_max_connections_wait_for_a_free_slot(max_connections):
    async def scenario():
        held = HeldServer()
        async with RawServer(held.reply) as server:
            client = pool(server.port, max_connections=max_connections)
            first = asyncio.ensure_future(client.request("/x", b"{}", {}))
            await within(held.wait_for_requests(1))
            second = asyncio.ensure_future(client.request("/x", b"{}", {}))
            if max_connections == 2:
                # The negative control: with a free slot the second call reaches the server at once.
                await within(held.wait_for_requests(2))
            else:
                # With one slot, the second call must not be sent while the first holds it.
                with pytest.raises(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(held.wait_for_requests(2)), 0.3)
                assert not second.done() and server.connections == 1
            held.release.set()
            assert await within((await first).read()) == b"{}"
            assert await within((await second).read()) == b"{}"
            # Queued behind the first call, the second reused its connection.
            assert server.connections == (1 if max_connections == 1 else 2)
            client.close()

    run(scenario())


def test_a_queued_caller_that_is_cancelled_takes_no_slot():
    async def scenario():
        held = HeldServer()
        async with RawServer(held.reply) as server:
            client = pool(server.port, max_connections=1)
            first = asyncio.ensure_future(client.request("/x", b"{}", {}))
            await within(held.wait_for_requests(1))
            queued = asyncio.ensure_future(client.request("/x", b"{}", {}))
            for _ in range(3):  # let it run up to the slot it waits for
                await asyncio.sleep(0)
            queued.cancel()
            with pytest.raises(asyncio.CancelledError):
                await queued
            held.release.set()
            await within((await first).read())
            # The one slot is free again: a new call goes through (it would hang if the slot leaked).
            assert await within((await client.request("/x", b"{}", {})).read()) == b"{}"
            assert held.count == 2
            client.close()

    run(scenario())


async def body_of(client: http1.Pool, way: str, timeout: float = 2.0) -> bytes:
    """One POST's answer body, through request() + read() or through fetch()."""
    if way == "request":
        return await (await client.request("/x", b"{}", {})).read()
    return (await client.fetch("/x", b"{}", {}, timeout))[2]


@pytest.mark.parametrize("way", ["request", "fetch"])
def test_a_caller_cancelled_while_waiting_for_its_answer_releases_its_slot_and_connection(way):
    # A client that disconnects cancels its call while it waits upstream (streams: request();
    # non-stream calls and /tokenize: fetch()).
    async def scenario():
        held = HeldServer()  # the first request is never answered
        async with RawServer(held.reply) as server:
            client = pool(server.port, max_connections=1)
            waiting = asyncio.ensure_future(body_of(client, way, timeout=30.0))
            await within(held.wait_for_requests(1))
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            assert await within(body_of(client, way)) == b"{}"
            # The half-used connection was closed, not put back in the pool.
            assert server.connections == 2
            held.release.set()
            client.close()

    run(scenario())


def test_a_pooled_connection_the_server_closes_is_not_reused():
    async def scenario():
        async def reply(request):
            return b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}"

        async with RawServer(reply) as server:
            client = pool(server.port)
            for _ in range(3):
                assert await within((await client.request("/x", b"{}", {})).read()) == b"{}"
            # One connection per call: each answer said `connection: close`, so none went back to the pool.
            assert server.connections == 3 and len(server.requests) == 3
            client.close()

    run(scenario())


def test_silence_between_body_chunks_is_a_timeout():
    async def scenario():
        async def streaming(reader, writer):
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n")
            await writer.drain()
            await asyncio.sleep(30)  # then nothing

        server = await asyncio.start_server(streaming, "127.0.0.1", 0)
        client = pool(server.sockets[0].getsockname()[1], read_timeout=0.3)
        response = await client.request("/x", b"{}", {})
        chunks = response.iter_raw()
        assert await within(chunks.__anext__()) == b"first"
        with pytest.raises(http1.TimeoutError_):
            await within(chunks.__anext__())
        server.close()

    run(scenario())


def test_a_4xx_answer_is_returned_with_its_body_and_the_connection_kept():
    async def scenario():
        async def reply(request):
            return fixed(b'{"error": {"message": "no such route"}}', status=404)

        async with RawServer(reply) as server:
            client = pool(server.port)
            for _ in range(2):
                response = await client.request("/x", b"{}", {})
                assert response.status_code == 404
                assert await response.read() == b'{"error": {"message": "no such route"}}'
            assert server.connections == 1
            client.close()

    run(scenario())


def test_a_per_call_header_overrides_a_fixed_one():
    async def scenario():
        async def reply(request):
            return fixed(b"{}")

        async with RawServer(reply) as server:
            client = pool(server.port)
            await (await client.request("/x", b"{}", {"authorization": "Bearer per-call"})).read()
            await (await client.request("/x", b"{}", {})).read()
            overridden, plain = server.requests
            assert b"authorization: Bearer per-call\r\n" in overridden and b"Bearer k" not in overridden
            assert overridden.lower().count(b"authorization:") == 1
            assert b"authorization: Bearer k\r\n" in plain  # the fixed header is back for the next call
            client.close()

    run(scenario())


@pytest.mark.parametrize("expiry, connections, hung_up", [(0.1, 2, 1), (30.0, 1, 0)])
def test_an_idle_connection_is_closed_after_the_keepalive_expiry(expiry, connections, hung_up):
    # With a long expiry the same sequence keeps and reuses the one connection: the negative control.
    async def scenario():
        async def reply(request):
            return fixed(b"{}")

        async with RawServer(reply) as server:
            client = pool(server.port, keepalive_expiry=expiry)
            assert await within((await client.request("/x", b"{}", {})).read()) == b"{}"
            await asyncio.sleep(0.4)
            assert server.hung_up_by_client == hung_up
            assert await within((await client.request("/x", b"{}", {})).read()) == b"{}"
            assert server.connections == connections
            client.close()

    run(scenario())


@pytest.mark.skipif(http1._QUICKACK is None or delayed_acks() is None, reason="Linux's TCP_QUICKACK and counters")
@pytest.mark.parametrize("acknowledge_at_once", [True, False], ids=["quickack", "control-without-it"])
def test_streams_on_a_reused_connection_are_not_held_back_by_the_servers_nagle(monkeypatch, acknowledge_at_once):
    """Every read is acknowledged at once, so the server's held writes go out without a delayed ACK.

    Timing-free: the kernel counts the ACKs it delays. Without TCP_QUICKACK (the control) each
    stream on the reused connection waits for one (~40 ms) before its chunk can leave the server.
    """
    if not acknowledge_at_once:
        monkeypatch.setattr(http1, "_QUICKACK", None)
    streams = 12

    async def scenario(port: int) -> int:
        client = pool(port)
        for n in range(streams + 1):
            if n == 1:  # the first stream opened the connection; count from the first reuse on
                before = delayed_acks()
            response = await client.request("/chat/completions", b"{}", {}, stream=True)
            assert [chunk async for chunk in response.iter_raw()] == [b"first"]
        delayed = delayed_acks() - before
        client.close()
        return delayed

    with NaglingStreamServer() as server:
        delayed = run(scenario(server.port))
    assert server.connections == 1  # one kept-alive connection carried every stream
    if acknowledge_at_once:
        assert delayed < streams // 3, delayed
    else:
        assert delayed >= streams // 2, delayed


# ---- fetch(): a whole answer under one deadline (the engine's /tokenize) ------------------------


def test_fetch_returns_whole_answers_sent_in_pieces_and_reuses_the_connection():
    async def scenario():
        async def pieces(reader, writer):
            for _ in range(2):  # two requests on one kept-alive connection
                await reader.readuntil(b"\r\n\r\n")
                # The head, then the body in chunks, each its own write (as uvicorn answers).
                for part in (
                    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\nx-a: 1\r\n\r\n",
                    b"3\r\n[1,\r\n",
                    b"2\r\n2]\r\n0\r\n\r\n",
                ):
                    writer.write(part)
                    await writer.drain()
                    await asyncio.sleep(0.01)
            writer.close()

        server = await asyncio.start_server(pieces, "127.0.0.1", 0)
        client = pool(server.sockets[0].getsockname()[1])
        for _ in range(2):
            status, headers, body = await within(client.fetch("/tokenize", b"{}", {}, 2.0))
            assert (status, headers["x-a"], body) == (200, "1", b"[1,2]")
        assert len(client._idle) == 1  # the one connection went back to the pool both times
        client.close()
        server.close()

        async def reply(request):
            return fixed(b'{"error": "no"}', status=400)

        async with RawServer(reply) as raw:
            client = pool(raw.port)
            assert await within(client.fetch("/tokenize", b"{}", {}, 2.0)) == (
                400,
                {"content-type": "application/json", "content-length": "15"},
                b'{"error": "no"}',
            )
            assert raw.requests[0].startswith(b"POST /v1/tokenize HTTP/1.1\r\n")
            client.close()

    run(scenario())


@pytest.mark.parametrize("head_first", [False, True])
def test_fetch_times_out_on_the_whole_exchange_and_frees_its_slot(head_first):
    # The deadline covers the body too: a head that arrives in time is not enough.
    async def scenario():
        answered = 0

        async def stalling(reader, writer):
            nonlocal answered
            try:
                while True:
                    await reader.readuntil(b"\r\n\r\n")
                    await reader.readexactly(2)
                    answered += 1
                    if answered == 1:
                        if head_first:
                            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n12345")
                        await asyncio.sleep(30)  # then nothing
                    writer.write(fixed(b"{}"))
                    await writer.drain()
            except (asyncio.IncompleteReadError, ConnectionError):
                writer.close()

        server = await asyncio.start_server(stalling, "127.0.0.1", 0)
        client = pool(server.sockets[0].getsockname()[1], max_connections=1, read_timeout=30.0)
        with pytest.raises(http1.TimeoutError_):
            await within(client.fetch("/x", b"{}", {}, 0.3))
        # The one slot is free and the half-read connection was not pooled: the next call answers.
        assert await within(client.fetch("/x", b"{}", {}, 2.0)) == (
            200,
            {"content-type": "application/json", "content-length": "2"},
            b"{}",
        )
        client.close()
        server.close()

    run(scenario())


def test_a_fetch_waiting_for_a_connection_slot_starts_its_deadline_once_it_has_one():
    # As with request(): the timeout bounds the exchange, not the wait behind other calls.
    async def scenario():
        held = HeldServer()  # the first request is answered only when released
        async with RawServer(held.reply) as server:
            client = pool(server.port, max_connections=1)
            first = asyncio.ensure_future(client.fetch("/x", b"{}", {}, 30.0))
            await within(held.wait_for_requests(1))
            queued = asyncio.ensure_future(client.fetch("/x", b"{}", {}, 0.3))
            await asyncio.sleep(0.6)  # twice the queued call's timeout, spent waiting for the slot
            held.release.set()
            assert (await within(first))[2] == b"{}"
            assert (await within(queued))[2] == b"{}"
            client.close()

    run(scenario())


def test_fetch_retries_a_stale_kept_alive_connection_once_and_reports_a_cut_answer():
    async def scenario():
        async with RawServer(hang_up_on_the_second_request()) as server:
            client = pool(server.port)
            for _ in range(2):
                assert (await within(client.fetch("/x", b"{}", {}, 2.0)))[2] == b"{}"
            assert server.connections == 2 and len(server.requests) == 3

        unretrieved = []

        async def cut(request):
            return b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\npartial"

        async with RawServer(cut) as server:
            asyncio.get_running_loop().set_exception_handler(lambda loop, context: unretrieved.append(context))
            with pytest.raises(http1.ProtocolError):
                await within(pool(server.port).fetch("/x", b"{}", {"connection": "close"}, 2.0))
            gc.collect()  # an exception set on a future nobody retrieved is reported when it is collected
            await asyncio.sleep(0)
        assert unretrieved == []

    run(scenario())
