"""Pages (WAL frames) and CPU a stored response costs the response store, one (or `--batch N`) a commit, the store full.

Usage: PYTHONPATH=CHECKOUT python bench/store_pages.py [--responses N] [--batch N]

The store writer commits what one turn of the event loop finished (a third of its commits at c=64
hold one response; docs/benchmarks.md), and a commit's cost goes with the pages it writes: each is a
WAL frame, copied again into the file at the next checkpoint. The frame count is exact, so two
commits compare on a busy host where CPU figures swing; the CPU figure (writer thread, checkpoints left out) is printed beside it. Run it with
PYTHONPATH pointed at another checkout (a `git worktree`) to measure that commit's store (from
`376d2c5` on, where `server.stateful` exports what it uses; `f6ec135`'s 8.9 frames in docs/benchmarks.md
were counted the same way through its modules). `--batch N` commits N responses a transaction, as
the writer does under load (a tree whose `server.stateful` exports `Put`).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from typing import Any

from server.config import Settings
from server.stateful import Stateful, normalize_input

_FULL = 3000  # stored responses: every commit evicts one, as a long-running server's does


def one_call() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A response shaped as the bench's small Responses call and its input: one item each, the answer named after it."""
    base = os.urandom(12).hex()  # as new_id("resp") and the translator's item ids make them
    response: dict[str, Any] = {
        "id": f"resp_{base}",
        "object": "response",
        "status": "completed",
        "output": [
            {
                "type": "message",
                "id": f"msg_{base}_0",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "Hello there, nice to meet you.", "annotations": []}],
            }
        ],
        "usage": {"input_tokens": 12, "output_tokens": 8, "total_tokens": 20},
        "store": True,
    }
    message = [{"role": "user", "content": "Say hello in one short sentence, please."}]
    try:  # named after the response, as the server names them
        items = normalize_input(message, response["id"])
    except TypeError:  # a tree from before that: its own item ids
        items = normalize_input(message)
    assert isinstance(items, list)
    return response, items


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/store_pages.py", description=__doc__.splitlines()[0])
    parser.add_argument("--responses", type=int, default=500, help="responses stored while measured")
    parser.add_argument("--batch", type=int, default=1, help="responses a commit (more than one: put_many)")
    args = parser.parse_args(argv)
    directory = tempfile.mkdtemp(prefix="store-pages-")
    settings = Settings(
        switchyard_base_url="http://127.0.0.1:9/v1",  # never contacted
        capture_dir=directory,
        response_store_max_count=_FULL,
        response_store_max_bytes=1 << 30,
    )
    service = Stateful(settings)
    try:
        service.open()
        store = service.responses  # written from this thread: the writer thread's work, timed here

        def put(call: tuple[dict[str, Any], list[dict[str, Any]]]) -> None:
            store.put(call[0], owner="", session_id=None, input_items=call[1])

        def put_batch(calls: list[tuple[dict[str, Any], list[dict[str, Any]]]]) -> None:
            if len(calls) == 1:
                put(calls[0])
                return
            from server.stateful import Put  # a response to write, as the writer thread hands them over

            store.put_many(
                [Put.of(response, owner="", session_id=None, input_items=items) for response, items in calls]
            )

        for _ in range(_FULL + 200):
            put(one_call())
        conn = service.db.connection()
        conn.execute("PRAGMA wal_autocheckpoint=0")  # frames counted, none copied meanwhile
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        calls = [one_call() for _ in range(args.responses)]
        started = time.thread_time()
        for start in range(0, len(calls), args.batch):
            put_batch(calls[start : start + args.batch])
        cpu = time.thread_time() - started
        _, frames, _ = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        print(
            f"{frames / args.responses:.1f} WAL frames and {cpu / args.responses * 1e6:.0f} us of CPU (the body"
            f" encoded too) a response, in commits of {args.batch}, store full ({_FULL}); code from"
            f" {sys.modules['server'].__path__[0]}"
        )
    finally:
        service.close()
        shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
