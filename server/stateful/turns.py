"""One stateful Responses call: what its response echoes, and keeping it (store, conversation turn).

The Responses handler makes a `Turn` per call once the request is expanded. `keep(response)` runs
before the client sees the response end (before `response.completed`, or before the non-stream
answer), so a follow-up sent the instant it ends finds it; it sets `store` on the response to what
really happened. A failure to store is logged (ids only, never content) and reported as
`store: false`; it never fails the call.

A background run keeps its final response only after its stream events are all in the store
(`keep_final`), so a reader following the events never sees the run end before its last event.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from server.stateful.context import Expanded, echo_fields
from server.stateful.items import stored_output
from server.stateful.responses import Put
from server.stateful.service import Stateful

log = logging.getLogger("switchyard_model.stateful")

# A turn joins its conversation only when the model finished it.
_FINISHED = ("completed", "incomplete")


class Turn:
    def __init__(self, stateful: Stateful | None, expanded: Expanded, response_id: str, session_id: str | None) -> None:
        self.stateful = stateful
        self.expanded = expanded
        self.response_id = response_id
        self.session_id = session_id
        self.echo = echo_fields(expanded, stored=expanded.store)
        seal = stateful.seal if stateful is not None and expanded.seal_reasoning else None
        owner = expanded.owner
        self.seal = (lambda text: seal.seal(text, owner)) if seal is not None else None
        self.final: dict[str, Any] | None = None

    @property
    def background(self) -> bool:
        return self.expanded.background

    async def keep(self, response: dict[str, Any] | None, encoded: bytes | None = None) -> bool:
        """Store the response (and its conversation turn) now; background runs defer to `keep_final`.

        `encoded`: the response as `orjson.dumps` gives it now, when the caller has it already.
        """
        if response is None:
            return False
        if self.background and response.get("status") not in ("queued", "in_progress"):
            self.final = response
            return bool(response.get("store"))
        stored = await self._write(response, encoded)
        response["store"] = stored
        return stored

    async def keep_final(self, fallback: dict[str, Any]) -> None:
        """A background run's last write: its final response, or `fallback` (cancelled, failed) if it has none."""
        response = self.final if self.final is not None else fallback
        await self._write(response)

    async def _write(self, response: dict[str, Any], encoded: bytes | None = None) -> bool:
        expanded = self.expanded
        if not expanded.store or self.stateful is None:
            return False
        try:
            if expanded.background and response.get("status") != "queued":
                # Only the queued write creates a background run's row: a run deleted meanwhile
                # stays deleted, its private input never written back.
                stored = await asyncio.to_thread(self.stateful.responses.update_running, response, expanded.input_items)
            else:
                put = Put.of(
                    response,
                    owner=expanded.owner,
                    session_id=self.session_id,
                    input_items=expanded.input_items,
                    background=expanded.background,
                    encoded=encoded,
                )
                stored = await self.stateful.writer.put(put)
            if stored and expanded.conversation_id and response.get("status") in _FINISHED:
                turn = expanded.new_items + stored_output(response.get("output") or [])
                await asyncio.to_thread(
                    self.stateful.conversations.add_items, expanded.conversation_id, expanded.owner, turn
                )
            return stored
        except Exception as exc:  # the store must never fail the call
            log.error("could not store response %s: %s: %s", self.response_id, type(exc).__name__, exc)
            return False
