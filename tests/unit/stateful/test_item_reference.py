"""`item_reference` input items: resolved to the key's own stored items, 404 naming the id otherwise."""

from __future__ import annotations

import asyncio

import pytest

from server.errors import OpenAIError
from server.stateful.context import expand
from server.stateful.service import Stateful
from tests.support.stateful_settings import stateful_settings

USER = {"type": "message", "role": "user", "id": "msg_u1", "content": [{"type": "input_text", "text": "hi"}]}
ANSWER = {
    "id": "msg_a1",
    "type": "message",
    "role": "assistant",
    "status": "completed",
    "content": [{"type": "output_text", "text": "hello", "annotations": []}],
}
CALL = {
    "id": "fc_1",
    "type": "function_call",
    "call_id": "call_1",
    "name": "weather",
    "arguments": "{}",
    "status": "completed",
    "prompt_token_ids": [1, 2],  # capture's, never history's
}


@pytest.fixture
def stateful(tmp_path):
    service = Stateful(stateful_settings(tmp_path))
    service.open()
    yield service
    service.close()


def run(coro):
    return asyncio.run(coro)


def store(stateful, response_id="resp_1", owner="alice", output=(ANSWER, CALL), input_items=(USER,)):
    assert stateful.responses.put(
        {"id": response_id, "status": "completed", "output": list(output)},
        owner=owner,
        session_id="s",
        input_items=list(input_items),
    )


def refs(*ids):
    return [{"type": "item_reference", "id": item_id} for item_id in ids]


def test_references_to_output_and_input_items_become_the_stored_items(stateful):
    store(stateful)
    body = {"input": [*refs("msg_u1", "msg_a1", "fc_1"), {"role": "user", "content": "and now?"}], "store": False}
    expanded = run(expand(body, stateful, "alice", has_session=True))
    sent = expanded.body["input"]
    assert sent[:2] == [USER, ANSWER]
    assert sent[2] == {k: v for k, v in CALL.items() if k != "prompt_token_ids"}
    assert sent[3]["type"] == "message" and sent[3]["role"] == "user"
    # What is stored as this response's input (and listed by input_items) is the resolved items.
    assert expanded.input_items == sent and expanded.new_items == sent


def test_the_type_may_be_left_out(stateful):
    store(stateful)
    expanded = run(expand({"input": [{"id": "msg_a1"}]}, stateful, "alice", has_session=True))
    assert expanded.body["input"] == [ANSWER]


@pytest.mark.parametrize("owner, item_id", [("bob", "msg_a1"), ("alice", "msg_nope")])
def test_unknown_or_another_keys_item_is_404_naming_the_id(stateful, owner, item_id):
    store(stateful, owner="alice")
    body = {"input": [{"role": "user", "content": "x"}, *refs(item_id)]}
    with pytest.raises(OpenAIError) as caught:
        run(expand(body, stateful, owner, has_session=True))
    error = caught.value
    assert (error.status, error.code, error.param) == (404, "item_not_found", "input[1]")
    assert repr(item_id) in error.message and "upstream" not in error.message


def test_an_item_stays_findable_in_a_later_turn_after_the_first_is_deleted(stateful):
    store(stateful, "resp_1")
    store(stateful, "resp_2", output=(), input_items=(USER, ANSWER))  # a later turn that carried it on
    assert stateful.responses.delete("resp_1", "alice")
    assert run(expand({"input": refs("msg_a1")}, stateful, "alice", has_session=True)).body["input"] == [ANSWER]
    assert stateful.responses.delete("resp_2", "alice")
    with pytest.raises(OpenAIError) as caught:
        run(expand({"input": refs("msg_a1")}, stateful, "alice", has_session=True))
    assert caught.value.status == 404


def test_conversation_items_are_found_too_and_scoped_to_their_key(stateful):
    conversation = stateful.conversations.create("alice", {}, [ANSWER | {"id": "msg_c1"}])
    assert conversation["id"].startswith("conv_")
    expanded = run(expand({"input": refs("msg_c1")}, stateful, "alice", has_session=True))
    assert expanded.body["input"][0]["id"] == "msg_c1"
    with pytest.raises(OpenAIError) as caught:
        run(expand({"input": refs("msg_c1")}, stateful, "bob", has_session=True))
    assert caught.value.status == 404


def test_without_the_store_a_reference_is_400_saying_so(tmp_path):
    with pytest.raises(OpenAIError) as caught:
        run(expand({"input": refs("msg_a1")}, None, "", has_session=True))
    assert caught.value.status == 400 and caught.value.code == "response_store_disabled"
    assert "upstream" not in caught.value.message


def test_a_reference_without_an_id_is_400(stateful):
    with pytest.raises(OpenAIError) as caught:
        run(expand({"input": [{"type": "item_reference"}]}, stateful, "alice", has_session=True))
    assert (caught.value.status, caught.value.param) == (400, "input[0].id")


def test_a_state_file_from_before_the_item_index_gets_it(tmp_path):
    """An old state file (no `response_items`): the schema adds it, and indexes the responses already stored."""
    service = Stateful(stateful_settings(tmp_path))
    service.open()
    store(service, "resp_old", output=(ANSWER,), input_items=(USER,))
    service.db.connection().executescript(
        "DROP TRIGGER response_items_removed; DROP TABLE response_items;"
        " DELETE FROM facts WHERE name = 'response_items_indexed';"
    )
    service.close()
    service = Stateful(stateful_settings(tmp_path))
    service.open()
    try:
        body = run(expand({"input": refs("msg_a1", "msg_u1")}, service, "alice", has_session=True)).body
        assert body["input"] == [ANSWER, USER]
        store(service, "resp_new")  # and new responses are indexed as they are stored
        assert service.responses.delete("resp_old", "alice")
        assert run(expand({"input": refs("fc_1")}, service, "alice", has_session=True)).body["input"][0]["id"] == "fc_1"
    finally:
        service.close()


def test_references_may_not_make_the_server_read_too_many_stored_responses(stateful, monkeypatch):
    from server.stateful import context

    for n in range(3):
        store(stateful, f"resp_{n}", output=({**ANSWER, "id": f"msg_{n}"},), input_items=())
    monkeypatch.setattr(context, "MAX_RESPONSES_READ", 2)
    with pytest.raises(OpenAIError) as caught:
        run(expand({"input": refs("msg_0", "msg_1", "msg_2")}, stateful, "alice", has_session=True))
    assert (caught.value.status, caught.value.param) == (400, "input") and "more than 2" in caught.value.message
    # Two responses' items are fine.
    assert len(run(expand({"input": refs("msg_0", "msg_1")}, stateful, "alice", has_session=True)).body["input"]) == 2


def test_what_references_become_counts_against_the_body_limit(tmp_path):
    service = Stateful(stateful_settings(tmp_path, max_body_bytes=4096))
    service.open()
    try:
        big = {**ANSWER, "content": [{"type": "output_text", "text": "x" * 1000, "annotations": []}]}
        store(service, output=(big,), input_items=())
        assert len(run(expand({"input": refs("msg_a1")}, service, "alice", has_session=True)).body["input"]) == 1
        with pytest.raises(OpenAIError) as caught:  # five copies of a 1 KB item: over 4 KiB
            run(expand({"input": refs(*["msg_a1"] * 5)}, service, "alice", has_session=True))
        assert (caught.value.status, caught.value.code) == (413, "request_too_large")
    finally:
        service.close()


def _index_rows(service):
    return set(service.db.connection().execute("SELECT owner, id, response_id FROM response_items"))


def test_the_item_index_holds_only_stored_responses_items(tmp_path):
    """Evicted and deleted responses take their index rows with them (the index stays bounded by the
    store), except rows a later carrier took over; each key's rows alone."""
    service = Stateful(stateful_settings(tmp_path, response_store_max_count=2))
    service.open()
    try:
        store(service, "resp_a", output=(ANSWER,), input_items=(USER,))
        store(service, "resp_c", owner="bob", output=(ANSWER,), input_items=(USER,))  # another key's, same ids
        store(service, "resp_b", output=(CALL,), input_items=(USER, ANSWER))  # carries msg_u1 and msg_a1 on
        assert _index_rows(service) == {
            ("alice", "fc_1", "resp_b"),
            ("alice", "msg_u1", "resp_b"),
            ("alice", "msg_a1", "resp_b"),
            ("bob", "msg_u1", "resp_c"),
            ("bob", "msg_a1", "resp_c"),
        }
        assert service.responses.delete("resp_b", "alice")
        assert _index_rows(service) == {("bob", "msg_u1", "resp_c"), ("bob", "msg_a1", "resp_c")}
        for n in range(3):  # bob's store share fills: his oldest are evicted, and their rows with them
            store(service, f"resp_{n}", owner="bob", output=({**ANSWER, "id": f"msg_{n}"},), input_items=())
        assert _index_rows(service) == {("bob", "msg_1", "resp_1"), ("bob", "msg_2", "resp_2")}
    finally:
        service.close()


def test_without_the_trigger_a_deleted_responses_rows_stay(stateful):
    """Negative control for the test above: it is the trigger that drops the rows."""
    stateful.db.connection().execute("DROP TRIGGER response_items_removed")
    store(stateful, "resp_a", output=(ANSWER,), input_items=(USER,))
    assert stateful.responses.delete("resp_a", "alice")
    assert _index_rows(stateful) == {("alice", "msg_u1", "resp_a"), ("alice", "msg_a1", "resp_a")}


def test_output_items_named_after_their_response_are_found_without_index_rows(stateful):
    """The translator names output items after their response (`msg_<hex>_0`): found by that name, not by
    an index row; carried on into a later turn they are indexed there, and outlive their first response."""
    from server.translate.response import id_base, item_id

    named = {**ANSWER, "id": item_id("msg", id_base("resp_0af1"), 0)}
    store(stateful, "resp_0af1", output=(named, CALL), input_items=(USER,))
    assert {row[1] for row in _index_rows(stateful)} == {"msg_u1", "fc_1"}
    assert run(expand({"input": refs(named["id"])}, stateful, "alice", has_session=True)).body["input"] == [named]
    with pytest.raises(OpenAIError) as caught:  # another key's
        run(expand({"input": refs(named["id"])}, stateful, "bob", has_session=True))
    assert caught.value.status == 404
    store(stateful, "resp_0bf2", output=(), input_items=(USER, named))
    assert stateful.responses.delete("resp_0af1", "alice")
    assert run(expand({"input": refs(named["id"])}, stateful, "alice", has_session=True)).body["input"] == [named]
    assert stateful.responses.delete("resp_0bf2", "alice")
    with pytest.raises(OpenAIError) as caught:
        run(expand({"input": refs(named["id"])}, stateful, "alice", has_session=True))
    assert caught.value.status == 404 and named["id"] in caught.value.message


def test_input_items_named_after_their_response_are_found_without_index_rows(stateful):
    """Items the client sent without an id are named after the response they are input to: no index
    row for them (a plain call writes none at all), found by that name, and, carried on into a later
    turn, indexed there and findable after their first response is gone."""
    from server.stateful.items import normalize_input

    first = normalize_input(
        [{"role": "user", "content": "hi"}, {"type": "function_call_output", "call_id": "c", "output": "x"}],
        "resp_0af1",
    )
    assert [item["id"] for item in first] == ["msg_0af1_in0", "fco_0af1_in1"]
    store(stateful, "resp_0af1", output=(), input_items=first)
    assert _index_rows(stateful) == set()
    assert run(expand({"input": refs("fco_0af1_in1")}, stateful, "alice", has_session=True)).body["input"] == [first[1]]
    with pytest.raises(OpenAIError) as caught:  # another key's
        run(expand({"input": refs("msg_0af1_in0")}, stateful, "bob", has_session=True))
    assert caught.value.status == 404
    store(stateful, "resp_0bf2", output=(), input_items=first)
    assert {row[1:] for row in _index_rows(stateful)} == {("msg_0af1_in0", "resp_0bf2"), ("fco_0af1_in1", "resp_0bf2")}
    assert stateful.responses.delete("resp_0af1", "alice")
    assert run(expand({"input": refs("msg_0af1_in0")}, stateful, "alice", has_session=True)).body["input"] == [first[0]]


def test_a_requests_items_are_named_after_the_response_it_gets(stateful):
    expanded = run(expand({"input": "hi"}, stateful, "alice", has_session=True, response_id="resp_0cf3"))
    assert [item["id"] for item in expanded.body["input"]] == ["msg_0cf3_in0"]
    kept = {"type": "message", "role": "user", "id": "msg_mine", "content": "hi"}  # a client's own id is kept
    assert (
        run(expand({"input": [kept]}, stateful, "alice", has_session=True, response_id="resp_0cf3")).body["input"][0][
            "id"
        ]
        == "msg_mine"
    )


def test_names_of_unstored_responses_count_for_nothing_in_the_read_bound(stateful, monkeypatch):
    from server.stateful import context

    monkeypatch.setattr(context, "MAX_RESPONSES_READ", 2)
    with pytest.raises(OpenAIError) as caught:  # three well-shaped names, none stored: 404, not the bound's 400
        run(expand({"input": refs("msg_01_0", "msg_02_0", "msg_03_0")}, stateful, "alice", has_session=True))
    assert caught.value.status == 404
