"""Stored responses over HTTP (`routes`): retrieve (or replay its stream), delete, list its input items, cancel a background run."""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from server.api.cursor import flag, integer, list_params, not_found, object_id
from server.api.models import json_response
from server.api.shared import response_store
from server.errors import OpenAIError
from server.http.asgi import SSE_HEADERS
from server.stateful.items import cursor_page, list_object
from server.stateful.replay import follow
from server.stateful.responses import StoredResponse
from server.stateful.service import Stateful

# How long POST .../cancel waits for the run to record itself cancelled before answering.
CANCEL_SETTLE_S = 5.0
_SSE_HEADERS = {k.decode(): v.decode() for k, v in SSE_HEADERS if k != b"content-type"}


async def _load(request: Request) -> tuple[Stateful, str, StoredResponse]:
    """The dependency of every route here: the store, the caller's owner tag and the path's response,
    which that owner stored (any other is not found)."""
    stateful = response_store(request, "stored responses")
    response_id = object_id(request, "response_id", "response")
    owner = stateful.owner(request.scope)
    stored = await asyncio.to_thread(stateful.responses.get, response_id, owner)
    if stored is None:
        raise not_found("response", response_id)
    return stateful, owner, stored


async def retrieve_response(request: Request) -> Response:
    stream = flag(request, "stream")
    starting_after = integer(request, "starting_after", -1)
    stateful, owner, stored = await _load(request)
    if not stream:
        return json_response(200, stored.response)
    return StreamingResponse(
        follow(stateful.responses, stored, owner, starting_after),
        media_type="text/event-stream",
        headers=_SSE_HEADERS,
    )


async def delete_response(request: Request) -> Response:
    stateful, owner, stored = await _load(request)
    stateful.runs.cancel_here(stored.id)  # a run still going here has nobody left to report to
    if not await asyncio.to_thread(stateful.responses.delete, stored.id, owner):
        raise not_found("response", stored.id)
    return json_response(200, {"id": stored.id, "object": "response.deleted", "deleted": True})


async def input_items(request: Request) -> Response:
    after, limit, order = list_params(request)
    _, _, stored = await _load(request)
    page = cursor_page(stored.input, after=after, limit=limit, order=order)
    if page is None:
        raise OpenAIError(
            400, f"`after`: no input item {after!r} in this response", param="after", code="invalid_value"
        )
    return json_response(200, list_object(*page))


async def cancel_response(request: Request) -> Response:
    stateful, owner, stored = await _load(request)
    if not stored.background:
        raise OpenAIError(
            400,
            "only responses created with `background: true` can be cancelled",
            param=None,
            code="invalid_request",
        )
    if stored.running:
        await asyncio.to_thread(stateful.responses.request_cancel, stored.id, owner)
        stateful.runs.cancel_here(stored.id)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CANCEL_SETTLE_S
        while stored.running and loop.time() < deadline:
            await asyncio.sleep(0.05)
            current = await asyncio.to_thread(stateful.responses.get, stored.id, owner)
            if current is None:
                raise not_found("response", stored.id)
            stored = current
    return json_response(200, stored.response)


routes = [
    Route("/v1/responses/{response_id}", retrieve_response, methods=["GET"]),
    Route("/v1/responses/{response_id}", delete_response, methods=["DELETE"]),
    Route("/v1/responses/{response_id}/input_items", input_items, methods=["GET"]),
    Route("/v1/responses/{response_id}/cancel", cancel_response, methods=["POST"]),
]
