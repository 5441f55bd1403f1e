"""The state database: one SQLite file in the capture directory, shared by every worker process.

SQLite (WAL journal) gives what a response store needs and hand-written files would not: atomic,
durable transactions; several processes reading and writing one directory; a restart that finds
everything committed. Nothing here is held in memory between calls: every read goes to the file, so
a response stored by one worker is visible to the next call on any other at once.

Connections are per thread (handlers call in from `asyncio.to_thread`), each opened on first use.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import shutil
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

DB_NAME = "state.sqlite3"

# Row counts and byte totals are kept by triggers in `totals` (and each key's), so a
# bound check is one row read whatever the table size, and stays right whichever process wrote.
_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    session_id TEXT,
    status TEXT NOT NULL,
    background INTEGER NOT NULL DEFAULT 0,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    stored_at REAL NOT NULL,
    heartbeat REAL NOT NULL,
    size INTEGER NOT NULL,
    body BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS responses_by_age ON responses(stored_at);
CREATE INDEX IF NOT EXISTS responses_by_owner ON responses(owner, stored_at);
CREATE TABLE IF NOT EXISTS response_events (
    response_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (response_id, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS conversations (
    id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    updated_at REAL NOT NULL,
    metadata BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS conversations_by_age ON conversations(updated_at);
CREATE TABLE IF NOT EXISTS conversation_items (
    conversation_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    id TEXT NOT NULL,
    size INTEGER NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (conversation_id, seq)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS conversation_item_ids ON conversation_items(conversation_id, id);
-- Facts about the directory's state that outlive a run (the seal key's fingerprint).
CREATE TABLE IF NOT EXISTS facts (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS totals (name TEXT PRIMARY KEY, count INTEGER NOT NULL, bytes INTEGER NOT NULL);
INSERT OR IGNORE INTO totals VALUES ('responses', 0, 0), ('conversations', 0, 0);
CREATE TRIGGER IF NOT EXISTS responses_added AFTER INSERT ON responses BEGIN
    UPDATE totals SET count = count + 1, bytes = bytes + NEW.size WHERE name = 'responses';
END;
CREATE TRIGGER IF NOT EXISTS responses_removed AFTER DELETE ON responses BEGIN
    UPDATE totals SET count = count - 1, bytes = bytes - OLD.size WHERE name = 'responses';
    DELETE FROM response_events WHERE response_id = OLD.id;
END;
CREATE TRIGGER IF NOT EXISTS responses_resized AFTER UPDATE OF size ON responses BEGIN
    UPDATE totals SET bytes = bytes - OLD.size + NEW.size WHERE name = 'responses';
END;
-- Each key's count and bytes, for the per-key shares (`response_store_max_*_per_key`): rows named
-- 'owner <key>' in `totals`, next to the store's own row (so a write dirties no page more). Kept by
-- triggers of their own, so a state file made before them gets them too; the INSERT counts such a
-- file's responses once, when it has no key's row (beside stored responses that is only ever such a
-- file: the triggers keep a key's row, at zero too).
INSERT INTO totals SELECT 'owner ' || owner, COUNT(*), SUM(size) FROM responses
    WHERE NOT EXISTS (SELECT 1 FROM totals WHERE name LIKE 'owner %') GROUP BY owner;
CREATE TRIGGER IF NOT EXISTS responses_added_by_owner AFTER INSERT ON responses BEGIN
    INSERT INTO totals VALUES ('owner ' || NEW.owner, 1, NEW.size)
        ON CONFLICT (name) DO UPDATE SET count = count + 1, bytes = bytes + NEW.size;
END;
CREATE TRIGGER IF NOT EXISTS responses_removed_by_owner AFTER DELETE ON responses BEGIN
    UPDATE totals SET count = count - 1, bytes = bytes - OLD.size WHERE name = 'owner ' || OLD.owner;
END;
CREATE TRIGGER IF NOT EXISTS responses_changed_by_owner AFTER UPDATE OF owner, size ON responses BEGIN
    UPDATE totals SET count = count - 1, bytes = bytes - OLD.size WHERE name = 'owner ' || OLD.owner;
    INSERT INTO totals VALUES ('owner ' || NEW.owner, 1, NEW.size)
        ON CONFLICT (name) DO UPDATE SET count = count + 1, bytes = bytes + NEW.size;
END;
-- Where a stored item is found by its id, for `item_reference` input items: for each key, the newest
-- stored response that carries the item (in its input or its output). A response's rows go with it.
CREATE TABLE IF NOT EXISTS response_items (
    owner TEXT NOT NULL,
    id TEXT NOT NULL,
    response_id TEXT NOT NULL,
    PRIMARY KEY (owner, id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS response_items_by_response ON response_items(response_id);
CREATE TRIGGER IF NOT EXISTS response_items_removed AFTER DELETE ON responses BEGIN
    DELETE FROM response_items WHERE response_id = OLD.id;
END;
-- A state file from before the item index gets its responses' items indexed, once (newest carrier first).
INSERT OR IGNORE INTO response_items (owner, id, response_id)
    SELECT r.owner, json_extract(item.value, '$.id'), r.id
    FROM responses r, json_each(CAST(r.body AS TEXT), '$.response.output') item
    WHERE NOT EXISTS (SELECT 1 FROM facts WHERE name = 'response_items_indexed')
        AND json_type(item.value, '$.id') = 'text'
    ORDER BY r.stored_at DESC;
INSERT OR IGNORE INTO response_items (owner, id, response_id)
    SELECT r.owner, json_extract(item.value, '$.id'), r.id
    FROM responses r, json_each(CAST(r.body AS TEXT), '$.input') item
    WHERE NOT EXISTS (SELECT 1 FROM facts WHERE name = 'response_items_indexed')
        AND json_type(item.value, '$.id') = 'text'
    ORDER BY r.stored_at DESC;
INSERT OR IGNORE INTO facts (name, value) VALUES ('response_items_indexed', '1');
CREATE INDEX IF NOT EXISTS conversation_items_by_id ON conversation_items(id);
CREATE TRIGGER IF NOT EXISTS conversations_added AFTER INSERT ON conversations BEGIN
    UPDATE totals SET count = count + 1 WHERE name = 'conversations';
END;
CREATE TRIGGER IF NOT EXISTS conversations_removed AFTER DELETE ON conversations BEGIN
    UPDATE totals SET count = count - 1 WHERE name = 'conversations';
    DELETE FROM conversation_items WHERE conversation_id = OLD.id;
END;
CREATE TRIGGER IF NOT EXISTS conversation_items_added AFTER INSERT ON conversation_items BEGIN
    UPDATE totals SET bytes = bytes + NEW.size WHERE name = 'conversations';
END;
CREATE TRIGGER IF NOT EXISTS conversation_items_removed AFTER DELETE ON conversation_items BEGIN
    UPDATE totals SET bytes = bytes - OLD.size WHERE name = 'conversations';
END;
"""

# Long enough to ride out another worker's write transaction (they are short); a failure after it
# is an error the caller reports, never a hang.
_BUSY_TIMEOUT_S = 10.0

log = logging.getLogger("switchyard_model.stateful")


# What setting a new state file up writes (measured: the file, its write-ahead log and its
# shared-memory index, about 122 KiB), rounded up: what a startup on a full disk is told it needed.
SETUP_BYTES = 128 << 10
_SQLITE_FULL = 13


def setup_failure(path: Path, exc: BaseException) -> str:
    """Why the state file could not be set up, naming it; on a full disk, the space free and the space needed."""
    full = (
        getattr(exc, "sqlite_errorcode", None) == _SQLITE_FULL
        or getattr(exc, "errno", None) == errno.ENOSPC
        or "disk is full" in str(exc)  # SQLite's words for SQLITE_FULL, whoever raised it
    )
    message = f"cannot set up the response store's state file {path}: {exc}"
    if not full:
        return message
    try:
        free = f"{shutil.disk_usage(path.parent).free // 1024} KiB free"
    except OSError:
        free = "free space unknown"
    return (
        f"{message} ({free} on the filesystem of {path.parent}; setting the file up writes about "
        f"{SETUP_BYTES // 1024} KiB, and every stored response more): free space there, set capture_dir to "
        "another disk, or turn response_store off"
    )


class StateDB:
    """The SQLite file `<capture_dir>/state.sqlite3` (mode 0600), opened once per thread."""

    def __init__(self, directory: str | Path, *, fsync_each_commit: bool = True) -> None:
        self.directory = Path(directory)
        # FULL: a commit is on disk before it returns (survives power loss). NORMAL, in WAL mode: a
        # commit is in the log before it returns (survives a crash of this process, not of the machine),
        # and the fsync waits for the next checkpoint; several ms less on every stored response.
        self._synchronous = "FULL" if fsync_each_commit else "NORMAL"
        self.path = self.directory / DB_NAME
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self._closed = False

    def open(self) -> None:
        """Create the directory, the file (0600) and the schema. Blocking: call from a thread.

        RuntimeError naming the file (and, on a full disk, the space it needed) when it cannot.
        """
        try:
            self._open()
        except (sqlite3.Error, OSError) as exc:
            self.close()  # its connections, so nothing keeps the file (or its filesystem) open
            raise RuntimeError(setup_failure(self.path, exc)) from exc

    def _open(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        # Created here with 0600 before SQLite sees it: SQLite gives its -wal/-shm files the same mode.
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
        os.close(fd)
        # Workers starting together take turns here. Switching a new file to WAL needs SQLite's
        # exclusive lock, and SQLite answers "database is locked" at once, without waiting out its
        # busy timeout, when another connection holds a lock it could not wait for without deadlock.
        # The lock is on the directory, so it never touches the POSIX locks SQLite keeps on the file.
        dir_fd = os.open(self.directory, os.O_RDONLY)
        try:
            try:
                fcntl.flock(dir_fd, fcntl.LOCK_EX)
            except OSError as exc:  # a filesystem without flock (some network mounts): no turns taken
                log.warning("cannot lock %s while setting up the state file (%s)", self.directory, exc)
            conn = self.connection()
            conn.execute("PRAGMA journal_mode=WAL")  # kept in the file: later connections find it
            conn.executescript("BEGIN IMMEDIATE;" + _SCHEMA + "COMMIT;")
        finally:
            os.close(dir_fd)  # releases the flock

    def connection(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            if self._closed:
                raise RuntimeError("the state database is closed")
            conn = sqlite3.connect(self.path, timeout=_BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
            conn.execute(f"PRAGMA synchronous={self._synchronous}")
            self._local.conn = conn
            with self._lock:
                self._all.append(conn)
        return conn

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """A write transaction (taken at once, so two workers never deadlock upgrading a read)."""
        conn = self.connection()
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conns, self._all = self._all, []
        for conn in conns:
            try:
                conn.close()
            except sqlite3.Error:
                pass
