"""Making written capture files durable: one sync of the capture filesystem covers a whole group of records."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
from collections.abc import Callable, Iterable
from typing import cast

# What `capture_fsync` promises (docs/operations.md says it for users):
#   always  the answer waits until its record is synced (power loss loses no acknowledged call)
#   batch   group commit: records are synced together within `capture_fsync_window_ms`, after the
#           answer (power loss may lose the last window; a process crash loses nothing)
#   never   the kernel writes records back when it likes (a process crash still loses nothing)
FSYNC_MODES = ("always", "batch", "never")

_OPEN_DIR = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)


def _load_syncfs() -> Callable[[int], int] | None:
    """libc's syncfs(2) (Linux): one call flushes every dirty file of one filesystem; None elsewhere."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        syncfs = libc.syncfs
    except (OSError, AttributeError):
        return None
    syncfs.argtypes = [ctypes.c_int]
    syncfs.restype = ctypes.c_int
    return cast("Callable[[int], int]", syncfs)  # a CDLL call releases the GIL while it waits for the disk


_SYNCFS = _load_syncfs()


class GroupSync:
    """Syncs groups of freshly written files; counts the syncs and the records they covered.

    On Linux a group costs one syncfs(2) of the capture directory's filesystem, whatever its size
    (it also writes back other dirty files of that filesystem: on a shared disk, give captures
    their own). Elsewhere each file and each directory of the group gets its own fsync.
    """

    def __init__(self, root: str | os.PathLike[str], *, use_syncfs: bool = True) -> None:
        self.root = os.fspath(root)
        self._syncfs = _SYNCFS if use_syncfs else None
        self._lock = threading.Lock()
        self.syncs = 0  # sync operations that completed (one per group with syncfs)
        self.synced_records = 0  # records a completed sync covered

    def sync(self, files: Iterable[str], dirs: Iterable[str], records: int) -> None:
        """Make `files` (and their entries in `dirs`) durable; raises OSError if the disk refuses."""
        if self._syncfs is not None:
            fd = os.open(self.root, _OPEN_DIR)
            try:
                if self._syncfs(fd) != 0:
                    errno = ctypes.get_errno()
                    raise OSError(errno, f"syncfs: {os.strerror(errno)}", self.root)
            finally:
                os.close(fd)
        else:
            for path in files:
                _fsync_path(path, os.O_RDONLY)
            for path in dirs:
                _fsync_path(path, _OPEN_DIR)
        with self._lock:
            self.syncs += 1
            self.synced_records += records


def _fsync_path(path: str, flags: int) -> None:
    fd = os.open(path, flags | getattr(os, "O_CLOEXEC", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
