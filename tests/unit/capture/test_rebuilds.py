"""Rollout rebuilds: cached by the tree's state, shared between identical requests, one at a time, same bytes in a worker process."""

from __future__ import annotations

import asyncio
import gc
import os
import threading
import time
from pathlib import Path

import orjson
import pytest

from server.capture.read import rebuilds
from server.capture.read.rebuilds import RolloutBuilder, rollout_json, tree_of
from server.capture.store import CaptureStore, UnknownSession
from tests.support.captures import captured_call as call
from tests.support.captures import chat_response, two_turns
from tests.support.captures import submit_all as add
from tests.support.procs import dead_and_living_dirs


@pytest.fixture
def store(tmp_path):
    capture = CaptureStore(tmp_path / "captures")
    capture.start()
    yield capture
    capture.close()


def _counting(monkeypatch):
    """Wrap the rebuild so the test sees how many ran and how many ran at once."""
    seen = {"runs": 0, "active": 0, "most": 0}
    lock = threading.Lock()
    real = rebuilds.rollout_json

    def counted(*args):
        with lock:
            seen["runs"] += 1
            seen["active"] += 1
            seen["most"] = max(seen["most"], seen["active"])
        time.sleep(0.05)  # long enough for concurrent requests to overlap
        try:
            return real(*args)
        finally:
            with lock:
                seen["active"] -= 1

    monkeypatch.setattr(rebuilds, "rollout_json", counted)
    return seen


def test_cached_until_the_session_changes(store, monkeypatch):
    seen = _counting(monkeypatch)
    builder = RolloutBuilder(store.sessions_dir, workers=0)
    add(store, two_turns("ses-a")[0])

    async def fetch():
        return await builder.rollout(store.index_view(), "ses-a")

    first = asyncio.run(fetch())
    again = asyncio.run(fetch())
    assert again == first and seen["runs"] == 1
    add(store, two_turns("ses-a")[1])  # a new record: the state changes, so the rollout is rebuilt
    third = asyncio.run(fetch())
    assert seen["runs"] == 2
    assert orjson.loads(third)["partial_reason"] is None
    assert len(orjson.loads(third)["record_uuids"]) > len(orjson.loads(first)["record_uuids"])


def test_negative_control_without_a_cache_every_request_rebuilds(store, monkeypatch):
    seen = _counting(monkeypatch)
    builder = RolloutBuilder(store.sessions_dir, workers=0, cache_bytes=0)
    add(store, call("ses-a", response=chat_response([1, 2], [3])))
    for _ in range(3):
        asyncio.run(builder.rollout(store.index_view(), "ses-a"))
    assert seen["runs"] == 3


def test_identical_requests_share_one_rebuild_and_distinct_ones_run_one_at_a_time(store, monkeypatch):
    seen = _counting(monkeypatch)
    builder = RolloutBuilder(store.sessions_dir, workers=0, cache_bytes=0)
    for session_id in ("ses-a", "ses-b", "ses-c"):
        add(store, call(session_id, response=chat_response([1, 2], [3])))

    async def burst():
        index = store.index_view()
        same = [builder.rollout(index, "ses-a") for _ in range(8)]
        others = [builder.rollout(index, sid) for sid in ("ses-b", "ses-c")]
        return await asyncio.gather(*same, *others)

    bodies = asyncio.run(burst())
    assert len(set(bodies[:8])) == 1
    assert seen["runs"] == 3  # one for the eight identical requests, one each for the others
    assert seen["most"] == 1  # never two rebuilds in memory at once


def test_a_cancelled_requester_does_not_cancel_a_shared_rebuild(store, monkeypatch):
    _counting(monkeypatch)
    builder = RolloutBuilder(store.sessions_dir, workers=0)
    add(store, call("ses-a", response=chat_response([1, 2], [3])))

    async def scenario():
        index = store.index_view()
        leaver = asyncio.ensure_future(builder.rollout(index, "ses-a"))
        stayer = asyncio.ensure_future(builder.rollout(index, "ses-a"))
        await asyncio.sleep(0.01)
        leaver.cancel()
        return await stayer

    assert orjson.loads(asyncio.run(scenario()))["session_id"] == "ses-a"


def test_tree_of_lists_descendants_and_refuses_unknown_sessions(store):
    add(store, *two_turns("root"))
    add(store, call("child", parent="root", response=chat_response([7], [8])))
    add(store, call("grandchild", parent="child", response=chat_response([7], [8])))
    index = store.index_view()
    assert tree_of(index, "root") == {"root": ["child"], "child": ["grandchild"], "grandchild": []}
    with pytest.raises(UnknownSession):
        tree_of(index, "nope")


@pytest.mark.integration
def test_a_worker_process_builds_the_same_bytes_as_this_process(store):
    add(store, *two_turns("root"))
    add(store, call("child", parent="root", response=chat_response([7], [8])))
    index = store.index_view()
    builder = RolloutBuilder(store.sessions_dir, workers=1)
    try:
        body = asyncio.run(builder.rollout(index, "root"))
    finally:
        builder.close()
    assert body == rollout_json(str(store.sessions_dir), "root", tree_of(index, "root"), True)
    assert [s["session_id"] for s in orjson.loads(body)["subagents"]] == ["child"]


def test_a_lost_record_marked_after_caching_is_never_hidden_by_the_cache(store):
    builder = RolloutBuilder(store.sessions_dir, workers=0)
    add(store, two_turns("ses-a")[0])
    lost = {"ses-a": 0}

    def rollout():
        store.flush(10)
        body = asyncio.run(builder.rollout(store.index_view(), "ses-a", lost_records=lambda sid: lost.get(sid, 0)))
        return orjson.loads(body)

    whole = rollout()
    assert whole["partial_reason"] is None and whole["mask_sample"] is False  # control: whole, and cached
    lost["ses-a"] = 1  # the next record failed to write: no new record, only the mark
    marked = rollout()
    assert marked["partial_reason"] == "capture_failed" and marked["mask_sample"] is True
    builder.close()


def test_a_spooled_rollout_is_a_file_removed_a_grace_after_nothing_refers_to_it(store, monkeypatch):
    add(store, *two_turns("ses-a"))
    builder = RolloutBuilder(store.sessions_dir, workers=0, inline_bytes=0)
    expected = rollout_json(str(store.sessions_dir), "ses-a", tree_of(store.index_view(), "ses-a"), True)

    async def fetch():
        return await builder.rollout(store.index_view(), "ses-a")

    body = asyncio.run(fetch())
    assert isinstance(body, rebuilds.SpooledBody) and len(body) == len(expected)
    assert Path(body.path).read_bytes() == expected
    assert asyncio.run(fetch()) is body  # the cache shares one file
    path = body.path
    builder._cache.clear()  # evicted; the only reference left is ours
    assert Path(body.path).read_bytes() == expected
    del body
    gc.collect()
    # Dropped, the name stays for the grace: an HTTP server asked to send it may not have opened it yet.
    assert os.path.exists(path)
    monkeypatch.setattr(rebuilds, "RETIRE_GRACE_S", 0.0)
    rebuilds._remove_retired()
    assert os.path.exists(path)  # the grace it was retired with still runs
    monkeypatch.setattr(rebuilds.time, "monotonic", lambda: float("inf"))
    rebuilds._remove_retired()
    assert not os.path.exists(path)
    builder.close()


def test_small_rollouts_stay_bytes(store):
    add(store, *two_turns("ses-a"))
    builder = RolloutBuilder(store.sessions_dir, workers=0)
    assert isinstance(asyncio.run(builder.rollout(store.index_view(), "ses-a")), bytes)
    builder.close()


@pytest.mark.integration
def test_the_worker_runs_under_the_idle_scheduling_policy_and_spools_what_it_builds(store):
    """SCHED_IDLE, not only a nice level: a serving thread that wakes takes the CPU from it at once."""
    if not hasattr(os, "SCHED_IDLE"):
        pytest.skip("no SCHED_IDLE on this platform")
    add(store, *two_turns("ses-a"))
    builder = RolloutBuilder(store.sessions_dir, workers=1, inline_bytes=0)
    try:
        policy = builder._executor().submit(os.sched_getscheduler, 0).result(60)
        body = asyncio.run(builder.rollout(store.index_view(), "ses-a"))
        assert Path(body.path).read_bytes() == rollout_json(
            str(store.sessions_dir), "ses-a", tree_of(store.index_view(), "ses-a"), True
        )
    finally:
        builder.close()
    assert policy == os.SCHED_IDLE
    assert os.sched_getscheduler(0) != os.SCHED_IDLE  # the control: this process is not idle-class


def test_a_killed_servers_spool_is_removed_by_the_next_one_and_a_live_ones_is_kept(store, tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    orphan, living = dead_and_living_dirs(tmp_path, rebuilds.SPOOL_PREFIX)
    builder = RolloutBuilder(store.sessions_dir, workers=0)
    own = builder._spool()
    assert not orphan.exists() and living.exists()
    assert os.path.basename(own).startswith(f"{rebuilds.SPOOL_PREFIX}{os.getpid()}-")
    builder.close()
    assert not os.path.exists(own)
