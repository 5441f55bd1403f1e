"""Which key wrote each session: an owner tag file in the session's folder, claimed once its first call is admitted.

The file is `sessions/<sha256(id)>/.owner`, created exclusively, so of two keys racing for one new
session id (in any worker) exactly one wins. It holds the owner tag (`server.request_owner`), never a key.
It is hidden, so the record readers never see it, and it goes with the folder when the session is
deleted. A session whose folder holds records but no such file (written while no keys were set, by
an older server, or an uncorrelated call) belongs to no key and can never be claimed: only an admin
key reads or writes it. Who may claim what is decided in `server.api.session_writes`.
"""

from __future__ import annotations

import enum
import os
import secrets
import stat
import threading
from collections import OrderedDict
from pathlib import Path

OWNER_FILE = ".owner"
# What the in-memory cache remembers for a session that holds records but no owner file.
_UNOWNED = ""
_CACHE_SIZE = 65536
_OPEN_READ = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


class Claim(enum.Enum):
    """What `SessionOwners.claim` did."""

    MADE = "made"  # the owner file is new: this claim made it (undo with `release`)
    HELD = "held"  # the tag owned the session already
    REFUSED = "refused"  # another key owns it, or it holds records without an owner


class SessionOwners:
    """`standing`, `claim` and `release` for the write rule, `owner` for readers; dir names as the store makes them."""

    def __init__(self, sessions_dir: str | Path) -> None:
        self.sessions_dir = Path(sessions_dir)
        # What this process claimed or read: a session's owner (or its having none, once it holds
        # records) never changes while its folder lives.
        self._known: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()

    def known(self, dir_name: str) -> str | None:
        """The owner remembered in memory (no file access), or None (not remembered, or unowned)."""
        with self._lock:
            tag = self._known.get(dir_name)
        return tag or None

    def known_standing(self, dir_name: str) -> str | None:
        """`standing` as remembered in memory (no file access): a tag, "" (unowned), or None (not remembered)."""
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

    def _read_owner_file(self, dir_name: str) -> str | None:
        """The owner file's tag; None when there is none (or it is not a regular file, or empty)."""
        try:
            fd = os.open(self.sessions_dir / dir_name / OWNER_FILE, _OPEN_READ)
        except OSError:
            return None
        try:
            if not _is_regular(fd):
                return None
            tag = os.read(fd, 128).decode("ascii", "replace").strip()
        finally:
            os.close(fd)
        return tag or None

    def owner(self, dir_name: str) -> str | None:
        """The tag of the key that wrote the session, or None (no such session, or written unowned)."""
        known = self.known(dir_name)
        if known is not None:
            return known
        tag = self._read_owner_file(dir_name)
        if tag is not None:
            self._remember(dir_name, tag)
        return tag

    def standing(self, dir_name: str) -> str | None:
        """The session's owner tag; "" when it holds records but no owner (nobody may claim it); None
        when it is new (no folder, or an empty one). Blocks on the disk unless remembered: a thread."""
        known = self.known_standing(dir_name)
        if known is not None:
            return known
        tag = self._read_owner_file(dir_name)
        if tag is not None:
            self._remember(dir_name, tag)
            return tag
        if not self._holds_anything(dir_name):
            return None
        tag = self._read_owner_file(dir_name)  # claimed between the two looks
        self._remember(dir_name, tag or _UNOWNED)
        return tag or _UNOWNED

    def _holds_anything(self, dir_name: str) -> bool:
        try:
            with os.scandir(self.sessions_dir / dir_name) as entries:
                return any(not entry.name.startswith(OWNER_FILE) for entry in entries)
        except (FileNotFoundError, NotADirectoryError):
            return False

    def claim(self, dir_name: str, tag: str) -> Claim:
        """Make `tag` the owner of a new session (blocks: a thread). A session that holds records
        without an owner is never claimed: it stays unowned."""
        for _ in range(3):  # a folder removed between making it and claiming it (a release, a delete): again
            standing = self.standing(dir_name)
            if standing is not None:
                return Claim.HELD if standing == tag else Claim.REFUSED
            folder = self.sessions_dir / dir_name
            folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            try:
                _link_owner_file(folder, tag)
            except (FileExistsError, FileNotFoundError):
                continue  # another claim won the race (its tag decides, on the next look), or a delete
            self._remember(dir_name, tag)
            return Claim.MADE
        return Claim.HELD if self.owner(dir_name) == tag else Claim.REFUSED

    def release(self, dir_name: str, tag: str) -> None:
        """Undo a claim this call MADE and nothing has written into since (its folder goes if empty)."""
        folder = self.sessions_dir / dir_name
        if self._read_owner_file(dir_name) != tag or self._holds_anything(dir_name):
            return
        self.forget(dir_name)
        try:
            os.unlink(folder / OWNER_FILE)
        except OSError:
            return
        try:
            folder.rmdir()
        except OSError:  # written into meanwhile (a call of the same key): the claim stays after all
            try:
                _link_owner_file(folder, tag)
            except OSError:
                return
            self._remember(dir_name, tag)


def _link_owner_file(folder: Path, tag: str) -> None:
    """Write the owner file whole under a private name, then link it into place: a reader never sees a
    half-written tag, and of two racing claims exactly one link succeeds (FileExistsError for the other)."""
    draft = folder / f"{OWNER_FILE}-{os.getpid()}-{secrets.token_hex(4)}"
    fd = os.open(draft, _CREATE, 0o600)
    try:
        os.write(fd, tag.encode("ascii"))
    finally:
        os.close(fd)
    try:
        os.link(draft, folder / OWNER_FILE)
    finally:
        _unlink_quietly(draft)


def _unlink_quietly(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _is_regular(fd: int) -> bool:
    return stat.S_ISREG(os.fstat(fd).st_mode)
