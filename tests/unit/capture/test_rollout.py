"""Rollout reconstruction: Gym's trace tests re-derived, plus partial prefixes, side calls, retries and trees."""

from __future__ import annotations

import copy
import json
import math

import pytest

from server.capture.rollout import (
    RolloutError,
    map_tools,
    reconstruct_envelope,
    reconstruct_session,
    reconstruct_tree,
)

SESSION_ID = "abc123"
MODEL = "Qwen/Qwen3-0.6B"
TOOL_SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
TOOLS = [{"id": "str_replace_editor", "description": "Edit files", "inputSchema": {"jsonSchema": TOOL_SCHEMA}}]
TRIPLE_0 = {"prompt_token_ids": [1, 2, 3], "generation_token_ids": [4, 5], "generation_log_probs": [-0.1, -0.2]}
TRIPLE_1 = {"prompt_token_ids": [1, 2, 3, 4, 5, 6], "generation_token_ids": [7], "generation_log_probs": [-0.3]}
SYSTEM = "You are a careful coding agent."


def _record(index: int, messages: list, triple: dict, *, session_id: str = SESSION_ID, **extra) -> dict:
    record = {
        "schema_version": 1,
        "uuid": f"uuid-{index}",
        "session_id": session_id,
        "parent_session_id": None,
        "captured_at": f"2026-07-14T00:00:{index:02d}.000000+00:00",
        "request_id": f"req-{index}",
        "model": MODEL,
        "messages": messages,
        "tools": TOOLS,
        "tool_choice": "auto",
        "finish_reason": "stop",
        "is_valid": True,
        "token_count": 7,
        **copy.deepcopy(triple),
    }
    record.update(extra)
    return record


def _tool_call(arguments: str = "{}", **extra) -> dict:
    function = {"name": "str_replace_editor", "arguments": arguments}
    return {"id": "call_1", "type": "function", "function": function, **extra}


def _two_call_records(arguments_0: str = "{}", arguments_1: str = "{}") -> list[dict]:
    first = _record(
        0,
        [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": "Fix the bug."},
            {"role": "assistant", "content": None, "tool_calls": [_tool_call(arguments_0)]},
        ],
        TRIPLE_0,
    )
    # The client re-sends the same conversation in its own spelling: text parts, null content,
    # and an extra "index" on the echoed tool call. None of that is a change.
    second = _record(
        1,
        [
            {"role": "system", "content": [{"type": "text", "text": SYSTEM}]},
            {"role": "user", "content": [{"type": "text", "text": "Fix the "}, {"type": "text", "text": "bug."}]},
            {"role": "assistant", "content": None, "tool_calls": [_tool_call(arguments_1, index=0)]},
            {"role": "tool", "tool_call_id": "call_1", "content": "edited ok"},
            {"role": "assistant", "content": "All fixed."},
        ],
        TRIPLE_1,
    )
    return [first, second]


def _strict(records: list[dict]) -> dict:
    return reconstruct_session(SESSION_ID, records, allow_partial=False)


def _triple(item: dict) -> dict:
    return {k: item[k] for k in ("prompt_token_ids", "generation_token_ids", "generation_log_probs")}


def _has_triple(item: dict) -> bool:
    return "prompt_token_ids" in item


# --------------------------------------------------------------------------------------------
# Gym's TestReconstruction
# --------------------------------------------------------------------------------------------


class TestReconstruction:
    def test_two_call_tool_trajectory(self):
        rollout = _strict(_two_call_records())
        assert rollout["record_uuids"] == ["uuid-0", "uuid-1"]
        assert rollout["model"] == MODEL
        assert rollout["session_id"] == SESSION_ID
        assert rollout["input"] == [
            {"type": "message", "role": "system", "content": SYSTEM},
            {"type": "message", "role": "user", "content": "Fix the bug."},
        ]
        call, output, message = rollout["output"]
        assert call == {
            "type": "function_call",
            "id": "call_1",
            "call_id": "call_1",
            "name": "str_replace_editor",
            "arguments": "{}",
            "status": "completed",
            **TRIPLE_0,
        }
        assert output == {
            "type": "function_call_output",
            "call_id": "call_1",
            "output": "edited ok",
            "status": "completed",
        }
        assert message["type"] == "message" and message["role"] == "assistant"
        assert message["status"] == "completed"
        assert message["content"] == [{"type": "output_text", "text": "All fixed.", "annotations": []}]
        assert _triple(message) == TRIPLE_1
        assert rollout["tools"] == [
            {
                "type": "function",
                "name": "str_replace_editor",
                "description": "Edit files",
                "parameters": TOOL_SCHEMA,
                "strict": None,
            }
        ]
        assert rollout["partial_reason"] is None and rollout["mask_sample"] is False
        assert rollout["side_calls"] == [] and rollout["discarded_record_uuids"] == []

    def test_reformatted_tool_args_tolerated_and_original_kept(self):
        pretty = json.dumps({"path": "a.py", "line": 3}, indent=2)
        compact = json.dumps({"line": 3, "path": "a.py"}, separators=(",", ":"))
        rollout = _strict(_two_call_records(arguments_0=pretty, arguments_1=compact))
        assert rollout["output"][0]["arguments"] == pretty
        assert rollout["tools"][0]["type"] == "function"

    def test_changed_tool_args_rejected(self):
        records = _two_call_records(arguments_0='{"path": "a.py"}', arguments_1='{"path": "b.py"}')
        with pytest.raises(RolloutError, match="does not extend"):
            _strict(records)

    def test_single_record_session(self):
        rollout = _strict(_two_call_records()[:1])
        assert len(rollout["input"]) == 2
        assert len(rollout["output"]) == 1
        assert _triple(rollout["output"][0]) == TRIPLE_0

    def test_divergent_history_rejected(self):
        records = _two_call_records()
        records[1]["messages"][1] = {"role": "user", "content": "Fix another bug."}
        with pytest.raises(RolloutError, match="does not extend"):
            _strict(records)

    def test_missing_environment_suffix_rejected(self):
        records = _two_call_records()
        del records[1]["messages"][3]
        with pytest.raises(RolloutError, match="adds no environment messages"):
            _strict(records)

    def test_assistant_in_suffix_rejected(self):
        records = _two_call_records()
        records[1]["messages"].insert(4, {"role": "assistant", "content": "uncaptured turn"})
        with pytest.raises(RolloutError, match=r"non-environment roles: \['assistant'\]"):
            _strict(records)

    def test_reordered_records_rejected(self):
        # Input order does not matter (records are sorted), so "reordered" means reordered in time.
        records = _two_call_records()
        records[0]["captured_at"], records[1]["captured_at"] = records[1]["captured_at"], records[0]["captured_at"]
        with pytest.raises(RolloutError, match="not extend"):
            _strict(records)

    def test_non_extending_token_history_rejected(self):
        records = _two_call_records()
        records[1]["prompt_token_ids"] = [9] * 6
        with pytest.raises(RolloutError, match="do not extend the prior prompt"):
            _strict(records)

    def test_equal_length_prompt_allowed(self):
        # A prompt exactly equal to the prior prompt+generation is contiguous.
        records = _two_call_records()
        records[1]["prompt_token_ids"] = [1, 2, 3, 4, 5]
        assert _strict(records)["record_uuids"] == ["uuid-0", "uuid-1"]

    def test_input_order_does_not_matter(self):
        records = _two_call_records()
        assert _strict(list(reversed(records))) == _strict(records)

    def test_first_record_prompt_may_hold_assistant_turns(self):
        # A session whose first captured call already carries history: that history is input.
        record = _record(
            0,
            [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "hello"},
                {"role": "user", "content": "bye"},
                {"role": "assistant", "content": "ciao"},
            ],
            TRIPLE_0,
        )
        rollout = _strict([record])
        assert [i["type"] for i in rollout["input"]] == ["message"]
        first, second, last = rollout["output"]
        assert first["role"] == "assistant" and not _has_triple(first)
        assert second == {"type": "message", "role": "user", "content": "bye"}
        assert last["content"][0]["text"] == "ciao" and _triple(last) == TRIPLE_0
        assert first["id"] != last["id"]


# --------------------------------------------------------------------------------------------
# Gym's TestValidation
# --------------------------------------------------------------------------------------------


class TestValidation:
    @pytest.mark.parametrize(
        ("field", "value", "match"),
        [
            ("schema_version", 2, "schema_version"),
            ("session_id", "other", "session_id"),
            ("completions", [], "no completions"),
            ("completions", "nope", "no completions"),
        ],
    )
    def test_bad_envelope(self, field, value, match):
        envelope = {"schema_version": 1, "session_id": SESSION_ID, "completions": _two_call_records()}
        envelope[field] = value
        with pytest.raises(RolloutError, match=match):
            reconstruct_envelope(envelope, SESSION_ID, allow_partial=False)

    def test_envelope_round_trip(self):
        envelope = {"schema_version": 1, "session_id": SESSION_ID, "completions": _two_call_records()}
        assert reconstruct_envelope(envelope, SESSION_ID) == _strict(_two_call_records())

    def test_non_object_envelope(self):
        with pytest.raises(RolloutError, match="not an object"):
            reconstruct_envelope([], SESSION_ID)

    def test_no_records(self):
        with pytest.raises(RolloutError, match="no completions"):
            reconstruct_session(SESSION_ID, [])

    @pytest.mark.parametrize(
        ("field", "value", "match"),
        [
            ("schema_version", 2, "schema_version"),
            ("session_id", "other", "session_id"),
            ("uuid", "", "no uuid"),
            ("uuid", "uuid-0", "duplicates uuid"),
            ("is_valid", False, "is_valid"),
            ("request_id", "", "empty request_id"),
            ("model", "", "empty model"),
            ("prompt_token_ids", [], "prompt_token_ids"),
            ("prompt_token_ids", [1, "2"], "prompt_token_ids"),
            ("prompt_token_ids", [1, 2, 3, 4, 5, True], "prompt_token_ids"),
            ("generation_token_ids", None, "generation_token_ids"),
            ("generation_log_probs", [math.nan], "finite"),
            ("generation_log_probs", [math.inf], "finite"),
            ("generation_log_probs", [False], "finite"),
            ("generation_log_probs", [-0.1, -0.2], "different lengths"),
            ("messages", [], "no messages"),
        ],
    )
    def test_bad_record_fields(self, field, value, match):
        records = _two_call_records()
        records[1][field] = value
        with pytest.raises(RolloutError, match=match):
            _strict(records)

    def test_messages_must_end_with_assistant(self):
        records = _two_call_records()
        records[1]["messages"].append({"role": "user", "content": "and?"})
        with pytest.raises(RolloutError, match="end with an assistant"):
            _strict(records)

    @pytest.mark.parametrize(
        ("field", "value"),
        [("model", "other-model"), ("tools", []), ("tool_choice", "required")],
    )
    def test_session_consistency(self, field, value):
        records = _two_call_records()
        records[1][field] = value
        with pytest.raises(RolloutError, match="model|tools/tool_choice"):
            _strict(records)

    @pytest.mark.parametrize(
        ("message", "match"),
        [
            ("nope", "non-object message"),
            ({"role": "narrator", "content": "x"}, "unsupported role"),
            ({"role": "user", "content": {"text": "x"}}, "unsupported content"),
            ({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}, "content part"),
            ({"role": "tool", "content": "x"}, "without tool_call_id"),
        ],
    )
    def test_bad_messages(self, message, match):
        records = _two_call_records()
        records[1]["messages"].insert(3, message)
        with pytest.raises(RolloutError, match=match):
            _strict(records)

    def test_bad_message_in_unchanged_history_still_caught(self):
        # Messages equal to the previous record's are skipped for speed; a bad one in the first
        # record is still caught there.
        records = _two_call_records()
        records[0]["messages"].insert(1, {"role": "narrator", "content": "x"})
        with pytest.raises(RolloutError, match="unsupported role"):
            _strict(records)

    def test_malformed_tool_call(self):
        records = _two_call_records()
        del records[1]["messages"][2]["tool_calls"][0]["id"]
        with pytest.raises(RolloutError, match="malformed tool call"):
            _strict(records)

    def test_non_list_tool_calls(self):
        records = _two_call_records()
        records[1]["messages"][2]["tool_calls"] = {"id": "call_1"}
        with pytest.raises(RolloutError, match="non-list tool_calls"):
            _strict(records)

    def test_messages_checked_before_history(self):
        # Gym's order: every message is validated before the history comparison runs.
        records = _two_call_records()
        records[1]["messages"][1] = {"role": "user", "content": "different"}
        records[1]["messages"].insert(4, {"role": "tool", "content": "no id"})
        with pytest.raises(RolloutError, match="without tool_call_id"):
            _strict(records)


# --------------------------------------------------------------------------------------------
# Gym's TestToolMapping, plus the Chat and Responses shapes
# --------------------------------------------------------------------------------------------


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
        records = _two_call_records()
        for record in records:
            record["tools"] = chat_tools
        rollout = _strict(records)
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
        records = _two_call_records()
        for record in records:
            record["tools"] = "nope"
        with pytest.raises(RolloutError, match="not a list"):
            reconstruct_session(SESSION_ID, records)


# --------------------------------------------------------------------------------------------
# Longest valid prefix (allow_partial=True, the default)
# --------------------------------------------------------------------------------------------


def _linear_session(n_calls: int, *, session_id: str = SESSION_ID, parent: str | None = None) -> list[dict]:
    """n_calls records of a user/assistant ping-pong whose tokens extend properly."""
    messages: list[dict] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "turn 0"}]
    tokens: list[int] = [100, 101]
    records = []
    for k in range(n_calls):
        generation = [1000 + k, 2000 + k]
        reply = {"role": "assistant", "content": f"answer {k}"}
        records.append(
            _record(
                k,
                [*copy.deepcopy(messages), reply],
                {
                    "prompt_token_ids": list(tokens),
                    "generation_token_ids": generation,
                    "generation_log_probs": [-0.5, -0.25],
                },
                session_id=session_id,
                parent_session_id=parent,
                uuid=f"{session_id}-{k}",
            )
        )
        messages += [reply, {"role": "user", "content": f"turn {k + 1}"}]
        tokens += generation + [300 + k]
    return records


class TestPartial:
    def test_break_keeps_longest_valid_prefix(self):
        records = _linear_session(4)
        records[2]["prompt_token_ids"][0] = 999
        rollout = reconstruct_session(SESSION_ID, records)
        assert rollout["record_uuids"] == [f"{SESSION_ID}-0", f"{SESSION_ID}-1"]
        assert rollout["partial_reason"] == (
            "record 2 of 4: record 2 prompt_token_ids do not extend the prior prompt+generation tokens"
        )
        assert rollout["mask_sample"] is True
        assert _triple(rollout["output"][-1])["generation_token_ids"] == [1001, 2001]

    def test_history_break_names_record(self):
        records = _linear_session(3)
        records[2]["messages"][1]["content"] = "rewritten"
        rollout = reconstruct_session(SESSION_ID, records)
        assert len(rollout["record_uuids"]) == 2
        assert rollout["partial_reason"] == ("record 2 of 3: record 2 prompt does not extend the reconstructed history")

    def test_invalid_record_ends_prefix(self):
        records = _linear_session(3)
        records[1]["is_valid"] = False
        records[1]["invalid_reason"] = "no token ids"
        rollout = reconstruct_session(SESSION_ID, records)
        assert rollout["record_uuids"] == [f"{SESSION_ID}-0"]
        assert rollout["partial_reason"] == f"record 1 of 3: record {SESSION_ID}-1 is_valid is not true"
        assert rollout["mask_sample"] is True

    def test_first_record_failure_raises(self):
        records = _linear_session(3)
        records[0]["is_valid"] = False
        with pytest.raises(RolloutError, match="is_valid is not true"):
            reconstruct_session(SESSION_ID, records)

    def test_strict_mode_fails_fast(self):
        records = _linear_session(3)
        records[2]["prompt_token_ids"][0] = 999
        with pytest.raises(RolloutError, match="record 2 prompt_token_ids do not extend"):
            reconstruct_session(SESSION_ID, records, allow_partial=False)

    def test_unknown_extra_keys_ignored(self):
        records = _linear_session(2)
        for record in records:
            record.update(
                route="policy",
                api="responses",
                stream=True,
                latency_ms=12.5,
                usage={"x": 1},
                invalid_reason=None,
                rollout_id="r1",
                status="completed",
                response_id="chatcmpl-1",
                something_new={"a": 1},
            )
        assert reconstruct_session(SESSION_ID, records)["record_uuids"] == [r["uuid"] for r in records]


# --------------------------------------------------------------------------------------------
# Side calls
# --------------------------------------------------------------------------------------------


def _title_call(index: int, **extra) -> dict:
    return _record(
        index,
        [
            {"role": "system", "content": "You are a Title Generator. You output ONLY a thread title."},
            {"role": "user", "content": "Generate a title for this conversation:\n"},
            {"role": "user", "content": "turn 0"},
            {"role": "assistant", "content": "Bug hunt"},
        ],
        {"prompt_token_ids": [7, 7, 7], "generation_token_ids": [8], "generation_log_probs": [-1.0]},
        tools=[],
        uuid=f"title-{index}",
        **extra,
    )


class TestSideCalls:
    def test_title_call_first_is_set_aside(self):
        records = _linear_session(3)
        title = _title_call(0, captured_at="2026-07-13T23:59:59.000000+00:00")
        rollout = reconstruct_session(SESSION_ID, [title, *records])
        assert rollout["side_calls"] == ["title-0"]
        assert rollout["record_uuids"] == [r["uuid"] for r in records]
        assert rollout["partial_reason"] is None and rollout["mask_sample"] is False
        assert rollout["model"] == MODEL

    def test_title_call_mid_session_is_set_aside(self):
        records = _linear_session(3)
        title = _title_call(0, captured_at="2026-07-14T00:00:01.500000+00:00")
        rollout = reconstruct_session(SESSION_ID, [*records, title])
        assert rollout["side_calls"] == ["title-0"]
        assert len(rollout["record_uuids"]) == 3 and rollout["mask_sample"] is False

    def test_title_call_with_text_parts_and_invalid_tokens(self):
        # Title calls are recognised before any validation: even a tokenless one is set aside.
        title = _title_call(0, captured_at="2026-07-13T23:00:00.000000+00:00", is_valid=False, prompt_token_ids=None)
        title["messages"][0]["content"] = [{"type": "text", "text": "you are a TITLE GENERATOR"}]
        rollout = reconstruct_session(SESSION_ID, [title, *_linear_session(2)])
        assert rollout["side_calls"] == ["title-0"] and len(rollout["record_uuids"]) == 2

    def test_only_title_call_raises(self):
        with pytest.raises(RolloutError, match="only side calls"):
            reconstruct_session(SESSION_ID, [_title_call(0)])

    def test_title_text_with_tools_is_not_a_title_call(self):
        # The rule needs both: a "title generator" system prompt and no tools.
        records = _linear_session(2)
        records[0]["messages"][0]["content"] = "You are a title generator and a coder."
        records[1]["messages"][0]["content"] = "You are a title generator and a coder."
        rollout = reconstruct_session(SESSION_ID, records)
        assert rollout["side_calls"] == [] and len(rollout["record_uuids"]) == 2

    def test_dead_end_call_with_other_tools_is_set_aside(self):
        records = _linear_session(3)
        side = _record(
            9,
            [
                {"role": "system", "content": "Summarize."},
                {"role": "user", "content": "..."},
                {"role": "assistant", "content": "summary"},
            ],
            {"prompt_token_ids": [5, 5, 5, 5], "generation_token_ids": [6], "generation_log_probs": [-0.1]},
            tools=[],
            model="small-model",
            uuid="side-1",
            captured_at="2026-07-14T00:00:01.500000+00:00",
        )
        rollout = reconstruct_session(SESSION_ID, [*records, side])
        assert rollout["side_calls"] == ["side-1"]
        assert rollout["record_uuids"] == [r["uuid"] for r in records]
        assert rollout["mask_sample"] is False

    def test_leading_unrecognised_side_call_does_not_define_the_session(self):
        records = _linear_session(3)
        side = _record(
            9,
            [{"role": "user", "content": "classify"}, {"role": "assistant", "content": "code"}],
            {"prompt_token_ids": [5, 5], "generation_token_ids": [6], "generation_log_probs": [-0.1]},
            tools=[],
            model="small-model",
            uuid="side-1",
            captured_at="2026-07-13T23:00:00.000000+00:00",
        )
        rollout = reconstruct_session(SESSION_ID, [side, *records])
        assert rollout["side_calls"] == ["side-1"]
        assert rollout["model"] == MODEL and len(rollout["record_uuids"]) == 3

    def test_same_signature_non_extending_call_is_a_break(self):
        # Same model and tools: nothing marks it as a side call, so it is a genuine break.
        records = _linear_session(3)
        stray = _record(
            9,
            [{"role": "user", "content": "unrelated"}, {"role": "assistant", "content": "x"}],
            {"prompt_token_ids": [5, 5], "generation_token_ids": [6], "generation_log_probs": [-0.1]},
            uuid="stray",
            captured_at="2026-07-14T00:00:01.500000+00:00",
        )
        rollout = reconstruct_session(SESSION_ID, [*records, stray])
        assert rollout["side_calls"] == []
        assert len(rollout["record_uuids"]) == 2 and rollout["mask_sample"] is True
        assert rollout["partial_reason"].startswith("record 2 of 4: record 2 prompt_token_ids do not extend")

    def test_differing_call_that_later_calls_build_on_is_a_break(self):
        # Other tools and non-extending, but a later record continues it: not a one-off side call.
        records = _linear_session(2)
        side = _record(
            8,
            [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
            {"prompt_token_ids": [5, 5], "generation_token_ids": [6], "generation_log_probs": [-0.1]},
            tools=[],
            uuid="side-1",
            captured_at="2026-07-14T00:00:05.000000+00:00",
        )
        follow = _record(
            9,
            [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": "a"},
                {"role": "user", "content": "q2"},
                {"role": "assistant", "content": "a2"},
            ],
            {"prompt_token_ids": [5, 5, 6, 9], "generation_token_ids": [6], "generation_log_probs": [-0.1]},
            tools=[],
            uuid="side-2",
            captured_at="2026-07-14T00:00:06.000000+00:00",
        )
        rollout = reconstruct_session(SESSION_ID, [*records, side, follow])
        assert rollout["side_calls"] == []
        assert rollout["record_uuids"] == [r["uuid"] for r in records]
        assert rollout["partial_reason"].startswith("record 2 of 4:")


# --------------------------------------------------------------------------------------------
# Retries
# --------------------------------------------------------------------------------------------


def _retry_of(record: dict, uuid: str, captured_at: str, generation: list[int], text: str) -> dict:
    retry = copy.deepcopy(record)
    retry.update(
        uuid=uuid,
        captured_at=captured_at,
        request_id=f"req-{uuid}",
        generation_token_ids=generation,
        generation_log_probs=[-0.9] * len(generation),
    )
    retry["messages"][-1] = {"role": "assistant", "content": text}
    return retry


class TestRetries:
    def test_retry_resolves_to_the_attempt_the_next_call_extends(self):
        records = _linear_session(3)
        # An earlier attempt of call 1 that nobody continued (different generation).
        loser = _retry_of(records[1], "retry-1", "2026-07-14T00:00:00.500000+00:00", [55, 56], "other answer")
        rollout = reconstruct_session(SESSION_ID, [*records, loser])
        assert rollout["record_uuids"] == [r["uuid"] for r in records]
        assert rollout["discarded_record_uuids"] == ["retry-1"]
        assert rollout["partial_reason"] is None and rollout["mask_sample"] is False

    def test_retry_after_the_chosen_attempt(self):
        records = _linear_session(3)
        loser = _retry_of(records[1], "retry-1", "2026-07-14T00:00:01.500000+00:00", [55, 56], "other answer")
        rollout = reconstruct_session(SESSION_ID, [*records, loser])
        assert rollout["record_uuids"] == [r["uuid"] for r in records]
        assert rollout["discarded_record_uuids"] == ["retry-1"]

    def test_late_retry_after_the_conversation_moved_on(self):
        records = _linear_session(4)
        late = _retry_of(records[1], "retry-1", "2026-07-14T00:00:02.500000+00:00", [55, 56], "other answer")
        rollout = reconstruct_session(SESSION_ID, [*records, late])
        assert rollout["record_uuids"] == [r["uuid"] for r in records]
        assert rollout["discarded_record_uuids"] == ["retry-1"] and rollout["mask_sample"] is False

    def test_retry_at_the_end_keeps_the_last_attempt(self):
        records = _linear_session(2)
        again = _retry_of(records[1], "retry-1", "2026-07-14T00:00:05.000000+00:00", [55, 56], "second try")
        rollout = reconstruct_session(SESSION_ID, [*records, again])
        assert rollout["record_uuids"] == [records[0]["uuid"], "retry-1"]
        assert rollout["discarded_record_uuids"] == [records[1]["uuid"]]
        assert rollout["output"][-1]["content"][0]["text"] == "second try"
        assert rollout["output"][-1]["generation_token_ids"] == [55, 56]

    def test_retry_of_the_first_call(self):
        records = _linear_session(2)
        loser = _retry_of(records[0], "retry-0", "2026-07-13T23:00:00.000000+00:00", [55, 56], "other answer")
        rollout = reconstruct_session(SESSION_ID, [loser, *records])
        assert rollout["record_uuids"] == [r["uuid"] for r in records]
        assert rollout["discarded_record_uuids"] == ["retry-0"]

    def test_three_attempts(self):
        records = _linear_session(3)
        attempts = [
            _retry_of(records[1], f"retry-{k}", f"2026-07-14T00:00:01.{k}00000+00:00", [60 + k, 61], f"try {k}")
            for k in (1, 2)
        ]
        rollout = reconstruct_session(SESSION_ID, [*attempts, *records])
        assert rollout["record_uuids"] == [r["uuid"] for r in records]
        assert sorted(rollout["discarded_record_uuids"]) == ["retry-1", "retry-2"]

    def test_next_call_extending_no_attempt_is_a_break(self):
        records = _linear_session(3)
        again = _retry_of(records[1], "retry-1", "2026-07-14T00:00:01.500000+00:00", [55, 56], "second try")
        records[2]["prompt_token_ids"][0] = 999
        rollout = reconstruct_session(SESSION_ID, [*records, again])
        assert rollout["record_uuids"] == [records[0]["uuid"], "retry-1"]
        assert rollout["discarded_record_uuids"] == [records[1]["uuid"]]
        assert rollout["partial_reason"].startswith("record 3 of 4: record 3 prompt_token_ids do not extend")

    def test_retry_with_changed_model_is_a_break(self):
        records = _linear_session(2)
        again = _retry_of(records[1], "retry-1", "2026-07-14T00:00:05.000000+00:00", [55, 56], "x")
        again["model"] = "other-model"
        rollout = reconstruct_session(SESSION_ID, [*records, again])
        assert rollout["record_uuids"] == [r["uuid"] for r in records]
        assert "model 'other-model' != session model" in rollout["partial_reason"]


# --------------------------------------------------------------------------------------------
# Output items
# --------------------------------------------------------------------------------------------


class TestItems:
    def test_reasoning_content_becomes_a_reasoning_item(self):
        records = _two_call_records()
        records[0]["messages"][-1]["reasoning_content"] = "I should edit the file."
        rollout = _strict(records)
        reasoning, call = rollout["output"][:2]
        assert reasoning == {
            "type": "reasoning",
            "id": "rs_uuid-0",
            "summary": [{"type": "summary_text", "text": "I should edit the file."}],
        }
        assert not _has_triple(reasoning) and _triple(call) == TRIPLE_0
        assert rollout["input"][-1]["role"] == "user"  # the split is at the reasoning item

    def test_think_tags_in_content(self):
        records = _two_call_records()
        records[1]["messages"][-1]["content"] = "<think>check tests</think>All fixed."
        message = _strict(records)["output"][-1]
        reasoning = _strict(records)["output"][-2]
        assert reasoning["summary"] == [{"type": "summary_text", "text": "check tests"}]
        assert message["content"][0]["text"] == "All fixed." and _triple(message) == TRIPLE_1

    def test_empty_reply_is_an_empty_message(self):
        records = _two_call_records()[:1]
        records[0]["messages"][-1] = {"role": "assistant", "content": None}
        (message,) = _strict(records)["output"]
        assert message["content"][0]["text"] == "" and _triple(message) == TRIPLE_0

    def test_text_and_several_tool_calls(self):
        records = _two_call_records()[:1]
        second_call = {
            "id": "call_2",
            "type": "function",
            "function": {"name": "str_replace_editor", "arguments": '{"path":"b"}'},
        }
        records[0]["messages"][-1] = {
            "role": "assistant",
            "content": "Editing two files.",
            "tool_calls": [_tool_call('{"path":"a"}'), second_call],
        }
        message, first, second = _strict(records)["output"]
        assert message["content"][0]["text"] == "Editing two files." and not _has_triple(message)
        assert first["call_id"] == "call_1" and not _has_triple(first)
        assert second["call_id"] == "call_2" and second["arguments"] == '{"path":"b"}'
        assert _triple(second) == TRIPLE_0

    def test_ids_are_deterministic(self):
        assert _strict(_two_call_records()) == _strict(_two_call_records())
        assert _strict(_two_call_records())["output"][-1]["id"] == "msg_uuid-1"


# --------------------------------------------------------------------------------------------
# Trees
# --------------------------------------------------------------------------------------------


class _Store:
    def __init__(self, sessions: dict[str, list[dict]], children: dict[str, list[str]]) -> None:
        self.sessions, self.children = sessions, children

    def load(self, session_id: str) -> list[dict]:
        return self.sessions.get(session_id, [])

    def children_of(self, session_id: str) -> list[str]:
        return self.children.get(session_id, [])


class TestTree:
    def _store(self) -> _Store:
        return _Store(
            {
                "root": _linear_session(3, session_id="root"),
                "child": _linear_session(2, session_id="child", parent="root"),
                "grandchild": _linear_session(2, session_id="grandchild", parent="child"),
                "sibling": _linear_session(1, session_id="sibling", parent="root"),
            },
            {"root": ["child", "sibling"], "child": ["grandchild"]},
        )

    def test_child_and_grandchild_beside_the_root(self):
        store = self._store()
        tree = reconstruct_tree("root", store.load, store.children_of)
        assert tree["session_id"] == "root" and tree["parent_session_id"] is None
        assert len(tree["record_uuids"]) == 3
        assert [(s["session_id"], s["parent_session_id"]) for s in tree["subagents"]] == [
            ("child", "root"),
            ("grandchild", "child"),
            ("sibling", "root"),
        ]
        assert [len(s["record_uuids"]) for s in tree["subagents"]] == [2, 2, 1]
        assert all("subagents" not in s for s in tree["subagents"])
        assert tree["mask_sample"] is False and not any(s["mask_sample"] for s in tree["subagents"])

    def test_partial_grandchild_masks_its_ancestors_only(self):
        store = self._store()
        store.sessions["grandchild"][1]["prompt_token_ids"][0] = 999
        tree = reconstruct_tree("root", store.load, store.children_of)
        by_id = {s["session_id"]: s for s in tree["subagents"]}
        assert by_id["grandchild"]["mask_sample"] is True
        assert by_id["grandchild"]["partial_reason"].startswith("record 1 of 2:")
        assert by_id["child"]["mask_sample"] is True and by_id["child"]["partial_reason"] is None
        assert by_id["child"]["degraded_reason"] == "subagent session 'grandchild' is partial"
        assert by_id["sibling"]["mask_sample"] is False
        assert tree["mask_sample"] is True and tree["partial_reason"] is None

    def test_unreconstructable_child_is_reported_and_masks(self):
        store = self._store()
        store.sessions["sibling"][0]["is_valid"] = False
        tree = reconstruct_tree("root", store.load, store.children_of)
        sibling = tree["subagents"][-1]
        assert sibling["session_id"] == "sibling" and sibling["parent_session_id"] == "root"
        assert sibling["input"] == [] and sibling["output"] == [] and sibling["mask_sample"] is True
        assert "is_valid is not true" in sibling["partial_reason"]
        assert tree["mask_sample"] is True

    def test_strict_tree_raises_on_child_failure(self):
        store = self._store()
        store.sessions["grandchild"][1]["prompt_token_ids"][0] = 999
        with pytest.raises(RolloutError, match="session 'grandchild': record 1 prompt_token_ids"):
            reconstruct_tree("root", store.load, store.children_of, allow_partial=False)

    def test_root_failure_raises(self):
        store = self._store()
        store.sessions["root"] = []
        with pytest.raises(RolloutError, match="no completions"):
            reconstruct_tree("root", store.load, store.children_of)

    def test_cycle_is_not_followed(self):
        store = self._store()
        store.children["grandchild"] = ["root", "child"]
        tree = reconstruct_tree("root", store.load, store.children_of)
        assert [s["session_id"] for s in tree["subagents"]] == ["child", "grandchild", "sibling"]

    def test_parent_falls_back_to_the_tree(self):
        store = self._store()
        for record in store.sessions["sibling"]:
            record["parent_session_id"] = None
        tree = reconstruct_tree("root", store.load, store.children_of)
        assert tree["subagents"][-1]["parent_session_id"] == "root"


# --------------------------------------------------------------------------------------------
# Failed attempts (invalid records) that the client retried
# --------------------------------------------------------------------------------------------


def _failed_attempt(record: dict, uuid: str, captured_at: str, *, keep_tokens: bool = False) -> dict:
    """What the record builder writes for a call that failed or was cut off: invalid, often tokenless."""
    failed = copy.deepcopy(record)
    failed.update(
        uuid=uuid,
        captured_at=captured_at,
        is_valid=False,
        status="failed",
        invalid_reason="call did not complete (status 'failed')",
        generation_token_ids=None,
        generation_log_probs=None,
    )
    if not keep_tokens:
        failed["prompt_token_ids"] = None
    failed["messages"][-1] = {"role": "assistant"}
    return failed


class TestFailedAttempts:
    def test_tokenless_failure_then_successful_retry(self):
        records = _linear_session(3)
        failed = _failed_attempt(records[1], "failed-1", "2026-07-14T00:00:00.500000+00:00")
        rollout = reconstruct_session(SESSION_ID, [*records, failed])
        assert rollout["record_uuids"] == [r["uuid"] for r in records]
        assert rollout["discarded_record_uuids"] == ["failed-1"]
        assert rollout["partial_reason"] is None and rollout["mask_sample"] is False

    def test_failed_first_call_then_successful_retry_does_not_raise(self):
        records = _linear_session(2)
        failed = _failed_attempt(records[0], "failed-0", "2026-07-13T23:00:00.000000+00:00")
        rollout = reconstruct_session(SESSION_ID, [failed, *records], allow_partial=False)
        assert rollout["record_uuids"] == [r["uuid"] for r in records]
        assert rollout["discarded_record_uuids"] == ["failed-0"]

    def test_two_failures_then_success(self):
        records = _linear_session(3)
        failures = [
            _failed_attempt(records[2], f"failed-{k}", f"2026-07-14T00:00:01.{k}00000+00:00", keep_tokens=bool(k % 2))
            for k in (1, 2)
        ]
        rollout = reconstruct_session(SESSION_ID, [*records, *failures])
        assert rollout["record_uuids"] == [r["uuid"] for r in records]
        assert rollout["discarded_record_uuids"] == ["failed-1", "failed-2"]

    def test_failure_recorded_after_the_successful_attempt(self):
        records = _linear_session(3)
        late = _failed_attempt(records[1], "failed-1", "2026-07-14T00:00:02.500000+00:00", keep_tokens=True)
        rollout = reconstruct_session(SESSION_ID, [*records, late])
        assert rollout["record_uuids"] == [r["uuid"] for r in records]
        assert rollout["discarded_record_uuids"] == ["failed-1"] and rollout["mask_sample"] is False

    def test_failure_that_was_not_retried_ends_the_rollout(self):
        records = _linear_session(3)
        failed = _failed_attempt(records[2], "failed-2", "2026-07-14T00:00:01.500000+00:00")
        rollout = reconstruct_session(SESSION_ID, [*records[:2], failed])
        assert rollout["record_uuids"] == [r["uuid"] for r in records[:2]]
        assert rollout["partial_reason"] == "record 2 of 3: record failed-2 is_valid is not true"
        assert rollout["mask_sample"] is True

    def test_failure_followed_by_a_different_prompt_ends_the_rollout(self):
        records = _linear_session(3)
        failed = _failed_attempt(records[2], "failed-2", "2026-07-14T00:00:01.500000+00:00")
        failed["messages"][1]["content"] = "a different question"
        rollout = reconstruct_session(SESSION_ID, [*records, failed])
        assert len(rollout["record_uuids"]) == 2
        assert rollout["partial_reason"].startswith("record 2 of 4: record failed-2 is_valid")


def test_damaged_entries_sort_last_and_end_the_rollout():
    records = _linear_session(2)
    no_time = _linear_session(3)[2]
    del no_time["captured_at"]
    rollout = reconstruct_session(SESSION_ID, ["garbage", no_time, *records])
    assert rollout["record_uuids"] == [r["uuid"] for r in records]
    assert rollout["partial_reason"].startswith("record 2 of 4:")
    assert rollout["mask_sample"] is True


def test_identical_retries_resolve_to_the_latest():
    # A deterministic re-ask: both attempts are continued by the next call; the later one is kept.
    records = _linear_session(3)
    twin = copy.deepcopy(records[1])
    twin.update(uuid="twin-1", captured_at="2026-07-14T00:00:01.500000+00:00")
    rollout = reconstruct_session(SESSION_ID, [*records, twin])
    assert rollout["record_uuids"] == [records[0]["uuid"], "twin-1", records[2]["uuid"]]
    assert rollout["discarded_record_uuids"] == [records[1]["uuid"]]
