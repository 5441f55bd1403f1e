"""The Responses API through the real chain: an engine's cut stream, Switchyard's own translation, rollouts.

(The translated bodies' and events' shapes, read by the openai SDK, are checked in process:
tests/unit/api/test_responses_shapes.py.)"""

from __future__ import annotations

import httpx
import openai

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


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
