"""Responses <-> Chat translation: requests, non-stream responses, and the streamed event sequence."""

from __future__ import annotations

import logging

import httpx
import openai
import orjson
import pytest
from openai import omit
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from server.errors import OpenAIError
from server.translate import convert as translate
from server.translate.convert import (
    NAMESPACE_SEPARATOR,
    ResponsesStreamWriter,
    ToolMap,
    chat_to_response,
    responses_to_chat,
    token_triple,
)

# The keys the Open Responses ResponseResource schema requires to be present.
OPEN_RESPONSES_KEYS = {
    "id",
    "object",
    "created_at",
    "completed_at",
    "status",
    "incomplete_details",
    "model",
    "previous_response_id",
    "instructions",
    "output",
    "error",
    "tools",
    "tool_choice",
    "truncation",
    "parallel_tool_calls",
    "text",
    "top_p",
    "presence_penalty",
    "frequency_penalty",
    "top_logprobs",
    "temperature",
    "reasoning",
    "user",
    "usage",
    "max_output_tokens",
    "max_tool_calls",
    "store",
    "background",
    "service_tier",
    "metadata",
    "safety_identifier",
    "prompt_cache_key",
}

FN_EXEC = {
    "type": "function",
    "name": "exec_command",
    "description": "Run a command",
    "strict": False,
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
}
NS_AGENTS = {
    "type": "namespace",
    "name": "multi_agent_v1",
    "description": "Sub-agents",
    "tools": [
        {
            "type": "function",
            "name": "spawn_agent",
            "description": "Spawn",
            "strict": True,
            "parameters": {
                "type": "object",
                "properties": {"task": {"type": "string"}},
                "required": ["task"],
                "additionalProperties": False,
            },
        },
        {"type": "function", "name": "wait_agent", "parameters": {"type": "object", "properties": {}}},
    ],
}
WEB_SEARCH = {"type": "web_search", "external_web_access": True}

# A Codex request body, as measured (clients.md), minus the long texts.
CODEX_BODY = {
    "model": "sy/route",
    "stream": True,
    "input": [
        {"type": "message", "id": "msg_1", "role": "developer", "content": [{"type": "input_text", "text": "base"}]},
        {"type": "message", "id": "msg_2", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
    ],
    "tools": [FN_EXEC, NS_AGENTS, WEB_SEARCH],
    "tool_choice": "auto",
    "parallel_tool_calls": True,
    "reasoning": {"summary": "auto"},
    "store": False,
    "include": ["reasoning.encrypted_content"],
    "prompt_cache_key": "0199-root",
    "client_metadata": {"session_id": "s", "thread_id": "t"},
}


def chat(body: dict, **kw) -> dict:
    return responses_to_chat({"model": "m", **body}, **kw).body


def error_of(body: dict) -> OpenAIError:
    with pytest.raises(OpenAIError) as info:
        responses_to_chat(body)
    assert info.value.status == 400
    return info.value


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


# ---- request: tools ------------------------------------------------------------------------------


def test_function_tool_becomes_a_chat_function_tool():
    body = chat({"input": "x", "tools": [FN_EXEC]})
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "exec_command",
                "description": "Run a command",
                "parameters": FN_EXEC["parameters"],
                "strict": False,
            },
        }
    ]


def test_namespace_tools_are_flattened_and_mapped_back():
    translated = responses_to_chat({"model": "m", "input": "x", "tools": [FN_EXEC, NS_AGENTS]})
    names = [t["function"]["name"] for t in translated.body["tools"]]
    assert names == [
        "exec_command",
        f"multi_agent_v1{NAMESPACE_SEPARATOR}spawn_agent",
        f"multi_agent_v1{NAMESPACE_SEPARATOR}wait_agent",
    ]
    spawn = translated.body["tools"][1]["function"]
    assert spawn["strict"] is True and spawn["parameters"] == NS_AGENTS["tools"][0]["parameters"]
    tool_map = translated.tool_map
    assert tool_map.response_name("multi_agent_v1__spawn_agent") == ("spawn_agent", "multi_agent_v1")
    assert tool_map.response_name("exec_command") == ("exec_command", None)
    assert tool_map.chat_name("spawn_agent", "multi_agent_v1") == "multi_agent_v1__spawn_agent"


def test_flattened_names_never_collide_with_real_tools():
    impostor = {"type": "function", "name": "multi_agent_v1__spawn_agent", "parameters": {"type": "object"}}
    other_ns = {
        "type": "namespace",
        "name": "multi_agent",
        "description": "",
        "tools": [{"type": "function", "name": "v1__spawn_agent"}],
    }
    translated = responses_to_chat({"model": "m", "input": "x", "tools": [NS_AGENTS, impostor, other_ns]})
    names = [t["function"]["name"] for t in translated.body["tools"]]
    assert len(names) == len(set(names))
    assert "multi_agent_v1__spawn_agent" in names  # the real top-level tool keeps its name
    tool_map = translated.tool_map
    assert tool_map.response_name("multi_agent_v1__spawn_agent") == ("multi_agent_v1__spawn_agent", None)
    flat_ns = tool_map.chat_name("spawn_agent", "multi_agent_v1")
    flat_other = tool_map.chat_name("v1__spawn_agent", "multi_agent")
    assert len({flat_ns, flat_other, "multi_agent_v1__spawn_agent"}) == 3
    assert tool_map.response_name(flat_ns) == ("spawn_agent", "multi_agent_v1")
    assert tool_map.response_name(flat_other) == ("v1__spawn_agent", "multi_agent")


def test_input_function_call_with_namespace_is_flattened_the_same_way():
    messages = chat(
        {
            "tools": [NS_AGENTS],
            "input": [
                {
                    "type": "function_call",
                    "call_id": "c",
                    "name": "spawn_agent",
                    "namespace": "multi_agent_v1",
                    "arguments": '{"task": "t"}',
                }
            ],
        }
    )["messages"]
    assert messages[0]["tool_calls"][0]["function"]["name"] == "multi_agent_v1__spawn_agent"
    # A namespace no longer offered (e.g. a subagent request) still flattens predictably.
    messages = chat(
        {
            "tools": [FN_EXEC],
            "input": [
                {
                    "type": "function_call",
                    "call_id": "c",
                    "name": "spawn_agent",
                    "namespace": "multi_agent_v1",
                    "arguments": "{}",
                }
            ],
        }
    )["messages"]
    assert messages[0]["tool_calls"][0]["function"]["name"] == "multi_agent_v1__spawn_agent"


def test_unservable_tools_are_dropped_with_one_warning_per_type(caplog, monkeypatch):
    monkeypatch.setattr(translate, "_warned_tool_types", set())
    body = {
        "model": "m",
        "input": "x",
        "tools": [FN_EXEC, WEB_SEARCH, {"type": "file_search"}, {"type": "custom", "name": "apply_patch"}, WEB_SEARCH],
    }
    with caplog.at_level(logging.WARNING, logger="switchyard_model.translate"):
        translated = responses_to_chat(body)
        responses_to_chat(body)
    assert [t["function"]["name"] for t in translated.body["tools"]] == ["exec_command"]
    assert translated.dropped_tool_types == ["web_search", "file_search", "custom", "web_search"]
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 3 and all("dropping tools" in m for m in warned)


def test_only_unservable_tools_means_no_tools_and_no_tool_choice():
    body = chat({"input": "x", "tools": [WEB_SEARCH], "tool_choice": "auto", "parallel_tool_calls": True})
    assert "tools" not in body and "tool_choice" not in body and "parallel_tool_calls" not in body


@pytest.mark.parametrize(
    "choice, expected",
    [
        ("auto", "auto"),
        ("none", "none"),
        ("required", "required"),
        ({"type": "function", "name": "exec_command"}, {"type": "function", "function": {"name": "exec_command"}}),
        (
            {"type": "function", "name": "spawn_agent", "namespace": "multi_agent_v1"},
            {"type": "function", "function": {"name": "multi_agent_v1__spawn_agent"}},
        ),
        (
            {"type": "function", "name": "wait_agent"},
            {"type": "function", "function": {"name": "multi_agent_v1__wait_agent"}},
        ),
    ],
)
def test_tool_choice_maps_to_chat(choice, expected):
    body = chat({"input": "x", "tools": [FN_EXEC, NS_AGENTS], "tool_choice": choice})
    assert body["tool_choice"] == expected


def test_allowed_tools_narrows_the_tool_list():
    body = chat(
        {
            "input": "x",
            "tools": [FN_EXEC, NS_AGENTS],
            "tool_choice": {
                "type": "allowed_tools",
                "mode": "required",
                "tools": [{"type": "function", "name": "spawn_agent", "namespace": "multi_agent_v1"}],
            },
        }
    )
    assert body["tool_choice"] == "required"
    assert [t["function"]["name"] for t in body["tools"]] == ["multi_agent_v1__spawn_agent"]


@pytest.mark.parametrize(
    "choice, param",
    [
        ({"type": "web_search"}, "tool_choice"),
        ({"type": "function", "name": "nope"}, "tool_choice"),
        ("sometimes", "tool_choice"),
        (5, "tool_choice"),
    ],
)
def test_bad_tool_choice_is_400(choice, param):
    assert error_of({"model": "m", "input": "x", "tools": [FN_EXEC], "tool_choice": choice}).param == param


def test_required_tool_choice_without_servable_tools_is_400():
    assert (
        error_of({"model": "m", "input": "x", "tools": [WEB_SEARCH], "tool_choice": "required"}).param == "tool_choice"
    )


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


# ---- non-stream response -------------------------------------------------------------------------

PROMPT_IDS = [151644, 872, 198, 9707, 151645]


def lp(token_id: int, value: float) -> dict:
    return {
        "token": f"token_id:{token_id}",
        "logprob": value,
        "bytes": [104],
        "top_logprobs": [{"token": f"token_id:{token_id}", "logprob": value, "bytes": [104]}],
    }


def chat_completion(message: dict, *, finish="stop", token_ids=None, logprobs=None, usage=True, prompt_ids=True):
    choice = {
        "index": 0,
        "message": {"role": "assistant", **message},
        "finish_reason": finish,
        "logprobs": {"content": logprobs} if logprobs is not None else None,
    }
    if token_ids is not None:
        choice["token_ids"] = token_ids
    doc = {
        "id": "chatcmpl-fake-123",
        "object": "chat.completion",
        "created": 1795956045,
        "model": "fake/ok",
        "choices": [choice],
    }
    if usage:
        doc["usage"] = {
            "prompt_tokens": 5,
            "completion_tokens": 4,
            "total_tokens": 9,
            "prompt_tokens_details": {"cached_tokens": 2},
        }
    if prompt_ids:
        doc["prompt_token_ids"] = PROMPT_IDS
    return doc


def to_response(chat_doc: dict, request: dict | None = None, tool_map: ToolMap | None = None, token_ids=False):
    request = request or {"model": "sy/route", "input": "x"}
    return chat_to_response(
        chat_doc, request, tool_map, response_id="resp_abc", created_at=1795956000, token_ids=token_ids
    )


def test_text_response_is_complete_and_sdk_valid():
    response = to_response(chat_completion({"content": "Hello from fake upstream"}))
    assert OPEN_RESPONSES_KEYS <= response.keys()
    parsed = Response.model_validate(response)
    assert parsed.output_text == "Hello from fake upstream"
    assert response["model"] == "fake/ok"  # the routed target, not the route
    assert (response["status"], response["object"], response["created_at"]) == ("completed", "response", 1795956000)
    assert response["completed_at"] >= 1795956000
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


def test_token_triple_sources_and_refusals():
    ids, probs = [7, 8], [-1.0, -2.0]
    entries = [lp(i, p) for i, p in zip(ids, probs)]
    inline = chat_completion({"content": "x"}, token_ids=ids, logprobs=entries)
    assert token_triple(inline) == (PROMPT_IDS, ids, probs)
    # Without inline generation ids, `token_id:<n>` tokens are parsed.
    assert token_triple(chat_completion({"content": "x"}, logprobs=entries)) == (PROMPT_IDS, ids, probs)
    # A bundle already on the message wins.
    bundle = chat_completion(
        {"content": "x", "prompt_token_ids": [1], "generation_token_ids": [2], "generation_log_probs": [-0.5]},
        prompt_ids=False,
    )
    assert token_triple(bundle) == ([1], [2], [-0.5])
    # Anything missing or inconsistent: no triple rather than a wrong one.
    assert token_triple(chat_completion({"content": "x"}, token_ids=ids, logprobs=entries, prompt_ids=False)) is None
    assert token_triple(chat_completion({"content": "x"}, token_ids=ids)) is None
    assert token_triple(chat_completion({"content": "x"}, token_ids=[7], logprobs=entries)) is None
    plain = [{"token": "Hello", "logprob": -0.1}]
    assert token_triple(chat_completion({"content": "x"}, logprobs=plain)) is None
    assert token_triple({"choices": []}) is None


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


# ---- streaming -----------------------------------------------------------------------------------

STREAM_EVENTS = TypeAdapter(ResponseStreamEvent)
HEAD = {"id": "chatcmpl-s", "object": "chat.completion.chunk", "created": 1795956046, "model": "fake/ok"}


def ck(delta=None, *, finish=None, token_ids=None, logprobs=None, **top):
    choice = {
        "index": 0,
        "delta": delta or {},
        "logprobs": {"content": logprobs} if logprobs else None,
        "finish_reason": finish,
    }
    if token_ids is not None:
        choice["token_ids"] = token_ids
    return {**HEAD, "choices": [choice], **top}


def usage_ck(prompt=5, completion=4):
    return {
        **HEAD,
        "choices": [],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
    }


def tc(index, *, id=None, name=None, args=None):
    call: dict = {"index": index}
    if id:
        call["id"], call["type"] = id, "function"
    function = {}
    if name is not None:
        function["name"] = name
    if args is not None:
        function["arguments"] = args
    call["function"] = function
    return ck({"tool_calls": [call]})


def writer_for(request=None, tool_map=None, token_ids=False):
    request = request or {"model": "sy/route", "input": "x", "stream": True}
    return ResponsesStreamWriter(
        request, tool_map, response_id="resp_abc", created_at=1795956000, model="target/model", token_ids=token_ids
    )


def run_stream(chunks, *, writer=None, end="finish", **kw) -> tuple[bytes, ResponsesStreamWriter]:
    writer = writer or writer_for(**kw)
    raw = writer.start()
    for c in chunks:
        raw += writer.feed(c)
    raw += writer.finish() if end == "finish" else writer.fail("upstream went away", "upstream_stream_cut")
    return raw, writer


def parse_sse(raw: bytes) -> list[dict]:
    """Strict framing check: `event: T\\ndata: {json}\\n\\n` with T == type, then exactly one [DONE]."""
    frames = raw.split(b"\n\n")
    assert frames[-1] == b"", "the stream must end with a blank line"
    assert frames[-2] == b"data: [DONE]", "the stream must end with [DONE]"
    events = []
    for frame in frames[:-2]:
        event_line, data_line = frame.split(b"\n")
        assert event_line.startswith(b"event: ") and data_line.startswith(b"data: ")
        data = orjson.loads(data_line[6:])
        assert event_line[7:].decode() == data["type"]
        events.append(data)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    check_item_lifecycle(events)
    return events


def check_item_lifecycle(events: list[dict]) -> None:
    """What the SDK does not enforce but Codex needs: every item added is done (unless the response
    failed), nothing refers to an item outside its added..done window, one item open at a time."""
    assert events[0]["type"] == "response.created" and events[1]["type"] == "response.in_progress"
    terminal = events[-1]["type"]
    assert terminal in ("response.completed", "response.incomplete", "response.failed")
    assert not any(e["type"] in ("response.completed", "response.incomplete", "response.failed") for e in events[:-1])
    open_index: int | None = None
    closed: set[int] = set()
    for e in events[2:-1]:
        index = e.get("output_index")
        if e["type"] == "response.output_item.added":
            assert open_index is None, "a new item opened before the previous one was done"
            assert index == len(closed), "output indices must be dense and in order"
            open_index = index
        elif e["type"] == "response.output_item.done":
            assert index == open_index
            closed.add(index)
            open_index = None
        elif index is not None:
            assert index == open_index, f"{e['type']} outside its item's window"
    if terminal != "response.failed":
        assert open_index is None, "an item was never finished"
        assert len(closed) == len(events[-1]["response"]["output"])


def sdk_accumulate(events: list[dict], tools=None):
    """Every event validated strictly against the SDK's types, then run through its stream state."""
    state = ResponseStreamState(input_tools=tools if tools is not None else omit, text_format=omit)
    for data in events:
        state.handle_event(STREAM_EVENTS.validate_python(data))
    return state._completed_response


def types(events):
    return [e["type"] for e in events]


TEXT_CHUNKS = [
    ck({"role": "assistant", "content": ""}, prompt_token_ids=PROMPT_IDS),
    ck({"content": "Hello"}, token_ids=[9707], logprobs=[lp(9707, -0.1)]),
    ck({"content": " there"}, token_ids=[504], logprobs=[lp(504, -0.2)]),
    ck({}, finish="stop", token_ids=[], logprobs=[]),
    usage_ck(5, 2),
]


def test_text_stream_event_sequence():
    raw, writer = run_stream(TEXT_CHUNKS)
    events = parse_sse(raw)
    assert types(events) == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    for lifecycle in (events[0], events[1], events[-1]):
        assert OPEN_RESPONSES_KEYS <= lifecycle["response"].keys()
        Response.model_validate(lifecycle["response"])
    assert events[0]["response"]["status"] == "in_progress" and events[0]["response"]["output"] == []
    item_ids = {e.get("item_id") or e.get("item", {}).get("id") for e in events[2:-1]}
    assert item_ids == {"msg_abc_0"}
    assert {e["output_index"] for e in events[2:-1]} == {0}
    assert events[6]["text"] == "Hello there"
    completed = sdk_accumulate(events)
    assert completed.output_text == "Hello there"
    assert writer.response == events[-1]["response"]
    assert writer.response["usage"]["input_tokens"] == 5 and writer.response["model"] == "fake/ok"


def test_stream_final_response_equals_the_non_stream_translation():
    translated = responses_to_chat({"model": "m", "input": "x", "tools": [FN_EXEC, NS_AGENTS]})
    chunks = [
        ck({"role": "assistant", "content": ""}, prompt_token_ids=PROMPT_IDS),
        ck({"reasoning_content": "plan"}, token_ids=[1], logprobs=[lp(1, -0.5)]),
        ck({"content": "Calling."}, token_ids=[2], logprobs=[lp(2, -0.5)]),
        tc(0, id="call_1", name="multi_agent_v1__spawn_agent", args='{"task": '),
        tc(0, args='"x"}'),
        tc(1, id="call_2", name="exec_command", args='{"cmd": "ls"}'),
        ck({}, finish="tool_calls", token_ids=[3, 4], logprobs=[lp(3, -0.5), lp(4, -0.5)]),
        usage_ck(),
    ]
    request = {"model": "m", "input": "x", "tools": [FN_EXEC, NS_AGENTS]}
    raw, writer = run_stream(chunks, writer=writer_for(request, translated.tool_map, token_ids=True))
    expected = chat_to_response(
        writer.accumulator.result(),
        request,
        translated.tool_map,
        response_id="resp_abc",
        created_at=1795956000,
        token_ids=True,
    )
    streamed = dict(writer.response)
    streamed.pop("completed_at"), expected.pop("completed_at")
    assert streamed == expected
    sdk_accumulate(parse_sse(raw), tools=request["tools"])


def test_tool_call_stream_keeps_arguments_byte_for_byte_and_restores_namespace():
    translated = responses_to_chat({"model": "m", "input": "x", "tools": [NS_AGENTS]})
    pieces = ['{"ta', 'sk": "say ', "h\u00e9llo", '"}']
    chunks = [
        ck({"role": "assistant", "content": None}),
        tc(0, id="call_1", name="multi_agent_v1__spawn_agent", args=""),
    ]
    chunks += [tc(0, args=p) for p in pieces]
    chunks += [ck({}, finish="tool_calls"), usage_ck()]
    request = {"model": "m", "input": "x", "tools": [NS_AGENTS]}
    raw, writer = run_stream(chunks, writer=writer_for(request, translated.tool_map))
    events = parse_sse(raw)
    assert types(events) == ["response.created", "response.in_progress", "response.output_item.added"] + [
        "response.function_call_arguments.delta"
    ] * 4 + ["response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    added, done = events[2]["item"], events[-2]["item"]
    assert (added["name"], added["namespace"], added["call_id"], added["arguments"]) == (
        "spawn_agent",
        "multi_agent_v1",
        "call_1",
        "",
    )
    assert [e["delta"] for e in events[3:7]] == pieces
    assert done["arguments"] == events[-3]["arguments"] == "".join(pieces)
    completed = sdk_accumulate(events, tools=request["tools"])
    # The SDK found the strict tool inside the namespace and parsed its arguments.
    assert completed.output[0].parsed_arguments == {"task": "say h\u00e9llo"}


def test_parallel_tool_calls_are_closed_in_order():
    chunks = [
        tc(0, id="a", name="exec_command", args='{"cmd":"1"}'),
        tc(1, id="b", name="exec_command", args='{"cmd":'),
        tc(1, args='"2"}'),
        ck({}, finish="tool_calls"),
        usage_ck(),
    ]
    raw, writer = run_stream(chunks)
    events = parse_sse(raw)
    assert types(events)[2:] == [
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e["output_index"] for e in events[2:-1]] == [0, 0, 0, 0, 1, 1, 1, 1, 1]
    assert [(i["call_id"], i["arguments"]) for i in writer.response["output"]] == [
        ("a", '{"cmd":"1"}'),
        ("b", '{"cmd":"2"}'),
    ]
    sdk_accumulate(events)


def test_text_then_tool_call_closes_the_message_first():
    chunks = [ck({"content": "Let me check."}), tc(0, id="c", name="f", args="{}"), ck({}, finish="tool_calls")]
    events = parse_sse(run_stream(chunks)[0])
    kinds = types(events)
    assert kinds.index("response.output_item.done") < kinds.index("response.output_item.added", 3)
    assert [e["item"]["type"] for e in events if e["type"] == "response.output_item.done"] == [
        "message",
        "function_call",
    ]
    sdk_accumulate(events)


def test_reasoning_stream_events():
    chunks = [
        ck({"reasoning": "Think"}),
        ck({"reasoning_content": "ing."}),
        ck({"content": "Done"}),
        ck({}, finish="stop"),
    ]
    raw, writer = run_stream(chunks)
    events = parse_sse(raw)
    assert types(events)[2:10] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
    ]
    assert events[2]["item"]["type"] == "reasoning" and events[3]["part"] == {"type": "reasoning_text", "text": ""}
    assert events[6]["text"] == "Thinking."
    assert writer.response["output"][0]["content"] == [{"type": "reasoning_text", "text": "Thinking."}]
    assert sdk_accumulate(events).output_text == "Done"


def test_refusal_stream_events():
    raw, writer = run_stream([ck({"refusal": "I can"}), ck({"refusal": "'t."}), ck({}, finish="stop")])
    events = parse_sse(raw)
    assert types(events)[2:] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.refusal.delta",
        "response.refusal.delta",
        "response.refusal.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert writer.response["output"][0]["content"] == [{"type": "refusal", "refusal": "I can't."}]
    sdk_accumulate(events)


def test_length_stop_ends_with_response_incomplete():
    raw, writer = run_stream([ck({"content": "cut"}), ck({}, finish="length"), usage_ck()])
    events = parse_sse(raw)
    assert events[-1]["type"] == "response.incomplete"
    response = events[-1]["response"]
    Response.model_validate(response)
    assert response["status"] == "incomplete" and response["incomplete_details"] == {"reason": "max_output_tokens"}
    assert events[-2]["item"]["status"] == "incomplete" == response["output"][-1]["status"]
    sdk_accumulate(events)


def test_failure_stream_sends_error_then_failed_and_leaves_open_items_unfinished():
    chunks = [ck({"content": "Hi"}), tc(0, id="c", name="f", args='{"half')]
    raw, writer = run_stream(chunks, end="fail")
    events = parse_sse(raw)
    assert types(events)[-2:] == ["error", "response.failed"]
    assert events[-2]["message"] == "upstream went away" and events[-2]["code"] == "upstream_stream_cut"
    failed = events[-1]["response"]
    Response.model_validate(failed)
    assert failed["status"] == "failed"
    assert failed["error"] == {"code": "server_error", "message": "upstream went away"}
    # The message was finished (the call started after it); the half tool call never was.
    assert [i["type"] for i in failed["output"]] == ["message"]
    done_items = [e["item"]["type"] for e in events if e["type"] == "response.output_item.done"]
    assert done_items == ["message"]
    sdk_accumulate(events)
    assert writer.finish() == b"" and writer.feed(ck({"content": "late"})) == b""


def test_fail_before_start_still_opens_with_response_created():
    writer = writer_for()
    events = parse_sse(writer.fail("rate limited", "rate_limit_exceeded"))
    assert types(events) == ["response.created", "response.in_progress", "error", "response.failed"]
    assert events[-1]["response"]["error"]["code"] == "rate_limit_exceeded"
    sdk_accumulate(events)


def test_empty_generation_streams_an_empty_message():
    events = parse_sse(run_stream([ck({"role": "assistant", "content": ""}), ck({}, finish="stop")])[0])
    assert types(events)[2:] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    sdk_accumulate(events)


def test_start_is_idempotent_and_feed_starts_implicitly():
    writer = writer_for()
    raw = writer.feed(ck({"content": "a"}))
    assert writer.start() == b""
    raw += writer.finish()
    assert types(parse_sse(raw))[:2] == ["response.created", "response.in_progress"]
    assert writer.feed(ck({"role": "assistant"})) == b""


def test_triple_rides_only_on_the_completed_responses_last_item():
    raw, writer = run_stream(TEXT_CHUNKS, token_ids=True)
    events = parse_sse(raw)
    last = events[-1]["response"]["output"][-1]
    assert (last["prompt_token_ids"], last["generation_token_ids"], last["generation_log_probs"]) == (
        PROMPT_IDS,
        [9707, 504],
        [-0.1, -0.2],
    )
    assert all("generation_token_ids" not in e.get("item", {}) for e in events[:-1])
    assert "generation_token_ids" not in run_stream(TEXT_CHUNKS)[1].response["output"][-1]


def test_tool_call_name_arriving_after_its_first_delta_is_buffered():
    chunks = [tc(0, id="c", args='{"a"'), tc(0, name="exec_command", args=": 1}"), ck({}, finish="tool_calls")]
    events = parse_sse(run_stream(chunks)[0])
    assert events[2]["item"]["name"] == "exec_command"
    # What arrived before the name is released as one delta when the item opens.
    assert [e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta"] == ['{"a": 1}']
    sdk_accumulate(events)


def test_interleaved_late_arguments_reach_the_final_response(caplog, monkeypatch):
    monkeypatch.setattr(translate, "_warned_late_tool_delta", False)
    chunks = [
        tc(0, id="a", name="f", args='{"x":'),
        tc(1, id="b", name="g", args="{}"),
        tc(0, args="1}"),
        ck({}, finish="tool_calls"),
    ]
    with caplog.at_level(logging.WARNING, logger="switchyard_model.translate"):
        raw, writer = run_stream(chunks)
    assert writer.response["output"][0]["arguments"] == '{"x":1}'
    assert any("interleaved" in r.getMessage() for r in caplog.records)
    sdk_accumulate(parse_sse(raw))


def test_stream_text_logprobs_when_asked():
    request = {"model": "m", "input": "x", "top_logprobs": 0}
    raw, writer = run_stream(TEXT_CHUNKS, writer=writer_for(request))
    deltas = [e for e in parse_sse(raw) if e["type"] == "response.output_text.delta"]
    assert [d["logprobs"][0]["logprob"] for d in deltas] == [-0.1, -0.2]
    assert len(writer.response["output"][0]["content"][0]["logprobs"]) == 2


# ---- through the real openai client, offline -----------------------------------------------------


def sdk_client(body: bytes, content_type: str) -> openai.OpenAI:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": content_type}, content=body)

    return openai.OpenAI(
        api_key="sk-test",
        base_url="http://model.invalid/v1",
        max_retries=0,
        http_client=httpx.Client(transport=httpx.MockTransport(handler)),
    )


def test_openai_client_streams_our_events_to_a_final_response():
    translated = responses_to_chat({"model": "m", "input": "x", "tools": [FN_EXEC, NS_AGENTS]})
    chunks = [
        ck({"content": "Spawning."}),
        tc(0, id="call_9", name="multi_agent_v1__spawn_agent", args='{"task": "t"}'),
        ck({}, finish="tool_calls"),
        usage_ck(),
    ]
    request = {"model": "m", "input": "x", "tools": [FN_EXEC, NS_AGENTS]}
    raw, _ = run_stream(chunks, writer=writer_for(request, translated.tool_map))
    client = sdk_client(raw, "text/event-stream")
    with client.responses.stream(model="m", input="x", tools=request["tools"]) as stream:
        seen = [event.type for event in stream]
        final = stream.get_final_response()
    assert seen[0] == "response.created" and seen[-1] == "response.completed"
    assert final.output_text == "Spawning."
    call = final.output[1]
    assert (call.name, call.namespace, call.call_id, call.parsed_arguments) == (
        "spawn_agent",
        "multi_agent_v1",
        "call_9",
        {"task": "t"},
    )
    assert final.usage.input_tokens_details.cache_write_tokens == 0


def test_openai_client_reads_the_non_stream_response():
    response = to_response(chat_completion({"content": "Hello"}))
    client = sdk_client(orjson.dumps(response), "application/json")
    parsed = client.responses.create(model="m", input="x")
    assert parsed.output_text == "Hello" and parsed.id == "resp_abc"
