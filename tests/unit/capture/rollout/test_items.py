"""Gym's shapes: tools (Switchyard, Chat, Responses, namespaces) as FunctionTools, and the Responses items of a rollout."""

from __future__ import annotations

import pytest

from server.capture.rollout import RolloutError, map_tools, reconstruct_session
from tests.support.rollouts import (
    SESSION_ID,
    TOOL_SCHEMA,
    TOOLS,
    TRIPLE_0,
    TRIPLE_1,
    has_triple,
    make_tool_call,
    strict_rollout,
    triple_of,
    two_call_records,
)


class TestToolMapping:
    def test_tool_without_schema(self):
        (tool,) = map_tools([{"id": "finish", "description": ""}])
        assert tool == {"type": "function", "name": "finish", "description": None, "parameters": None, "strict": None}

    def test_tool_without_id_rejected(self):
        with pytest.raises(RolloutError, match="no usable id"):
            map_tools([{"description": "x", "inputSchema": {"jsonSchema": {}}}])

    def test_non_dict_tool_rejected(self):
        with pytest.raises(RolloutError, match="tool 1 has no usable id"):
            map_tools([TOOLS[0], "bash"])

    def test_non_list_rejected(self):
        with pytest.raises(RolloutError, match="not a list"):
            map_tools("nope")

    def test_openai_chat_shape(self):
        tools = [
            {
                "type": "function",
                "function": {"name": "bash", "description": "Run", "parameters": TOOL_SCHEMA, "strict": True},
            },
            {"type": "function", "function": {"name": "noop"}},
        ]
        assert map_tools(tools) == [
            {"type": "function", "name": "bash", "description": "Run", "parameters": TOOL_SCHEMA, "strict": True},
            {"type": "function", "name": "noop", "description": None, "parameters": None, "strict": None},
        ]

    def test_chat_shape_without_name_rejected(self):
        with pytest.raises(RolloutError, match="no usable id"):
            map_tools([{"type": "function", "function": {"description": "x"}}])

    def test_responses_shape_namespace_and_hosted(self):
        tools = [
            {
                "type": "function",
                "name": "exec_command",
                "description": "Run",
                "parameters": TOOL_SCHEMA,
                "strict": False,
            },
            {
                "type": "namespace",
                "name": "multi_agent_v1",
                "tools": [{"type": "function", "name": "spawn_agent", "parameters": {}}],
            },
            {"type": "web_search", "external_web_access": True},
        ]
        assert [t["name"] for t in map_tools(tools)] == ["exec_command", "spawn_agent"]
        assert map_tools(tools)[0]["strict"] is False

    def test_none_is_no_tools(self):
        assert map_tools(None) == []

    def test_session_with_chat_shaped_tools(self):
        chat_tools = [
            {
                "type": "function",
                "function": {"name": "str_replace_editor", "description": "Edit files", "parameters": TOOL_SCHEMA},
            }
        ]
        records = two_call_records()
        for record in records:
            record["tools"] = chat_tools
        rollout = strict_rollout(records)
        assert rollout["tools"] == [
            {
                "type": "function",
                "name": "str_replace_editor",
                "description": "Edit files",
                "parameters": TOOL_SCHEMA,
                "strict": None,
            }
        ]

    def test_bad_tools_raise_even_when_partial_allowed(self):
        records = two_call_records()
        for record in records:
            record["tools"] = "nope"
        with pytest.raises(RolloutError, match="not a list"):
            reconstruct_session(SESSION_ID, records)


class TestItems:
    def test_reasoning_content_becomes_a_reasoning_item(self):
        records = two_call_records()
        records[0]["messages"][-1]["reasoning_content"] = "I should edit the file."
        rollout = strict_rollout(records)
        reasoning, call = rollout["output"][:2]
        assert reasoning == {
            "type": "reasoning",
            "id": "rs_uuid-0",
            "summary": [{"type": "summary_text", "text": "I should edit the file."}],
        }
        assert not has_triple(reasoning) and triple_of(call) == TRIPLE_0
        assert rollout["input"][-1]["role"] == "user"  # the split is at the reasoning item

    def test_think_tags_in_content(self):
        records = two_call_records()
        records[1]["messages"][-1]["content"] = "<think>check tests</think>All fixed."
        message = strict_rollout(records)["output"][-1]
        reasoning = strict_rollout(records)["output"][-2]
        assert reasoning["summary"] == [{"type": "summary_text", "text": "check tests"}]
        assert message["content"][0]["text"] == "All fixed." and triple_of(message) == TRIPLE_1

    def test_empty_reply_is_an_empty_message(self):
        records = two_call_records()[:1]
        records[0]["messages"][-1] = {"role": "assistant", "content": None}
        (message,) = strict_rollout(records)["output"]
        assert message["content"][0]["text"] == "" and triple_of(message) == TRIPLE_0

    def test_text_and_several_tool_calls(self):
        records = two_call_records()[:1]
        second_call = {
            "id": "call_2",
            "type": "function",
            "function": {"name": "str_replace_editor", "arguments": '{"path":"b"}'},
        }
        records[0]["messages"][-1] = {
            "role": "assistant",
            "content": "Editing two files.",
            "tool_calls": [make_tool_call('{"path":"a"}'), second_call],
        }
        message, first, second = strict_rollout(records)["output"]
        assert message["content"][0]["text"] == "Editing two files." and not has_triple(message)
        assert first["call_id"] == "call_1" and not has_triple(first)
        assert second["call_id"] == "call_2" and second["arguments"] == '{"path":"b"}'
        assert triple_of(second) == TRIPLE_0

    def test_ids_are_deterministic(self):
        assert strict_rollout(two_call_records()) == strict_rollout(two_call_records())
        assert strict_rollout(two_call_records())["output"][-1]["id"] == "msg_uuid-1"


def test_a_message_the_client_sent_as_developer_is_a_developer_item_again():
    """Sent upstream (and recorded) as `system`; the record's `developer_messages` gives the role back."""
    records = two_call_records()
    plain = strict_rollout(records)
    assert plain["input"][0]["role"] == "system"  # without the field: as recorded
    for record in records:
        record["developer_messages"] = [0]
    rollout = strict_rollout(records)
    assert rollout["input"][0] == {"type": "message", "role": "developer", "content": plain["input"][0]["content"]}
    assert rollout["input"][1:] == plain["input"][1:] and rollout["output"] == plain["output"]
    for junk in ("0", [True], [None], {"0": 1}):  # a damaged field is ignored, not trusted
        for record in records:
            record["developer_messages"] = junk
        assert strict_rollout(records)["input"][0]["role"] == "system"


def test_a_strict_tool_in_the_record_shape_stays_strict():
    (tool,) = map_tools(
        [{"id": "bash", "description": "Run", "inputSchema": {"jsonSchema": TOOL_SCHEMA}, "strict": True}]
    )
    assert tool["strict"] is True
