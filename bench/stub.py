"""Tiny loopback HTTP responder: a canned chat reply (the load generator's ceiling) or an OTLP sink.

`python -m bench.stub --port P --reply chat|empty`. Every POST gets the canned answer (`empty` is
a 200 with an empty protobuf body, which OTLP/HTTP exporters take as success); `GET /stats`
returns how many requests arrived per path and per exporter (user-agent family).
"""

from __future__ import annotations

import argparse
import asyncio
import sys

import orjson

from bench.loadgen import new_loop, raise_fd_limit

# Shaped like the mock's short non-stream answer, so the ceiling is measured on a similar body.
_CHAT = orjson.dumps(
    {
        "id": "chatcmpl-stub",
        "object": "chat.completion",
        "created": 0,
        "model": "mock-model",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": " ".join(["alpha"] * 16)},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 20, "completion_tokens": 16, "total_tokens": 36},
    }
)


def _answer(body: bytes, content_type: bytes) -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\ncontent-type: "
        + content_type
        + b"\r\ncontent-length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )


class Stub(asyncio.Protocol):
    """Parses requests just enough to find their end (content-length or chunked), then answers."""

    def __init__(self, reply: bytes, counts: dict[str, int]) -> None:
        self.reply = reply
        self.counts = counts
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self.buf[:end]).lower()
            body_start = end + 4
            if b"\r\ntransfer-encoding: chunked" in head:
                done = self.buf.find(b"\r\n0\r\n\r\n", end)
                if done < 0:
                    return
                consumed = done + 7
            else:
                at = head.find(b"\r\ncontent-length:")
                length = 0
                if at >= 0:
                    stop = head.find(b"\r\n", at + 2)
                    length = int(head[at + 17 : stop if stop >= 0 else None])
                if len(self.buf) < body_start + length:
                    return
                consumed = body_start + length
            del self.buf[:consumed]
            self._count(head)
            if head.startswith(b"get /stats"):
                self.transport.write(_answer(orjson.dumps(self.counts), b"application/json"))  # type: ignore[union-attr]
            else:
                self.transport.write(self.reply)  # type: ignore[union-attr]

    def _count(self, head: bytes) -> None:
        line_end = head.find(b"\r\n")
        path = head[:line_end].split(b" ")[1].decode("latin-1") if line_end > 0 else "?"
        key = "path:" + path
        self.counts[key] = self.counts.get(key, 0) + 1
        at = head.find(b"\r\nuser-agent:")
        if at >= 0:
            stop = head.find(b"\r\n", at + 2)
            agent = head[at + 13 : stop if stop >= 0 else None].strip().decode("latin-1")
            family = "agent:" + agent.split("/")[0]
            self.counts[family] = self.counts.get(family, 0) + 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.stub", description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--reply", choices=("chat", "empty"), default="chat")
    args = parser.parse_args(argv)
    raise_fd_limit()
    reply = _answer(_CHAT, b"application/json") if args.reply == "chat" else _answer(b"", b"application/x-protobuf")
    counts: dict[str, int] = {}
    loop = new_loop()
    asyncio.set_event_loop(loop)
    server = loop.run_until_complete(
        loop.create_server(lambda: Stub(reply, counts), "127.0.0.1", args.port, backlog=4096)
    )
    print(f"stub listening on 127.0.0.1:{args.port}", flush=True)
    try:
        loop.run_forever()
    finally:
        server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
