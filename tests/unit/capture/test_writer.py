"""The capture writer: a record is in its file before `write_call` returns, syncs as `fsync` says, failures are loud."""

from __future__ import annotations

import asyncio
import hashlib
import threading

import pytest

from server.capture.store import CaptureStore
from server.capture.write import writer as writer_module
from server.capture.write.durable import GroupSync
from server.capture.write.marks import MARK_NAME
from server.capture.write.record import RecordInput, record_of
from tests.support.captures import captured_call as call
from tests.support.procs import wait_for


def session_dir(root, session_id):
    return root / "sessions" / hashlib.sha256(session_id.encode()).hexdigest()


def files(root, session_id):
    return sorted(session_dir(root, session_id).glob("*.json"))


@pytest.fixture
def make_store(tmp_path):
    stores = []

    def make(**options):
        store = CaptureStore(tmp_path / "captures", **options)
        store.start()
        stores.append(store)
        return store

    yield make
    for store in stores:
        store.close()


class Gate:
    """Holds a function on the writer's path until released, so a test can look at the world meanwhile."""

    def __init__(self, inner):
        self.inner = inner
        self.entered = threading.Event()
        self.release = threading.Event()

    def __call__(self, *args, **kwargs):
        self.entered.set()
        assert self.release.wait(30), "the test never released the gate"
        return self.inner(*args, **kwargs)


async def pending_while_gated(store, gate, session_id):
    """Start a write_call, wait until the writer is inside the gate, report whether the call is done."""
    task = asyncio.ensure_future(store.write_call(RecordInput(**call(session_id))))
    await asyncio.to_thread(gate.entered.wait, 30)
    await asyncio.sleep(0.05)  # room for a wrong implementation to answer early
    done_while_gated = task.done()
    gate.release.set()
    return done_while_gated, await task


def test_write_call_returns_once_the_record_is_in_its_file(make_store, monkeypatch):
    gate = Gate(record_of)
    monkeypatch.setattr(writer_module, "record_of", gate)
    store = make_store()
    done_while_gated, kept = asyncio.run(pending_while_gated(store, gate, "acked"))
    assert not done_while_gated and kept is True
    # No flush: the file is there the moment the call returns.
    assert len(files(store.capture_dir, "acked")) == 1


def test_submit_call_does_not_wait_for_the_file(make_store, monkeypatch):
    """Negative control for the test above: the fire-and-forget path returns with nothing on disk."""
    gate = Gate(record_of)
    monkeypatch.setattr(writer_module, "record_of", gate)
    store = make_store()
    assert store.submit_call(RecordInput(**call("queued")))
    assert gate.entered.wait(10)
    assert files(store.capture_dir, "queued") == []
    gate.release.set()
    assert store.flush(10) and len(files(store.capture_dir, "queued")) == 1


@pytest.mark.parametrize("mode, answered_before_sync", [("always", False), ("batch", True), ("never", True)])
def test_fsync_always_answers_only_after_its_sync(make_store, monkeypatch, mode, answered_before_sync):
    gate = Gate(GroupSync.sync)
    calls = []

    def counting_sync(self, files, dirs, records):
        calls.append(records)
        return gate(self, files, dirs, records)

    monkeypatch.setattr(GroupSync, "sync", counting_sync)
    store = make_store(fsync=mode, fsync_window_ms=0)
    if mode == "never":
        gate.entered.set()  # nothing ever syncs: the call must not wait for a sync
    done_while_gated, kept = asyncio.run(pending_while_gated(store, gate, f"sync-{mode}"))
    assert kept is True
    assert done_while_gated is answered_before_sync
    store.close()
    assert bool(calls) is (mode != "never")
    if mode == "always":
        assert store.stats()["synced"] == 1 and store.stats()["syncs"] == 1


def test_fsync_always_counts_a_real_sync_per_group(make_store):
    store = make_store(fsync="always")

    async def burst():
        return await asyncio.gather(*(store.write_call(RecordInput(**call(f"real-{i % 4}"))) for i in range(40)))

    assert all(asyncio.run(burst()))
    stats = store.stats()
    assert stats["synced"] == 40  # every answered record was covered by a completed sync
    assert 1 <= stats["syncs"] <= 40


def test_batch_syncs_a_window_of_records_at_once(make_store):
    store = make_store(fsync="batch", fsync_window_ms=2000)

    async def burst():
        return await asyncio.gather(*(store.write_call(RecordInput(**call(f"group-{i % 5}"))) for i in range(50)))

    assert all(asyncio.run(burst()))
    assert store.stats()["synced"] < 50  # answered before their sync: the window is still open
    assert wait_for(lambda: store.stats()["synced"] == 50)
    assert store.stats()["syncs"] < 50  # one sync covered many records


def test_a_failed_write_degrades_capture_marks_the_session_and_recovers(make_store):
    store = make_store()
    blocked = session_dir(store.capture_dir, "lost-one")
    blocked.write_text("a file where the session's directory must go")

    async def one(session_id):
        return await store.write_call(RecordInput(**call(session_id)))

    assert asyncio.run(one("lost-one")) is False
    stats = store.stats()
    assert stats["status"] == "degraded" and stats["failed"] == 1 and stats["degraded_reason"]
    assert stats["sessions_with_lost_records"] == 1 and store.lost_records("lost-one") == 1
    assert store.lost_records("never-lost") == 0
    blocked.unlink()  # the disk works again: the probe writes the mark, and capture recovers by itself
    assert wait_for(lambda: not store.degraded)
    assert (blocked / MARK_NAME).exists()
    assert asyncio.run(one("lost-one")) is True
    store.close()
    # The mark survives a restart.
    again = make_store()
    assert again.lost_records("lost-one") == 1
    assert again.stats()["status"] == "ok"


def test_write_call_gives_up_after_its_timeout_and_the_call_goes_on(make_store, monkeypatch):
    gate = Gate(record_of)
    monkeypatch.setattr(writer_module, "record_of", gate)
    store = make_store()

    async def one():
        return await store.write_call(RecordInput(**call("slow-disk")), timeout=0.05)

    assert asyncio.run(one()) is False
    assert store.stats()["timed_out"] == 1
    gate.release.set()
    assert store.flush(10) and len(files(store.capture_dir, "slow-disk")) == 1  # written late, not lost


def test_the_directories_the_writer_remembers_stay_bounded_and_it_writes_on_after_forgetting(make_store, monkeypatch):
    monkeypatch.setattr(writer_module, "MADE_DIRS_KEPT", 4)
    store = make_store()
    for _ in range(2):
        for i in range(10):
            assert store.submit_call(RecordInput(**call(f"s{i}")))
        assert store.flush(10)
        assert len(store.writer.made_dirs) <= 4
    for i in range(10):
        assert len(files(store.capture_dir, f"s{i}")) == 2
