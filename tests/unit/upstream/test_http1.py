"""The lean HTTP/1.1 client against raw loopback servers: framing, pooling, retries and failures."""

from __future__ import annotations

import asyncio

import pytest

from server.upstream import http1


class RawServer:
    """A loopback TCP server answering each request with `reply(request_bytes) -> bytes | None`."""

    def __init__(self, reply) -> None:
        self.reply = reply
        self.connections = 0
        self.requests: list[bytes] = []

    async def __aenter__(self) -> RawServer:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc) -> None:
        self.server.close()
        await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(
                    next(
                        line.split(b":")[1]
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length")
                    )
                )
                request = head + await reader.readexactly(length)
                self.requests.append(request)
                answer = await self.reply(request)
                if answer is None:  # hang up without answering
                    writer.close()
                    return
                writer.write(answer)
                await writer.drain()
                if b"connection: close" in request.lower():
                    writer.close()
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


def fixed(body: bytes, status: int = 200) -> bytes:
    return b"HTTP/1.1 %d X\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
        status,
        len(body),
        body,
    )


def pool(port: int, **kw) -> http1.Pool:
    return http1.Pool(
        f"http://127.0.0.1:{port}/v1",
        connect_timeout=kw.pop("connect_timeout", 2.0),
        read_timeout=kw.pop("read_timeout", 2.0),
        max_connections=8,
        headers={"authorization": "Bearer k"},
        **kw,
    )


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


def test_chunked_stream_arrives_chunk_by_chunk_on_a_fresh_connection():
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
            response = await client.request("/chat/completions", b"{}", {}, fresh=True)
            chunks = response.iter_raw()
            assert await chunks.__anext__() == b"first"  # before the rest was even sent
            release.set()
            assert [c async for c in chunks] == [b"second"]
            stream_server.close()

    run(scenario())


def test_a_stale_kept_alive_connection_is_retried_once_on_a_new_one():
    async def scenario():
        calls = 0

        async def reply(request):
            nonlocal calls
            calls += 1
            if calls == 2:
                return None  # the kept-alive connection dies just as it is reused
            return fixed(b"{}")

        async with RawServer(reply) as server:
            client = pool(server.port)
            assert (await (await client.request("/x", b"{}", {})).read()) == b"{}"
            assert (await (await client.request("/x", b"{}", {})).read()) == b"{}"
            assert server.connections == 2 and calls == 3

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
