"""A raw loopback HTTP/1.1 server for client tests: each request answered by `reply(request_bytes) -> bytes | None`."""

from __future__ import annotations

import asyncio


class RawServer:
    """A loopback TCP server answering each request with `reply(request_bytes) -> bytes | None` (None hangs up)."""

    def __init__(self, reply) -> None:
        self.reply = reply
        self.connections = 0
        self.hung_up_by_client = 0  # connections the client closed between requests
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
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError as exc:
                    if not exc.partial:
                        self.hung_up_by_client += 1
                    raise
                lengths = [
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                ]
                request = head + (await reader.readexactly(lengths[0]) if lengths else b"")
                self.requests.append(request)
                answer = await self.reply(request)
                if answer is None:  # hang up without answering
                    writer.close()
                    return
                writer.write(answer)
                await writer.drain()
                answer_head = answer.split(b"\r\n\r\n", 1)[0].lower()
                if b"connection: close" in request.lower() or b"connection: close" in answer_head:
                    writer.close()
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


def fixed(body: bytes, status: int = 200, content_type: bytes = b"application/json") -> bytes:
    """A whole answer with a content-length."""
    return b"HTTP/1.1 %d X\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n%s" % (
        status,
        content_type,
        len(body),
        body,
    )
