"""Expanding a Responses request against the stores: order, tool items, sessions, errors."""

from __future__ import annotations

import asyncio
import os
import re

import pytest

from server.errors import OpenAIError
from server.stateful.context import expand
from server.stateful.items import new_item_id, normalize_input
from server.stateful.service import Stateful
from tests.support.stateful_settings import stateful_settings


@pytest.fixture
def stateful(tmp_path):
    service = Stateful(stateful_settings(tmp_path))
    service.open()
    yield service
    service.close()


def run(coro):
    return asyncio.run(coro)


FIRST_INPUT = [{"type": "message", "role": "user", "id": "msg_u1", "content": [{"type": "input_text", "text": "hi"}]}]
FIRST_OUTPUT = [
    {"id": "rs_1", "type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "hmm"}]},
    {
        "id": "fc_1",
        "type": "function_call",
        "call_id": "call_1",
        "name": "get_weather",
        "arguments": '{"city": "Oslo"}',
        "status": "completed",
        "prompt_token_ids": [1, 2],
    },
]


def store_first(stateful, owner=""):
    stateful.responses.put(
        {"id": "resp_1", "status": "completed", "output": FIRST_OUTPUT, "instructions": "be terse"},
        owner=owner,
        session_id="sess-1",
        input_items=FIRST_INPUT,
    )


def test_previous_input_then_output_then_new_input(stateful):
    store_first(stateful)
    follow_up = [{"type": "function_call_output", "call_id": "call_1", "output": "sunny"}]
    expanded = run(expand({"input": follow_up, "previous_response_id": "resp_1"}, stateful, "", has_session=False))
    kinds = [item["type"] for item in expanded.body["input"]]
    assert kinds == ["message", "reasoning", "function_call", "function_call_output"]
    assert "prompt_token_ids" not in expanded.body["input"][2]  # the token triple is capture's, not history's
    assert "previous_response_id" not in expanded.body and "instructions" not in expanded.body
    assert expanded.session_id == "sess-1" and expanded.store
    assert expanded.new_items[0]["id"].startswith("fco_") and expanded.input_items == expanded.body["input"]


def test_own_session_wins(stateful):
    store_first(stateful)
    expanded = run(expand({"input": "next", "previous_response_id": "resp_1"}, stateful, "", has_session=True))
    assert expanded.session_id is None


def test_unknown_or_foreign_previous_is_404(stateful):
    store_first(stateful, owner="alice")
    for owner in ("bob", "alice"):
        body = {"input": "x", "previous_response_id": "resp_1" if owner == "bob" else "resp_nope"}
        with pytest.raises(OpenAIError) as caught:
            run(expand(body, stateful, owner, has_session=False))
        assert caught.value.status == 404 and caught.value.code == "previous_response_not_found"


def test_previous_and_conversation_together_is_400(stateful):
    with pytest.raises(OpenAIError) as caught:
        run(expand({"input": "x", "previous_response_id": "resp_1", "conversation": "conv_1"}, stateful, "", False))
    assert caught.value.status == 400 and caught.value.param == "conversation"


def test_conversation_items_come_first_and_name_the_session(stateful):
    conv = stateful.conversations.create("", {}, FIRST_INPUT)
    expanded = run(expand({"input": "more", "conversation": {"id": conv["id"]}}, stateful, "", has_session=False))
    assert [i["id"] for i in expanded.body["input"]][0] == "msg_u1" and len(expanded.body["input"]) == 2
    assert expanded.session_id == conv["id"] and expanded.conversation_id == conv["id"]
    with pytest.raises(OpenAIError) as caught:
        run(expand({"input": "x", "conversation": "conv_missing"}, stateful, "", has_session=False))
    assert caught.value.status == 404 and caught.value.code == "conversation_not_found"


def test_store_off(tmp_path):
    for body in ({"previous_response_id": "r"}, {"conversation": "c"}, {"background": True}):
        with pytest.raises(OpenAIError) as caught:
            run(expand({"input": "x", **body}, None, "", has_session=False))
        assert caught.value.code == "response_store_disabled"
    assert not run(expand({"input": "x", "store": True}, None, "", has_session=False)).store


def test_background_needs_store_and_flags_are_booleans(stateful):
    for body, param in (({"background": True, "store": False}, "background"), ({"store": "yes"}, "store")):
        with pytest.raises(OpenAIError) as caught:
            run(expand({"input": "x", **body}, stateful, "", has_session=False))
        assert caught.value.status == 400 and caught.value.param == param


def test_sealed_reasoning_is_opened_and_forgery_refused(stateful):
    sealed = stateful.seal.seal("the real chain of thought")
    item = {
        "type": "reasoning",
        "summary": [],
        "encrypted_content": sealed,
        "content": [{"type": "reasoning_text", "text": "forged"}],
    }
    expanded = run(expand({"input": [item, {"role": "user", "content": "go"}]}, stateful, "", has_session=False))
    assert expanded.body["input"][0]["content"] == [{"type": "reasoning_text", "text": "the real chain of thought"}]
    forged = {**item, "encrypted_content": sealed[:-4] + "AAAA"}
    with pytest.raises(OpenAIError) as caught:
        run(expand({"input": [forged]}, stateful, "", has_session=False))
    assert caught.value.status == 400 and caught.value.param == "input[0].encrypted_content"


def test_malformed_items_reach_the_translator_as_a_400(stateful):
    """Found by the fuzzer: an item whose `type` is an object once crashed the normaliser (a 500)."""
    from server.translate.request import responses_to_chat

    for bad in ({"type": {}, "role": "user", "content": ""}, {"type": [1]}, 5):
        expanded = run(expand({"input": [bad]}, stateful, "", has_session=False))
        with pytest.raises(OpenAIError) as caught:
            responses_to_chat(expanded.body)
        assert caught.value.status == 400


def test_input_items_get_distinct_ids_shaped_like_stored_ones():
    first = normalize_input([{"role": "user", "content": "a"}, {"type": "function_call_output", "output": "x"}])
    second = normalize_input("b")
    ids = [item["id"] for item in first + second]
    assert re.fullmatch(r"msg_[0-9a-f]{24}", ids[0]) and re.fullmatch(r"fco_[0-9a-f]{24}", ids[1])
    assert len(set(ids)) == 3
    assert len({new_item_id("msg") for _ in range(1000)}) == 1000
    # A client's own id is kept.
    assert normalize_input([{"role": "user", "content": "c", "id": "msg_mine"}])[0]["id"] == "msg_mine"


def test_a_forked_worker_does_not_repeat_its_parents_item_ids():
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next id, then out without running the parent's teardown
        os.write(writer, new_item_id("msg").encode())
        os._exit(0)
    os.close(writer)
    child = os.read(reader, 100).decode()
    os.close(reader)
    os.waitpid(pid, 0)
    parent = new_item_id("msg")
    assert re.fullmatch(r"msg_[0-9a-f]{24}", child)
    assert child[:16] != parent[:16]  # another random half, so the counters cannot meet
