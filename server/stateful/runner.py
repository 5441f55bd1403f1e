"""Starting a background run: store it queued, answer at once, run the stream path into the event log.

The run goes through the same streaming code as a foreground call, with an ASGI `send` that writes
its events to the store instead of a socket. The caller gets the queued response (or, with
`stream: true`, the run's events as they land, followed from the store). Cancelling the task (the
cancel endpoint, on any worker, or shutdown) cancels the upstream call; the run is then kept as
`cancelled`.

The Responses endpoint (`server.api.responses`) calls this, so this names what it needs of that
endpoint and its call as protocols instead of importing them: no import circle, even for annotations.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import orjson

from server.errors import OpenAIError
from server.http.asgi import SSE_HEADERS, send_json
from server.stateful.background import EventLog
from server.stateful.replay import follow
from server.stateful.turns import Turn
from server.translate.response import response_base

if TYPE_CHECKING:
    from starlette.types import Message, Send

    from server.telemetry.spans import CallSpan

log = logging.getLogger("switchyard_model.stateful")


class RoutedCall(Protocol):
    """What a run reads of its model call (`server.api.call.Call`): the route it answers as."""

    route: str


class BackgroundCall(Protocol):
    """What a run reads of its call in flight (`server.api.call.Exchange`, the Responses endpoint's)."""

    @property
    def call(self) -> RoutedCall: ...
    @property
    def body(self) -> dict[str, Any]: ...
    @property
    def headers(self) -> dict[str, str]: ...
    @property
    def span(self) -> CallSpan: ...
    @property
    def turn(self) -> Turn: ...
    @property
    def created_at(self) -> int: ...

    @property
    def send(self) -> Send:
        """The client's, until `redirect` gives the call another."""
        ...

    def redirect(self, send: Send) -> None:
        """The stream's events go to `send` (the run's event log), not to the client."""
        ...


CallT = TypeVar("CallT", bound=BackgroundCall, contravariant=True)


class StreamingEndpoint(Protocol[CallT]):
    """What a run needs of the Responses endpoint: its concurrency limit and its stream path."""

    def limit(self) -> AbstractAsyncContextManager[object]: ...

    async def relay_stream(self, exchange: CallT) -> None: ...


async def start_background(endpoints: StreamingEndpoint[CallT], exchange: CallT) -> None:
    """`endpoints` is the Responses endpoint: its `limit()` and `relay_stream()` run the call. The run's
    place is reserved already (`stateful.runs.reserve`, the 429 beyond the bounds, taken before the call
    was admitted so that a refused run leaves nothing); from here on this gives it back."""
    call, body, headers, span, turn, send = (
        exchange.call,
        exchange.body,
        exchange.headers,
        exchange.span,
        exchange.turn,
        exchange.send,
    )
    stateful = turn.stateful
    assert stateful is not None  # expand() refuses background without the store
    owner = turn.expanded.owner
    try:
        queued = response_base(
            body, response_id=turn.response_id, created_at=exchange.created_at, model=call.route, echo=turn.echo
        )
        queued["status"] = "queued"
        kept = await turn.keep(queued)
    except BaseException:
        stateful.runs.release(owner)
        raise
    if not kept:
        stateful.runs.release(owner)
        span.finish(None, None)
        raise OpenAIError(
            503, "the response store could not take the background run", code="response_store_unavailable"
        )
    events = EventLog(stateful.responses, turn.response_id)

    async def to_event_log(message: Message) -> None:
        if message["type"] == "http.response.body" and message.get("body"):
            events.add(message["body"])

    async def run() -> None:
        ended = {**queued, "status": "cancelled"}
        try:
            async with endpoints.limit():
                span.upstream_headers(headers)
                await turn.keep({**queued, "status": "in_progress"})
                exchange.redirect(to_event_log)
                await endpoints.relay_stream(exchange)
        except asyncio.CancelledError as exc:
            span.finish(None, exc)
        except Exception as exc:  # the stream path answers upstream errors itself; this is the rest
            log.exception("background run %s failed", turn.response_id)
            span.finish(None, exc)
            ended = {**queued, "status": "failed", "error": {"code": "server_error", "message": "internal error"}}
        await events.flush()
        await turn.keep_final(ended)

    stateful.runs.start(turn.response_id, run(), owner)
    if body.get("stream") is not True:
        await send_json(send, 200, orjson.dumps(queued))
        return
    stored = await asyncio.to_thread(stateful.responses.get, turn.response_id, turn.expanded.owner)
    await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
    if stored is not None:
        async for frame in follow(stateful.responses, stored, turn.expanded.owner, -1, poll_s=0.05):
            await send({"type": "http.response.body", "body": frame, "more_body": True})
    await send({"type": "http.response.body", "body": b""})
