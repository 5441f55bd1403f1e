"""The Conversations API (`routes`): create, retrieve, update metadata and delete conversations; list, add, get and delete items."""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from server.api.cursor import list_params, not_found, object_id
from server.api.models import json_response
from server.api.shared import app_state, response_store
from server.errors import OpenAIError
from server.http.asgi import parse_json_object, read_body
from server.stateful.context import check_items, open_sealed_reasoning, resolve_references
from server.stateful.items import cursor_page, list_object, normalize_input
from server.stateful.service import Stateful
from server.translate.checks import check_metadata

MAX_ITEMS_PER_CALL = 20


async def _body_of(request: Request, *, required: bool) -> dict[str, Any]:
    raw = await read_body(request.receive, app_state(request).settings.max_body_bytes)
    if not raw and not required:
        return {}
    return parse_json_object(raw)


async def _new_items(stateful: Stateful, owner: str, value: Any, *, required: bool) -> list[dict[str, Any]]:
    if value is None and not required:
        return []
    if not isinstance(value, list):
        raise OpenAIError(400, "`items` must be an array of items", param="items", code="invalid_type")
    if len(value) > MAX_ITEMS_PER_CALL or (required and not value):
        raise OpenAIError(
            400, f"`items` must hold 1 to {MAX_ITEMS_PER_CALL} items", param="items", code="invalid_value"
        )
    items: list[dict[str, Any]] = normalize_input(value)
    open_sealed_reasoning(items, stateful, owner, param="items")
    await resolve_references(items, stateful, owner, param="items")
    check_items(items, param="items")
    return items


def _target(request: Request) -> tuple[Stateful, str, str]:
    """The dependency of the routes on one conversation: the store, the caller's owner tag and the
    path's conversation id (a malformed one is not found)."""
    stateful = response_store(request, "conversations")
    return stateful, stateful.owner(request.scope), object_id(request, "conversation_id", "conversation")


async def create_conversation(request: Request) -> Response:
    stateful = response_store(request, "conversations")
    body = await _body_of(request, required=False)
    metadata = check_metadata(body.get("metadata"))
    owner = stateful.owner(request.scope)
    items = await _new_items(stateful, owner, body.get("items"), required=False)
    return json_response(200, await asyncio.to_thread(stateful.conversations.create, owner, metadata, items))


async def retrieve_conversation(request: Request) -> Response:
    stateful, owner, conversation_id = _target(request)
    found = await asyncio.to_thread(stateful.conversations.get, conversation_id, owner)
    if found is None:
        raise not_found("conversation", conversation_id)
    return json_response(200, found)


async def update_conversation(request: Request) -> Response:
    stateful, owner, conversation_id = _target(request)
    body = await _body_of(request, required=True)
    if "metadata" not in body:
        raise OpenAIError(400, "`metadata` is required", param="metadata", code="missing_required_parameter")
    metadata = check_metadata(body["metadata"])
    found = await asyncio.to_thread(stateful.conversations.update_metadata, conversation_id, owner, metadata)
    if found is None:
        raise not_found("conversation", conversation_id)
    return json_response(200, found)


async def delete_conversation(request: Request) -> Response:
    stateful, owner, conversation_id = _target(request)
    if not await asyncio.to_thread(stateful.conversations.delete, conversation_id, owner):
        raise not_found("conversation", conversation_id)
    return json_response(200, {"id": conversation_id, "object": "conversation.deleted", "deleted": True})


async def list_items(request: Request) -> Response:
    after, limit, order = list_params(request)
    stateful, owner, conversation_id = _target(request)
    items = await asyncio.to_thread(stateful.conversations.items, conversation_id, owner)
    if items is None:
        raise not_found("conversation", conversation_id)
    page = cursor_page(items, after=after, limit=limit, order=order)
    if page is None:
        raise OpenAIError(400, f"`after`: no item {after!r} in this conversation", param="after", code="invalid_value")
    return json_response(200, list_object(*page))


async def add_items(request: Request) -> Response:
    stateful, owner, conversation_id = _target(request)
    body = await _body_of(request, required=True)
    items = await _new_items(stateful, owner, body.get("items"), required=True)
    added = await asyncio.to_thread(stateful.conversations.add_items, conversation_id, owner, items)
    if added is None:
        raise not_found("conversation", conversation_id)
    return json_response(200, list_object(added, False))


async def get_item(request: Request) -> Response:
    stateful, owner, conversation_id = _target(request)
    item_id = object_id(request, "item_id", "item")
    exists, item = await asyncio.to_thread(stateful.conversations.get_item, conversation_id, owner, item_id)
    if not exists:
        raise not_found("conversation", conversation_id)
    if item is None:
        raise not_found("item", item_id)
    return json_response(200, item)


async def delete_item(request: Request) -> Response:
    stateful, owner, conversation_id = _target(request)
    item_id = object_id(request, "item_id", "item")
    exists, gone = await asyncio.to_thread(stateful.conversations.delete_item, conversation_id, owner, item_id)
    if not exists:
        raise not_found("conversation", conversation_id)
    if not gone:
        raise not_found("item", item_id)
    found = await asyncio.to_thread(stateful.conversations.get, conversation_id, owner)
    if found is None:
        raise not_found("conversation", conversation_id)
    return json_response(200, found)


routes = [
    Route("/v1/conversations", create_conversation, methods=["POST"]),
    Route("/v1/conversations/{conversation_id}", retrieve_conversation, methods=["GET"]),
    Route("/v1/conversations/{conversation_id}", update_conversation, methods=["POST"]),
    Route("/v1/conversations/{conversation_id}", delete_conversation, methods=["DELETE"]),
    Route("/v1/conversations/{conversation_id}/items", list_items, methods=["GET"]),
    Route("/v1/conversations/{conversation_id}/items", add_items, methods=["POST"]),
    Route("/v1/conversations/{conversation_id}/items/{item_id}", get_item, methods=["GET"]),
    Route("/v1/conversations/{conversation_id}/items/{item_id}", delete_item, methods=["DELETE"]),
]
