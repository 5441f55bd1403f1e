"""Property tests for rollout reconstruction: order independence and exact longest-valid-prefix cuts."""

from __future__ import annotations

import copy
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server.capture.rollout import RolloutError, reconstruct_session

SESSION_ID = "ses_prop"
MODEL = "policy-model"
TOOLS = [{"id": "bash", "description": "Run a command", "inputSchema": {"jsonSchema": {"type": "object"}}}]

token = st.integers(min_value=0, max_value=150_000)
tokens = st.lists(token, min_size=1, max_size=12)
text = st.text(alphabet="abcdefghij <>/{}\"'", min_size=0, max_size=12)
json_value = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.text(alphabet="xyz", max_size=3),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(alphabet="abc", max_size=2), inner, max_size=3),
    max_leaves=6,
)


def _spell_arguments(draw, value) -> str:
    """The same JSON value in one of several spellings (what clients do when they echo arguments)."""
    spacing = draw(st.sampled_from([(", ", ": "), (",", ":"), None]))
    if spacing is None:
        return json.dumps(value, indent=2, sort_keys=draw(st.booleans()))
    return json.dumps(value, separators=spacing, sort_keys=draw(st.booleans()))


def _spell_content(draw, content: str):
    """A message's content as a string or as text parts (both mean the same text)."""
    if draw(st.booleans()) or not content:
        return content
    cut = draw(st.integers(0, len(content)))
    return [{"type": "text", "text": content[:cut]}, {"type": "text", "text": content[cut:]}]


@st.composite
def sessions(draw, min_calls: int = 1, max_calls: int = 7) -> list[dict]:
    """A valid session: every call's prompt extends the previous call's prompt+generation, in tokens
    and in messages, with the client re-spelling what it echoes back."""
    n_calls = draw(st.integers(min_calls, max_calls))
    # The logical conversation, and the client's own spelling of each message (what it resends).
    sent: list[dict] = []
    if draw(st.booleans()):
        sent.append({"role": "system", "content": "You are an agent. " + draw(text)})
    sent.append({"role": "user", "content": "Task: " + draw(text)})
    prompt = draw(tokens)
    records = []
    for k in range(n_calls):
        generation = draw(tokens)
        n_tools = draw(st.integers(0, 2))
        calls = [(f"call_{k}_{t}", draw(json_value.filter(lambda v: v is not None))) for t in range(n_tools)]
        words = draw(text)
        reply: dict = {"role": "assistant", "content": words if (words or not calls) else None}
        if calls:
            reply["tool_calls"] = [
                {"id": cid, "type": "function", "function": {"name": "bash", "arguments": _spell_arguments(draw, v)}}
                for cid, v in calls
            ]
        if draw(st.booleans()):
            reply["reasoning_content"] = "thinking " + draw(text)
        messages = [
            {**m, "content": _spell_content(draw, m["content"])} if m["role"] != "assistant" else m
            for m in copy.deepcopy(sent)
        ]
        records.append(
            {
                "schema_version": 1,
                "uuid": f"u{k:03d}-{draw(st.integers(0, 999)):03d}",
                "session_id": SESSION_ID,
                "parent_session_id": None,
                "captured_at": f"2026-07-14T00:{k // 60:02d}:{k % 60:02d}.000000+00:00",
                "request_id": f"req-{k}",
                "model": MODEL,
                "messages": [*messages, reply],
                "tools": TOOLS,
                "tool_choice": "auto",
                "token_count": {},
                "prompt_token_ids": list(prompt),
                "generation_token_ids": generation,
                "generation_log_probs": [-0.5] * len(generation),
                "finish_reason": "tool_calls" if calls else "stop",
                "is_valid": True,
            }
        )
        # The client's echo of the reply: reasoning dropped, arguments re-spelled, null vs "" content.
        echoed_content = reply["content"] if reply["content"] else draw(st.sampled_from(["", None]))
        echo: dict = {"role": "assistant", "content": echoed_content}
        if calls:
            echo["tool_calls"] = [
                {
                    "id": cid,
                    "type": "function",
                    "index": t,
                    "function": {"name": "bash", "arguments": _spell_arguments(draw, v)},
                }
                for t, (cid, v) in enumerate(calls)
            ]
        sent.append(echo)
        for cid, _ in calls:
            sent.append({"role": "tool", "tool_call_id": cid, "content": "out " + draw(text)})
        if not calls or draw(st.booleans()):
            sent.append({"role": "user", "content": "next " + draw(text)})
        prompt = prompt + generation + draw(st.lists(token, max_size=6))
    return records


def _title_call() -> dict:
    return {
        "schema_version": 1,
        "uuid": "title",
        "session_id": SESSION_ID,
        "parent_session_id": None,
        "captured_at": "2026-07-14T00:00:00.500000+00:00",
        "request_id": "req-title",
        "model": MODEL,
        "messages": [
            {"role": "system", "content": "You are a title generator."},
            {"role": "user", "content": "Task"},
            {"role": "assistant", "content": "A title"},
        ],
        "tools": [],
        "tool_choice": "auto",
        "prompt_token_ids": [1],
        "generation_token_ids": [2],
        "generation_log_probs": [-1.0],
        "finish_reason": "stop",
        "is_valid": True,
    }


def _losing_retry(record: dict) -> dict:
    retry = copy.deepcopy(record)
    retry["uuid"] = record["uuid"] + "-retry"
    retry["generation_token_ids"] = [150_001]  # outside the drawn range: nothing can extend it
    retry["generation_log_probs"] = [-2.0]
    retry["messages"][-1] = {"role": "assistant", "content": "abandoned attempt"}
    return retry


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records=sessions(), data=st.data())
def test_any_order_gives_the_same_rollout(records, data):
    expected = reconstruct_session(SESSION_ID, records, allow_partial=False)
    assert expected["record_uuids"] == [r["uuid"] for r in records]
    assert expected["mask_sample"] is False and expected["partial_reason"] is None
    generated = [item for item in expected["output"] if "generation_token_ids" in item]
    assert [item["generation_token_ids"] for item in generated] == [r["generation_token_ids"] for r in records]
    assert [item["prompt_token_ids"] for item in generated] == [r["prompt_token_ids"] for r in records]

    extra = []
    if data.draw(st.booleans(), label="with title call"):
        extra.append(_title_call())
    retried = None
    if data.draw(st.booleans(), label="with a losing retry"):
        retried = data.draw(st.integers(0, len(records) - 1), label="retried call")
        extra.append(_losing_retry(records[retried]))
    shuffled = data.draw(st.permutations(records + extra), label="order")
    got = reconstruct_session(SESSION_ID, shuffled)
    again = reconstruct_session(SESSION_ID, data.draw(st.permutations(records + extra), label="order 2"))
    assert got == again

    if retried is not None and retried < len(records) - 1:
        # A retry the next call did not continue changes nothing but the bookkeeping.
        assert got["discarded_record_uuids"] == [records[retried]["uuid"] + "-retry"]
        assert {k: v for k, v in got.items() if k not in ("side_calls", "discarded_record_uuids")} == {
            k: v for k, v in expected.items() if k not in ("side_calls", "discarded_record_uuids")
        }
    elif retried is None:
        assert got["discarded_record_uuids"] == []
        assert {k: v for k, v in got.items() if k != "side_calls"} == {
            k: v for k, v in expected.items() if k != "side_calls"
        }
    assert got["side_calls"] == (["title"] if extra and extra[0]["uuid"] == "title" else [])
    assert got["mask_sample"] is False


def _break_tokens(record: dict, history_len: int, draw) -> None:
    at = draw(st.integers(0, history_len - 1), label="token to change")
    record["prompt_token_ids"][at] += 1


def _break_history(record: dict, history_messages: int, draw) -> None:
    at = draw(st.integers(0, history_messages - 1), label="message to change")
    message = record["messages"][at]
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(part["text"] for part in content)
    message["content"] = (content or "") + "\u2020"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records=sessions(min_calls=2), data=st.data())
def test_a_cut_at_record_k_keeps_exactly_the_first_k(records, data):
    n = len(records)
    k = data.draw(st.integers(1, n - 1), label="cut")
    prior = records[k - 1]
    broken = copy.deepcopy(records)
    how = data.draw(st.sampled_from(["tokens", "history"]), label="how")
    if how == "tokens":
        _break_tokens(broken[k], len(prior["prompt_token_ids"]) + len(prior["generation_token_ids"]), data.draw)
        expected_reason = (
            f"record {k} of {n}: record {k} prompt_token_ids do not extend the prior prompt+generation tokens"
            " (the engine's template changed earlier tokens)"
        )
    else:
        _break_history(broken[k], len(prior["messages"]), data.draw)
        expected_reason = (
            f"record {k} of {n}: record {k} prompt does not extend the reconstructed history"
            " (the client rewrote an earlier message)"
        )

    rollout = reconstruct_session(SESSION_ID, data.draw(st.permutations(broken), label="order"))
    prefix = reconstruct_session(SESSION_ID, records[:k], allow_partial=False)
    assert rollout["record_uuids"] == [r["uuid"] for r in records[:k]]
    assert rollout["partial_reason"] == expected_reason
    assert rollout["mask_sample"] is True
    assert rollout["input"] == prefix["input"] and rollout["output"] == prefix["output"]

    with pytest.raises(RolloutError, match=f"record {k} "):
        reconstruct_session(SESSION_ID, broken, allow_partial=False)


@settings(max_examples=50, deadline=None)
@given(records=sessions(), data=st.data())
def test_a_bad_first_record_raises(records, data):
    broken = copy.deepcopy(records)
    broken[0]["is_valid"] = False
    with pytest.raises(RolloutError, match="is_valid is not true"):
        reconstruct_session(SESSION_ID, data.draw(st.permutations(broken)))
