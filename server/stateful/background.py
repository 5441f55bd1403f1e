"""Background runs: tasks that outlive their request, their kept events, and cancellation from any worker.

A `background: true` response runs as a task of the worker that took the call. Its stream events go
to the store in order (`EventLog`), so any worker can serve `GET ?stream=true`. `POST .../cancel`
may land on any worker: it sets a flag in the store, and the worker running the task sees it within
`poll_s` and cancels the task, which cancels the upstream call. A cancel on the same worker cancels
at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

from server.stateful.responses import ResponseStore

log = logging.getLogger("switchyard_model.stateful")


class EventLog:
    """Collects a run's SSE frames (numbered in the order the writer emitted them) and writes them in batches."""

    def __init__(self, store: ResponseStore, response_id: str) -> None:
        self.store = store
        self.response_id = response_id
        self._next_seq = 0
        self._pending: list[tuple[int, bytes]] = []
        self._writing: asyncio.Task | None = None

    def add(self, sse: bytes) -> None:
        """Keep each event frame in `sse` (the writer's output); the terminal `[DONE]` is not an event."""
        for chunk in sse.split(b"\n\n"):
            if not chunk or chunk.startswith(b"data: [DONE]"):
                continue
            self._pending.append((self._next_seq, chunk + b"\n\n"))
            self._next_seq += 1
        if self._pending and (self._writing is None or self._writing.done()):
            # One write in flight at a time; what arrives meanwhile goes in the next batch.
            self._writing = asyncio.ensure_future(self._write_pending())

    async def _write_pending(self) -> None:
        while self._pending:
            batch, self._pending = self._pending, []
            try:
                await asyncio.to_thread(self.store.append_events, self.response_id, batch)
            except Exception as exc:
                log.error("could not keep events of %s: %s", self.response_id, type(exc).__name__)

    async def flush(self) -> None:
        """Wait until every event added so far is in the store."""
        while self._writing is not None and not self._writing.done():
            await asyncio.shield(self._writing)
        if self._pending:
            await self._write_pending()


class BackgroundRuns:
    """This worker's running background tasks, by response id."""

    def __init__(self, store: ResponseStore, poll_s: float = 0.25) -> None:
        self.store = store
        self.poll_s = poll_s
        self._tasks: dict[str, asyncio.Task] = {}
        self._watcher: asyncio.Task | None = None

    def start(self, response_id: str, run: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(run, name=f"background {response_id}")
        self._tasks[response_id] = task
        task.add_done_callback(lambda _: self._tasks.pop(response_id, None))
        if self._watcher is None or self._watcher.done():
            self._watcher = asyncio.ensure_future(self._watch())

    def cancel_here(self, response_id: str) -> bool:
        task = self._tasks.get(response_id)
        if task is None:
            return False
        task.cancel()
        return True

    async def _watch(self) -> None:
        """Cancel the tasks whose response another worker flagged; ends when no task is left."""
        while self._tasks:
            await asyncio.sleep(self.poll_s)
            for response_id in list(self._tasks):
                try:
                    flagged = await asyncio.to_thread(self.store.cancel_requested, response_id)
                except Exception as exc:
                    log.error("cancel check failed: %s", type(exc).__name__)
                    continue
                if flagged:
                    self.cancel_here(response_id)

    async def shutdown(self) -> None:
        """Cancel every run (each records itself cancelled), and wait for them."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        if self._watcher is not None:
            self._watcher.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def __len__(self) -> int:
        return len(self._tasks)
