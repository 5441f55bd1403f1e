"""Replaying a stored response's stream: rebuilt events, kept events, and resuming after a sequence number."""

from __future__ import annotations

import asyncio

import orjson

from server.stateful.background import EventLog
from server.stateful.db import StateDB
from server.stateful.replay import DONE, follow, rebuilt_events
from server.stateful.responses import Bounds, ResponseStore

FINAL = {
    "id": "resp_1",
    "object": "response",
    "status": "completed",
    "output": [
        {"id": "rs_1", "type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "hm"}]},
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "hello", "annotations": []}],
        },
        {"id": "fc_1", "type": "function_call", "call_id": "c", "name": "f", "arguments": "{}", "status": "completed"},
    ],
}


def make(tmp_path) -> ResponseStore:
    db = StateDB(tmp_path)
    db.open()
    return ResponseStore(db, Bounds(100, 10**9, 3600))


def collect(agen) -> list[bytes]:
    async def run():
        return [frame async for frame in agen]

    return asyncio.run(run())


def test_rebuilt_events_are_canonical():
    events = list(rebuilt_events(FINAL))
    kinds = [e["type"] for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta") == "hello"
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert done == FINAL["output"]
    added = [e["output_index"] for e in events if e["type"] == "response.output_item.added"]
    assert added == [0, 1, 2]


def test_follow_resumes_after_starting_after(tmp_path):
    store = make(tmp_path)
    store.put(FINAL, owner="", session_id=None, input_items=[])
    stored = store.get("resp_1", "")
    frames = collect(follow(store, stored, "", starting_after=4))
    assert frames[-1] == DONE
    first = orjson.loads(frames[0].split(b"data: ", 1)[1])
    assert first["sequence_number"] == 5


def test_follow_tracks_a_live_background_run(tmp_path):
    """Events kept while the run goes are streamed as they land; the stream ends when the run does."""
    store = make(tmp_path)

    async def scenario():
        running = {**FINAL, "status": "in_progress", "output": []}
        await asyncio.to_thread(store.put, running, owner="", session_id=None, input_items=[], background=True)
        stored = await asyncio.to_thread(store.get, "resp_1", "")
        log = EventLog(store, "resp_1")
        frames = [b'event: e\ndata: {"n": %d}\n\n' % n for n in range(6)]

        async def runner():
            for frame_ in frames[:3]:
                log.add(frame_)
            await log.flush()
            await asyncio.sleep(0.3)
            log.add(b"".join(frames[3:]) + DONE)
            await log.flush()
            await asyncio.to_thread(store.update_running, FINAL, [])

        task = asyncio.ensure_future(runner())
        got = [frame async for frame in follow(store, stored, "", starting_after=0, poll_s=0.02)]
        await task
        return frames, got

    frames, got = asyncio.run(scenario())
    assert got == frames[1:] + [DONE]
