"""The response store's writer: many responses, few commits; each caller told once its own is committed."""

from __future__ import annotations

import asyncio
import sys
import time

import pytest

from server.stateful.db import StateDB
from server.stateful.responses import Bounds, Put, ResponseStore
from server.stateful.writer import StoreWriter

BIG = Bounds(max_count=1000, max_bytes=10**9, max_age_s=3600)


def response(rid: str, text: str = "hi") -> dict:
    return {"id": rid, "object": "response", "status": "completed", "output": [{"type": "message", "content": text}]}


def put(rid: str, text: str = "hi") -> Put:
    return Put.of(response(rid, text), owner="", session_id="s", input_items=[])


@pytest.fixture
def writer(tmp_path):
    db = StateDB(tmp_path)
    db.open()
    started = StoreWriter(ResponseStore(db, BIG))
    started.start()
    yield started
    started.close()
    db.close()


def committed_elsewhere(tmp_path, rid: str) -> bool:
    """Read through a connection of its own: it sees only what was committed (as another worker would)."""
    other = StateDB(tmp_path)
    try:
        row = other.connection().execute("SELECT 1 FROM responses WHERE id = ?", (rid,)).fetchone()
        return row is not None
    finally:
        other.close()


def test_concurrent_puts_share_commits_and_each_is_committed_when_its_caller_wakes(writer, tmp_path):
    async def one(i: int) -> bool:
        kept = await writer.put(put(f"resp_{i}"))
        return kept and committed_elsewhere(tmp_path, f"resp_{i}")

    async def burst() -> list[bool]:
        return await asyncio.gather(*(one(i) for i in range(64)))

    assert all(asyncio.run(burst()))
    assert writer.store.totals()[0] == 64
    assert writer.batches < 64, "64 responses queued at once took a commit each"


def test_the_puts_of_one_event_loop_turn_go_in_one_commit(writer):
    """Responses that finish in one turn of the loop are handed to the thread together, even when it
    is idle and free to take the first alone (each caller here blocks a while before its put)."""

    async def one(i: int) -> bool:
        time.sleep(0.02)  # holds the loop, not the GIL: the thread could commit what is queued meanwhile
        return await writer.put(put(f"resp_{i}"))

    async def burst() -> list[bool]:
        return await asyncio.gather(*(one(i) for i in range(8)))

    assert all(asyncio.run(burst()))
    assert writer.batches == 1


def test_one_at_a_time_takes_a_commit_each(writer):
    """Negative control for the test above: the commit count is real, and batching is what lowers it."""

    async def sequential() -> None:
        for i in range(8):
            assert await writer.put(put(f"resp_{i}"))

    asyncio.run(sequential())
    assert writer.batches == 8


def test_a_batch_respects_the_bounds_and_tells_each_caller_whether_it_was_kept(tmp_path):
    db = StateDB(tmp_path)
    db.open()
    store = ResponseStore(db, Bounds(max_count=3, max_bytes=2000, max_age_s=3600))
    kept = store.put_many([put(f"resp_{i}") for i in range(5)] + [put("resp_huge", "x" * 5000)])
    assert kept == [False, False, True, True, True, False]
    assert store.totals()[0] == 3 and store.get("resp_huge", "") is None
    assert [store.get(f"resp_{i}", "") is not None for i in range(5)] == [False, False, True, True, True]
    db.close()


def test_an_oversized_response_does_not_evict_the_others(tmp_path):
    db = StateDB(tmp_path)
    db.open()
    store = ResponseStore(db, Bounds(max_count=100, max_bytes=2000, max_age_s=3600))
    assert store.put_many([put("resp_a"), put("resp_b")]) == [True, True]
    assert store.put_many([put("resp_huge", "x" * 5000)]) == [False]
    assert store.totals()[0] == 2
    db.close()


def test_a_failed_commit_reaches_every_caller_of_its_batch_and_the_writer_goes_on(writer, monkeypatch):
    real = writer.store.put_many
    failures = iter([OSError("disk I/O error")])

    def flaky(puts):
        failure = next(failures, None)
        if failure is not None:
            raise failure
        return real(puts)

    monkeypatch.setattr(writer.store, "put_many", flaky)

    async def scenario() -> bool:
        with pytest.raises(OSError, match="disk I/O error"):
            await writer.put(put("resp_lost"))
        return await writer.put(put("resp_next"))

    assert asyncio.run(scenario())
    assert writer.store.get("resp_lost", "") is None and writer.store.get("resp_next", "") is not None


def test_close_commits_what_is_queued_then_refuses(tmp_path):
    db = StateDB(tmp_path)
    db.open()
    writer = StoreWriter(ResponseStore(db, BIG))
    writer.start()

    async def scenario() -> None:
        pending = [asyncio.ensure_future(writer.put(put(f"resp_{i}"))) for i in range(10)]
        await asyncio.sleep(0)  # every put is queued
        await asyncio.to_thread(writer.close)
        assert all(await asyncio.gather(*pending))
        with pytest.raises(RuntimeError, match="closed"):
            await writer.put(put("resp_late"))

    asyncio.run(scenario())
    assert writer.store.totals()[0] == 10
    db.close()


def test_an_idle_writer_keeps_no_response_it_stored(writer):
    """The thread drops its last batch before it waits for the next one: a batch holds its responses'
    bodies (tens of MiB for a maximum-size input), which stayed resident while the server was idle."""
    stored = put("resp_big", "x" * 100_000)
    body = stored.body
    alone = sys.getrefcount(body)  # `body`, `stored` and getrefcount's argument
    assert asyncio.run(writer.put(stored))
    del stored
    deadline = time.monotonic() + 10.0  # the thread answers first, then lets go of the batch
    while sys.getrefcount(body) >= alone and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sys.getrefcount(body) == alone - 1, "the idle writer still holds the batch it committed"
