"""A minimal Python pass-through proxy: the floor any one-extra-hop Python server can reach on this machine.

`python -m bench.floor --port P --upstream-port S` forwards non-stream POSTs to 127.0.0.1:S. Per
call it does the least a real front must do: parse the request JSON, set `model`, serialise it,
send it upstream on a pooled keep-alive connection in one write, parse the reply JSON,
serialise it, and answer in one write. No framework, no httpx: uvloop and raw protocols. The
benchmark runs it beside this server so "what a lean server could reach" is a measurement, not a guess.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

import orjson

from bench.loadgen import Conn, Counters, new_loop, raise_fd_limit


class Pool:
    """Idle keep-alive connections to the upstream, newest first (LIFO keeps few of them warm)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.idle: list[Conn] = []
        self.counters = Counters()

    async def call(self, path: bytes, body: bytes) -> tuple[int, bytes]:
        loop = asyncio.get_running_loop()
        conn = None
        while self.idle:
            candidate = self.idle.pop()
            if not candidate.lost:
                conn = candidate
                break
        if conn is None:
            _, conn = await loop.create_connection(lambda: Conn(self.counters), "127.0.0.1", self.port)
            conn.keep_body = True
        head = (
            b"POST " + path + b" HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
            b"content-length: " + str(len(body)).encode() + b"\r\n\r\n"
        )
        status, *_rest, close_after = await conn.request(head + body, None)
        reply = bytes(conn.body)
        if close_after:
            conn.close()
        else:
            self.idle.append(conn)
        return status, reply


class Front(asyncio.Protocol):
    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return
        head = bytes(self.buf[:end]).lower()
        at = head.find(b"\r\ncontent-length:")
        stop = head.find(b"\r\n", at + 2)
        length = int(head[at + 17 : stop if stop >= 0 else None]) if at >= 0 else 0
        if len(self.buf) < end + 4 + length:
            return
        body = bytes(self.buf[end + 4 : end + 4 + length])
        del self.buf[: end + 4 + length]
        path = head.split(b" ", 2)[1]
        if not head.startswith(b"post "):
            self.transport.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")  # type: ignore[union-attr]  # readiness probe
            return
        self.transport.pause_reading()  # type: ignore[union-attr]  # one request at a time per connection
        asyncio.ensure_future(self.handle(path, body))

    async def handle(self, path: bytes, raw: bytes) -> None:
        request = orjson.loads(raw)
        request["model"] = "demo"
        status, reply = await self.pool.call(path, orjson.dumps(request))
        out = orjson.dumps(orjson.loads(reply)) if status == 200 else reply
        self.transport.write(  # type: ignore[union-attr]
            b"HTTP/1.1 "
            + str(status).encode()
            + b" OK\r\ncontent-type: application/json\r\ncontent-length: "
            + str(len(out)).encode()
            + b"\r\n\r\n"
            + out
        )
        self.transport.resume_reading()  # type: ignore[union-attr]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.floor", description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream-port", type=int, required=True)
    args = parser.parse_args(argv)
    raise_fd_limit()
    loop = new_loop()
    asyncio.set_event_loop(loop)
    pool = Pool(args.upstream_port)
    server = loop.run_until_complete(loop.create_server(lambda: Front(pool), "127.0.0.1", args.port, backlog=4096))
    print(f"floor proxy on 127.0.0.1:{args.port} -> 127.0.0.1:{args.upstream_port}", flush=True)
    try:
        loop.run_forever()
    finally:
        server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
