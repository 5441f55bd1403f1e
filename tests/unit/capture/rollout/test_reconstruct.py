"""One session's reconstruction: Gym's trace and validation tests re-derived, partial prefixes, side calls, retries, failed attempts."""

from __future__ import annotations

import copy
import json
import math

import pytest

from server.capture.rollout import RolloutError, reconstruct_envelope, reconstruct_session
from tests.support.rollouts import (
    MODEL,
    SESSION_ID,
    SYSTEM,
    TOOL_SCHEMA,
    TRIPLE_0,
    TRIPLE_1,
    has_triple,
    linear_session,
    make_record,
    strict_rollout,
    triple_of,
    two_call_records,
)


class TestReconstruction:
    def test_two_call_tool_trajectory(self):
        rollout = strict_rollout(two_call_records())
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
        assert triple_of(message) == TRIPLE_1
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
        rollout = strict_rollout(two_call_records(arguments_0=pretty, arguments_1=compact))
        assert rollout["output"][0]["arguments"] == pretty
        assert rollout["tools"][0]["type"] == "function"

    def test_changed_tool_args_rejected(self):
        records = two_call_records(arguments_0='{"path": "a.py"}', arguments_1='{"path": "b.py"}')
        with pytest.raises(RolloutError, match="does not extend"):
            strict_rollout(records)

    def test_single_record_session(self):
        rollout = strict_rollout(two_call_records()[:1])
        assert len(rollout["input"]) == 2
        assert len(rollout["output"]) == 1
        assert triple_of(rollout["output"][0]) == TRIPLE_0

    def test_divergent_history_rejected(self):
        records = two_call_records()
        records[1]["messages"][1] = {"role": "user", "content": "Fix another bug."}
        with pytest.raises(RolloutError, match="does not extend"):
            strict_rollout(records)

    def test_missing_environment_suffix_rejected(self):
        records = two_call_records()
        del records[1]["messages"][3]
        with pytest.raises(RolloutError, match="adds no environment messages"):
            strict_rollout(records)

    def test_assistant_in_suffix_rejected(self):
        records = two_call_records()
        records[1]["messages"].insert(4, {"role": "assistant", "content": "uncaptured turn"})
        with pytest.raises(RolloutError, match=r"non-environment roles: \['assistant'\]"):
            strict_rollout(records)

    def test_a_system_message_in_the_suffix_is_environment(self):
        # Claude Code adds `role: system` blocks between turns; they are the harness's, not the model's.
        records = two_call_records()
        records[1]["messages"].insert(4, {"role": "system", "content": "Available agent types: ..."})
        rollout = strict_rollout(records)
        assert rollout["partial_reason"] is None and len(rollout["record_uuids"]) == 2

    def test_reordered_records_rejected(self):
        # Input order does not matter (records are sorted), so "reordered" means reordered in time.
        records = two_call_records()
        records[0]["captured_at"], records[1]["captured_at"] = records[1]["captured_at"], records[0]["captured_at"]
        with pytest.raises(RolloutError, match="not extend"):
            strict_rollout(records)

    def test_non_extending_token_history_rejected(self):
        records = two_call_records()
        records[1]["prompt_token_ids"] = [9] * 6
        with pytest.raises(RolloutError, match="do not extend the prior prompt"):
            strict_rollout(records)

    def test_equal_length_prompt_allowed(self):
        # A prompt exactly equal to the prior prompt+generation is contiguous.
        records = two_call_records()
        records[1]["prompt_token_ids"] = [1, 2, 3, 4, 5]
        assert strict_rollout(records)["record_uuids"] == ["uuid-0", "uuid-1"]

    def test_input_order_does_not_matter(self):
        records = two_call_records()
        assert strict_rollout(list(reversed(records))) == strict_rollout(records)

    def test_first_record_prompt_may_hold_assistant_turns(self):
        # A session whose first captured call already carries history: that history is input.
        record = make_record(
            0,
            [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "hello"},
                {"role": "user", "content": "bye"},
                {"role": "assistant", "content": "ciao"},
            ],
            TRIPLE_0,
        )
        rollout = strict_rollout([record])
        assert [i["type"] for i in rollout["input"]] == ["message"]
        first, second, last = rollout["output"]
        assert first["role"] == "assistant" and not has_triple(first)
        assert second == {"type": "message", "role": "user", "content": "bye"}
        assert last["content"][0]["text"] == "ciao" and triple_of(last) == TRIPLE_0
        assert first["id"] != last["id"]


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
        envelope = {"schema_version": 1, "session_id": SESSION_ID, "completions": two_call_records()}
        envelope[field] = value
        with pytest.raises(RolloutError, match=match):
            reconstruct_envelope(envelope, SESSION_ID, allow_partial=False)

    def test_envelope_round_trip(self):
        envelope = {"schema_version": 1, "session_id": SESSION_ID, "completions": two_call_records()}
        assert reconstruct_envelope(envelope, SESSION_ID) == strict_rollout(two_call_records())

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
        records = two_call_records()
        records[1][field] = value
        with pytest.raises(RolloutError, match=match):
            strict_rollout(records)

    def test_messages_must_end_with_assistant(self):
        records = two_call_records()
        records[1]["messages"].append({"role": "user", "content": "and?"})
        with pytest.raises(RolloutError, match="end with an assistant"):
            strict_rollout(records)

    @pytest.mark.parametrize(
        ("field", "value"),
        [("model", "other-model"), ("tools", []), ("tool_choice", "required")],
    )
    def test_session_consistency(self, field, value):
        records = two_call_records()
        records[1][field] = value
        with pytest.raises(RolloutError, match="model|tools/tool_choice"):
            strict_rollout(records)

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
        records = two_call_records()
        records[1]["messages"].insert(3, message)
        with pytest.raises(RolloutError, match=match):
            strict_rollout(records)

    def test_bad_message_in_unchanged_history_still_caught(self):
        # Messages equal to the previous record's are skipped for speed; a bad one in the first
        # record is still caught there.
        records = two_call_records()
        records[0]["messages"].insert(1, {"role": "narrator", "content": "x"})
        with pytest.raises(RolloutError, match="unsupported role"):
            strict_rollout(records)

    def test_malformed_tool_call(self):
        records = two_call_records()
        del records[1]["messages"][2]["tool_calls"][0]["id"]
        with pytest.raises(RolloutError, match="malformed tool call"):
            strict_rollout(records)

    def test_non_list_tool_calls(self):
        records = two_call_records()
        records[1]["messages"][2]["tool_calls"] = {"id": "call_1"}
        with pytest.raises(RolloutError, match="non-list tool_calls"):
            strict_rollout(records)

    def test_messages_checked_before_history(self):
        # Gym's order: every message is validated before the history comparison runs.
        records = two_call_records()
        records[1]["messages"][1] = {"role": "user", "content": "different"}
        records[1]["messages"].insert(4, {"role": "tool", "content": "no id"})
        with pytest.raises(RolloutError, match="without tool_call_id"):
            strict_rollout(records)


class TestPartial:
    def test_break_keeps_longest_valid_prefix(self):
        records = linear_session(4)
        records[2]["prompt_token_ids"][0] = 999
        rollout = reconstruct_session(SESSION_ID, records)
        assert rollout["record_uuids"] == [f"{SESSION_ID}-0", f"{SESSION_ID}-1"]
        assert rollout["partial_reason"] == (
            "record 2 of 4: record 2 prompt_token_ids do not extend the prior prompt+generation tokens"
            " (the engine's template changed earlier tokens)"
        )
        assert rollout["partial_break"]["kind"] == "template_changed"
        assert rollout["partial_break"]["position"] == 0
        assert rollout["mask_sample"] is True
        assert triple_of(rollout["output"][-1])["generation_token_ids"] == [1001, 2001]

    def test_history_break_names_record(self):
        records = linear_session(3)
        records[2]["messages"][1]["content"] = "rewritten"
        rollout = reconstruct_session(SESSION_ID, records)
        assert len(rollout["record_uuids"]) == 2
        assert rollout["partial_reason"] == (
            "record 2 of 3: record 2 prompt does not extend the reconstructed history"
            " (the client rewrote an earlier message)"
        )

    def test_invalid_record_ends_prefix(self):
        records = linear_session(3)
        records[1]["is_valid"] = False
        records[1]["invalid_reason"] = "no token ids"
        rollout = reconstruct_session(SESSION_ID, records)
        assert rollout["record_uuids"] == [f"{SESSION_ID}-0"]
        assert rollout["partial_reason"] == (
            f"record 1 of 3: record {SESSION_ID}-1 is_valid is not true: no token ids (the record is incomplete)"
        )
        assert rollout["partial_break"]["invalid_reason"] == "no token ids"
        assert rollout["mask_sample"] is True

    def test_first_record_failure_raises(self):
        records = linear_session(3)
        records[0]["is_valid"] = False
        with pytest.raises(RolloutError, match="is_valid is not true"):
            reconstruct_session(SESSION_ID, records)

    def test_strict_mode_fails_fast(self):
        records = linear_session(3)
        records[2]["prompt_token_ids"][0] = 999
        with pytest.raises(RolloutError, match="record 2 prompt_token_ids do not extend"):
            reconstruct_session(SESSION_ID, records, allow_partial=False)

    def test_unknown_extra_keys_ignored(self):
        records = linear_session(2)
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


def _title_call(index: int, **extra) -> dict:
    return make_record(
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
        records = linear_session(3)
        title = _title_call(0, captured_at="2026-07-13T23:59:59.000000+00:00")
        rollout = reconstruct_session(SESSION_ID, [title, *records])
        assert rollout["side_calls"] == ["title-0"]
        assert rollout["record_uuids"] == [r["uuid"] for r in records]
        assert rollout["partial_reason"] is None and rollout["mask_sample"] is False
        assert rollout["model"] == MODEL

    def test_title_call_mid_session_is_set_aside(self):
        records = linear_session(3)
        title = _title_call(0, captured_at="2026-07-14T00:00:01.500000+00:00")
        rollout = reconstruct_session(SESSION_ID, [*records, title])
        assert rollout["side_calls"] == ["title-0"]
        assert len(rollout["record_uuids"]) == 3 and rollout["mask_sample"] is False

    def test_title_call_with_text_parts_and_invalid_tokens(self):
        # Title calls are recognised before any validation: even a tokenless one is set aside.
        title = _title_call(0, captured_at="2026-07-13T23:00:00.000000+00:00", is_valid=False, prompt_token_ids=None)
        title["messages"][0]["content"] = [{"type": "text", "text": "you are a TITLE GENERATOR"}]
        rollout = reconstruct_session(SESSION_ID, [title, *linear_session(2)])
        assert rollout["side_calls"] == ["title-0"] and len(rollout["record_uuids"]) == 2

    def test_only_title_call_raises(self):
        with pytest.raises(RolloutError, match="only side calls"):
            reconstruct_session(SESSION_ID, [_title_call(0)])

    def test_title_text_with_tools_is_not_a_title_call(self):
        # The rule needs both: a "title generator" system prompt and no tools.
        records = linear_session(2)
        records[0]["messages"][0]["content"] = "You are a title generator and a coder."
        records[1]["messages"][0]["content"] = "You are a title generator and a coder."
        rollout = reconstruct_session(SESSION_ID, records)
        assert rollout["side_calls"] == [] and len(rollout["record_uuids"]) == 2

    def test_dead_end_call_with_other_tools_is_set_aside(self):
        records = linear_session(3)
        side = make_record(
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
        records = linear_session(3)
        side = make_record(
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
        records = linear_session(3)
        stray = make_record(
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
        records = linear_session(2)
        side = make_record(
            8,
            [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
            {"prompt_token_ids": [5, 5], "generation_token_ids": [6], "generation_log_probs": [-0.1]},
            tools=[],
            uuid="side-1",
            captured_at="2026-07-14T00:00:05.000000+00:00",
        )
        follow = make_record(
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
        records = linear_session(3)
        # An earlier attempt of call 1 that nobody continued (different generation).
        loser = _retry_of(records[1], "retry-1", "2026-07-14T00:00:00.500000+00:00", [55, 56], "other answer")
        rollout = reconstruct_session(SESSION_ID, [*records, loser])
        assert rollout["record_uuids"] == [r["uuid"] for r in records]
        assert rollout["discarded_record_uuids"] == ["retry-1"]
        assert rollout["partial_reason"] is None and rollout["mask_sample"] is False

    def test_retry_after_the_chosen_attempt(self):
        records = linear_session(3)
        loser = _retry_of(records[1], "retry-1", "2026-07-14T00:00:01.500000+00:00", [55, 56], "other answer")
        rollout = reconstruct_session(SESSION_ID, [*records, loser])
        assert rollout["record_uuids"] == [r["uuid"] for r in records]
        assert rollout["discarded_record_uuids"] == ["retry-1"]

    def test_late_retry_after_the_conversation_moved_on(self):
        records = linear_session(4)
        late = _retry_of(records[1], "retry-1", "2026-07-14T00:00:02.500000+00:00", [55, 56], "other answer")
        rollout = reconstruct_session(SESSION_ID, [*records, late])
        assert rollout["record_uuids"] == [r["uuid"] for r in records]
        assert rollout["discarded_record_uuids"] == ["retry-1"] and rollout["mask_sample"] is False

    def test_retry_at_the_end_keeps_the_last_attempt(self):
        records = linear_session(2)
        again = _retry_of(records[1], "retry-1", "2026-07-14T00:00:05.000000+00:00", [55, 56], "second try")
        rollout = reconstruct_session(SESSION_ID, [*records, again])
        assert rollout["record_uuids"] == [records[0]["uuid"], "retry-1"]
        assert rollout["discarded_record_uuids"] == [records[1]["uuid"]]
        assert rollout["output"][-1]["content"][0]["text"] == "second try"
        assert rollout["output"][-1]["generation_token_ids"] == [55, 56]

    def test_retry_of_the_first_call(self):
        records = linear_session(2)
        loser = _retry_of(records[0], "retry-0", "2026-07-13T23:00:00.000000+00:00", [55, 56], "other answer")
        rollout = reconstruct_session(SESSION_ID, [loser, *records])
        assert rollout["record_uuids"] == [r["uuid"] for r in records]
        assert rollout["discarded_record_uuids"] == ["retry-0"]

    def test_three_attempts(self):
        records = linear_session(3)
        attempts = [
            _retry_of(records[1], f"retry-{k}", f"2026-07-14T00:00:01.{k}00000+00:00", [60 + k, 61], f"try {k}")
            for k in (1, 2)
        ]
        rollout = reconstruct_session(SESSION_ID, [*attempts, *records])
        assert rollout["record_uuids"] == [r["uuid"] for r in records]
        assert sorted(rollout["discarded_record_uuids"]) == ["retry-1", "retry-2"]

    def test_next_call_extending_no_attempt_is_a_break(self):
        records = linear_session(3)
        again = _retry_of(records[1], "retry-1", "2026-07-14T00:00:01.500000+00:00", [55, 56], "second try")
        records[2]["prompt_token_ids"][0] = 999
        rollout = reconstruct_session(SESSION_ID, [*records, again])
        assert rollout["record_uuids"] == [records[0]["uuid"], "retry-1"]
        assert rollout["discarded_record_uuids"] == [records[1]["uuid"]]
        assert rollout["partial_reason"].startswith("record 3 of 4: record 3 prompt_token_ids do not extend")

    def test_retry_with_changed_model_is_a_break(self):
        records = linear_session(2)
        again = _retry_of(records[1], "retry-1", "2026-07-14T00:00:05.000000+00:00", [55, 56], "x")
        again["model"] = "other-model"
        rollout = reconstruct_session(SESSION_ID, [*records, again])
        assert rollout["record_uuids"] == [r["uuid"] for r in records]
        assert "model 'other-model' != session model" in rollout["partial_reason"]


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
        records = linear_session(3)
        failed = _failed_attempt(records[1], "failed-1", "2026-07-14T00:00:00.500000+00:00")
        rollout = reconstruct_session(SESSION_ID, [*records, failed])
        assert rollout["record_uuids"] == [r["uuid"] for r in records]
        assert rollout["discarded_record_uuids"] == ["failed-1"]
        assert rollout["partial_reason"] is None and rollout["mask_sample"] is False

    def test_failed_first_call_then_successful_retry_does_not_raise(self):
        records = linear_session(2)
        failed = _failed_attempt(records[0], "failed-0", "2026-07-13T23:00:00.000000+00:00")
        rollout = reconstruct_session(SESSION_ID, [failed, *records], allow_partial=False)
        assert rollout["record_uuids"] == [r["uuid"] for r in records]
        assert rollout["discarded_record_uuids"] == ["failed-0"]

    def test_two_failures_then_success(self):
        records = linear_session(3)
        failures = [
            _failed_attempt(records[2], f"failed-{k}", f"2026-07-14T00:00:01.{k}00000+00:00", keep_tokens=bool(k % 2))
            for k in (1, 2)
        ]
        rollout = reconstruct_session(SESSION_ID, [*records, *failures])
        assert rollout["record_uuids"] == [r["uuid"] for r in records]
        assert rollout["discarded_record_uuids"] == ["failed-1", "failed-2"]

    def test_failure_recorded_after_the_successful_attempt(self):
        records = linear_session(3)
        late = _failed_attempt(records[1], "failed-1", "2026-07-14T00:00:02.500000+00:00", keep_tokens=True)
        rollout = reconstruct_session(SESSION_ID, [*records, late])
        assert rollout["record_uuids"] == [r["uuid"] for r in records]
        assert rollout["discarded_record_uuids"] == ["failed-1"] and rollout["mask_sample"] is False

    def test_failure_that_was_not_retried_ends_the_rollout(self):
        records = linear_session(3)
        failed = _failed_attempt(records[2], "failed-2", "2026-07-14T00:00:01.500000+00:00")
        rollout = reconstruct_session(SESSION_ID, [*records[:2], failed])
        assert rollout["record_uuids"] == [r["uuid"] for r in records[:2]]
        assert rollout["partial_reason"].startswith("record 2 of 3: record failed-2 is_valid is not true: ")
        assert rollout["mask_sample"] is True

    def test_failure_followed_by_a_different_prompt_ends_the_rollout(self):
        records = linear_session(3)
        failed = _failed_attempt(records[2], "failed-2", "2026-07-14T00:00:01.500000+00:00")
        failed["messages"][1]["content"] = "a different question"
        rollout = reconstruct_session(SESSION_ID, [*records, failed])
        assert len(rollout["record_uuids"]) == 2
        assert rollout["partial_reason"].startswith("record 2 of 4: record failed-2 is_valid")


def test_damaged_entries_sort_last_and_end_the_rollout():
    records = linear_session(2)
    no_time = linear_session(3)[2]
    del no_time["captured_at"]
    rollout = reconstruct_session(SESSION_ID, ["garbage", no_time, *records])
    assert rollout["record_uuids"] == [r["uuid"] for r in records]
    assert rollout["partial_reason"].startswith("record 2 of 4:")
    assert rollout["mask_sample"] is True


def test_identical_retries_resolve_to_the_latest():
    # A deterministic re-ask: both attempts are continued by the next call; the later one is kept.
    records = linear_session(3)
    twin = copy.deepcopy(records[1])
    twin.update(uuid="twin-1", captured_at="2026-07-14T00:00:01.500000+00:00")
    rollout = reconstruct_session(SESSION_ID, [*records, twin])
    assert rollout["record_uuids"] == [records[0]["uuid"], "twin-1", records[2]["uuid"]]
    assert rollout["discarded_record_uuids"] == [records[1]["uuid"]]


# ---- token injection fallbacks ---------------------------------------------------------------


def _with_injection(record: dict, reason: str | None) -> dict:
    record["injection"] = {
        "transport": "vllm",
        "chain": "chain_1",
        "injected_len": 0 if reason else len(record["prompt_token_ids"]),
        "echo_ok": None if reason else True,
        "fallback_reason": reason,
    }
    return record


def test_injected_calls_reconstruct_unchanged():
    records = [_with_injection(r, None) for r in two_call_records()]
    rollout = reconstruct_session(SESSION_ID, records)
    assert rollout["partial_reason"] is None and rollout["record_uuids"] == ["uuid-0", "uuid-1"]


def test_a_fallback_call_is_never_presented_as_contiguous():
    """Its ids line up (the control above), yet the engine rendered it itself: the rollout ends before it."""
    first, second = two_call_records()
    _with_injection(first, "first_call")  # a session's first call is no break
    _with_injection(second, "echo_mismatch")
    rollout = reconstruct_session(SESSION_ID, [first, second])
    assert rollout["record_uuids"] == ["uuid-0"] and rollout["mask_sample"] is True
    assert "without token injection (echo_mismatch)" in rollout["partial_reason"]


def test_a_break_says_when_injection_fell_back():
    first, second = two_call_records()
    second["prompt_token_ids"] = [9, 9, 9] + second["prompt_token_ids"]
    _with_injection(second, "upstream_rejected")
    rollout = reconstruct_session(SESSION_ID, [first, second])
    assert "do not extend" in rollout["partial_reason"] and "upstream_rejected" in rollout["partial_reason"]
