"""Responses items as they are stored: every item gets an id and an explicit shape.

A client's input may be a bare string, "easy" messages (`{"role", "content": "text"}`) or items
without ids; stored and listed items are always full items with an id (the openai SDK's item types
require one), and the same normalized items are what the model runs on, so a turn replayed from
the store translates to exactly the chat messages it did the first time.
"""

from __future__ import annotations

import itertools
import os
import secrets
from collections.abc import Callable
from typing import Any

from server.translate.response import id_base

_ID_PREFIX = {
    "message": "msg",
    "function_call": "fc",
    "function_call_output": "fco",
    "custom_tool_call": "ctc",
    "custom_tool_call_output": "ctco",
    "reasoning": "rs",
}
# Gym's token triple rides on generated items; it is capture's business, not the conversation's.
_TRAINING_KEYS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs", "routed_experts")
_WITH_STATUS = frozenset({"message", "function_call", "function_call_output"})


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


# Input items get an id on every call: a random half per process and a counter for the other half
# keeps them unique across processes and restarts without a trip to the OS's random source per item.
_ITEM_ID_PREFIX = secrets.token_hex(6)
_item_counter = itertools.count(1)


def _renew_item_ids() -> None:
    """A forked worker starts its own ids: it must not repeat its parent's prefix and counter."""
    global _ITEM_ID_PREFIX, _item_counter
    _ITEM_ID_PREFIX = secrets.token_hex(6)
    _item_counter = itertools.count(1)


os.register_at_fork(after_in_child=_renew_item_ids)


def new_item_id(prefix: str) -> str:
    """An id for an item of a client's input: `prefix_` and 24 hex digits, like `new_id`, unique per process run."""
    return f"{prefix}_{_ITEM_ID_PREFIX}{next(_item_counter):012x}"


def _normalize(item: dict[str, Any], new_id: Callable[[str], str]) -> dict[str, Any]:
    item = dict(item)
    kind = item.get("type")
    if kind is None and "role" in item:
        kind = item["type"] = "message"
    if kind == "message" and isinstance(item.get("content"), str):
        part = "output_text" if item.get("role") == "assistant" else "input_text"
        text_part: dict[str, Any] = {"type": part, "text": item["content"]}
        if part == "output_text":
            text_part["annotations"] = []
        item["content"] = [text_part]
    if kind == "item_reference":  # its id names a stored item: never made up here
        return item
    if not isinstance(item.get("id"), str) or not item["id"]:
        item["id"] = new_id(_ID_PREFIX.get(kind, "item") if isinstance(kind, str) else "item")  # kind may be any JSON
    if isinstance(kind, str) and kind in _WITH_STATUS and item.get("status") is None:
        item["status"] = "completed"
    return item


def normalize_input(value: Any, response_id: str | None = None) -> Any:
    """The input as full items; anything malformed is left as is for the translator to reject by name.

    `response_id`: the response this input is for. Items that come without an id are then named after
    it (`<prefix>_<its hex>_in<n>`), so the store finds them by that name as it finds the response's
    output items, and writes no item-index row for them (a page to write on every stored response,
    and one more at its eviction).
    """
    name = new_item_id if response_id is None else _named_after(response_id)
    if isinstance(value, str):
        return [_normalize({"type": "message", "role": "user", "content": value}, name)]
    if not isinstance(value, list):
        return value
    return [_normalize(item, name) if isinstance(item, dict) else item for item in value]


def _named_after(response_id: str) -> Callable[[str], str]:
    base = id_base(response_id)
    count = itertools.count()
    return lambda prefix: f"{prefix}_{base}_in{next(count)}"


def stored_output(output: list[Any]) -> list[dict[str, Any]]:
    """A response's output items as the next turn's input: finished items, without the token triple."""
    items = []
    for item in output:
        if not isinstance(item, dict) or item.get("status") == "in_progress":
            continue
        if any(key in item for key in _TRAINING_KEYS):
            item = {k: v for k, v in item.items() if k not in _TRAINING_KEYS}
        items.append(item)
    return items


def cursor_page(
    items: list[dict[str, Any]], *, after: str | None, limit: int, order: str
) -> tuple[list[dict[str, Any]], bool] | None:
    """One page of a cursor list (`after` an item id, in `order`); None if `after` names no item."""
    ordered = items if order == "asc" else items[::-1]
    start = 0
    if after is not None:
        for index, item in enumerate(ordered):
            if item.get("id") == after:
                start = index + 1
                break
        else:
            return None
    page = ordered[start : start + limit]
    return page, start + limit < len(ordered)


def list_object(page: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": has_more,
    }
