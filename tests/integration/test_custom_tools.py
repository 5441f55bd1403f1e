"""Freeform (`custom`) tools through the real chain with the openai SDK: offered, called, answered, chained, captured."""

from __future__ import annotations

import json

import httpx
import orjson
from openai.types.responses import Response, ResponseCustomToolCall

GRAMMAR = 'start: "*** Begin Patch" LF hunk+ "*** End Patch" LF?\n%import common.LF\n'
APPLY_PATCH = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Use the `apply_patch` tool to edit files. This is a FREEFORM tool.",
    "format": {"type": "grammar", "syntax": "lark", "definition": GRAMMAR},
}
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
# Quotes, backslashes, newlines and non-ASCII: every escape the arguments' JSON can need.
PATCH = '*** Begin Patch\n*** Update File: app.py\n@@\n-greeting = "hi"\n+greeting = "h\u00e9llo \\\\ \U0001f600"\n*** End Patch\n'


def call_patch(marker: str) -> str:
    """A user message whose mock model calls apply_patch with PATCH (the call's one string argument)."""
    return f"Fix the greeting {marker}. [[mock:tool apply_patch {orjson.dumps({'input': PATCH}).decode()}]]"


def upstream_request(chain, marker: str) -> dict:
    for request in reversed(chain.mock_requests()):
        if marker in json.dumps(request["body"]):
            return request["body"]
    raise AssertionError(f"no upstream request carried {marker!r}")


def test_custom_tool_call_non_stream_then_its_output(chain, sdk):
    first = sdk.responses.create(model="x", input=call_patch("ns-marker"), tools=[WEATHER, APPLY_PATCH])
    Response.model_validate(first.model_dump())
    call = first.output[-1]
    assert isinstance(call, ResponseCustomToolCall), first.output
    assert (call.name, call.input) == ("apply_patch", PATCH)

    # Upstream, the custom tool was a function with one string argument, grammar in its description.
    offered = {tool["function"]["name"]: tool["function"] for tool in upstream_request(chain, "ns-marker")["tools"]}
    assert offered.keys() == {"get_weather", "apply_patch"}
    assert offered["apply_patch"]["parameters"]["required"] == ["input"]
    assert GRAMMAR in offered["apply_patch"]["description"]

    history = [
        {"role": "user", "content": "Fix the greeting ns-marker."},
        call.model_dump(exclude_none=True),
        {"type": "custom_tool_call_output", "call_id": call.call_id, "output": "Success. Updated app.py out-marker"},
    ]
    second = sdk.responses.create(model="x", input=history, tools=[WEATHER, APPLY_PATCH])
    assert "out-marker" in second.output_text
    messages = upstream_request(chain, "out-marker")["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]
    sent = messages[1]["tool_calls"][0]
    assert sent["id"] == call.call_id and sent["function"]["name"] == "apply_patch"
    assert json.loads(sent["function"]["arguments"]) == {"input": PATCH}
    assert messages[2]["tool_call_id"] == call.call_id


def test_custom_tool_call_streams_input_deltas_the_sdk_assembles(sdk):
    with sdk.responses.stream(model="x", input=call_patch("st-marker"), tools=[APPLY_PATCH]) as stream:
        events = list(stream)
        final = stream.get_final_response()
    deltas = [e for e in events if e.type == "response.custom_tool_call_input.delta"]
    done = [e for e in events if e.type == "response.custom_tool_call_input.done"]
    assert len(deltas) > 1, "the mock streams arguments token by token: so must the input"
    assert "".join(e.delta for e in deltas) == done[0].input == PATCH
    assert not any(e.type.startswith("response.function_call_arguments") for e in events)
    call = final.output[-1]
    assert call.type == "custom_tool_call" and call.input == PATCH
    assert {e.item_id for e in deltas} == {call.id} and {e.output_index for e in deltas} == {len(final.output) - 1}
    item_done = [e for e in events if e.type == "response.output_item.done" and e.item.type == "custom_tool_call"]
    assert len(item_done) == 1 and item_done[0].item.input == PATCH


def test_custom_tool_call_survives_previous_response_id_and_is_captured(chain, sdk):
    session = "custom-tool-chain"
    first = sdk.responses.create(
        model="x", input=call_patch("chain-marker"), tools=[APPLY_PATCH], extra_headers={"x-session-id": session}
    )
    call = first.output[-1]
    assert call.type == "custom_tool_call"
    second = sdk.responses.create(
        model="x",
        previous_response_id=first.id,
        input=[{"type": "custom_tool_call_output", "call_id": call.call_id, "output": "patched chained-out"}],
        tools=[APPLY_PATCH],
    )
    assert "chained-out" in second.output_text
    items = sdk.responses.input_items.list(second.id, order="asc")
    assert [item.type for item in items.data] == ["message", "custom_tool_call", "custom_tool_call_output"]
    assert items.data[1].input == PATCH
    messages = upstream_request(chain, "chained-out")["messages"]
    assert json.loads(messages[1]["tool_calls"][0]["function"]["arguments"]) == {"input": PATCH}

    # Captured as the model saw it: a call to the one-argument function, then the tool result;
    # the history matched across the two calls, so the rollout is whole.
    records = chain.records(session)
    assert len(records) == 2 and all(r["is_valid"] for r in records)
    assert records[0]["messages"][-1]["tool_calls"][0]["function"]["name"] == "apply_patch"
    assert [t["id"] for t in records[0]["tools"]] == ["apply_patch"]
    rollout = httpx.get(f"{chain.v1}/sessions/{session}/rollout").json()
    assert rollout["partial_reason"] is None and rollout["mask_sample"] is False
    kinds = [item["type"] for item in rollout["output"]]
    assert kinds == ["function_call", "function_call_output", "message"]
    assert json.loads(rollout["output"][0]["arguments"]) == {"input": PATCH}
