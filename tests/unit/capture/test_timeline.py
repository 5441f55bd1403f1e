"""Session summaries and timelines: what each call added, contiguity per call, spawn links, rolled-up tokens."""

from __future__ import annotations

import pytest

from server.capture.catalog.runs import started_at
from server.capture.catalog.summary import SummaryCache, session_facts
from server.capture.read.timeline import build_timeline, build_tree, link_children, spawning_call
from server.capture.store import CaptureStore
from server.capture.write.record import build_record

SYSTEM = {"role": "system", "content": "be brief"}


def record(session_id, messages, reply, prompt, generation, *, at, parent=None, latency_ms=1000.0, texts=None):
    message = {"role": "assistant", **reply}
    response = {
        "id": f"chatcmpl-{at}",
        "model": "m",
        "prompt_token_ids": prompt,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if reply.get("tool_calls") else "stop",
                "token_ids": generation,
                "logprobs": {
                    "content": [
                        {"token": (texts[i] if texts else f"t{t}"), "logprob": -0.5} for i, t in enumerate(generation)
                    ]
                },
            }
        ],
        "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(generation), "total_tokens": 0},
    }
    return build_record(
        session_id=session_id,
        parent_session_id=parent,
        rollout_id=None,
        request_id=None,
        chat_request={"messages": messages},
        chat_response=response,
        route="r",
        api="chat",
        stream=False,
        latency_ms=latency_ms,
        captured_at=f"2025-01-01T00:00:{at:02d}.000000+00:00",
    )


TOOL_CALL = {"id": "call-1", "type": "function", "function": {"name": "task", "arguments": '{"prompt": "go"}'}}


def two_turns(*, resend_reasoning: bool = True):
    """A tool-calling session of two calls; the second resends the first reply (reasoning optional)."""
    user = {"role": "user", "content": "hi"}
    first = record(
        "s",
        [SYSTEM, user],
        {"content": None, "reasoning_content": "hmm", "tool_calls": [TOOL_CALL]},
        [1, 2, 3],
        [5, 9, 6, 4, 2],
        at=2,
        texts=["<think>", "hmm", "</think>", "call", "<|im_end|>"],
    )
    resent = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {**TOOL_CALL, "function": {"name": "task", "arguments": '{ "prompt":"go" }'}}  # respaced
        ],
    }
    if resend_reasoning:
        resent["reasoning_content"] = "hmm"
    prompt = [1, 2, 3, 5, 9, 6, 4, 2, 7, 8] if resend_reasoning else [1, 2, 3, 4, 2, 7, 8]
    second = record(
        "s",
        [SYSTEM, user, resent, {"role": "tool", "tool_call_id": "call-1", "content": "done"}],
        {"content": "ok"},
        prompt,
        [11, 2],
        at=6,
    )
    return [first, second]


def test_each_call_shows_only_the_messages_it_added():
    calls = build_timeline("s", two_turns())["calls"]
    assert [m["role"] for m in calls[0]["added_messages"]] == ["system", "user"]
    # The resent assistant turn matches despite respaced arguments and a dropped `content: null` difference.
    assert calls[1]["kept_messages"] == 3
    assert [m["role"] for m in calls[1]["added_messages"]] == ["tool"]
    assert calls[1]["reply"]["content"] == "ok"


def test_a_resent_turn_that_really_differs_counts_as_added():
    records = two_turns()
    records[1]["messages"][2] = {"role": "assistant", "content": "something else"}
    calls = build_timeline("s", records)["calls"]
    assert calls[1]["kept_messages"] == 2
    assert [m["role"] for m in calls[1]["added_messages"]] == ["assistant", "tool"]


def test_contiguity_per_call_with_token_text_where_the_previous_call_generated_it():
    calls = build_timeline("s", two_turns())["calls"]
    assert [c["contiguity"]["kind"] for c in calls] == ["first", "extends"]
    assert [c["in_rollout"] for c in calls] == ["step", "step"]

    broken = build_timeline("s", two_turns(resend_reasoning=False), window=2)
    contiguity = broken["calls"][1]["contiguity"]
    assert contiguity["kind"] == "breaks"
    assert contiguity["position"] == 3  # where the <think> the model generated was left out
    assert contiguity["expected"] == [5, 9] and contiguity["expected_text"] == ["<think>", "hmm"]
    assert contiguity["actual"] == [4, 2]
    assert contiguity["before"] == [2, 3] and contiguity["before_text"] == [None, None]  # prompt tokens: no text
    assert broken["rollout"]["status"] == "partial"
    assert broken["calls"][1]["in_rollout"] == "unused"


def test_timeline_carries_no_token_lists():
    calls = build_timeline("s", two_turns())["calls"]
    assert not any(key.endswith("token_ids") or key.endswith("log_probs") for call in calls for key in call)


def test_ttft_and_injection_are_shown_when_recorded():
    records = two_turns()
    records[1]["ttft_ms"] = 12.5
    records[1]["injection"] = {"transport": "vllm", "injected_len": 8, "echo_ok": True, "fallback_reason": None}
    calls = build_timeline("s", records)["calls"]
    assert calls[0]["ttft_ms"] is None and calls[0]["injection"] is None
    assert calls[1]["ttft_ms"] == 12.5 and calls[1]["injection"]["injected_len"] == 8


def test_started_at_is_the_end_minus_the_latency():
    assert started_at({"captured_at": "2025-01-01T00:00:02.000000+00:00", "latency_ms": 1500}) == (
        "2025-01-01T00:00:00.500000+00:00"
    )


def test_the_spawning_call_is_the_last_tool_call_that_ended_before_the_child_began():
    calls = [
        ("2025-01-01T00:00:02", None, "a", True),
        ("2025-01-01T00:00:04", None, "b", False),
        ("2025-01-01T00:00:09", None, "c", True),
    ]
    assert spawning_call(calls, "2025-01-01T00:00:05") == "a"  # b ended later but asked for no tool
    assert spawning_call(calls, "2025-01-01T00:00:10") == "c"
    assert spawning_call(calls, "2025-01-01T00:00:01") is None
    assert spawning_call([("2025-01-01T00:00:02", None, "x", False)], "2025-01-01T00:00:03") == "x"


def test_summary_counts_and_status():
    summary = session_facts("s", two_turns()).summary
    assert summary["calls"] == 2
    assert summary["tokens_in"] == 3 + 10 and summary["tokens_out"] == 5 + 2
    assert summary["finish_reasons"] == {"tool_calls": 1, "stop": 1}
    assert summary["started_at"] == "2025-01-01T00:00:01.000000+00:00"
    assert summary["duration_ms"] == 5000.0
    assert (summary["rollout"], summary["mask_sample"]) == ("whole", False)
    broken = session_facts("s", two_turns(resend_reasoning=False)).summary
    assert (broken["rollout"], broken["mask_sample"]) == ("partial", True)


@pytest.fixture
def tree_store(tmp_path):
    store = CaptureStore(tmp_path)
    store.start()
    for r in two_turns():
        store.submit(r)
    child_user = [{"role": "user", "content": "go"}]
    store.submit(record("s-sub", child_user, {"content": "found"}, [40, 41], [42, 2], at=4, parent="s", latency_ms=500))
    grandchild = record("s-sub-sub", child_user, {"content": "x"}, [50], [51], at=3, parent="s-sub", latency_ms=100)
    store.submit(grandchild)
    store.flush()
    yield store
    store.close()


def test_tree_links_children_to_calls_and_rolls_tokens_up(tree_store):
    cache = SummaryCache()
    tree = build_tree(tree_store, tree_store.index_view(), cache, "s")
    first_uuid = tree_store.read_completions("s")[0][0]["uuid"]
    (child,) = tree["children"]
    assert child["session_id"] == "s-sub" and child["spawned_by"] == first_uuid
    (grandchild,) = child["children"]
    assert grandchild["spawned_by"] is None  # its parent had no call ended before it began
    assert child["total_tokens_in"] == 2 + 1 and child["total_calls"] == 2
    assert tree["total_tokens_in"] == 13 + 2 + 1
    assert tree["total_tokens_out"] == 7 + 2 + 1
    timeline = build_timeline("s", tree_store.read_completions("s")[0])
    link_children(timeline, tree)
    assert [c["spawned"] for c in timeline["calls"]] == [["s-sub"], []]


def test_summary_cache_rebuilds_when_a_session_gains_records(tree_store):
    cache = SummaryCache()
    assert cache.summary(tree_store, tree_store.index_view(), "s-sub")["calls"] == 1
    tree_store.submit(
        record("s-sub", [{"role": "user", "content": "more"}], {"content": "y"}, [60], [61], at=8, parent="s")
    )
    tree_store.flush()
    assert cache.summary(tree_store, tree_store.index_view(), "s-sub")["calls"] == 2


def test_a_partial_subagent_masks_its_ancestors_in_the_summary(tree_store):
    # The grandchild's second call breaks its chain: it, and everything above it, is masked.
    tree_store.submit(record("s-sub-sub", BROKEN_ON, {"content": "z"}, [99], [2], at=5, parent="s-sub"))
    tree_store.flush()
    cache = SummaryCache()
    assert cache.summary(tree_store, tree_store.index_view(), "s-sub-sub")["rollout"] == "partial"
    top = cache.summary(tree_store, tree_store.index_view(), "s")
    assert top["rollout"] == "whole"  # its own chain holds ...
    assert top["mask_sample"] is True  # ... but the rollout as a whole may not be trained on
    assert "s-sub-sub" in top["degraded_reason"]


# A second call that goes on with the conversation (an assistant turn) with tokens that do not extend it:
# a break in the chain (the same first call asked again would be a new dispatch instead).
BROKEN_ON = [
    {"role": "user", "content": "go"},
    {"role": "assistant", "content": "x"},
    {"role": "user", "content": "more"},
]


def _wait_for_background(cache):
    cache._background.submit(lambda: None).result(timeout=30)  # one worker: runs after what was queued


def test_a_large_session_is_listed_from_record_heads_and_filled_in_later(tree_store):
    from server.capture.catalog.summary import ListQuery, list_page

    full = SummaryCache().summary(tree_store, tree_store.index_view(), "s")
    cache = SummaryCache(full_read_bytes=0)  # every session counts as large
    rows, _ = list_page(tree_store, cache, ListQuery(q="s", kind="root", summary=True), limit=10, after=None)
    quick = rows[0]["summary"]
    assert quick["rollout"] == "pending" and quick["mask_sample"] is None
    # Every column but the status comes out the same from the records' first block alone.
    columns = ("calls", "tokens_in", "tokens_out", "started_at", "ended_at", "duration_ms", "finish_reasons")
    assert {k: quick[k] for k in columns} == {k: full[k] for k in columns}
    assert (quick["models"], quick["routes"], quick["invalid_calls"]) == (full["models"], full["routes"], 0)
    _wait_for_background(cache)
    rows, _ = list_page(tree_store, cache, ListQuery(q="s", kind="root", summary=True), limit=10, after=None)
    assert rows[0]["summary"] == full


def test_the_status_filter_never_sees_pending(tree_store):
    from server.capture.catalog.summary import ListQuery, list_page

    tree_store.submit(record("s-sub-sub", BROKEN_ON, {"content": "z"}, [99], [2], at=5, parent="s-sub"))
    tree_store.flush()
    cache = SummaryCache(full_read_bytes=0)
    query = ListQuery(status="partial", summary=True)
    rows, _ = list_page(tree_store, cache, query, limit=10, after=None)
    assert [(r["session_id"], r["summary"]["rollout"]) for r in rows] == [("s-sub-sub", "partial")]
    masked, _ = list_page(tree_store, SummaryCache(full_read_bytes=0), ListQuery(status="masked"), limit=10, after=None)
    assert [r["session_id"] for r in masked] == ["s", "s-sub", "s-sub-sub"]


def test_record_heads_refuse_files_they_cannot_vouch_for(tree_store, tmp_path):
    from server.capture.store import session_dir_name

    assert len(tree_store.read_record_heads("s")) == 2
    # A record written by something else (keys in another order) is not read by its first block.
    directory = tmp_path / "sessions" / session_dir_name("s")
    (directory / "foreign.json").write_text('{"uuid": "foreign", "schema_version": 1}')
    assert tree_store.read_record_heads("s") is None


def test_the_strip_never_calls_green_what_the_rollout_calls_broken():
    """The history sent twice carries the tokens on, but not the conversation: one verdict for both."""
    from tests.support.scripted_sessions import scripted

    records = scripted("s", ["extend", "history_twice"])
    timeline = build_timeline("s", records)
    cell = timeline["calls"][2]["contiguity"]
    assert cell["kind"] == "breaks" and cell["break_kind"] == "history_sent_twice"
    assert cell["previous_index"] == 1 and cell["summary"] in timeline["rollout"]["partial_reason"]
    assert timeline["rollout"]["status"] == "partial"
    assert [chain["call_indices"] for chain in timeline["chains"]] == [[0, 1], [2]]
    assert timeline["trainable_fraction"] == 1.0


def test_the_strip_compares_a_call_with_the_call_it_continues_not_the_side_call_before_it():
    from tests.support.scripted_sessions import scripted

    records = scripted("s", ["title", "extend"])
    kinds = [call["contiguity"]["kind"] for call in build_timeline("s", records)["calls"]]
    assert kinds == ["first", "side", "extends", "extends"]
