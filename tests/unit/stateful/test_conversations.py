"""The conversation store: ordered items, owner scoping, unique item ids, bounds."""

from __future__ import annotations

from server.stateful.conversations import ConversationStore
from server.stateful.db import StateDB
from server.stateful.responses import Bounds


def make(tmp_path, bounds=Bounds(max_count=100, max_bytes=10**9, max_age_s=3600)) -> ConversationStore:
    db = StateDB(tmp_path)
    db.open()
    return ConversationStore(db, bounds)


def item(iid: str, text: str = "x") -> dict:
    return {"id": iid, "type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def test_create_append_list_delete(tmp_path):
    store = make(tmp_path)
    conv = store.create("", {"topic": "t"}, [item("msg_a")])
    assert conv["object"] == "conversation" and conv["metadata"] == {"topic": "t"}
    store.add_items(conv["id"], "", [item("msg_b"), item("msg_c")])
    assert [i["id"] for i in store.items(conv["id"], "")] == ["msg_a", "msg_b", "msg_c"]
    assert store.delete_item(conv["id"], "", "msg_b") == (True, True)
    assert store.delete_item(conv["id"], "", "msg_b") == (True, False)
    assert [i["id"] for i in store.items(conv["id"], "")] == ["msg_a", "msg_c"]
    assert store.update_metadata(conv["id"], "", {"topic": "u"})["metadata"] == {"topic": "u"}
    assert store.delete(conv["id"], "")
    assert store.items(conv["id"], "") is None and store.totals() == (0, 0)


def test_owner_scoping(tmp_path):
    store = make(tmp_path)
    conv = store.create("alice", {}, [])
    assert store.get(conv["id"], "bob") is None
    assert store.items(conv["id"], "bob") is None
    assert store.add_items(conv["id"], "bob", [item("msg_x")]) is None
    assert store.get_item(conv["id"], "bob", "msg_x") == (False, None)
    assert not store.delete(conv["id"], "bob")


def test_repeated_item_ids_get_fresh_ones(tmp_path):
    store = make(tmp_path)
    conv = store.create("", {}, [item("msg_a", "one")])
    added = store.add_items(conv["id"], "", [item("msg_a", "two")])
    assert added[0]["id"] != "msg_a" and added[0]["id"].startswith("msg_")
    assert store.get_item(conv["id"], "", added[0]["id"])[1]["content"][0]["text"] == "two"


def test_count_bound_drops_least_recently_used(tmp_path):
    store = make(tmp_path, Bounds(max_count=2, max_bytes=10**9, max_age_s=3600))
    first = store.create("", {}, [])
    second = store.create("", {}, [])
    store.add_items(first["id"], "", [item("msg_1")])  # first is now the most recently used
    third = store.create("", {}, [])
    assert store.get(second["id"], "") is None
    assert store.get(first["id"], "") is not None and store.get(third["id"], "") is not None


def test_byte_bound(tmp_path):
    store = make(tmp_path, Bounds(max_count=100, max_bytes=1500, max_age_s=3600))
    ids = [store.create("", {}, [item(f"msg_{i}", "y" * 400)])["id"] for i in range(6)]
    assert store.totals()[1] <= 1500
    assert store.get(ids[0], "") is None and store.get(ids[-1], "") is not None
