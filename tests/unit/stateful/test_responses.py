"""The response store: durable, shared between processes, scoped by owner, within its bounds."""

from __future__ import annotations

import ctypes
import ctypes.util
import multiprocessing
import os
import stat
import time
from collections.abc import Callable

import orjson
import pytest

from server.stateful import responses
from server.stateful.db import StateDB
from server.stateful.responses import Bounds, Put, ResponseStore

BIG = Bounds(max_count=1000, max_bytes=10**9, max_age_s=3600)


def make(tmp_path, bounds: Bounds = BIG, clock: Callable[[], float] = time.time) -> ResponseStore:
    db = StateDB(tmp_path)
    db.open()
    return ResponseStore(db, bounds, clock=clock)


def response(rid: str, text: str = "hi", status: str = "completed") -> dict:
    return {"id": rid, "object": "response", "status": status, "output": [{"type": "message", "content": text}]}


def put(rid: str, owner: str) -> Put:
    return Put.of(response(rid), owner=owner, session_id=None, input_items=[])


def test_put_get_delete_round_trip(tmp_path):
    store = make(tmp_path)
    items = [{"type": "message", "role": "user", "id": "msg_1", "content": [{"type": "input_text", "text": "q"}]}]
    assert store.put(response("resp_a"), owner="", session_id="s1", input_items=items)
    got = store.get("resp_a", "")
    assert got.response == response("resp_a") and got.input == items and got.session_id == "s1"
    assert store.delete("resp_a", "")
    assert store.get("resp_a", "") is None
    assert not store.delete("resp_a", "")


def test_file_is_private(tmp_path):
    make(tmp_path)
    assert stat.S_IMODE(os.stat(tmp_path / "state.sqlite3").st_mode) == 0o600


def test_owner_scoping(tmp_path):
    store = make(tmp_path)
    store.put(response("resp_a"), owner="alice", session_id=None, input_items=[])
    assert store.get("resp_a", "bob") is None
    assert not store.delete("resp_a", "bob")
    assert store.get("resp_a", "alice") is not None


def test_survives_reopen(tmp_path):
    store = make(tmp_path)
    store.put(response("resp_a"), owner="", session_id=None, input_items=[])
    store.db.close()
    assert make(tmp_path).get("resp_a", "").response["id"] == "resp_a"


def _child_put(directory: str, rid: str) -> None:
    db = StateDB(directory)
    db.open()
    ResponseStore(db, BIG).put(response(rid), owner="", session_id=None, input_items=[])


def test_another_process_sees_a_write_at_once(tmp_path):
    """No in-memory truth: what another process committed is readable the moment it returns."""
    store = make(tmp_path)
    assert store.get("resp_child", "") is None  # opened (and read) before the child wrote
    child = multiprocessing.get_context("spawn").Process(target=_child_put, args=(str(tmp_path), "resp_child"))
    child.start()
    child.join(60)
    assert child.exitcode == 0
    assert store.get("resp_child", "").id == "resp_child"


def test_count_bound_evicts_oldest(tmp_path):
    store = make(tmp_path, Bounds(max_count=3, max_bytes=10**9, max_age_s=3600))
    for i in range(6):
        store.put(response(f"resp_{i}"), owner="", session_id=None, input_items=[])
    assert store.totals()[0] == 3
    assert [store.get(f"resp_{i}", "") is not None for i in range(6)] == [False] * 3 + [True] * 3


def test_byte_bound_holds_and_an_oversized_response_is_not_stored(tmp_path):
    store = make(tmp_path, Bounds(max_count=1000, max_bytes=2000, max_age_s=3600))
    for i in range(20):
        assert store.put(response(f"resp_{i}", "x" * 300), owner="", session_id=None, input_items=[])
        assert store.totals()[1] <= 2000
    assert not store.put(response("resp_huge", "x" * 5000), owner="", session_id=None, input_items=[])
    assert store.get("resp_huge", "") is None


def test_unbounded_store_grows_past_the_limit(tmp_path):
    """Negative control for the bound tests: the same load without a low bound keeps everything."""
    store = make(tmp_path)
    for i in range(20):
        store.put(response(f"resp_{i}", "x" * 300), owner="", session_id=None, input_items=[])
    assert store.totals()[0] == 20 and store.totals()[1] > 2000


def test_a_keys_share_drops_only_that_keys_oldest(tmp_path):
    store = make(tmp_path, Bounds(max_count=1000, max_bytes=10**9, max_age_s=3600, max_count_per_key=2))
    for rid, owner in (("resp_a1", "a"), ("resp_b1", "b"), ("resp_a2", "a"), ("resp_a3", "a")):
        assert store.put(response(rid), owner=owner, session_id=None, input_items=[])
    kept = {rid for rid, owner in (("resp_a1", "a"), ("resp_a2", "a"), ("resp_a3", "a"), ("resp_b1", "b"))}
    assert {rid for rid in kept if store.get(rid, rid[5]) is not None} == {"resp_a2", "resp_a3", "resp_b1"}


def statements_of_one_put(store: ResponseStore, rid: str) -> list[str]:
    """The SQL one more write runs."""
    seen: list[str] = []
    conn = store.db.connection()
    conn.set_trace_callback(seen.append)
    try:
        store.put(response(rid), owner="a", session_id=None, input_items=[])
    finally:
        conn.set_trace_callback(None)
    return seen


@pytest.mark.parametrize("max_count", [1000, 5], ids=["room", "full"])
def test_a_write_reads_no_per_key_sums(tmp_path, max_count):
    """The bound check reads rows of `totals` (the store's, the key's), never a sum over every response of
    the key (which costs more the fuller the store), with or without per-key shares, whether the
    store has room or must evict."""
    plain = make(tmp_path / "plain", Bounds(max_count=max_count, max_bytes=10**9, max_age_s=3600))
    shared = make(
        tmp_path / "shared", Bounds(max_count=max_count, max_bytes=10**9, max_age_s=3600, max_count_per_key=500)
    )
    for store in (plain, shared):
        for i in range(5):
            store.put(response(f"resp_{i}"), owner="a", session_id=None, input_items=[])
        seen = statements_of_one_put(store, "resp_x")
        assert not [sql for sql in seen if "SUM(" in sql.replace("SUM(LENGTH(data))", "") or "COUNT(" in sql]
        # A full store gave up its oldest for the new one.
        assert store.totals()[0] == min(6, max_count) and (store.get("resp_0", "a") is None) == (max_count == 5)
    key_read = "SELECT count, bytes FROM totals WHERE name = 'owner a'"
    assert not [sql for sql in statements_of_one_put(plain, "resp_y") if key_read in sql]
    assert [sql for sql in statements_of_one_put(shared, "resp_y") if key_read in sql]


def owner_totals(store: ResponseStore) -> tuple[dict, dict]:
    """Each key's (count, bytes) as kept in `totals`, and as summed from the rows."""
    conn = store.db.connection()
    kept = {
        name.removeprefix("owner "): (count, size)
        for name, count, size in conn.execute("SELECT * FROM totals WHERE name LIKE 'owner %'")
        if count
    }
    summed = {
        owner: (count, size)
        for owner, count, size in conn.execute("SELECT owner, COUNT(*), SUM(size) FROM responses GROUP BY owner")
    }
    return kept, summed


def test_each_keys_totals_follow_every_kind_of_write(tmp_path):
    store = make(tmp_path, Bounds(max_count=6, max_bytes=10**9, max_age_s=3600, max_count_per_key=3))
    for i in range(5):
        store.put(response(f"resp_a{i}", "x" * i), owner="a", session_id=None, input_items=[])
    store.put_many([put("resp_b0", "b"), put("resp_a9", "a"), put("resp_b1", "b")])
    store.put(response("resp_b0", "longer now"), owner="b", session_id=None, input_items=[])  # replaced
    store.put(response("resp_r", status="in_progress"), owner="c", session_id=None, input_items=[])
    store.append_events("resp_r", [(1, b"data: 1"), (2, b"data: 22")])
    store.update_running(response("resp_r", "done"), [])
    store.put(response("resp_b1"), owner="c", session_id=None, input_items=[])  # another key's id, replaced
    store.delete("resp_a9", "a")
    kept, summed = owner_totals(store)
    assert kept == summed and set(summed) == {"a", "b", "c"}
    assert summed["a"][0] == 2 and summed["c"][0] == 2


def test_a_state_file_from_before_the_per_key_totals_gets_them(tmp_path):
    """A file made by the schema without each key's totals opens with its keys counted, and they stay right."""
    store = make(tmp_path)
    for i in range(4):
        store.put(response(f"resp_a{i}", "x" * i), owner="a", session_id=None, input_items=[])
    store.put(response("resp_b0"), owner="b", session_id=None, input_items=[])
    conn = store.db.connection()
    for trigger in ("responses_added_by_owner", "responses_removed_by_owner", "responses_changed_by_owner"):
        conn.execute(f"DROP TRIGGER {trigger}")
    conn.execute("DELETE FROM totals WHERE name LIKE 'owner %'")
    store.put(response("resp_b1"), owner="b", session_id=None, input_items=[])  # written by the older schema
    store.db.close()
    store = make(tmp_path, Bounds(max_count=1000, max_bytes=10**9, max_age_s=3600, max_count_per_key=3))
    kept, summed = owner_totals(store)
    assert kept == summed and summed["a"][0] == 4 and summed["b"][0] == 2
    store.put(response("resp_a9"), owner="a", session_id=None, input_items=[])
    assert store.get("resp_a0", "a") is None and store.get("resp_a1", "a") is None  # a held to its share
    store.db.close()
    kept, summed = owner_totals(make(tmp_path))  # opened again: counted once, not twice
    assert kept == summed and summed["a"][0] == 3


def test_age_bound_expires(tmp_path):
    now = [1_000_000.0]
    store = make(tmp_path, Bounds(max_count=1000, max_bytes=10**9, max_age_s=60), clock=lambda: now[0])
    store.put(response("resp_old"), owner="", session_id=None, input_items=[])
    now[0] += 59
    store.put(response("resp_young"), owner="", session_id=None, input_items=[])
    assert store.get("resp_old", "") is not None  # not yet past its age: a write within it keeps it
    now[0] += 2
    store.put(response("resp_new"), owner="", session_id=None, input_items=[])
    assert store.get("resp_old", "") is None  # 61 s old
    assert store.get("resp_young", "") is not None and store.get("resp_new", "") is not None


def test_running_responses_are_never_evicted(tmp_path):
    store = make(tmp_path, Bounds(max_count=2, max_bytes=10**9, max_age_s=3600))
    store.put(response("resp_run", status="in_progress"), owner="", session_id=None, input_items=[], background=True)
    for i in range(4):
        store.put(response(f"resp_{i}"), owner="", session_id=None, input_items=[])
    assert store.get("resp_run", "").running


def test_events_are_kept_counted_and_dropped_with_the_response(tmp_path):
    store = make(tmp_path)
    store.put(response("resp_bg", status="in_progress"), owner="", session_id=None, input_items=[], background=True)
    before = store.totals()[1]
    store.append_events("resp_bg", [(0, b"event: a\n\n"), (1, b"event: b\n\n"), (2, b"event: c\n\n")])
    assert store.totals()[1] == before + 30
    assert [seq for seq, _ in store.events_after("resp_bg", 0)] == [1, 2]
    assert store.put(response("resp_bg"), owner="", session_id=None, input_items=[], background=True)
    assert len(store.events_after("resp_bg", -1)) == 3  # replacing the object keeps its events
    store.delete("resp_bg", "")
    assert store.events_after("resp_bg", -1) == [] and store.totals() == (0, 0)


def test_cancel_flag_only_on_running_responses(tmp_path):
    store = make(tmp_path)
    store.put(response("resp_done"), owner="", session_id=None, input_items=[], background=True)
    store.put(response("resp_run", status="queued"), owner="", session_id=None, input_items=[], background=True)
    store.request_cancel("resp_done", "")
    store.request_cancel("resp_run", "")
    assert not store.cancel_requested("resp_done") and store.cancel_requested("resp_run")


@pytest.mark.parametrize("count", [200])
def test_bounds_hold_under_concurrent_writers(tmp_path, count):
    """Two processes writing at once: the totals the bound reads stay exact, and the bound holds."""
    bounds = Bounds(max_count=25, max_bytes=10**9, max_age_s=3600)
    store = make(tmp_path, bounds)
    ctx = multiprocessing.get_context("spawn")
    children = [ctx.Process(target=_many_puts, args=(str(tmp_path), f"p{n}", count)) for n in range(2)]
    for child in children:
        child.start()
    for child in children:
        child.join(120)
        assert child.exitcode == 0
    rows = store.db.connection().execute("SELECT COUNT(*), SUM(size) FROM responses").fetchone()
    assert store.totals() == (rows[0], rows[1]) and rows[0] == 25


def _many_puts(directory: str, prefix: str, count: int) -> None:
    db = StateDB(directory)
    db.open()
    store = ResponseStore(db, Bounds(max_count=25, max_bytes=10**9, max_age_s=3600))
    for i in range(count):
        store.put(response(f"resp_{prefix}_{i}"), owner="", session_id=None, input_items=[])


def test_a_batch_of_two_keys_in_a_full_store_evicts_each_keys_own(tmp_path):
    """A full store, one batch of two keys' responses: each key gives up its own oldest for its own
    new one, even where the other key's is older (one key never evicts another's)."""
    store = make(tmp_path, Bounds(max_count=4, max_bytes=10**9, max_age_s=3600))
    for rid, owner in (("resp_b1", "b"), ("resp_b2", "b"), ("resp_a1", "a"), ("resp_a2", "a")):
        store.put(response(rid), owner=owner, session_id=None, input_items=[])
    kept = store.put_many([put("resp_a3", "a"), put("resp_b3", "b")])
    assert kept == [True, True] and store.totals()[0] == 4
    stored = {
        rid
        for rid in ("resp_a1", "resp_a2", "resp_a3", "resp_b1", "resp_b2", "resp_b3")
        if store.get(rid, rid[5]) is not None
    }
    # b's two oldest are the store's oldest, yet a's new one took a's own oldest.
    assert stored == {"resp_a2", "resp_a3", "resp_b2", "resp_b3"}


def test_a_batch_of_one_key_in_a_full_store_takes_that_keys_oldest_only(tmp_path):
    """Control for the test above: one key's batch of two gives up its own two oldest, not b's older ones."""
    store = make(tmp_path, Bounds(max_count=4, max_bytes=10**9, max_age_s=3600))
    for rid, owner in (("resp_b1", "b"), ("resp_b2", "b"), ("resp_a1", "a"), ("resp_a2", "a")):
        store.put(response(rid), owner=owner, session_id=None, input_items=[])
    assert store.put_many([put("resp_a3", "a"), put("resp_a4", "a")]) == [True, True]
    assert [store.get(rid, rid[5]) is not None for rid in ("resp_b1", "resp_b2", "resp_a1", "resp_a2")] == [
        True,
        True,
        False,
        False,
    ]


def test_a_body_spliced_from_the_encoded_response_is_the_one_encoded_whole():
    items = [{"type": "message", "role": "user", "id": "msg_1", "content": [{"type": "input_text", "text": "q"}]}]
    answer = response("resp_s", 'é \u2028 "quoted"')
    whole = orjson.dumps({"response": answer, "input": items})
    spliced = Put.of(answer, owner="", session_id=None, input_items=items, encoded=orjson.dumps(answer))
    assert spliced.body == whole
    assert Put.of(answer, owner="", session_id=None, input_items=items).body == whole
    # The bytes given are the ones stored (not encoded again): what the client got is what is kept.
    other = Put.of(answer, owner="", session_id=None, input_items=items, encoded=orjson.dumps(response("resp_t")))
    assert orjson.loads(other.body)["response"]["id"] == "resp_t"


def large_items(size: int) -> list[dict]:
    """Input items of about `size` bytes once encoded."""
    return [{"type": "message", "role": "user", "content": "w" * 4000}] * (size // 4030)


def test_large_bodies_round_trip_and_are_counted_on_every_kind_of_write(tmp_path):
    """A body of `LARGE_BODY_BYTES` or more is written through blob I/O: a batch mixing small and large,
    a large one replacing another, and a background run's update all read back as written, sized right."""
    store = make(tmp_path)
    big = large_items(responses.LARGE_BODY_BYTES + 50_000)
    other = large_items(responses.LARGE_BODY_BYTES * 2)
    batch = [put("resp_s1", "a"), Put.of(response("resp_l1"), owner="a", session_id="s", input_items=big)]
    batch += [put("resp_s2", "b"), Put.of(response("resp_l2"), owner="b", session_id=None, input_items=other)]
    assert len(batch[1].body) >= responses.LARGE_BODY_BYTES > len(batch[0].body)
    assert store.put_many(batch) == [True] * 4
    assert store.get("resp_l1", "a").input == big and store.get("resp_l1", "a").session_id == "s"
    assert store.get("resp_l2", "b").input == other and store.get("resp_s2", "b").input == []
    # Replaced by a large body of another length (the upsert's conflict path), then by a small one.
    assert store.put(response("resp_l1", "again"), owner="a", session_id="s", input_items=other)
    assert store.get("resp_l1", "a").input == other and store.get("resp_l1", "a").response == response(
        "resp_l1", "again"
    )
    # A background run: stored small while running, its final object large.
    store.put(response("resp_r", status="in_progress"), owner="c", session_id=None, input_items=[])
    store.append_events("resp_r", [(1, b"data: 1")])
    assert store.update_running(response("resp_r", "done"), big)
    assert store.get("resp_r", "c").input == big and store.get("resp_r", "c").response == response("resp_r", "done")
    kept, summed = owner_totals(store)
    assert kept == summed
    conn = store.db.connection()
    assert conn.execute("SELECT COUNT(*) FROM responses WHERE size < LENGTH(body)").fetchone() == (0,)
    assert store.totals()[1] == conn.execute("SELECT SUM(size) FROM responses").fetchone()[0]


def test_a_large_body_is_not_kept_by_sqlite_after_its_write(tmp_path, monkeypatch):
    """SQLite keeps a copy of a blob bound to a statement until the statement is bound again, and Python
    caches its statements: a large body bound to the upsert stayed resident after the write (and was
    copied once more into the row's record on the way in). Measured with SQLite's own memory counters
    (the library `sqlite3` uses); with the blob path turned off, the copy shows."""
    sqlite = ctypes.CDLL(ctypes.util.find_library("sqlite3") or "libsqlite3.so.0")
    sqlite.sqlite3_memory_used.restype = ctypes.c_int64
    sqlite.sqlite3_memory_highwater.restype = ctypes.c_int64
    sqlite.sqlite3_memory_highwater.argtypes = [ctypes.c_int]
    items = large_items(8 << 20)

    def held_and_peak(directory) -> tuple[int, int, int]:
        store = make(directory)
        store.put(response("resp_0"), owner="", session_id=None, input_items=[])  # the statements prepared
        before = sqlite.sqlite3_memory_used()
        sqlite.sqlite3_memory_highwater(1)  # reset the peak to the present
        body = Put.of(response("resp_1"), owner="", session_id=None, input_items=items).body
        assert store.put_many([Put.of(response("resp_1"), owner="", session_id=None, input_items=items)]) == [True]
        held, peak = sqlite.sqlite3_memory_used() - before, sqlite.sqlite3_memory_highwater(0) - before
        assert store.get("resp_1", "").input == items
        store.db.close()
        return held, peak, len(body)

    held, peak, size = held_and_peak(tmp_path / "blob")
    assert held < size / 2 and peak < size / 2, (held, peak, size)
    monkeypatch.setattr(responses, "LARGE_BODY_BYTES", 1 << 40)  # every body bound to the upsert
    held, peak, size = held_and_peak(tmp_path / "bound")
    assert held >= size and peak >= 2 * size, (held, peak, size)


@pytest.mark.parametrize("sizes", [("large", "small"), ("small", "large"), ("large", "larger"), ("larger", "large")])
def test_one_id_put_twice_in_a_batch_keeps_the_later_body(tmp_path, sizes):
    store = make(tmp_path)
    size = {"small": 100, "large": responses.LARGE_BODY_BYTES + 50_000, "larger": 2 * responses.LARGE_BODY_BYTES}
    inputs = [large_items(size[which]) if which != "small" else [{"role": "user", "content": "q"}] for which in sizes]
    batch = [
        Put.of(response("resp_x", which), owner="a", session_id=None, input_items=items)
        for which, items in zip(sizes, inputs)
    ]
    assert store.put_many(batch) == [True, True]
    got = store.get("resp_x", "a")
    assert got.response == response("resp_x", sizes[1]) and got.input == inputs[1]
    kept, summed = owner_totals(store)
    assert kept == summed == {"a": (1, len(batch[1].body))}
