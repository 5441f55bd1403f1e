"""The Responses API through the real chain, read by the openai SDK (its stream accumulator checks order)."""

from __future__ import annotations

import json

import httpx
import openai
from openai.types.responses import Response

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


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
    raw = httpx.post(
        chain.v1 + "/responses",
        timeout=60,
        json={"model": "x", "input": "tokens please", "return_token_id_information": True},
    ).json()
    last = raw["output"][-1]
    assert last["prompt_token_ids"] and last["generation_token_ids"]
    assert len(last["generation_token_ids"]) == len(last["generation_log_probs"]) == raw["usage"]["output_tokens"]
    plain = sdk.responses.create(model="x", input="tokens please").model_dump()
    assert "generation_token_ids" not in json.dumps(plain)


def test_token_triple_in_the_completed_event_of_a_stream(chain):
    events = []
    with httpx.stream(
        "POST",
        chain.v1 + "/responses",
        timeout=60,
        json={"model": "x", "input": "tokens", "stream": True, "return_token_id_information": True},
    ) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[6:]))
    completed = events[-1]
    assert completed["type"] == "response.completed"
    assert completed["response"]["output"][-1]["generation_token_ids"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))


def test_mid_stream_failure_sends_error_then_response_failed(chain):
    events = []
    with httpx.stream(
        "POST",
        chain.v1 + "/responses",
        timeout=60,
        json={"model": "x", "stream": True, "input": "[[mock:tokens 40]] [[mock:streamcut 5]]"},
    ) as r:
        for line in r.iter_lines():
            if line.startswith("event: "):
                events.append(line[7:])
    assert events[-2:] == ["error", "response.failed"]


def test_unknown_field_is_a_400_naming_it(chain):
    response = httpx.post(chain.v1 + "/responses", timeout=30, json={"model": "x", "input": "hi", "frobnicate": 1})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "frobnicate"


def test_upstream_api_responses_passes_through_and_still_records(mock_upstream, tmp_path):
    from tests.support.stack import launch_stack

    config = tmp_path / "cfg.yaml"
    config.write_text("upstream_api: responses\n")
    stack = launch_stack(mock_upstream, tmp_path / "cap", "--config", str(config))
    try:
        sdk = openai.OpenAI(
            base_url=stack.v1,
            api_key="k",
            max_retries=0,
            default_headers={"x-session-id": "pt-1"},
            http_client=httpx.Client(timeout=60),
        )
        response = sdk.responses.create(model="x", input="hello passthrough")
        assert response.output_text and response.model == "mock-model"
        # Switchyard translated this one itself: the ids do not survive (why the default is `chat`).
        assert stack.mock_requests()[-1]["body"].get("return_token_ids") is None
        with sdk.responses.stream(model="x", input="streamed passthrough") as stream:
            final = stream.get_final_response()
        assert final.output_text
        records = stack.records("pt-1")
        assert [r["api"] for r in records] == ["responses", "responses"]
        assert records[0]["messages"][-1]["role"] == "assistant"
        assert records[0]["messages"][-1]["content"] == response.output_text
        assert records[1]["status"] == "completed" and records[1]["messages"][-1]["content"] == final.output_text
        assert records[0]["is_valid"] is False  # no token ids on this path
    finally:
        stack.proc.stop()


def test_a_rollout_keeps_the_developer_role_and_a_strict_tool_as_the_client_sent_them(chain):
    """The model is sent `system` (chat templates know it), the rollout gives Gym what Gym sent."""
    strict_tool = {**WEATHER, "strict": True}
    history: list = [
        {"role": "developer", "content": "answer in one word"},
        {
            "role": "user",
            "content": 'Paris? [[mock:tool get_weather {"city": "Paris"}]] [[mock:next]] [[mock:say sunny]]',
        },
    ]
    path = chain.url + "/ng-rollout/developer-strict/v1/responses"
    for _ in range(2):
        body = {"model": "x", "input": history, "tools": [strict_tool], "instructions": "be kind"}
        reply = httpx.post(path, json=body, timeout=30)
        assert reply.status_code == 200, reply.text
        output = reply.json()["output"]
        history += output
        calls = [item for item in output if item["type"] == "function_call"]
        if calls:
            history.append({"type": "function_call_output", "call_id": calls[0]["call_id"], "output": "sunny"})

    records = httpx.get(chain.url + "/v1/sessions/developer-strict/completions", timeout=30).json()["completions"]
    assert [m["role"] for m in records[0]["messages"][:3]] == ["system", "system", "user"]  # as sent upstream
    assert records[0]["developer_messages"] == [1] and records[0]["tools"][0]["strict"] is True
    rollout = httpx.get(chain.url + "/v1/sessions/developer-strict/rollout", timeout=30).json()
    assert not rollout["mask_sample"], rollout["partial_reason"]
    assert [(i.get("role"), i.get("content")) for i in rollout["input"][:3]] == [
        ("system", "be kind"),
        ("developer", "answer in one word"),
        ("user", history[1]["content"]),
    ]
    assert rollout["tools"] == [
        {
            "type": "function",
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": WEATHER["parameters"],
            "strict": True,
        }
    ]
