"""Sessions that lost a record: remembered in memory, and written beside the session's records once the disk allows."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from server.capture.write.record import utc_timestamp
from server.files import write_atomic

# Beside the `<uuid>.json` records; not `*.json`, so readers of the record layout never take it for one.
MARK_NAME = "capture-failed.mark"

# O_NONBLOCK: a FIFO put in its place cannot block the open.
_OPEN_READ = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)


class LostRecords:
    """Counts the records each session lost. `add` never touches the disk (it is called when the disk
    just failed); the writer thread calls `write_pending` until every mark is on disk."""

    def __init__(self, sessions_dir: Path, on_written: Callable[[set[str]], None] | None = None) -> None:
        self.sessions_dir = sessions_dir
        # Told which session directories got a mark (the store's change journal): a session whose
        # every record was lost is listed from its mark, by this process and by others at once.
        self._on_written = on_written
        self._lock = threading.Lock()
        self._marks: dict[str, dict[str, Any]] = {}  # session dir name -> mark, this run's losses
        self._pending: set[str] = set()  # dir names whose mark is not on disk yet

    def add(self, session_id: str, dir_name: str, reason: str) -> None:
        now = utc_timestamp()
        with self._lock:
            mark = self._marks.get(dir_name)
            if mark is None:
                mark = self._marks[dir_name] = {
                    "session_id": session_id,
                    "lost_records": 0,
                    "first_lost_at": now,
                    "last_lost_at": now,
                    "last_reason": reason,
                    "on_disk": 0,  # how many of lost_records the file on disk already counts
                }
            mark["lost_records"] += 1
            mark["last_lost_at"] = now
            mark["last_reason"] = reason
            self._pending.add(dir_name)

    @property
    def pending(self) -> int:
        return len(self._pending)

    @property
    def sessions(self) -> int:
        return len(self._marks)

    def write_pending(self) -> OSError | None:
        """Write every pending mark (merged with a mark an earlier run left); the first error, if any."""
        with self._lock:
            todo = [(name, dict(self._marks[name])) for name in self._pending]
        first_error = None
        written: set[str] = set()
        for dir_name, mark in todo:
            try:
                self._write(dir_name, mark)
            except OSError as exc:
                first_error = first_error or exc
                continue
            written.add(dir_name)
            with self._lock:
                current = self._marks[dir_name]
                current["on_disk"] = mark["lost_records"]
                if current["lost_records"] == mark["lost_records"]:
                    self._pending.discard(dir_name)
        if written and self._on_written is not None:
            self._on_written(written)
        return first_error

    def _write(self, dir_name: str, mark: dict[str, Any]) -> None:
        directory = self.sessions_dir / dir_name
        os.makedirs(directory, mode=0o700, exist_ok=True)
        earlier = read_mark(directory) or {}
        # Losses counted in the file by an earlier run (or by an earlier write of ours) stay counted.
        base = int(earlier.get("lost_records", 0)) - mark["on_disk"]
        doc = {
            "session_id": mark["session_id"],
            "lost_records": max(0, base) + mark["lost_records"],
            "first_lost_at": earlier.get("first_lost_at") or mark["first_lost_at"],
            "last_lost_at": mark["last_lost_at"],
            "last_reason": mark["last_reason"],
        }
        # Synced, file and directory entry: marks are rare, and a mark is what says a rollout is not whole.
        write_atomic(directory / MARK_NAME, orjson.dumps(doc))
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def lost(self, dir_name: str) -> int:
        """Records this session lost (0: none): this run's count or the mark on disk's, the larger; non-zero is what matters."""
        with self._lock:
            mark = self._marks.get(dir_name)
            here = 0 if mark is None else mark["lost_records"]
        on_disk = read_mark(self.sessions_dir / dir_name)
        return max(here, int(on_disk.get("lost_records", 0)) if on_disk else 0)


def read_mark(directory: Path) -> dict[str, Any] | None:
    """The mark in a session directory, or None (absent or unreadable)."""
    try:
        fd = os.open(directory / MARK_NAME, _OPEN_READ)
        with os.fdopen(fd, "rb") as handle:
            doc = orjson.loads(handle.read())
    except (OSError, orjson.JSONDecodeError):
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("lost_records"), int):
        return None
    return doc
