"""Responses request -> chat request: input items, fields, and the 400s naming what is wrong."""

from __future__ import annotations

import orjson
import pytest

from server.translate.request import responses_to_chat
from tests.support.translate import (
    CODEX_BODY,
    FN_EXEC,
    chat,
    error_of,
)

# ---- request: input items ------------------------------------------------------------------------


def test_string_input_is_one_user_message_and_instructions_lead_as_system():
    assert chat({"input": "hello"}) == {"messages": [{"role": "user", "content": "hello"}]}
    assert chat({"input": "hello", "instructions": "be brief"})["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hello"},
    ]


def test_message_roles_and_content_forms():
    messages = chat(
        {
            "input": [
                {"type": "message", "role": "system", "content": "sys"},
                {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "dev"}]},
                {"role": "user", "content": "easy form without a type"},
                {
                    "type": "message",
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "look:"},
                        {"type": "input_image", "image_url": "data:image/png;base64,AAA", "detail": "low"},
                    ],
                },
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [
                        {"type": "output_text", "text": "part one, ", "annotations": []},
                        {"type": "output_text", "text": "part two", "annotations": [], "logprobs": []},
                    ],
                },
            ]
        }
    )["messages"]
    assert messages == [
        {"role": "system", "content": "sys"},
        {"role": "system", "content": "dev"},  # developer -> system by default (templates know system)
        {"role": "user", "content": "easy form without a type"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "look:"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAA", "detail": "low"}},
            ],
        },
        {"role": "assistant", "content": "part one, part two"},
    ]


def test_developer_role_can_be_kept():
    body = {"input": [{"role": "developer", "content": "dev"}]}
    assert chat(body, developer_role="developer")["messages"] == [{"role": "developer", "content": "dev"}]


def test_assistant_refusal_part_becomes_the_chat_refusal_field():
    messages = chat(
        {"input": [{"type": "message", "role": "assistant", "content": [{"type": "refusal", "refusal": "I can't."}]}]}
    )["messages"]
    assert messages == [{"role": "assistant", "content": "", "refusal": "I can't."}]


def test_function_calls_merge_into_one_assistant_turn_with_its_text():
    args_a = '{"cmd": "ls -la"}'  # spacing must survive byte for byte
    args_b = '{"cmd":"pwd"}'
    messages = chat(
        {
            "input": [
                {"role": "user", "content": "go"},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Running."}]},
                {
                    "type": "function_call",
                    "id": "fc_1",
                    "status": "completed",
                    "call_id": "call_a",
                    "name": "exec_command",
                    "arguments": args_a,
                },
                {"type": "function_call", "call_id": "call_b", "name": "exec_command", "arguments": args_b},
                {"type": "function_call_output", "id": "fco_1", "call_id": "call_a", "output": "total 0\n"},
                {
                    "type": "function_call_output",
                    "call_id": "call_b",
                    "output": [{"type": "input_text", "text": "/home"}],
                },
                {"type": "function_call", "call_id": "call_c", "name": "exec_command", "arguments": "{}"},
            ]
        }
    )["messages"]
    assert messages == [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": "Running.",
            "tool_calls": [
                {"id": "call_a", "type": "function", "function": {"name": "exec_command", "arguments": args_a}},
                {"id": "call_b", "type": "function", "function": {"name": "exec_command", "arguments": args_b}},
            ],
        },
        {"role": "tool", "tool_call_id": "call_a", "content": "total 0\n"},
        {"role": "tool", "tool_call_id": "call_b", "content": "/home"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "call_c", "type": "function", "function": {"name": "exec_command", "arguments": "{}"}}
            ],
        },
    ]


def test_function_call_output_with_an_image_keeps_parts():
    messages = chat(
        {
            "input": [
                {
                    "type": "function_call_output",
                    "call_id": "c",
                    "output": [
                        {"type": "input_text", "text": "shot:"},
                        {"type": "input_image", "image_url": "https://x/y.png"},
                    ],
                }
            ]
        }
    )["messages"]
    assert messages[0]["content"] == [
        {"type": "text", "text": "shot:"},
        {"type": "image_url", "image_url": {"url": "https://x/y.png"}},
    ]


def test_reasoning_items_attach_to_the_next_assistant_message():
    messages = chat(
        {
            "input": [
                {"role": "user", "content": "q"},
                {
                    "type": "reasoning",
                    "id": "rs_1",
                    "summary": [],
                    "content": [
                        {"type": "reasoning_text", "text": "think "},
                        {"type": "reasoning_text", "text": "hard"},
                    ],
                },
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "A"}]},
                {"role": "user", "content": "q2"},
                {
                    "type": "reasoning",
                    "id": "rs_2",
                    "summary": [{"type": "summary_text", "text": "sum 1"}, {"type": "summary_text", "text": "sum 2"}],
                },
                {"type": "function_call", "call_id": "c", "name": "exec_command", "arguments": "{}"},
                {"type": "reasoning", "id": "rs_3", "summary": [], "encrypted_content": "opaque"},
                {"type": "function_call_output", "call_id": "c", "output": "ok"},
            ]
        }
    )["messages"]
    assert messages[1] == {"role": "assistant", "content": "A", "reasoning_content": "think hard"}
    assert messages[3] == {
        "role": "assistant",
        "content": "",
        "reasoning_content": "sum 1\n\nsum 2",
        "tool_calls": [{"id": "c", "type": "function", "function": {"name": "exec_command", "arguments": "{}"}}],
    }
    # An encrypted-only reasoning item carries nothing for a chat upstream.
    assert messages[4] == {"role": "tool", "tool_call_id": "c", "content": "ok"}
    assert len(messages) == 5


def test_reasoning_with_no_assistant_output_after_it_is_its_own_turn():
    messages = chat(
        {
            "input": [
                {"role": "user", "content": "q"},
                {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "cut off"}]},
                {"role": "user", "content": "continue"},
            ]
        }
    )["messages"]
    assert messages == [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "", "reasoning_content": "cut off"},
        {"role": "user", "content": "continue"},
    ]


def test_gym_training_items_lose_their_token_fields():
    messages = chat(
        {
            "input": [
                {"role": "user", "content": "q"},
                {
                    "type": "message",
                    "id": "msg_1",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": "a", "annotations": []}],
                    "prompt_token_ids": [1, 2],
                    "generation_token_ids": [3],
                    "generation_log_probs": [-0.5],
                },
                {
                    "type": "function_call",
                    "call_id": "c",
                    "name": "f",
                    "arguments": "{}",
                    "prompt_token_ids": [1],
                    "generation_token_ids": [2],
                    "generation_log_probs": [-0.1],
                },
            ]
        }
    )["messages"]
    assert messages == [
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": "a",
            "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
        },
    ]
    assert b"token_ids" not in orjson.dumps(messages)


@pytest.mark.parametrize(
    "item, param",
    [
        ({"type": "item_reference", "id": "x"}, "input[0].type"),
        ({"type": "web_search_call", "id": "x"}, "input[0].type"),
        ({"type": "message", "role": "tool", "content": "x"}, "input[0].role"),
        ({"type": "message", "role": "user", "content": 5}, "input[0].content"),
        (
            {"type": "message", "role": "user", "content": [{"type": "input_file", "file_id": "f"}]},
            "input[0].content[0].type",
        ),
        (
            {"type": "message", "role": "user", "content": [{"type": "input_image", "file_id": "f"}]},
            "input[0].content[0]",
        ),
        ({"type": "message", "role": "user", "content": [{"type": "mystery"}]}, "input[0].content[0].type"),
        ({"type": "function_call", "call_id": "c", "name": "f", "arguments": {"a": 1}}, "input[0].arguments"),
        ({"type": "function_call_output", "call_id": "c", "output": None}, "input[0].output"),
        ("just a string", "input[0]"),
    ],
)
def test_bad_input_items_are_400_naming_the_spot(item, param):
    error = error_of({"model": "m", "input": [item]})
    assert error.param == param


def test_unknown_item_type_is_unsupported_parameter():
    error = error_of({"model": "m", "input": [{"type": "computer_call_output", "call_id": "c"}]})
    assert error.code == "unsupported_parameter"
    assert "computer_call_output" in error.message


# ---- request: fields -----------------------------------------------------------------------------


def test_sampling_and_output_fields_map_to_chat():
    body = chat(
        {
            "input": "x",
            "tools": [FN_EXEC],
            "parallel_tool_calls": False,
            "max_output_tokens": 256,
            "temperature": 0.2,
            "top_p": 0.9,
            "reasoning": {"effort": "high", "summary": "auto"},
            "user": "u-1",
            "metadata": {"k": "v"},
            "top_logprobs": 3,
            "seed": 7,
            "top_k": 20,
            "chat_template_kwargs": {"enable_thinking": False},
        }
    )
    assert body["parallel_tool_calls"] is False
    assert body["max_tokens"] == 256 and "max_completion_tokens" not in body
    assert (body["temperature"], body["top_p"]) == (0.2, 0.9)
    assert body["reasoning_effort"] == "high"
    assert body["user"] == "u-1"
    assert "metadata" not in body
    assert (body["logprobs"], body["top_logprobs"]) == (True, 3)
    assert (body["seed"], body["top_k"], body["chat_template_kwargs"]) == (7, 20, {"enable_thinking": False})
    assert "model" not in body and "stream" not in body


def test_include_output_logprobs_asks_for_logprobs():
    body = chat({"input": "x", "include": ["message.output_text.logprobs"]})
    assert (body["logprobs"], body["top_logprobs"]) == (True, 0)
    assert "logprobs" not in chat({"input": "x", "include": ["reasoning.encrypted_content"]})


@pytest.mark.parametrize(
    "text, expected",
    [
        ({"format": {"type": "text"}}, None),
        ({"format": {"type": "json_object"}}, {"type": "json_object"}),
        (
            {
                "format": {
                    "type": "json_schema",
                    "name": "answer",
                    "strict": True,
                    "schema": {"type": "object", "properties": {"a": {"type": "integer"}}},
                },
                "verbosity": "low",
            },
            {
                "type": "json_schema",
                "json_schema": {
                    "name": "answer",
                    "strict": True,
                    "schema": {"type": "object", "properties": {"a": {"type": "integer"}}},
                },
            },
        ),
    ],
)
def test_text_format_maps_to_response_format(text, expected):
    assert chat({"input": "x", "text": text}).get("response_format") == expected


def test_codex_body_is_accepted_as_measured():
    translated = responses_to_chat(CODEX_BODY)
    assert translated.body["messages"] == [{"role": "system", "content": "base"}, {"role": "user", "content": "hi"}]
    assert translated.body["tool_choice"] == "auto" and translated.body["parallel_tool_calls"] is True
    assert "reasoning_effort" not in translated.body  # summary only
    assert translated.dropped_tool_types == ["web_search"]


def test_gym_style_explicit_nulls_are_accepted():
    body = {
        "model": "m",
        "input": "x",
        "instructions": None,
        "max_output_tokens": None,
        "metadata": None,
        "previous_response_id": None,
        "reasoning": None,
        "temperature": None,
        "text": None,
        "tool_choice": "auto",
        "tools": [],
        "top_p": None,
        "user": None,
        "background": None,
        "conversation": None,
        "prompt": None,
        "store": True,
        "truncation": "disabled",
        "top_logprobs": None,
        "parallel_tool_calls": True,
        "include": None,
        "max_tool_calls": None,
        "service_tier": None,
    }
    assert responses_to_chat(body).body == {"messages": [{"role": "user", "content": "x"}]}


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"background": True}, "background"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"prompt": {"id": "pmpt_1"}}, "prompt"),
        ({"frobnicate": 1}, "frobnicate"),
        ({"n": 2}, "n"),
    ],
)
def test_unsupported_fields_are_400_naming_them(extra, param):
    error = error_of({"model": "m", "input": "x", **extra})
    assert (error.param, error.code) == (param, "unsupported_parameter")
    assert error.type == "invalid_request_error"


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"input": 5}, "input"),
        ({"input": None}, "input"),
        ({"input": []}, "input"),
        ({"tools": "x"}, "tools"),
        ({"tools": ["x"]}, "tools[0]"),
        ({"tools": [{"type": "function"}]}, "tools[0].name"),
        ({"tools": [{"type": "namespace", "name": "ns", "tools": "x"}]}, "tools[0].tools"),
        ({"temperature": "hot"}, "temperature"),
        ({"top_p": True}, "top_p"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"max_output_tokens": 1.5}, "max_output_tokens"),
        ({"parallel_tool_calls": "yes", "tools": [FN_EXEC]}, "parallel_tool_calls"),
        ({"top_logprobs": 50}, "top_logprobs"),
        ({"instructions": ["x"]}, "instructions"),
        ({"metadata": "x"}, "metadata"),
        ({"text": {"format": {"type": "json_schema", "name": "a"}}}, "text.format.schema"),
        ({"text": {"format": {"type": "yaml"}}}, "text.format.type"),
        ({"reasoning": "high"}, "reasoning"),
        ({"include": "x"}, "include"),
        ({"user": 5}, "user"),
    ],
)
def test_wrong_types_are_400_naming_the_param(extra, param):
    assert error_of({"model": "m", "input": "x", **extra}).param == param


def test_the_messages_sent_as_developer_are_named_by_their_index():
    body = {
        "instructions": "lead",
        "input": [
            {"role": "developer", "content": "dev"},
            {"role": "user", "content": "u"},
            {"role": "developer", "content": "d2"},
        ],
    }
    translated = responses_to_chat(body)
    assert [m["role"] for m in translated.body["messages"]] == ["system", "system", "user", "system"]
    assert translated.developer_messages == [1, 3]
    assert responses_to_chat(body, developer_role="developer").developer_messages == []  # kept as is
    assert responses_to_chat({"input": "hi"}).developer_messages == []
