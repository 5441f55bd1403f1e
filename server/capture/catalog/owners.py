"""Which key wrote each session: an owner tag file in the session's folder, claimed by its first call.

The file is `sessions/<sha256(id)>/.owner`, created exclusively, so of two keys racing for one new
session id (in any worker) exactly one wins. It holds the owner tag (`server.owners`), never a key.
It is hidden, so the record readers never see it, and it goes with the folder when the session is
deleted. A session without the file (written while no keys were set, or by an older server) belongs
to no key: only an admin key reads it.
"""

from __future__ import annotations

import os
import stat
import threading
from collections import OrderedDict
from pathlib import Path

OWNER_FILE = ".owner"
_CACHE_SIZE = 65536
_OPEN_READ = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)


class SessionOwners:
    """`claim(dir_name, tag)` for writers, `owner(dir_name)` for readers; dir names as the store makes them."""

    def __init__(self, sessions_dir: str | Path) -> None:
        self.sessions_dir = Path(sessions_dir)
        # Claims this process made or saw: a session's owner never changes while its folder lives.
        self._known: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()

    def known(self, dir_name: str) -> str | None:
        """The owner remembered in memory (no file access), or None."""
        with self._lock:
            return self._known.get(dir_name)

    def _remember(self, dir_name: str, tag: str) -> None:
        with self._lock:
            self._known[dir_name] = tag
            self._known.move_to_end(dir_name)
            while len(self._known) > _CACHE_SIZE:
                self._known.popitem(last=False)

    def forget(self, dir_name: str) -> None:
        with self._lock:
            self._known.pop(dir_name, None)

    def owner(self, dir_name: str) -> str | None:
        """The tag of the key that wrote the session, or None (no such session, or written unowned)."""
        known = self.known(dir_name)
        if known is not None:
            return known
        path = self.sessions_dir / dir_name / OWNER_FILE
        try:
            fd = os.open(path, _OPEN_READ)
        except OSError:
            return None
        try:
            if not _is_regular(fd):
                return None
            tag = os.read(fd, 128).decode("ascii", "replace").strip()
        finally:
            os.close(fd)
        if not tag:
            return None
        self._remember(dir_name, tag)
        return tag

    def claim(self, dir_name: str, tag: str) -> bool:
        """Make `tag` the session's owner if it has none; True if `tag` owns it now (blocks: a thread)."""
        known = self.known(dir_name)
        if known is not None:
            return known == tag
        folder = self.sessions_dir / dir_name
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = folder / OWNER_FILE
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
        except FileExistsError:
            return self.owner(dir_name) == tag
        try:
            os.write(fd, tag.encode("ascii"))
        finally:
            os.close(fd)
        self._remember(dir_name, tag)
        return True


def _is_regular(fd: int) -> bool:
    return stat.S_ISREG(os.fstat(fd).st_mode)
