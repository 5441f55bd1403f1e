"""The Anthropic Messages API through the real chain, read by the anthropic SDK (its types and stream accumulator check the shape)."""

from __future__ import annotations

import uuid

import anthropic
import httpx
import orjson
import pytest
from anthropic.types import Message

from tests.support.agents import assert_token_exact, get_json
from tests.support.stack import token_breaks

BASH = {
    "name": "Bash",
    "description": "Run a shell command",
    "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
}


def client_for(url: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=url,
        api_key="sk-test",
        max_retries=0,
        timeout=60,
        http_client=anthropic.DefaultHttpxClient(),  # the SDK's own httpx flavour
    )


@pytest.fixture(scope="module")
def sdk(chain) -> anthropic.Anthropic:
    return client_for(chain.url)


def session_headers(session: str) -> dict[str, str]:
    return {"x-claude-code-session-id": session}


def test_text_non_stream(sdk):
    message = sdk.messages.create(model="claude-x", max_tokens=64, messages=[{"role": "user", "content": "Say hi"}])
    Message.model_validate(message.model_dump())
    assert message.type == "message" and message.role == "assistant" and message.model == "mock-model"
    assert message.stop_reason == "end_turn"
    assert message.content[0].type == "text" and message.content[0].text
    assert message.usage.input_tokens > 0 and message.usage.output_tokens > 0


def test_text_stream_matches_non_stream(sdk):
    request = {"model": "x", "max_tokens": 64, "messages": [{"role": "user", "content": "Say hello"}]}
    with sdk.messages.stream(**request) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    Message.model_validate(final.model_dump())
    assert text == final.content[0].text == sdk.messages.create(**request).content[0].text
    assert final.stop_reason == "end_turn" and final.usage.output_tokens > 0


@pytest.mark.parametrize("streamed", [False, True])
def test_tool_use_then_the_result_sent_back(sdk, chain, streamed):
    session = f"tools-{uuid.uuid4().hex[:8]}"
    history: list = [{"role": "user", "content": 'List files. [[mock:tool Bash {"command": "ls"}]]'}]

    def ask() -> Message:
        request = {"model": "x", "max_tokens": 200, "messages": history, "tools": [BASH]}
        if not streamed:
            return sdk.messages.create(**request, extra_headers=session_headers(session))
        with sdk.messages.stream(**request, extra_headers=session_headers(session)) as stream:
            return stream.get_final_message()

    first = ask()
    Message.model_validate(first.model_dump())
    assert first.stop_reason == "tool_use"
    calls = [block for block in first.content if block.type == "tool_use"]
    assert len(calls) == 1 and calls[0].name == "Bash" and calls[0].input == {"command": "ls"}
    history.append({"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in first.content]})
    history.append(
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": calls[0].id, "content": "README.md"}]}
    )
    second = ask()
    assert second.stop_reason == "end_turn" and "README.md" in second.content[-1].text

    # Captured under the Claude Code session header, as messages calls, one token chain.
    records = get_json(f"{chain.v1}/sessions/{session}/completions")["completions"]
    assert [r["api"] for r in records] == ["messages", "messages"] and all(r["is_valid"] for r in records)
    assert [r["response_id"] for r in records] == [first.id, second.id]
    rollout = get_json(f"{chain.v1}/sessions/{session}/rollout")
    assert rollout["partial_reason"] is None and rollout["mask_sample"] is False, rollout["partial_reason"]
    assert [item["type"] for item in rollout["output"]] == ["function_call", "function_call_output", "message"]
    assert_token_exact(chain, rollout)


def _thinking_turns(sdk, session: str, send_back, streamed: bool = False) -> list[Message]:
    history: list = [{"role": "user", "content": "Think first. [[mock:reasoning]] [[mock:tool Bash {}]]"}]
    request = {"model": "x", "max_tokens": 300, "tools": [BASH], "thinking": {"type": "enabled", "budget_tokens": 100}}

    def ask() -> Message:
        if not streamed:
            return sdk.messages.create(**request, messages=history, extra_headers=session_headers(session))
        with sdk.messages.stream(**request, messages=history, extra_headers=session_headers(session)) as stream:
            return stream.get_final_message()

    first = ask()
    history.append({"role": "assistant", "content": send_back(first.content)})
    call = next(block for block in first.content if block.type == "tool_use")
    history.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "ok"}]})
    return [first, ask()]


@pytest.mark.parametrize("streamed", [False, True])
def test_thinking_with_its_signed_block_sent_back_keeps_the_token_chain(sdk, chain, streamed):
    before = chain.engine_mark()
    first, _ = _thinking_turns(
        sdk, f"think-{uuid.uuid4().hex[:8]}", lambda content: [b.model_dump() for b in content], streamed
    )
    Message.model_validate(first.model_dump())
    thinking = first.content[0]
    assert thinking.type == "thinking" and thinking.thinking and thinking.signature
    calls = chain.engine_calls(after=before)
    assert len(calls) == 2 and token_breaks(calls) == []
    # Negative control: the same turns without the thinking block break the chain (the engine sees
    # a history without its reasoning).
    before = chain.engine_mark()
    _thinking_turns(
        sdk, f"nothink-{uuid.uuid4().hex[:8]}", lambda content: [b.model_dump() for b in content[1:]], streamed
    )
    assert token_breaks(chain.engine_calls(after=before)) == [1]


def test_omitted_thinking_display_still_seals_the_reasoning(sdk, chain):
    message = sdk.messages.create(
        model="x",
        max_tokens=300,
        thinking={"type": "adaptive", "display": "omitted"},
        messages=[{"role": "user", "content": "Think. [[mock:reasoning]]"}],
    )
    thinking = message.content[0]
    assert thinking.type == "thinking" and thinking.thinking == "" and thinking.signature


def test_a_tampered_thinking_signature_is_refused(sdk):
    first = sdk.messages.create(
        model="x", max_tokens=300, messages=[{"role": "user", "content": "Think. [[mock:reasoning]]"}]
    )
    blocks = [b.model_dump() for b in first.content]
    signature = blocks[0]["signature"]
    blocks[0]["signature"] = signature[:-6] + ("AAAAAA" if signature[-6:] != "AAAAAA" else "BBBBBB")
    with pytest.raises(anthropic.BadRequestError) as caught:
        sdk.messages.create(
            model="x",
            max_tokens=50,
            messages=[
                {"role": "user", "content": "Think. [[mock:reasoning]]"},
                {"role": "assistant", "content": blocks},
                {"role": "user", "content": "again"},
            ],
        )
    error = caught.value.body["error"]
    assert error["type"] == "invalid_request_error" and "signature" in error["message"]


@pytest.mark.parametrize("streamed", [False, True])
def test_a_length_stop(sdk, streamed):
    request = {"model": "x", "max_tokens": 5, "messages": [{"role": "user", "content": "[[mock:length 5]] go"}]}
    if streamed:
        with sdk.messages.stream(**request) as stream:
            message = stream.get_final_message()
    else:
        message = sdk.messages.create(**request)
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 5


@pytest.mark.parametrize("streamed", [False, True])
def test_upstream_429_and_500_in_anthropic_shape(sdk, streamed):
    def ask(directive: str):
        request = {
            "model": "x",
            "max_tokens": 20,
            "messages": [{"role": "user", "content": f"{directive} {uuid.uuid4()}"}],
        }
        if streamed:
            with sdk.messages.stream(**request) as stream:
                return stream.get_final_message()
        return sdk.messages.create(**request)

    with pytest.raises(anthropic.RateLimitError) as limited:
        ask("[[mock:error 429 3]]")
    assert limited.value.body["error"]["type"] == "rate_limit_error"
    assert limited.value.response.headers["retry-after"]
    with pytest.raises(anthropic.InternalServerError) as failed:
        ask("[[mock:error 500]]")
    assert failed.value.status_code >= 500 and failed.value.body["type"] == "error"


def raw_events(chain, body: dict) -> list[tuple[str, dict]]:
    """The stream's events in wire order: (the `event:` name, the data)."""
    with httpx.stream("POST", chain.v1 + "/messages?beta=true", json={**body, "stream": True}, timeout=60) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        text = response.read().decode()
    events = []
    for block in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines())
        data = orjson.loads(lines["data"])
        assert data["type"] == lines["event"]
        events.append((lines["event"], data))
    return events


def test_raw_sse_order_event_by_event(chain):
    events = raw_events(
        chain,
        {
            "model": "x",
            "max_tokens": 300,
            "tools": [BASH],
            "messages": [{"role": "user", "content": 'Go. [[mock:reasoning]] [[mock:tool Bash {"command": "ls"}]]'}],
        },
    )
    names = [name for name, _ in events]
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-2:] == ["message_delta", "message_stop"]
    blocks: dict[int, list[str]] = {}
    for name, data in events:
        if name.startswith("content_block"):
            kind = data["content_block"]["type"] if name == "content_block_start" else data.get("delta", {}).get("type")
            blocks.setdefault(data["index"], []).append(kind or name)
    thinking, *rest = blocks.values()
    assert thinking[0] == "thinking" and set(thinking[1:-2]) == {"thinking_delta"}
    assert thinking[-2:] == ["signature_delta", "content_block_stop"]
    tool = list(blocks.values())[-1]
    assert tool[0] == "tool_use" and "input_json_delta" in tool and tool[-1] == "content_block_stop"
    # Blocks never overlap: each one stops before the next starts.
    starts_and_stops = [
        (name, data["index"]) for name, data in events if name in ("content_block_start", "content_block_stop")
    ]
    assert starts_and_stops == [
        (kind, i) for i in range(len(blocks)) for kind in ("content_block_start", "content_block_stop")
    ]
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"


def test_a_stream_cut_upstream_ends_with_an_error_event(chain):
    events = raw_events(
        chain, {"model": "x", "max_tokens": 100, "messages": [{"role": "user", "content": "[[mock:streamcut 3]] hi"}]}
    )
    assert events[0][0] == "message_start" and events[-1][0] == "error"
    assert events[-1][1]["error"]["type"] == "api_error"


def test_without_the_session_header_a_call_is_recorded_in_the_session_its_answer_names(chain):
    marker = uuid.uuid4().hex
    response = httpx.post(
        chain.v1 + "/messages",
        json={"model": "x", "max_tokens": 20, "messages": [{"role": "user", "content": marker}]},
        timeout=60,
    )
    assert response.status_code == 200
    session = response.headers["x-switchyard-session-id"]
    assert session.startswith("inferred-") and response.headers["x-switchyard-model-capture"] == "recorded"
    (record,) = get_json(f"{chain.v1}/sessions/{session}/completions")["completions"]
    assert marker in orjson.dumps(record["messages"]).decode() and record["session_source"] == "inferred"


def test_errors_in_anthropic_shape(chain):
    post = lambda body: httpx.post(chain.v1 + "/messages", json=body, timeout=60)  # noqa: E731
    unknown = post({"model": "x", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "bogus": 1})
    assert unknown.status_code == 400
    assert unknown.json() == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "unsupported parameter: bogus"},
    }
    missing = post({"model": "x", "messages": [{"role": "user", "content": "x"}]})
    assert missing.status_code == 400 and "max_tokens" in missing.json()["error"]["message"]


def test_models_in_anthropic_shape_with_anthropic_version(sdk, chain):
    page = sdk.models.list()
    assert [model.id for model in page.data] and page.data[0].type == "model"
    plain = get_json(chain.v1 + "/models")
    assert plain["object"] == "list" and "owned_by" in plain["data"][0]


def test_count_tokens_is_the_engines_prompt_length(sdk, chain):
    messages = [{"role": "user", "content": "Count these words please"}]
    counted = sdk.messages.count_tokens(model="x", messages=messages, system="be brief")
    created = sdk.messages.create(model="x", max_tokens=5, messages=messages, system="be brief")
    assert counted.input_tokens == created.usage.input_tokens > 0


def test_under_the_gym_prefix_the_rollout_is_the_session(chain):
    rollout_id = f"msg-r{uuid.uuid4().hex[:6]}"
    response = httpx.post(
        f"{chain.url}/ng-rollout/{rollout_id}/v1/messages?beta=true",
        json={"model": "x", "max_tokens": 20, "messages": [{"role": "user", "content": "hi"}]},
        timeout=60,
    )
    assert response.status_code == 200 and response.json()["type"] == "message"
    records = get_json(f"{chain.v1}/sessions/{rollout_id}/completions")["completions"]
    assert [(r["api"], r["rollout_id"]) for r in records] == [("messages", rollout_id)]


def test_metrics_name_the_messages_api(sdk, chain):
    sdk.messages.create(model="x", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    metrics = httpx.get(chain.url + "/metrics", timeout=30).text
    assert 'openai_api_type="messages"' in metrics


@pytest.mark.parametrize("injection", [True, False])
def test_token_injection_keeps_a_messages_chain_whole_on_a_template_that_drops_reasoning(reasoning_chains, injection):
    """With injection the engine continues from its own ids; without (the control) the re-rendered turn breaks."""
    chain = reasoning_chains[injection]
    before = chain.engine_mark()
    _thinking_turns(
        client_for(chain.url), f"inj-{uuid.uuid4().hex[:8]}", lambda content: [b.model_dump() for b in content]
    )
    assert token_breaks(chain.engine_calls(after=before)) == ([] if injection else [1])
