"""A Responses request made whole: `previous_response_id` or `conversation` expanded, item references resolved, sealed reasoning opened.

`expand()` validates the stateful fields (`store`, `background`, `previous_response_id`,
`conversation`, `include`), reads what they name from the stores (in a worker thread) and returns
the body the translator sees, with the full input the model runs on, in the order the Open
Responses spec fixes: previous input, previous output, new input (or: the conversation's items,
then the new input). The previous `instructions` are not carried over. The session id to use comes
back too: the previous response's, or the conversation id, when the call carries none of its own.
An `item_reference` in the new input becomes the stored item it names (the key's own responses and
conversations), so what is stored and listed as the response's input is what the model ran on.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import orjson

from server.errors import OpenAIError
from server.stateful.items import normalize_input, stored_output
from server.stateful.responses import MAX_RESPONSES_READ
from server.stateful.service import Stateful

ENCRYPTED_REASONING = "reasoning.encrypted_content"
# Read here and never passed on: the translator only ever sees the expanded input.
STATEFUL_FIELDS = ("store", "background", "previous_response_id", "conversation")


@dataclass(slots=True)
class Expanded:
    body: dict[str, Any]  # the Responses body to translate: stateful fields removed, input expanded
    input_items: list[dict[str, Any]] = field(default_factory=list)  # what the model runs on (stored)
    new_items: list[dict[str, Any]] = field(default_factory=list)  # this call's own input (a turn's start)
    store: bool = False  # store the response (asked for, and the store is on)
    background: bool = False
    previous_response_id: str | None = None
    conversation_id: str | None = None
    session_id: str | None = None  # inherited from the previous response or the conversation
    session_source: str = ""  # which of the two, for logs and spans
    seal_reasoning: bool = False  # include has reasoning.encrypted_content
    owner: str = ""


def _flag(body: dict[str, Any], key: str, default: bool) -> bool:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise OpenAIError(400, f"`{key}` must be a boolean", param=key, code="invalid_type")
    return value


def _conversation_id(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, dict):
        value = value.get("id")
    if not isinstance(value, str) or not value:
        raise OpenAIError(
            400,
            "`conversation` must be a conversation id or an object with an `id`",
            param="conversation",
            code="invalid_type",
        )
    return value


def open_sealed_reasoning(items: Any, stateful: Stateful | None, owner: str, param: str = "input") -> None:
    """Replace each sealed reasoning item's content by what it seals for this key (in place); 400 if it does not open."""
    if not isinstance(items, list):
        return
    for index, item in enumerate(items):
        if not (isinstance(item, dict) and item.get("type") == "reasoning" and item.get("encrypted_content")):
            continue
        where = f"{param}[{index}].encrypted_content"
        if stateful is None or stateful.seal is None:
            raise OpenAIError(
                400,
                f"`{where}` cannot be opened: the response store is off on this server, and with it the seal key",
                param=where,
                code="invalid_encrypted_content",
            )
        text = stateful.seal.open(item["encrypted_content"], where, owner)
        items[index] = {**item, "content": [{"type": "reasoning_text", "text": text}]}


def check_items(items: list[dict[str, Any]], param: str) -> None:
    """400 naming the item if the translator could not send these items upstream (checked before storing them)."""
    from server.translate.request import responses_to_chat

    try:
        responses_to_chat({"input": items} if items else {"input": "-"})
    except OpenAIError as error:
        if error.param and error.param.startswith("input"):
            error.param = param + error.param[len("input") :]
            error.message = error.message.replace("input", param, 1)
        raise


def _is_reference(item: Any) -> bool:
    """An `item_reference` input item (its `type` may be left out: then the item is its `id` alone)."""
    if not isinstance(item, dict):
        return False
    kind = item.get("type")
    return kind == "item_reference" or (kind is None and set(item) == {"id"})


async def resolve_references(items: list[Any], stateful: Stateful | None, owner: str, param: str = "input") -> None:
    """Replace each `item_reference` by the stored item it names (in place): an item of one of this key's
    stored responses (input or output) or conversations; 404 naming the id when the key holds none by that id."""
    references: dict[int, str] = {}
    for index, item in enumerate(items):
        if not _is_reference(item):
            continue
        item_id = item.get("id")
        if not isinstance(item_id, str) or not item_id:
            where = f"{param}[{index}].id"
            raise OpenAIError(400, f"`{where}` must be the id of a stored item", param=where, code="invalid_type")
        references[index] = item_id
    if not references:
        return
    if stateful is None:
        where = f"{param}[{next(iter(references))}]"
        raise OpenAIError(
            400,
            f"`{where}` is an item_reference, which needs the response store, and it is turned off on this "
            "server (response_store: false): send the item itself",
            param=where,
            code="response_store_disabled",
        )
    ids = list(references.values())
    found = await asyncio.to_thread(stateful.responses.find_items, ids, owner, MAX_RESPONSES_READ)
    if found is None:
        raise OpenAIError(
            400,
            f"`{param}` refers to items of more than {MAX_RESPONSES_READ} stored responses: send the items "
            "themselves, or fewer references per request",
            param=param,
            code="invalid_value",
        )
    missing = [item_id for item_id in ids if item_id not in found]
    if missing:
        found.update(await asyncio.to_thread(stateful.conversations.find_items, missing, owner))
    # What the references became counts against the body limit, as if the client had sent it.
    resolved_bytes = sum(len(orjson.dumps(found[item_id])) for item_id in ids if item_id in found)
    limit = stateful.settings.max_body_bytes
    if resolved_bytes > limit:
        raise OpenAIError(
            413,
            f"the items `{param}` refers to come to {resolved_bytes} bytes, more than max_body_bytes ({limit})",
            param=param,
            code="request_too_large",
        )
    for index, item_id in references.items():
        if item_id not in found:
            raise OpenAIError(
                404,
                f"Item with id {item_id!r} not found: `{param}[{index}]` refers to it, and no stored response or "
                "conversation of this key holds it (it may have expired or been deleted)",
                param=f"{param}[{index}]",
                code="item_not_found",
            )
        items[index] = found[item_id]


async def expand(
    body: dict[str, Any], stateful: Stateful | None, owner: str, has_session: bool, response_id: str | None = None
) -> Expanded:
    """The request with its stored context; OpenAIError (400/404) for what cannot be honoured.

    `response_id`: the id the response will have; its input's items without an id are named after it.
    """
    store = _flag(body, "store", True)
    background = _flag(body, "background", False)
    previous_id = body.get("previous_response_id")
    if previous_id is not None and (not isinstance(previous_id, str) or not previous_id):
        raise OpenAIError(
            400, "`previous_response_id` must be a string", param="previous_response_id", code="invalid_type"
        )
    conversation_id = _conversation_id(body.get("conversation"))
    if previous_id is not None and conversation_id is not None:
        raise OpenAIError(
            400,
            "`previous_response_id` and `conversation` cannot be used together: a conversation carries its own history",
            param="conversation",
            code="invalid_request",
        )
    include = body.get("include")
    seal = isinstance(include, list) and ENCRYPTED_REASONING in include
    if stateful is None:
        for key, used in (
            ("previous_response_id", previous_id is not None),
            ("conversation", conversation_id is not None),
            ("background", background),
        ):
            if used:
                raise OpenAIError(
                    400,
                    f"`{key}` needs the response store, which is turned off on this server (response_store: false)",
                    param=key,
                    code="response_store_disabled",
                )
        store = False
        seal = False
    if background and not store:
        raise OpenAIError(400, "`background: true` needs `store: true`", param="background", code="invalid_request")

    new_items = normalize_input(body.get("input"), response_id)
    open_sealed_reasoning(new_items, stateful, owner)
    if isinstance(new_items, list):  # referenced items are stored ones, their reasoning already open
        await resolve_references(new_items, stateful, owner)
    expanded = Expanded(
        body={k: v for k, v in body.items() if k not in STATEFUL_FIELDS},
        store=store,
        background=background,
        previous_response_id=previous_id,
        conversation_id=conversation_id,
        seal_reasoning=seal,
        owner=owner,
    )
    if not isinstance(new_items, list):  # malformed: the translator names it
        expanded.body["input"] = new_items
        return expanded
    expanded.new_items = new_items
    history: list[dict[str, Any]] = []
    if previous_id is not None:
        assert stateful is not None
        previous = await asyncio.to_thread(stateful.responses.get, previous_id, owner)
        if previous is None:
            raise OpenAIError(
                404,
                f"previous response {previous_id!r} not found (it may have expired or been deleted)",
                param="previous_response_id",
                code="previous_response_not_found",
            )
        if previous.running:
            raise OpenAIError(
                400,
                f"previous response {previous_id!r} is still {previous.status}; wait for it to finish",
                param="previous_response_id",
                code="previous_response_in_progress",
            )
        history = previous.input + stored_output(previous.response.get("output") or [])
        if not has_session:
            expanded.session_id = previous.session_id
            expanded.session_source = "previous_response_id"
    elif conversation_id is not None:
        assert stateful is not None
        items = await asyncio.to_thread(stateful.conversations.items, conversation_id, owner)
        if items is None:
            raise OpenAIError(
                404, f"conversation {conversation_id!r} not found", param="conversation", code="conversation_not_found"
            )
        history = items
        if not has_session:
            expanded.session_id = conversation_id
            expanded.session_source = "conversation"
    expanded.input_items = history + new_items
    expanded.body["input"] = expanded.input_items
    return expanded


def echo_fields(expanded: Expanded, stored: bool) -> dict[str, Any]:
    """The stateful fields of the response object, as the client is told them."""
    return {
        "store": stored,
        "background": expanded.background,
        "previous_response_id": expanded.previous_response_id,
        "conversation": {"id": expanded.conversation_id} if expanded.conversation_id else None,
    }
