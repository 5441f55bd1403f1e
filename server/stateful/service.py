"""What a server process holds for the stateful API: the state database, its stores, the seal key.

Opened by the lifespan (off the event loop) when `response_store` is on; the route modules and the
Responses handler reach it through `AppState.stateful`. Also: whose stored objects a request may see.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

from server.stateful.background import BackgroundRuns
from server.stateful.conversations import ConversationStore
from server.stateful.db import StateDB
from server.stateful.responses import Bounds, ResponseStore
from server.stateful.sealing import ReasoningSeal, load_key
from server.stateful.writer import StoreWriter

if TYPE_CHECKING:
    from server.config import Settings


class Stateful:
    """The stores and the seal; `open()` and `close()` block (call them from a thread)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        # Stored responses are as durable as capture records: `capture_fsync: always` fsyncs each one.
        self.db = StateDB(settings.capture_dir, fsync_each_commit=settings.capture_fsync == "always")
        self.responses = ResponseStore(
            self.db,
            Bounds(
                max_count=settings.response_store_max_count,
                max_bytes=settings.response_store_max_bytes,
                max_age_s=settings.response_store_max_age_s,
            ),
        )
        self.conversations = ConversationStore(
            self.db,
            Bounds(
                max_count=settings.conversation_store_max_count,
                max_bytes=settings.conversation_store_max_bytes,
                max_age_s=settings.response_store_max_age_s,
            ),
        )
        self.writer = StoreWriter(self.responses)  # how handlers store responses: batched, one commit per batch
        self.runs = BackgroundRuns(self.responses)
        self.seal: ReasoningSeal | None = None
        self.auth_on = bool(settings.api_keys)

    def open(self) -> None:
        self.db.open()
        self.seal = ReasoningSeal(load_key(self.settings.reasoning_seal_key, self.settings.capture_dir))
        self.writer.start()

    def close(self) -> None:
        self.writer.close()  # what is queued is committed first
        self.db.close()

    def owner(self, scope) -> str:
        """Whose objects this request may see: a digest of its API key when auth is on, else everyone's ("")."""
        if not self.auth_on:
            return ""
        for name, value in scope.get("headers") or ():
            if name == b"authorization":
                token = value[7:].strip() if value[:7].lower() == b"bearer " else b""
                return hashlib.sha256(b"switchyard-model owner\0" + token).hexdigest()
        return hashlib.sha256(b"switchyard-model owner\0").hexdigest()
