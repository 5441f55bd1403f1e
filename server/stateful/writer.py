"""The response store's writer thread: every response that queued up meanwhile goes into one transaction.

A handler awaits `StoreWriter.put`, which returns once the response is committed (in SQLite's
write-ahead log; synced too under `capture_fsync: always`), so a follow-up sent the instant the
answer ends finds it, and a crash of this process never loses a response whose answer was sent.
One thread with one connection takes the queue in batches: at c=64 one commit, one bound check and
one wake-up of the event loop serve many responses, and writers in one process never wait on each
other's SQLite locks. The puts of one turn of an event loop reach the thread as one item at the
turn's end: woken by the first put, the thread would otherwise commit it alone (most batches at
c=64 held one response, at five times the CPU per response of a batch of sixteen).
"""

from __future__ import annotations

import asyncio
import queue
import threading

from server.batching import Waiter, answer
from server.stateful.responses import Put, ResponseStore

# Most responses in one transaction: bounds how long one commit holds the write lock other workers wait for.
_MAX_BATCH = 128
_STOP = None


class StoreWriter:
    """The queue and the thread; `put` from any coroutine, `close` once (blocking: from a thread)."""

    def __init__(self, store: ResponseStore) -> None:
        self.store = store
        self._queue: queue.SimpleQueue[list[tuple[Put, Waiter]] | None] = queue.SimpleQueue()
        # Each event loop's puts of its current turn, handed to the thread as one item when the turn ends.
        self._pending: dict[asyncio.AbstractEventLoop, list[tuple[Put, Waiter]]] = {}
        self._lock = threading.Lock()  # closing against enqueueing
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="response-store", daemon=True)
        self.batches = 0  # transactions committed (tests read it: many responses, fewer commits)

    def start(self) -> None:
        self._thread.start()

    async def put(self, put: Put) -> bool:
        """Store one response with whatever else is queued; True once it is committed and within the bounds.

        Raises when the transaction fails (the caller reports it as `store: false`) or the writer is closed.
        """
        waiter = Waiter.here()
        with self._lock:
            if self._closed:
                raise RuntimeError("the response store is closed")
            pending = self._pending.get(waiter.loop)
            if pending is None:
                # The hand-over runs once the loop has run every callback already due, so the answers
                # that finished in this turn go to the thread as one item, and one wake-up of it; a
                # lone caller waits for nothing (the next turn starts at once).
                pending = self._pending[waiter.loop] = []
                waiter.loop.call_soon(self._hand_over, waiter.loop)
            pending.append((put, waiter))
        result = await waiter.future
        if isinstance(result, BaseException):
            raise result
        return bool(result)

    def _hand_over(self, loop: asyncio.AbstractEventLoop) -> None:
        with self._lock:
            jobs = self._pending.pop(loop, None)
            if jobs:  # None: `close` has queued them
                self._queue.put(jobs)

    def close(self, timeout: float = 30.0) -> None:
        """Commit what is queued, then stop the thread. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for jobs in self._pending.values():
                self._queue.put(jobs)
            self._pending.clear()
            self._queue.put(_STOP)
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            stop = first is _STOP
            jobs = [] if first is None else first
            # Whatever else is queued right now joins it, up to the cap; never waits for more.
            while not stop and len(jobs) < _MAX_BATCH:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    stop = True
                else:
                    jobs.extend(more)
            if jobs:
                self._commit(jobs)
            if stop:
                return
            # Not kept while the thread waits for the next batch: a batch holds its responses'
            # bodies (a maximum-size input is tens of MiB), which an idle writer would keep resident.
            first = more = None
            jobs = []

    def _commit(self, jobs: list[tuple[Put, Waiter]]) -> None:
        results: list[bool] | BaseException
        try:
            results = self.store.put_many([put for put, _ in jobs])
            self.batches += 1
        except Exception as exc:  # every caller gets the error (and logs it with its id); the thread goes on
            results = exc
        if isinstance(results, BaseException):
            answer([(waiter, results) for _, waiter in jobs])
        else:
            answer([(waiter, kept) for (_, waiter), kept in zip(jobs, results)])
