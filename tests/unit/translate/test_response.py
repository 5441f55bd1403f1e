"""Chat answer -> Responses object (what the openai SDK accepts), and back for the passthrough."""

from __future__ import annotations

import orjson
import pytest
from openai.types.responses import Response

from server.translate.request import responses_to_chat
from tests.support.translate import (
    COMPLETED_AT,
    FN_EXEC,
    NS_AGENTS,
    OPEN_RESPONSES_KEYS,
    PROMPT_IDS,
    WEB_SEARCH,
    chat_completion,
    lp,
    sdk_client,
    to_response,
)

# ---- non-stream response -------------------------------------------------------------------------


def test_text_response_is_complete_and_sdk_valid():
    response = to_response(chat_completion({"content": "Hello from fake upstream"}))
    assert OPEN_RESPONSES_KEYS <= response.keys()
    parsed = Response.model_validate(response)
    assert parsed.output_text == "Hello from fake upstream"
    assert response["model"] == "fake/ok"  # the routed target, not the route
    assert (response["status"], response["object"], response["created_at"]) == ("completed", "response", 1795956000)
    assert response["completed_at"] == COMPLETED_AT  # the caller's clock, not a wall-clock read
    assert response["output"] == [
        {
            "id": "msg_abc_0",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "Hello from fake upstream", "annotations": [], "logprobs": []}],
        }
    ]
    assert response["usage"] == {
        "input_tokens": 5,
        "input_tokens_details": {"cached_tokens": 2, "cache_write_tokens": 0},
        "output_tokens": 4,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 9,
    }


def test_request_settings_are_echoed_and_metadata_returned():
    request = {
        "model": "sy/route",
        "input": "x",
        "instructions": "be brief",
        "metadata": {"run": "7"},
        "temperature": 0.3,
        "max_output_tokens": 99,
        "tool_choice": "none",
        "tools": [FN_EXEC, WEB_SEARCH],
        "user": "u",
        "reasoning": {"effort": "low"},
        "prompt_cache_key": "pk",
        "top_logprobs": 2,
    }
    response = to_response(chat_completion({"content": "ok"}), request)
    Response.model_validate(response)
    for key in (
        "instructions",
        "metadata",
        "temperature",
        "max_output_tokens",
        "tool_choice",
        "tools",
        "user",
        "reasoning",
        "prompt_cache_key",
        "top_logprobs",
    ):
        assert response[key] == request[key], key
    assert (response["store"], response["background"], response["previous_response_id"]) == (False, False, None)


def test_tool_calls_become_function_call_items_with_namespace_restored():
    translated = responses_to_chat({"model": "m", "input": "x", "tools": [FN_EXEC, NS_AGENTS]})
    args = '{"task": "echo hello-from-tool"}'
    response = to_response(
        chat_completion(
            {
                "content": "",
                "tool_calls": [
                    {
                        "id": "call_fake_1",
                        "type": "function",
                        "function": {"name": "multi_agent_v1__spawn_agent", "arguments": args},
                    },
                    {
                        "id": "call_fake_2",
                        "type": "function",
                        "function": {"name": "exec_command", "arguments": '{"cmd":"ls"}'},
                    },
                ],
            },
            finish="tool_calls",
        ),
        tool_map=translated.tool_map,
    )
    Response.model_validate(response)
    assert response["output"] == [
        {
            "id": "fc_abc_0",
            "type": "function_call",
            "call_id": "call_fake_1",
            "name": "spawn_agent",
            "arguments": args,
            "status": "completed",
            "namespace": "multi_agent_v1",
        },
        {
            "id": "fc_abc_1",
            "type": "function_call",
            "call_id": "call_fake_2",
            "name": "exec_command",
            "arguments": '{"cmd":"ls"}',
            "status": "completed",
        },
    ]
    assert response["status"] == "completed"


def test_reasoning_text_and_calls_come_out_in_order():
    response = to_response(
        chat_completion(
            {
                "reasoning_content": "I should greet.",
                "content": "Hi",
                "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
            },
            finish="tool_calls",
        )
    )
    Response.model_validate(response)
    assert [item["type"] for item in response["output"]] == ["reasoning", "message", "function_call"]
    assert response["output"][0] == {
        "id": "rs_abc_0",
        "type": "reasoning",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": "I should greet."}],
        "encrypted_content": None,
        "status": "completed",
    }
    assert len({item["id"] for item in response["output"]}) == 3


def test_output_echoed_back_as_input_reproduces_the_assistant_turn():
    # Codex and Gym resend our output items verbatim; the model must see its own turn unchanged.
    translated = responses_to_chat({"model": "m", "input": "x", "tools": [FN_EXEC, NS_AGENTS]})
    assistant = {
        "role": "assistant",
        "content": "Working on it.",
        "reasoning_content": "plan: spawn, then ls",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "multi_agent_v1__spawn_agent", "arguments": '{"task": "t"}'},
            },
            {"id": "call_2", "type": "function", "function": {"name": "exec_command", "arguments": '{"cmd":  "ls"}'}},
        ],
    }
    ids = [1, 2, 3]
    doc = chat_completion(dict(assistant), finish="tool_calls", token_ids=ids, logprobs=[lp(i, -0.1) for i in ids])
    output = to_response(doc, tool_map=translated.tool_map, token_ids=True)["output"]
    follow_up = {
        "model": "m",
        "tools": [FN_EXEC, NS_AGENTS],
        "input": [
            {"role": "user", "content": "x"},
            *output,
            {"type": "function_call_output", "call_id": "call_1", "output": "spawned"},
            {"type": "function_call_output", "call_id": "call_2", "output": "a b"},
        ],
    }
    messages = responses_to_chat(follow_up).body["messages"]
    assert messages[1] == assistant
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool"]


def test_newer_vllm_reasoning_key_is_read_too():
    response = to_response(chat_completion({"reasoning": "hmm", "content": "Hi"}))
    assert response["output"][0]["content"][0]["text"] == "hmm"


def test_refusal_message():
    response = to_response(chat_completion({"content": None, "refusal": "No."}))
    Response.model_validate(response)
    assert response["output"][0]["content"] == [{"type": "refusal", "refusal": "No."}]


def test_empty_generation_still_has_one_message_item():
    response = to_response(chat_completion({"content": None}))
    Response.model_validate(response)
    assert [item["type"] for item in response["output"]] == ["message"]
    assert response["output"][0]["content"][0]["text"] == ""


@pytest.mark.parametrize("finish, reason", [("length", "max_output_tokens"), ("content_filter", "content_filter")])
def test_length_and_content_filter_are_incomplete(finish, reason):
    response = to_response(chat_completion({"content": "trunc"}, finish=finish))
    Response.model_validate(response)
    assert response["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": reason}
    assert response["output"][-1]["status"] == "incomplete"
    assert response["completed_at"] is None


def test_token_triple_goes_on_the_last_item_only():
    ids, probs = [9707, 504, 12418, 41730], [-0.1, -0.2, -0.3, -0.4]
    doc = chat_completion(
        {
            "content": "Hello",
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
        },
        finish="tool_calls",
        token_ids=ids,
        logprobs=[lp(i, p) for i, p in zip(ids, probs)],
    )
    response = to_response(doc, token_ids=True)
    Response.model_validate(response)
    first, last = response["output"]
    assert "prompt_token_ids" not in first
    assert (last["prompt_token_ids"], last["generation_token_ids"], last["generation_log_probs"]) == (
        PROMPT_IDS,
        ids,
        probs,
    )
    assert "prompt_token_ids" not in orjson.dumps(to_response(doc, token_ids=False)).decode()


def test_usage_falls_back_to_token_counts_then_null():
    ids = [7, 8, 9]
    doc = chat_completion({"content": "x"}, token_ids=ids, logprobs=[lp(i, -1.0) for i in ids], usage=False)
    usage = to_response(doc)["usage"]
    assert (usage["input_tokens"], usage["output_tokens"], usage["total_tokens"]) == (5, 3, 8)
    assert to_response(chat_completion({"content": "x"}, usage=False, prompt_ids=False))["usage"] is None


def test_output_text_logprobs_only_when_asked():
    entries = [lp(1, -0.25)]
    doc = chat_completion({"content": "h"}, logprobs=entries)
    assert to_response(doc)["output"][0]["content"][0]["logprobs"] == []
    asked = to_response(doc, {"model": "m", "input": "x", "top_logprobs": 1})
    Response.model_validate(asked)
    assert asked["output"][0]["content"][0]["logprobs"] == [
        {
            "token": "token_id:1",
            "logprob": -0.25,
            "bytes": [104],
            "top_logprobs": [{"token": "token_id:1", "logprob": -0.25, "bytes": [104]}],
        }
    ]


def test_openai_client_reads_the_non_stream_response():
    response = to_response(chat_completion({"content": "Hello"}))
    client = sdk_client(orjson.dumps(response), "application/json")
    parsed = client.responses.create(model="m", input="x")
    assert parsed.output_text == "Hello" and parsed.id == "resp_abc"


def test_response_base_echoes_settings_defaults_nulls_and_never_shares_its_lists():
    from server.translate.response import response_base

    request = {"temperature": 0.2, "top_p": None, "tools": None, "input": "hi", "model": "asked", "store": True}
    one = response_base(request, response_id="resp_1", created_at=5, model=None, echo={"store": True})
    assert one["temperature"] == 0.2 and one["top_p"] == 1.0 and one["tools"] == [] and one["model"] == "asked"
    assert "input" not in one and one["store"] is True and one["status"] == "in_progress"
    assert list(one)[:3] == ["id", "object", "created_at"] and list(one)[-1] == "prompt"
    one["output"].append({})
    one["tools"].append({})
    one["metadata"]["k"] = "v"
    two = response_base({}, response_id="resp_2", created_at=6, model="routed")
    assert two["output"] == [] and two["tools"] == [] and two["metadata"] == {} and two["store"] is False
    assert two["model"] == "routed"
