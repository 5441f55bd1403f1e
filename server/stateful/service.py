"""What a server process holds for the stateful API: the state database, its stores, the seal key.

Opened by the lifespan (off the event loop) when `response_store` is on; the route modules and the
Responses handler reach it through `AppState.response_store`. Also: whose stored objects a request may see.
"""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING

from starlette.types import Scope

from server.config import ConfigError
from server.request_owner import Owners
from server.stateful.background import BackgroundRuns
from server.stateful.conversations import ConversationStore
from server.stateful.db import StateDB, setup_failure
from server.stateful.responses import Bounds, ResponseStore
from server.stateful.sealing import KEY_FILE, ReasoningSeal, fingerprint, load_key
from server.stateful.writer import StoreWriter

if TYPE_CHECKING:
    from server.config import Settings


class Stateful:
    """The stores and the seal; `open()` and `close()` block (call them from a thread)."""

    def __init__(self, settings: Settings, server_run: str = "") -> None:
        self.settings = settings
        self.server_run = server_run  # sealed reasoning opens only in the run that sealed it
        # Stored responses are as durable as capture records: `capture_fsync: always` fsyncs each one.
        self.db = StateDB(settings.capture_dir, fsync_each_commit=settings.capture_fsync == "always")
        self.responses = ResponseStore(
            self.db,
            Bounds(
                max_count=settings.response_store_max_count,
                max_bytes=settings.response_store_max_bytes,
                max_age_s=settings.response_store_max_age_s,
                max_count_per_key=settings.response_store_max_count_per_key,
                max_bytes_per_key=settings.response_store_max_bytes_per_key,
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
        # Background runs never take more than half the upstream pool: foreground calls keep the rest.
        # (Unset, the pool is as large as the calls admitted, thousands: background_max_runs bounds them.)
        pool = settings.upstream_max_connections or 2 * settings.background_max_runs
        self.runs = BackgroundRuns(
            self.responses,
            max_runs=max(1, min(settings.background_max_runs, pool // 2)),
            max_per_key=settings.background_max_runs_per_key,
        )
        self.seal: ReasoningSeal | None = None
        self.owners = Owners(settings.api_keys, settings.session_api_keys)

    def open(self) -> None:
        """RuntimeError naming the state file (and on a full disk, the space it needed) when it cannot be set up."""
        self.db.open()
        try:
            key = self._seal_key()
        except (sqlite3.Error, OSError) as exc:  # the key file, or its fingerprint in the state file
            self.db.close()
            raise RuntimeError(setup_failure(self.db.path, exc)) from exc
        except BaseException:
            self.db.close()
            raise
        self.seal = ReasoningSeal(key, self.server_run)
        self.writer.start()

    def _seal_key(self) -> bytes:
        """The seal key; a key file that went missing after this directory's state was sealed is an error."""
        setting = self.settings.reasoning_seal_key
        if setting:
            return load_key(setting, self.settings.capture_dir)
        conn = self.db.connection()
        row = conn.execute("SELECT value FROM facts WHERE name = 'seal_key'").fetchone()
        key = load_key(None, self.settings.capture_dir, may_create=row is None)
        if row is None:
            with self.db.transaction() as tx:
                tx.execute("INSERT OR IGNORE INTO facts (name, value) VALUES ('seal_key', ?)", (fingerprint(key),))
        elif row[0] != fingerprint(key):
            raise ConfigError(
                f"{self.settings.capture_dir}/{KEY_FILE} is not the key this capture directory's state was sealed "
                "with: restore the original file"
            )
        return key

    def close(self) -> None:
        self.writer.close()  # what is queued is committed first
        self.db.close()

    def owner(self, scope: Scope) -> str:
        """Whose objects this request may see: its key's owner tag when auth is on, else everyone's ("")."""
        return self.owners.tag(scope)
