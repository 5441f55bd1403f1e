"""The token triple and the reasoning lookup: one implementation, read the same way by every caller."""

from __future__ import annotations

import copy
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from server.capture.rollout.items import message_items
from server.capture.tokens import (
    TokenTriple,
    generation_token_texts,
    generation_tokens,
    is_finite_numbers,
    is_token_ids,
    reasoning_of,
    strip_token_fields,
    token_id_of,
    token_triple,
    triple_problem,
)
from server.capture.write.record import build_record
from server.translate.accumulate import ChatStreamAccumulator, chunks_from_completion
from server.translate.response import chat_to_response
from tests.support.translate import COMPLETED_AT, PROMPT_IDS, chat_completion, lp

# ---- reasoning ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ({"reasoning_content": "old name"}, "old name"),
        ({"reasoning": "new name"}, "new name"),
        ({"reasoning_content": "both", "reasoning": "other"}, "both"),
        ({"reasoning_content": "", "reasoning": "the one with text"}, "the one with text"),
        ({"reasoning_content": None, "reasoning": None}, None),
        ({"reasoning": ""}, None),
        ({"reasoning": {"effort": "high"}}, None),  # a request's reasoning *setting*, not text
        ({"content": "no reasoning"}, None),
        ("not a message", None),
    ],
)
def test_reasoning_of_reads_either_name(message, expected):
    assert reasoning_of(message) == expected


def test_every_reader_of_reasoning_takes_the_newer_vllm_name():
    # One message with only vLLM's newer `reasoning` key, read by record, rollout, the stream
    # accumulator and the Responses translation: each must find the text.
    chat = chat_completion({"content": "Hi", "reasoning": "think first"})
    record = build_record(
        session_id="s",
        parent_session_id=None,
        rollout_id=None,
        request_id="r",
        chat_request={"messages": [{"role": "user", "content": "hello"}]},
        chat_response=chat,
        route="route",
        api="chat",
        stream=False,
        latency_ms=1.0,
    )
    assert record["messages"][-1]["reasoning_content"] == "think first"

    accumulator = ChatStreamAccumulator()
    stream_chat = chat_completion({"content": "Hi"})
    for chunk in chunks_from_completion(stream_chat):
        for choice in chunk["choices"]:
            if choice.get("delta", {}).get("content"):
                choice["delta"]["reasoning"] = "think first"
        accumulator.feed(chunk)
    assert accumulator.result()["choices"][0]["message"]["reasoning_content"] == "think first"

    response = chat_to_response(
        chat,
        {"model": "m", "input": "x"},
        None,
        response_id="resp_1",
        created_at=1,
        token_ids=False,
        completed_at=COMPLETED_AT,
    )
    assert response["output"][0]["content"] == [{"type": "reasoning_text", "text": "think first"}]

    items = message_items({"role": "assistant", "content": "Hi"}, {"reasoning": "think first"}, "x", None)
    assert items[0]["summary"] == [{"type": "summary_text", "text": "think first"}]


def test_a_generated_turn_carries_its_triple_on_its_last_item_only_as_the_records_own_lists():
    triple = TokenTriple([1, 2], [3], [-0.5])
    call = {"id": "call_1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
    message = {"role": "assistant", "content": "Listing.", "tool_calls": [call]}
    items = message_items(message, {}, "x", triple)
    assert [item["type"] for item in items] == ["message", "function_call"]
    assert items[-1]["prompt_token_ids"] is triple.prompt_ids  # shared, not copied
    assert items[-1]["generation_token_ids"] is triple.generation_ids
    assert items[-1]["generation_log_probs"] is triple.log_probs
    assert "prompt_token_ids" not in items[0]
    # Negative control: a turn without a triple (context, not generated) carries none.
    assert not any("prompt_token_ids" in item for item in message_items(message, {}, "x", None))


# ---- shapes and validation ----------------------------------------------------------------------


def test_bools_are_not_token_ids_though_python_calls_them_ints():
    assert isinstance(True, int)  # the trap the check exists for
    assert not is_token_ids([1, True, 3])
    assert is_token_ids([1, 2, 3])
    assert not is_token_ids([])
    assert is_token_ids([], allow_empty=True)
    assert not is_token_ids([1.0])
    assert not is_token_ids("123")


def test_finite_numbers():
    assert is_finite_numbers([-0.5, 0, -3])
    assert is_finite_numbers([])
    for bad in ([math.nan], [-math.inf], [None], [False], ["-0.5"], "x"):
        assert not is_finite_numbers(bad)


@pytest.mark.parametrize(
    ("triple", "problem"),
    [
        (([1], [2, 3], [-0.1, -0.2]), None),
        (([], [2], [-0.1]), "prompt_token_ids is not a non-empty list of ints"),
        (([1], [], []), "generation_token_ids is not a non-empty list of ints"),
        (([1], None, [-0.1]), "generation_token_ids is not a non-empty list of ints"),
        (([1], [2], [None]), "generation_log_probs is not a list of finite numbers"),
        (([1], [2], [math.nan]), "generation_log_probs is not a list of finite numbers"),
        (([1], [2], [math.inf]), "generation_log_probs is not a list of finite numbers"),
        (
            ([1], [2, 3], [-0.1]),
            "generation_token_ids (2) and generation_log_probs (1) have different lengths",
        ),
    ],
)
def test_triple_problem_names_what_is_wrong(triple, problem):
    assert triple_problem(*triple) == problem


def test_token_id_of_both_spellings():
    assert token_id_of({"token": "token_id:42"}) == 42
    assert token_id_of({"token_id": 7, "token": "x"}) == 7
    assert token_id_of({"token_id": True, "token": "x"}) is None
    assert token_id_of({"token": "token_id:nope"}) is None
    assert token_id_of({"token": "Hello"}) is None
    assert token_id_of(None) is None


def test_generation_tokens_as_returned():
    entries = [lp(5, -0.5), lp(6, -0.25)]
    # Inline ids win; without them, the `token_id:<n>` tokens are parsed.
    assert generation_tokens({"token_ids": [9, 9], "logprobs": {"content": entries}}) == ([9, 9], [-0.5, -0.25])
    assert generation_tokens({"logprobs": {"content": entries}}) == ([5, 6], [-0.5, -0.25])
    # One entry without an id: no ids at all rather than a shifted list.
    assert generation_tokens({"logprobs": {"content": [*entries, {"token": "x", "logprob": -1}]}})[0] is None
    assert generation_tokens({"logprobs": None}) == (None, None)


# Entries as an upstream may send them: mostly well formed, sometimes not a dict, without a text or a
# logprob, with a text that is not a string, or spelled as an id (`token_id:<n>`) or holding the prefix.
_TEXTS = st.one_of(
    st.text(max_size=6),
    st.sampled_from(["token_id:", "token_id:7", "xtoken_id:", "token_", "id:"]),
    st.none(),
    st.integers(),
)
_ENTRY = st.one_of(
    st.fixed_dictionaries({"token": _TEXTS, "logprob": st.floats(allow_nan=False)}),
    st.fixed_dictionaries({"logprob": st.floats(allow_nan=False)}),
    st.fixed_dictionaries({"token": _TEXTS}),
    st.none(),
    st.text(max_size=3),
    st.lists(st.integers(), max_size=2),
)


def _texts_entry_by_entry(content):
    """The plain reading the fast one must agree with: every entry a dict with a string text, none an id."""
    if not content:
        return None
    texts = []
    for entry in content:
        text = entry.get("token") if isinstance(entry, dict) else None
        if not isinstance(text, str) or text.startswith("token_id:"):
            return None
        texts.append(text)
    return texts


@given(st.lists(_ENTRY, max_size=12))
def test_token_texts_and_logprobs_read_as_entry_by_entry(content):
    choice = {"token_ids": [1] * len(content), "logprobs": {"content": content}}
    assert generation_token_texts(choice) == _texts_entry_by_entry(content)
    expected = [e.get("logprob") if isinstance(e, dict) else None for e in content]
    assert generation_tokens(choice)[1] == expected


def test_token_texts_that_only_hold_the_id_prefix_inside_or_across_texts_are_kept():
    # The prefix found in the joined texts is only a hint: each text is then checked for it.
    content = [{"token": "tok", "logprob": -1.0}, {"token": "en_id:", "logprob": -1.0}, {"token": "a token_id:"}]
    assert generation_token_texts({"logprobs": {"content": content}}) == ["tok", "en_id:", "a token_id:"]
    content.append({"token": "token_id:9", "logprob": -1.0})
    assert generation_token_texts({"logprobs": {"content": content}}) is None


# ---- the triple from a chat answer ----------------------------------------------------------------


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


def test_token_triple_refuses_non_finite_log_probs_and_bad_bundles():
    entries = [lp(7, -1.0), lp(8, -1.0)]
    entries[1]["logprob"] = math.inf
    assert token_triple(chat_completion({"content": "x"}, token_ids=[7, 8], logprobs=entries)) is None
    uneven = chat_completion(
        {"content": "x", "prompt_token_ids": [1], "generation_token_ids": [2, 3], "generation_log_probs": [-0.5]},
        prompt_ids=False,
    )
    assert token_triple(uneven) is None


ids_lists = st.lists(st.integers(0, 200_000), max_size=6)
log_prob_lists = st.lists(st.one_of(st.floats(-50, 0), st.just(math.nan), st.none()), max_size=6)


@given(prompt=ids_lists, generation=ids_lists, log_probs=log_prob_lists)
def test_a_triple_handed_to_a_client_is_one_a_record_would_accept(prompt, generation, log_probs):
    chat = chat_completion(
        {"content": "x"},
        token_ids=generation,
        logprobs=[{"token": "t", "logprob": value} for value in log_probs],
        prompt_ids=False,
    )
    chat["prompt_token_ids"] = prompt
    triple = token_triple(chat)
    record_problem = triple_problem(
        prompt, generation, [e["logprob"] for e in chat["choices"][0]["logprobs"]["content"]]
    )
    if prompt and generation:
        # Extraction and validation are one rule: both accept, or both refuse.
        assert (triple is not None) == (record_problem is None)
    if triple is not None:
        assert triple == (prompt, generation, log_probs)


def test_strip_token_fields_removes_only_what_was_added():
    chat = chat_completion({"content": "x"}, token_ids=[1], logprobs=[lp(1, -0.5)])
    stripped = strip_token_fields(chat, frozenset({"return_token_ids"}))
    assert "prompt_token_ids" not in stripped and "token_ids" not in stripped["choices"][0]
    assert stripped["choices"][0]["logprobs"] is not None
    assert strip_token_fields(stripped, frozenset({"logprobs"}))["choices"][0]["logprobs"] is None


def test_strip_token_fields_leaves_the_original_whole_for_capture():
    chat = chat_completion({"content": "x"}, token_ids=[1], logprobs=[lp(1, -0.5)])
    chat["prompt_token_ids"] = [5, 6]
    before = copy.deepcopy(chat)
    strip_token_fields(chat, frozenset({"return_token_ids", "logprobs"}))
    assert chat == before  # the record built from it on the writer thread keeps its token triple


# ---- in place, for stream chunks ----------------------------------------------------------------

_TEXT = st.text(max_size=6)
_ENTRY = st.fixed_dictionaries(
    {"token": _TEXT, "logprob": st.floats(-20, 0), "bytes": st.lists(st.integers(0, 255), max_size=3)},
    optional={"top_logprobs": st.lists(st.fixed_dictionaries({"token": _TEXT, "logprob": st.floats(-20, 0)}))},
)
_DELTA = st.fixed_dictionaries(
    {},
    optional={
        "role": st.just("assistant"),
        "content": st.one_of(st.none(), _TEXT),
        "reasoning": _TEXT,
        "tool_calls": st.lists(
            st.fixed_dictionaries(
                {"index": st.integers(0, 1)},
                optional={"id": _TEXT, "function": st.fixed_dictionaries({}, optional={"arguments": _TEXT})},
            ),
            max_size=2,
        ),
    },
)
_CHOICE = st.fixed_dictionaries(
    {"index": st.integers(0, 1), "delta": _DELTA},
    optional={
        "logprobs": st.one_of(st.none(), st.fixed_dictionaries({"content": st.lists(_ENTRY, max_size=2)})),
        "finish_reason": st.one_of(st.none(), st.sampled_from(["stop", "length", "tool_calls"])),
        "token_ids": st.lists(st.integers(0, 200_000), max_size=3),
    },
)
_CHUNK = st.fixed_dictionaries(
    {"id": st.just("chatcmpl-1"), "object": st.just("chat.completion.chunk"), "choices": st.lists(_CHOICE, max_size=2)},
    optional={
        "prompt_token_ids": st.lists(st.integers(0, 200_000), max_size=4),
        "usage": st.fixed_dictionaries({"prompt_tokens": st.integers(0, 9), "completion_tokens": st.integers(0, 9)}),
    },
)
_ADDED = st.sets(st.sampled_from(["return_token_ids", "logprobs", "top_logprobs"])).map(frozenset)


def _fed_then_stripped(chunks: list[dict], added: frozenset[str], *, strip_first: bool = False):
    """What a stream relay does with each parsed chunk: feed it, then strip it in place to send it."""
    accumulator = ChatStreamAccumulator()
    sent = []
    for chunk in copy.deepcopy(chunks):
        if strip_first:
            sent.append(strip_token_fields(chunk, added, in_place=True))
        accumulator.feed(chunk)
        if not strip_first:
            sent.append(strip_token_fields(chunk, added, in_place=True))
    return accumulator.result(), sent


@given(st.lists(_CHUNK, max_size=5), _ADDED)
def test_in_place_stripping_after_feeding_sends_and_keeps_what_the_copying_strip_does(chunks, added):
    expected_result = ChatStreamAccumulator()
    for chunk in copy.deepcopy(chunks):
        expected_result.feed(chunk)
    result, sent = _fed_then_stripped(chunks, added)
    assert sent == [strip_token_fields(chunk, added) for chunk in chunks]  # the client's bytes
    assert result == expected_result.result()  # the record's: the accumulator kept nothing it edits


def test_negative_control_stripping_before_feeding_loses_the_tokens():
    # The order matters: the property above would fail if the relay stripped before the accumulator saw.
    chunk = {
        "id": "c",
        "choices": [{"index": 0, "delta": {"content": "a"}, "logprobs": {"content": [lp(7, -0.5)]}, "token_ids": [7]}],
        "prompt_token_ids": [1, 2],
    }
    added = frozenset({"return_token_ids", "logprobs"})
    right, _ = _fed_then_stripped([chunk], added)
    wrong, _ = _fed_then_stripped([chunk], added, strip_first=True)
    assert right["prompt_token_ids"] == [1, 2] and right["choices"][0]["token_ids"] == [7]
    assert "prompt_token_ids" not in wrong and "token_ids" not in wrong["choices"][0]
