"""Small raw-ASGI helpers: read a bounded JSON body, send JSON/errors, cancel work on client disconnect."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from starlette.types import Receive, Send

from server.errors import OpenAIError

JSON_HEADERS = [(b"content-type", b"application/json")]
SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]


async def read_body(receive: Receive, limit: int) -> bytes | bytearray:
    """The whole request body, 413 past `limit` bytes. A body in one piece comes back as it arrived;
    one in many grows one bytearray, never a list of pieces joined into a second copy."""
    first = b""
    grown: bytearray | None = None
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone()
        chunk = message.get("body", b"")
        if chunk:
            size += len(chunk)
            if size > limit:
                raise OpenAIError(413, f"request body exceeds the limit of {limit} bytes", code="request_too_large")
            if grown is not None:
                grown += chunk
            elif first:
                grown = bytearray(first)
                grown += chunk
                first = b""
            else:
                first = chunk
        if not message.get("more_body", False):
            return grown if grown is not None else first


def parse_json_object(raw: bytes | bytearray) -> dict[str, Any]:
    if not raw:
        raise OpenAIError(400, "request body is empty; expected a JSON object", code="invalid_json")
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise OpenAIError(400, f"request body is not valid JSON: {exc}", code="invalid_json") from exc
    if not isinstance(doc, dict):
        raise OpenAIError(400, "request body must be a JSON object", code="invalid_json")
    # orjson reads 1024 levels of nesting but writes only 254, and the body is written again on its
    # way upstream. Only a body with that many brackets can be that deep, so most skip the check,
    # which walks the containers rather than writing the body once more (a copy as large as it).
    if raw.count(b"[") + raw.count(b"{") > _MAX_WRITABLE_DEPTH and _deeper_than(doc, _MAX_WRITABLE_DEPTH):
        raise OpenAIError(
            400, f"request body is nested too deeply (at most {_MAX_WRITABLE_DEPTH} levels)", code="invalid_json"
        )
    return doc


_MAX_WRITABLE_DEPTH = 254


def _deeper_than(doc: dict[str, Any], limit: int) -> bool:
    """Whether objects and arrays nest more than `limit` levels deep in `doc` (itself level 1)."""
    stack: list[tuple[Any, int]] = [(doc, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > limit:
            return True
        for child in value.values() if isinstance(value, dict) else value:
            if isinstance(child, (dict, list)):
                stack.append((child, depth + 1))
    return False


async def send_json(
    send: Send, status: int, body: bytes, extra_headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    headers = JSON_HEADERS + [(b"content-length", str(len(body)).encode())]
    if extra_headers:
        headers += extra_headers
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class ClientGone(Exception):
    """The client disconnected; there is nobody left to answer."""


async def run_until_disconnect(
    receive: Receive, work: Callable[[], Awaitable[None]], answered: Callable[[], bool] = lambda: False
) -> None:
    """Run `work`, cancelling it as soon as the client disconnects (which cancels its upstream call).

    A disconnect after the response is complete (`answered()`) cancels nothing: the work is then
    only cleaning up (closing the upstream stream, handing off capture), which must not be cut.
    Only call this after the request body has been read: from then on `receive` delivers
    `http.disconnect`, after (under granian) one empty `http.request`, which the watcher skips.
    """
    task = asyncio.current_task()  # the work runs here; only the watcher is a task of its own
    assert task is not None, "called from a coroutine, so there is a current task"
    gone = False

    async def watch() -> None:
        nonlocal gone
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                if not answered():
                    gone = True
                    task.cancel()
                return

    watcher = asyncio.ensure_future(watch())
    try:
        await work()
    except asyncio.CancelledError:
        if gone:
            task.uncancel()  # our own cancel, now handled: later awaits in this task run normally
            raise ClientGone() from None
        raise
    finally:
        watcher.cancel()
