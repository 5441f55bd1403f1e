"""The Responses API's answers and events, read by the openai SDK (its stream accumulator checks order),
in process: the app behind httpx.ASGITransport, the mock engine's app as its upstream."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from openai.types.responses import Response

from tests.support.inprocess import in_process_server

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    """Named as the integration stack is, so that the tests read as they did there."""
    with in_process_server(tmp_path_factory.mktemp("responses-shapes")) as server:
        yield server


@pytest.fixture(scope="module")
def sdk(chain) -> openai.OpenAI:
    """The OpenAI SDK against the in-process app, without retries (a retry would hide a failed call)."""
    return openai.OpenAI(
        base_url=chain.v1, api_key="sk-test", max_retries=0, http_client=httpx.Client(transport=chain.transport)
    )


def test_text_non_stream(sdk):
    response = sdk.responses.create(model="whatever", input="Say hello")
    Response.model_validate(response.model_dump())
    assert response.status == "completed" and response.output_text
    assert response.model == "mock-model"
    assert response.usage.input_tokens > 0 and response.usage.output_tokens > 0
    assert response.output[-1].type == "message"


def test_text_stream_matches_non_stream(sdk):
    with sdk.responses.stream(model="x", input="Say hello") as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    Response.model_validate(final.model_dump())
    assert "".join(deltas) == final.output_text == sdk.responses.create(model="x", input="Say hello").output_text


def test_tool_call_then_function_call_output(sdk):
    history: list = [{"role": "user", "content": 'Paris? [[mock:tool get_weather {"city": "Paris"}]]'}]
    first = sdk.responses.create(model="x", input=history, tools=[WEATHER])
    calls = [item for item in first.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    assert json.loads(calls[0].arguments) == {"city": "Paris"}
    history += [item.model_dump(exclude_none=True) for item in first.output]
    history.append({"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny, 21C"})
    second = sdk.responses.create(model="x", input=history, tools=[WEATHER])
    assert "sunny, 21C" in second.output_text


def test_tool_call_streamed(sdk):
    with sdk.responses.stream(
        model="x", input='go [[mock:tool get_weather {"city": "Oslo"}]]', tools=[WEATHER]
    ) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_response()
    assert "response.function_call_arguments.delta" in kinds and "response.output_item.done" in kinds
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    call = next(item for item in final.output if item.type == "function_call")
    assert json.loads(call.arguments) == {"city": "Oslo"}


def test_length_stop_is_incomplete(sdk):
    response = sdk.responses.create(model="x", input="[[mock:length 5]] go", max_output_tokens=5)
    assert response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.output_tokens == 5


def test_token_triple_when_asked(sdk, chain):
    raw = chain.client.post(
        "/v1/responses",
        json={"model": "x", "input": "tokens please", "return_token_id_information": True},
    ).json()
    last = raw["output"][-1]
    assert last["prompt_token_ids"] and last["generation_token_ids"]
    assert len(last["generation_token_ids"]) == len(last["generation_log_probs"]) == raw["usage"]["output_tokens"]
    plain = sdk.responses.create(model="x", input="tokens please").model_dump()
    assert "generation_token_ids" not in json.dumps(plain)


def test_token_triple_in_the_completed_event_of_a_stream(chain):
    events = []
    with chain.client.stream(
        "POST",
        "/v1/responses",
        json={"model": "x", "input": "tokens", "stream": True, "return_token_id_information": True},
    ) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[6:]))
    completed = events[-1]
    assert completed["type"] == "response.completed"
    assert completed["response"]["output"][-1]["generation_token_ids"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))


def test_unknown_field_is_a_400_naming_it(chain):
    response = chain.client.post("/v1/responses", json={"model": "x", "input": "hi", "frobnicate": 1})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "frobnicate"


def test_a_plain_call_writes_no_item_index_row_and_its_items_can_be_referenced(sdk, chain):
    """The input's items are named after the response (`msg_<its hex>_in0`) and found by that name, as its
    output items are: storing a call whose client gave no item ids writes no row into the item index."""
    index = chain.state.response_store.db.connection()
    rows_before = index.execute("SELECT COUNT(*) FROM response_items").fetchone()[0]
    first = sdk.responses.create(model="whatever", input="Say hello")
    (item,) = sdk.responses.input_items.list(first.id).data
    assert item.id == "msg_" + first.id.removeprefix("resp_") + "_in0"
    assert index.execute("SELECT COUNT(*) FROM response_items").fetchone()[0] == rows_before
    second = sdk.responses.create(
        model="whatever",
        input=[{"type": "item_reference", "id": item.id}, {"type": "item_reference", "id": first.output[-1].id}],
    )
    assert [i.id for i in sdk.responses.input_items.list(second.id, order="asc").data] == [item.id, first.output[-1].id]
