"""A Messages call as Gym's /v1/messages hands it to capture: the Responses request lineage reads, the served answer."""

from __future__ import annotations

import json

import pytest

from server.capture.gym.messages import responses_request, served_response
from server.capture.gym.tokens import request_items

CALL = {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {"command": "ls"}}


def test_blocks_become_responses_items_in_gyms_order():
    body = {
        "model": "m",
        "max_tokens": 50,
        "system": [{"type": "text", "text": "be"}, {"type": "text", "text": "brief"}],
        "tools": [{"name": "bash", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "any"},
        "messages": [
            {"role": "user", "content": "go"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "hm", "signature": "sig"},
                    {"type": "text", "text": "a"},
                    {"type": "text", "text": "b"},
                    CALL,
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "x"}]}
                ],
            },
        ],
    }
    request = responses_request(body)
    assert request["instructions"] == "be\nbrief" and request["max_output_tokens"] == 50
    assert request["tool_choice"] == "required"
    assert request["tools"] == [
        {"type": "function", "name": "bash", "description": None, "parameters": {"type": "object"}, "strict": False}
    ]
    assert [(item.get("role"), item["type"]) for item in request["input"]] == [
        ("user", "message"),
        (None, "reasoning"),
        ("assistant", "message"),
        (None, "function_call"),
        (None, "function_call_output"),
    ]
    assert request["input"][2]["content"] == [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]
    assert request["input"][3]["call_id"] == "toolu_1" and request["input"][3]["arguments"] == '{"command":"ls"}'
    assert request["input"][4]["output"] == "x"
    # Lineage reads the envelope first (the system prompt as instructions, the tools as Responses tools).
    envelope, *items = request_items(request)
    assert envelope["role"] == "_ng_request_envelope" and items == request["input"]
    assert json.loads(envelope["content"]) == {"instructions": "be\nbrief", "tools": request["tools"]}


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"messages": "hi", "system": 3, "tools": "x", "tool_choice": "auto"},
        {"messages": [None, {"role": "user", "content": [None, "x", {"type": "image"}, {"type": "tool_use"}]}]},
        {"messages": [{"role": "user", "content": [{"type": "tool_result", "content": [1, {"type": "image"}]}]}]},
    ],
)
def test_a_malformed_body_never_raises(body):
    """Read as the body arrives, before the handler's checks refuse it: whatever it holds, no exception."""
    request_items(responses_request(body))


def test_the_served_answer_carries_the_triple_under_the_served_ids():
    chat = {
        "model": "m",
        "choices": [
            {
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"id": "", "type": "function", "function": {"name": "bash", "arguments": "{}"}}],
                },
                "finish_reason": "tool_calls",
                "token_ids": [5, 6],
                "logprobs": {"content": [{"token": "a", "logprob": -0.5}, {"token": "b", "logprob": -0.25}]},
            }
        ],
        "prompt_token_ids": [1, 2, 3],
    }
    served = served_response(chat, {"messages": []}, "msg_1", ["toolu_msg_1_0"], 0)
    assert served["id"] == "msg_1" and served["object"] == "response"
    [call] = served["output"]
    assert call["type"] == "function_call" and call["call_id"] == "toolu_msg_1_0"
    assert call["prompt_token_ids"] == [1, 2, 3] and call["generation_token_ids"] == [5, 6]
    # None keeps the call's own id.
    chat["choices"][0]["message"]["tool_calls"][0]["id"] = "call_up"
    assert served_response(chat, {}, "msg_1", [None], 0)["output"][0]["call_id"] == "call_up"
