"""The event stream of a stored response: followed live (background runs) or rebuilt from the stored object.

A background run keeps its stream events in the store as it goes, so `GET /v1/responses/{id}?stream=true`
on any worker replays them and then follows the run until it ends, resuming after `starting_after`.
A response that was not run in the background has no kept events; its stream is rebuilt from the
stored object in the canonical order (created, in_progress, each item added/delta/done, terminal),
one delta per content part.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import orjson

from server.stateful.responses import ResponseStore, StoredResponse

DONE = b"data: [DONE]\n\n"
_TERMINAL = {"completed": "response.completed", "incomplete": "response.incomplete", "failed": "response.failed"}


def frame(event: dict[str, Any]) -> bytes:
    kind: str = event["type"]
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"


def _in_progress(item: dict[str, Any]) -> dict[str, Any]:
    opened = {**item, "status": "in_progress"}
    kind = item.get("type")
    if kind in ("message", "reasoning"):
        opened["content"] = []
    elif kind == "function_call":
        opened["arguments"] = ""
    elif kind == "custom_tool_call":
        opened["input"] = ""
    return opened


def _item_events(index: int, item: dict[str, Any]) -> Iterator[dict[str, Any]]:
    ids = {"item_id": item.get("id"), "output_index": index}
    yield {"type": "response.output_item.added", "output_index": index, "item": _in_progress(item)}
    kind = item.get("type")
    if kind == "function_call":
        arguments = item.get("arguments") or ""
        yield {"type": "response.function_call_arguments.delta", **ids, "delta": arguments}
        yield {"type": "response.function_call_arguments.done", **ids, "arguments": arguments}
    elif kind == "custom_tool_call":
        text = item.get("input") or ""
        yield {"type": "response.custom_tool_call_input.delta", **ids, "delta": text}
        yield {"type": "response.custom_tool_call_input.done", **ids, "input": text}
    elif kind in ("message", "reasoning"):
        for k, part in enumerate(item.get("content") or []):
            at = {**ids, "content_index": k}
            ptype = part.get("type")
            if ptype == "output_text":
                empty: dict[str, Any] = {"type": "output_text", "text": "", "annotations": []}
                yield {"type": "response.content_part.added", **at, "part": empty}
                yield {"type": "response.output_text.delta", **at, "delta": part.get("text", ""), "logprobs": []}
                yield {
                    "type": "response.output_text.done",
                    **at,
                    "text": part.get("text", ""),
                    "logprobs": part.get("logprobs") or [],
                }
            elif ptype == "refusal":
                yield {"type": "response.content_part.added", **at, "part": {"type": "refusal", "refusal": ""}}
                yield {"type": "response.refusal.delta", **at, "delta": part.get("refusal", "")}
                yield {"type": "response.refusal.done", **at, "refusal": part.get("refusal", "")}
            elif ptype == "reasoning_text":
                yield {"type": "response.content_part.added", **at, "part": {"type": "reasoning_text", "text": ""}}
                yield {"type": "response.reasoning_text.delta", **at, "delta": part.get("text", "")}
                yield {"type": "response.reasoning_text.done", **at, "text": part.get("text", "")}
            else:
                continue
            yield {"type": "response.content_part.done", **at, "part": part}
    yield {"type": "response.output_item.done", "output_index": index, "item": item}


def rebuilt_events(response: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The canonical event sequence that ends in `response`, with sequence numbers from 0."""

    def events() -> Iterator[dict[str, Any]]:
        opening = {**response, "status": "in_progress", "output": [], "usage": None, "completed_at": None}
        yield {"type": "response.created", "response": opening}
        yield {"type": "response.in_progress", "response": opening}
        for index, item in enumerate(response.get("output") or []):
            if isinstance(item, dict):
                yield from _item_events(index, item)
        terminal = _TERMINAL.get(response.get("status") or "")
        if terminal:
            yield {"type": terminal, "response": response}

    for seq, event in enumerate(events()):
        event["sequence_number"] = seq
        yield event


async def follow(
    store: ResponseStore, stored: StoredResponse, owner: str, starting_after: int, poll_s: float = 0.1
) -> AsyncIterator[bytes]:
    """SSE frames after `starting_after`, ending with `data: [DONE]`; live for a run still going."""
    if not stored.background:
        for event in rebuilt_events(stored.response):
            if event["sequence_number"] > starting_after:
                yield frame(event)
        yield DONE
        return
    after = starting_after
    finished = False
    while True:
        events = await asyncio.to_thread(store.events_after, stored.id, after)
        for seq, data in events:
            after = seq
            yield data
        if events:
            continue
        if finished:
            break
        current = await asyncio.to_thread(store.get, stored.id, owner)
        if current is None or not current.running:
            finished = True  # one more read: the runner writes its last events before its final status
            continue
        await asyncio.sleep(poll_s)
    yield DONE
