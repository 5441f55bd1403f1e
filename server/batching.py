"""Group commit's plumbing: coroutines hand work to one thread, which takes what queued up as one batch and wakes them.

Used by the capture writer (records into files) and the response store's writer (rows into SQLite).
A waiter is a future on the caller's event loop; the thread answers a whole batch with one call into
each loop (`answer`), not one per item, which is most of what a thread hand-off costs a busy loop.
"""

from __future__ import annotations

import asyncio
import queue
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")


@dataclass(slots=True)
class Waiter:
    """A coroutine waiting on its item: the worker thread answers it on that coroutine's event loop."""

    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]
    answered: bool = False  # set by the worker; False after a wait means it timed out

    @classmethod
    def here(cls) -> Waiter:
        """A waiter for the running event loop (call from a coroutine)."""
        loop = asyncio.get_running_loop()
        return cls(loop, loop.create_future())


def settle(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():  # a caller that went away (client left, timed out) has cancelled its wait
        future.set_result(value)


def _settle_all(results: list[tuple[asyncio.Future[Any], Any]]) -> None:
    for future, value in results:
        settle(future, value)


def answer(results: list[tuple[Waiter, Any]]) -> None:
    """Wake the waiters with their results (from the worker thread): one call into each event loop per batch."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Any], Any]]] = {}
    for waiter, value in results:
        waiter.answered = True
        by_loop.setdefault(waiter.loop, []).append((waiter.future, value))
    for loop, settled in by_loop.items():
        try:
            loop.call_soon_threadsafe(_settle_all, settled)
        except RuntimeError:  # that loop is closed: nobody is waiting any more
            pass


def take_batch(source: queue.Queue[T] | queue.SimpleQueue[T], first: T, most: int) -> list[T]:
    """`first` and whatever else is queued right now, up to `most` items; never waits for more."""
    batch = [first]
    while len(batch) < most:
        try:
            batch.append(source.get_nowait())
        except queue.Empty:
            break
    return batch
