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

from server.errors import OpenAIError
from server.stateful.responses import ResponseStore

log = logging.getLogger("switchyard_model.stateful")


class EventLog:
    """Collects a run's SSE frames (numbered in the order the writer emitted them) and writes them in batches."""

    def __init__(self, store: ResponseStore, response_id: str) -> None:
        self.store = store
        self.response_id = response_id
        self._next_seq = 0
        self._pending: list[tuple[int, bytes]] = []
        self._writing: asyncio.Task[None] | None = None

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
    """This worker's running background tasks, by response id, bounded in all and per key.

    A run holds one of `max_runs` places (and one of its key's `max_per_key`) from `reserve`, before
    anything is stored, until its task ends; a run beyond either bound gets a 429. So background runs
    never hold more upstream connections than that, whatever a client sends.
    """

    def __init__(
        self, store: ResponseStore, poll_s: float = 0.25, *, max_runs: int = 64, max_per_key: int = 16
    ) -> None:
        self.store = store
        self.poll_s = poll_s
        self.max_runs = max_runs
        self.max_per_key = max_per_key
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._watcher: asyncio.Task[None] | None = None
        self._places: dict[str, int] = {}  # owner tag -> places held
        self._held = 0

    def reserve(self, owner: str) -> None:
        """Take a place for one run of `owner`, or raise the 429; give it back with `release` if the
        run never starts (`start` gives it back when the run ends)."""
        if self._held >= self.max_runs:
            raise _too_many(f"this server already runs {self.max_runs} background responses")
        if self._places.get(owner, 0) >= self.max_per_key:
            raise _too_many(f"this API key already has {self.max_per_key} background responses running")
        self._held += 1
        self._places[owner] = self._places.get(owner, 0) + 1

    def release(self, owner: str) -> None:
        self._held -= 1
        left = self._places.get(owner, 1) - 1
        if left > 0:
            self._places[owner] = left
        else:
            self._places.pop(owner, None)

    def start(self, response_id: str, run: Coroutine[Any, Any, None], owner: str) -> None:
        """Run a reserved run as a task; its place is released when it ends."""
        task = asyncio.get_running_loop().create_task(run, name=f"background {response_id}")
        self._tasks[response_id] = task

        def ended(_: asyncio.Task[None]) -> None:
            self._tasks.pop(response_id, None)
            self.release(owner)

        task.add_done_callback(ended)
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


def _too_many(why: str) -> OpenAIError:
    return OpenAIError(
        429,
        f"{why}; wait for one to finish, or cancel one",
        type="rate_limit_error",
        code="too_many_background_responses",
        headers={"retry-after": "1"},
    )
