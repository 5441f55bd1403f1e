"""Capture record: the fields and checks of Switchyard's record format, plus ours, and the reader check."""

from __future__ import annotations

import copy
import math
import uuid
from datetime import UTC, datetime

import orjson
import pytest

from server.capture.write.record import (
    build_record,
    format_tool_choice,
    format_tools,
    is_valid_session_id,
    utc_timestamp,
    validate_record,
)

WEATHER_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def vllm_completion(**choice_overrides):
    """A vLLM chat completion with return_token_ids + logprobs."""
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": "hi"},
        "finish_reason": "stop",
        "token_ids": [7, 8],
        "logprobs": {"content": [{"token": "h", "logprob": -0.1}, {"token": "i", "logprob": -0.2}]},
    }
    choice.update(choice_overrides)
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "model": "Qwen/Qwen3-0.6B",
        "prompt_token_ids": [1, 2, 3],
        "choices": [choice],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }


def make(chat_response=None, chat_request=None, **overrides):
    kwargs = dict(
        session_id="sess-1",
        parent_session_id=None,
        rollout_id=None,
        request_id=None,
        chat_request=chat_request if chat_request is not None else {"messages": [{"role": "user", "content": "hello"}]},
        chat_response=chat_response if chat_response is not None else vllm_completion(),
        route="policy-model",
        api="chat",
        stream=False,
        latency_ms=12.5,
    )
    kwargs.update(overrides)
    return build_record(**kwargs)


def test_unified_record_schema():
    record = make()
    assert record["schema_version"] == 1
    uuid.UUID(record["uuid"])
    captured = datetime.fromisoformat(record["captured_at"])
    assert captured.utcoffset() == UTC.utcoffset(None)
    assert record["session_id"] == "sess-1"
    assert record["parent_session_id"] is None
    assert record["request_id"] == "chatcmpl-test"
    assert record["model"] == "Qwen/Qwen3-0.6B"
    assert [m["role"] for m in record["messages"]] == ["user", "assistant"]
    assert [m["content"] for m in record["messages"]] == ["hello", "hi"]
    assert record["tools"] == []
    assert record["tool_choice"] == "auto"
    assert record["token_count"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    assert record["prompt_token_ids"] == [1, 2, 3]
    assert record["generation_token_ids"] == [7, 8]
    assert record["generation_log_probs"] == [-0.1, -0.2]
    assert record["finish_reason"] == "stop"
    assert record["is_valid"] is True
    assert record["invalid_reason"] is None


def test_our_fields_are_kept():
    record = make(
        parent_session_id="root-1",
        rollout_id="task0-r1",
        request_id="req-abc",
        route="policy-model",
        api="responses",
        stream=True,
        latency_ms=41.23456,
    )
    assert record["parent_session_id"] == "root-1"
    assert record["rollout_id"] == "task0-r1"
    assert record["request_id"] == "req-abc"  # an explicit request id wins over the upstream's
    assert record["response_id"] == "chatcmpl-test"
    assert record["route"] == "policy-model"
    assert record["api"] == "responses"
    assert record["stream"] is True
    assert record["latency_ms"] == pytest.approx(41.235)
    assert record["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    assert record["status"] == "completed"


def test_given_uuid_and_timestamp_are_used():
    record = make(record_uuid="u-1", captured_at="2026-01-01T00:00:00.000000+00:00")
    assert record["uuid"] == "u-1"
    assert record["captured_at"] == "2026-01-01T00:00:00.000000+00:00"


def test_timestamps_are_fixed_width_so_strings_sort_as_time():
    stamps = [utc_timestamp() for _ in range(50)]
    assert len({len(s) for s in stamps}) == 1
    assert all(s.endswith("+00:00") for s in stamps)
    assert stamps == sorted(stamps)
    # isoformat() drops a zero microsecond field; ours must not, or ".5" would sort before "".
    assert "." in stamps[0]


def test_request_is_not_mutated_and_record_is_json():
    request = {"messages": [{"role": "user", "content": "hello"}], "tools": [], "tool_choice": "auto"}
    before = copy.deepcopy(request)
    record = make(chat_request=request)
    assert request == before  # the assistant turn is appended to the record's own list
    assert orjson.loads(orjson.dumps(record)) == record


def test_assistant_keeps_tool_calls_and_reasoning():
    tool_call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
    }
    response = vllm_completion(
        message={"role": "assistant", "content": None, "reasoning_content": "think", "tool_calls": [tool_call]},
        finish_reason="tool_calls",
    )
    assistant = make(chat_response=response)["messages"][-1]
    assert assistant == {"role": "assistant", "reasoning_content": "think", "tool_calls": [tool_call]}
    # vLLM >= 0.24 calls it `reasoning`; the record keeps one name.
    response = vllm_completion(message={"role": "assistant", "content": "x", "reasoning": "r"})
    assert make(chat_response=response)["messages"][-1]["reasoning_content"] == "r"


def test_tools_use_the_former_switchyard_shape():
    tools = [
        {
            "type": "function",
            "function": {"name": "get_weather", "description": "Weather", "parameters": WEATHER_SCHEMA},
        }
    ]
    record = make(
        chat_request={"messages": [{"role": "user", "content": "hi"}], "tools": tools, "tool_choice": "required"}
    )
    assert record["tools"] == [
        {"id": "get_weather", "description": "Weather", "inputSchema": {"jsonSchema": WEATHER_SCHEMA}}
    ]
    assert record["tool_choice"] == "required"


def test_tool_shape_variants():
    # Responses-style flat tools and Anthropic-style tools map to the same shape.
    assert format_tools([{"type": "function", "name": "f", "parameters": WEATHER_SCHEMA}]) == [
        {"id": "f", "description": "", "inputSchema": {"jsonSchema": WEATHER_SCHEMA}}
    ]
    assert format_tools([{"name": "g", "description": "d", "input_schema": WEATHER_SCHEMA}]) == [
        {"id": "g", "description": "d", "inputSchema": {"jsonSchema": WEATHER_SCHEMA}}
    ]
    assert format_tools([{"type": "function", "function": {"name": "h"}}]) == [
        {"id": "h", "description": "", "inputSchema": {"jsonSchema": {}}}
    ]
    assert format_tools([{"type": "function", "function": {"name": "s", "strict": True}}]) == [
        {"id": "s", "description": "", "inputSchema": {"jsonSchema": {}}, "strict": True}  # kept for rollouts
    ]
    assert format_tools(None) == []
    assert format_tools("nope") == []


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        (None, "auto"),
        ("none", "none"),
        ("required", "required"),
        ({"type": "function", "function": {"name": "f"}}, "function"),
    ],
)
def test_tool_choice_like_the_former_format(choice, expected):
    assert format_tool_choice(choice) == expected


def test_token_ids_from_token_strings_when_token_ids_are_absent():
    response = vllm_completion(
        logprobs={"content": [{"token": "token_id:11", "logprob": -0.5}, {"token": "token_id:12", "logprob": -0.25}]}
    )
    del response["choices"][0]["token_ids"]
    record = make(chat_response=response)
    assert record["generation_token_ids"] == [11, 12]
    assert record["generation_log_probs"] == [-0.5, -0.25]
    assert record["is_valid"] is True


def _without(key):
    def edit(response):
        response["choices"][0].pop(key, None)

    return edit


def _set_choice(**values):
    def edit(response):
        response["choices"][0].update(values)

    return edit


def _set(**values):
    def edit(response):
        response.update(values)

    return edit


def _two_choices(response):
    response["choices"].append(copy.deepcopy(response["choices"][0]) | {"index": 1})


@pytest.mark.parametrize(
    ("edit", "reason_part"),
    [
        (_two_choices, "exactly one choice"),
        (_set(choices=[]), "exactly one choice"),
        (_set(id=None), "request_id"),
        (_set(model=None), "model"),
        (_set(model=""), "model"),
        (_set(prompt_token_ids=None), "prompt_token_ids"),
        (_set(prompt_token_ids=[]), "prompt_token_ids"),
        (_set(prompt_token_ids=[1, True, 3]), "prompt_token_ids"),
        (_set_choice(token_ids=[7.5, "8"]), "generation_token_ids"),
        (_set_choice(token_ids=[]), "generation_token_ids"),
        (_set_choice(logprobs={"content": [{"logprob": -0.1}, {"logprob": math.nan}]}), "finite"),
        (_set_choice(logprobs={"content": [{"logprob": -0.1}, {"logprob": -math.inf}]}), "finite"),
        (_set_choice(logprobs={"content": [{"logprob": -0.1}, {"logprob": None}]}), "finite"),
        (_set_choice(logprobs={"content": [{"logprob": -0.1}, {"logprob": False}]}), "finite"),
        (_set_choice(logprobs=None), "generation_log_probs"),
        (_set_choice(logprobs={"content": [{"logprob": -0.1}]}), "different lengths"),
    ],
)
def test_failed_token_check_keeps_the_record_with_a_reason(edit, reason_part):
    response = vllm_completion()
    edit(response)
    record = make(chat_response=response)
    assert record["is_valid"] is False
    assert reason_part in record["invalid_reason"]
    # Still a complete, readable record: nothing is dropped or "repaired".
    assert validate_record(record) is None
    assert record["messages"][0] == {"role": "user", "content": "hello"}


def test_misaligned_logprobs_are_stored_as_is():
    record = make(chat_response=vllm_completion(logprobs={"content": [{"token": "h", "logprob": -0.1}]}))
    assert record["is_valid"] is False
    assert record["generation_token_ids"] == [7, 8]
    assert record["generation_log_probs"] == [-0.1]


def test_missing_token_fields_keep_the_text():
    response = {
        "id": "chatcmpl-x",
        "model": "gpt-x",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "plain"}, "finish_reason": "stop"}],
    }
    record = make(chat_response=response)
    assert record["is_valid"] is False
    assert record["messages"][-1] == {"role": "assistant", "content": "plain"}
    assert record["prompt_token_ids"] is None
    assert record["generation_token_ids"] is None
    assert record["generation_log_probs"] is None
    assert record["token_count"] == {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}


def test_partial_call_is_marked_invalid_even_with_good_tokens():
    record = make(status="partial")
    assert record["status"] == "partial"
    assert record["is_valid"] is False
    assert "partial" in record["invalid_reason"]


def test_explicit_request_id_used_when_upstream_has_none():
    response = vllm_completion()
    del response["id"]
    record = make(chat_response=response, request_id="req-9")
    assert record["request_id"] == "req-9"
    assert record["is_valid"] is True


def gym_reader_problem(record, session_id):
    """What Gym's trace reconstruction checks on each record (gym-contracts §3.3), re-stated."""
    if record.get("schema_version") != 1 or record.get("session_id") != session_id:
        return "envelope"
    if not (isinstance(record.get("uuid"), str) and record["uuid"]):
        return "uuid"
    if record.get("is_valid") is not True:
        return "is_valid"
    for field in ("request_id", "model"):
        if not (isinstance(record.get(field), str) and record[field]):
            return field
    for field in ("prompt_token_ids", "generation_token_ids"):
        value = record.get(field)
        if not (isinstance(value, list) and value and all(type(x) is int for x in value)):
            return field
    lps = record.get("generation_log_probs")
    if not (isinstance(lps, list) and all(type(x) in (int, float) and math.isfinite(x) for x in lps)):
        return "log probs"
    if len(lps) != len(record["generation_token_ids"]):
        return "lengths"
    if not record.get("messages") or record["messages"][-1].get("role") != "assistant":
        return "messages"
    for tool in record["tools"]:
        if not (isinstance(tool.get("id"), str) and tool["id"]) or "jsonSchema" not in tool.get("inputSchema", {}):
            return "tools"
    return None


def test_a_valid_record_passes_gyms_reader_checks():
    tools = [
        {"type": "function", "function": {"name": "get_weather", "description": "W", "parameters": WEATHER_SCHEMA}}
    ]
    record = make(
        chat_request={
            "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}],
            "tools": tools,
        }
    )
    assert gym_reader_problem(orjson.loads(orjson.dumps(record)), "sess-1") is None


@pytest.mark.parametrize(
    ("edit", "reason_part"),
    [
        (lambda r: [], "not an object"),
        (lambda r: r | {"schema_version": 2}, "schema_version"),
        (lambda r: r | {"uuid": ""}, "uuid"),
        (lambda r: r | {"session_id": "../ etc"}, "session_id"),
        (lambda r: r | {"session_id": None}, "session_id"),
        (lambda r: r | {"parent_session_id": 5}, "parent_session_id"),
        (lambda r: {k: v for k, v in r.items() if k != "captured_at"}, "captured_at"),
        (lambda r: r | {"messages": "x"}, "messages"),
        (lambda r: r | {"is_valid": "yes"}, "is_valid"),
    ],
)
def test_validate_record_rejects_foreign_objects(edit, reason_part):
    assert validate_record(make()) is None
    problem = validate_record(edit(make()))
    assert problem is not None and reason_part in problem


def test_validate_record_accepts_a_former_switchyard_record():
    former = {
        "schema_version": 1,
        "uuid": str(uuid.uuid4()),
        "session_id": "abc123",
        "parent_session_id": None,
        "captured_at": "2026-07-14T00:00:00.123456+00:00",
        "request_id": "chatcmpl-1",
        "model": "Qwen/Qwen3-0.6B",
        "messages": [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}],
        "tools": [],
        "tool_choice": "auto",
        "token_count": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        "prompt_token_ids": [1],
        "generation_token_ids": [2],
        "generation_log_probs": [-0.1],
        "finish_reason": "stop",
        "is_valid": True,
    }
    assert validate_record(former) is None


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("abc123", True),
        ("task0-r1-a0", True),
        ("ses_01.J-x", True),
        ("a" * 200, True),
        ("a" * 201, False),
        ("", False),
        (".hidden", True),
        ("-lead", True),
        (".", False),
        ("a b", False),
        ("s\u00e9ance", False),
        ("..", False),
        ("a/b", True),
        ("a\n", False),
        ("bad\r\nx-injected: 1", False),
        ("tenant:a", True),
        ("swe:django-1234:0", True),
        (None, False),
        (5, False),
    ],
)
def test_session_id_charset(value, ok):
    assert is_valid_session_id(value) is ok


def test_the_injection_object_is_kept_only_when_given():
    from server.capture.write.record import build_record as build

    kwargs = dict(
        session_id="s",
        parent_session_id=None,
        rollout_id=None,
        request_id="r",
        chat_request={"messages": []},
        chat_response={},
        route="demo",
        api="chat",
        stream=False,
        latency_ms=1.0,
    )
    assert "injection" not in build(**kwargs)
    info = {"transport": "vllm", "chain": "c", "injected_len": 3, "echo_ok": True, "fallback_reason": None}
    assert build(**kwargs, injection=info)["injection"] == info


def test_token_texts_are_kept_beside_the_ids():
    record = make()
    assert record["generation_token_texts"] == ["h", "i"]
    assert len(record["generation_token_texts"]) == len(record["generation_token_ids"])


@pytest.mark.parametrize(
    "logprobs",
    [
        None,  # no logprobs asked for
        {"content": [{"token": "token_id:7", "logprob": -0.1}, {"token": "token_id:8", "logprob": -0.2}]},  # ids mode
        {"content": [{"logprob": -0.1}, {"token": "i", "logprob": -0.2}]},  # an entry without text
    ],
    ids=["no-logprobs", "token-id-strings", "missing-text"],
)
def test_token_texts_are_null_when_the_upstream_gave_no_text(logprobs):
    assert make(chat_response=vllm_completion(logprobs=logprobs))["generation_token_texts"] is None


@pytest.mark.parametrize(
    "ids, ok",
    [
        ([1, 2, 3], True),
        ([-1, 0], True),
        ([1, True], False),
        ([1, 2.0], False),
        (["1"], False),
        ([None], False),
        ([[1], [2]], False),
        ([{}], False),
        ([], False),
        ([2**70], False),
        ((1, 2), False),
    ],
)
def test_token_id_lists_are_checked_element_by_element(ids, ok):
    from server.capture.tokens import is_token_ids

    assert is_token_ids(ids) is ok
