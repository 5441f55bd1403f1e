"""The response store alone at 64 concurrent callers: a thread-pool transaction each, against the batching writer.

Usage: python bench/store.py [--puts-per-caller N] [--rounds N]

No server and no network: 64 coroutines on one uvloop store small Responses objects into a fresh
state database (WAL, `synchronous=NORMAL`, as `capture_fsync: batch` runs it), first each with its
own `asyncio.to_thread(store.put)` (how responses were stored before the writer), then through
`StoreWriter` (one thread, one transaction per batch). Prints CPU per stored response of the whole
process and of the event-loop thread, and wall time per response, for each round.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import uvloop  # noqa: E402

from server.stateful.db import StateDB  # noqa: E402
from server.stateful.responses import Bounds, Put, ResponseStore  # noqa: E402
from server.stateful.writer import StoreWriter  # noqa: E402

CALLERS = 64
RESPONSE = {
    "object": "response",
    "created_at": 1,
    "status": "completed",
    "model": "m",
    "output": [
        {
            "type": "message",
            "id": "msg_1",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "word " * 40, "annotations": [], "logprobs": []}],
        }
    ],
    "usage": {"input_tokens": 10, "output_tokens": 40, "total_tokens": 50},
    "tools": [],
    "store": True,
}
INPUT = [{"type": "message", "role": "user", "id": "msg_u", "content": [{"type": "input_text", "text": "hello " * 10}]}]


async def series(mode: str, store: ResponseStore, writer: StoreWriter, tag: str, per_caller: int) -> str:
    async def caller(k: int) -> None:
        for i in range(per_caller):
            response = {**RESPONSE, "id": f"resp_{tag}_{k}_{i}"}
            if mode == "thread pool":
                await asyncio.to_thread(store.put, response, owner="", session_id=None, input_items=INPUT)
            else:
                await writer.put(Put.of(response, owner="", session_id=None, input_items=INPUT))

    cpu, loop_cpu, wall = time.process_time(), time.thread_time(), time.perf_counter()
    await asyncio.gather(*(caller(k) for k in range(CALLERS)))
    n = CALLERS * per_caller
    return (
        f"{mode:<12} CPU {(time.process_time() - cpu) / n * 1e6:4.0f} us/response"
        f" (event loop {(time.thread_time() - loop_cpu) / n * 1e6:4.1f}),"
        f" wall {(time.perf_counter() - wall) / n * 1e6:4.0f} us/response"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/store.py", description=__doc__.splitlines()[0])
    parser.add_argument("--puts-per-caller", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    directory = tempfile.mkdtemp(prefix="switchyard-bench-store-")
    db = StateDB(directory, fsync_each_commit=False)
    db.open()
    store = ResponseStore(db, Bounds(max_count=10_000, max_bytes=2**30, max_age_s=30 * 86400))
    writer = StoreWriter(store)
    writer.start()

    async def run() -> None:
        for r in range(args.rounds):
            modes = ("thread pool", "writer") if r % 2 == 0 else ("writer", "thread pool")
            for mode in modes:
                print(f"round {r + 1}: " + await series(mode, store, writer, f"{r}{mode[0]}", args.puts_per_caller))

    try:
        uvloop.run(run())
    finally:
        writer.close()
        db.close()
        shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
