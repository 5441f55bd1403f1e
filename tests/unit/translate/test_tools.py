"""Responses tools and tool_choice -> chat tools; the ToolMap that restores namespaces."""

from __future__ import annotations

import logging

import pytest

from server.translate.request import responses_to_chat
from server.translate.tools import NAMESPACE_SEPARATOR
from tests.support.translate import (
    FN_EXEC,
    NS_AGENTS,
    WEB_SEARCH,
    chat,
    error_of,
)

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


def test_unservable_tools_are_dropped_and_reported_not_logged(caplog):
    body = {
        "model": "m",
        "input": "x",
        "tools": [FN_EXEC, WEB_SEARCH, {"type": "file_search"}, {"type": "local_shell"}, WEB_SEARCH],
    }
    with caplog.at_level(logging.DEBUG):
        translated = responses_to_chat(body)
    assert [t["function"]["name"] for t in translated.body["tools"]] == ["exec_command"]
    # Every dropped tool is reported to the caller (which logs once per type); translation logs nothing.
    assert translated.dropped_tool_types == ["web_search", "file_search", "local_shell", "web_search"]
    assert caplog.records == []


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
