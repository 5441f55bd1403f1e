"""The change journal: an append-only file naming every session directory a writer just changed, so an
index learns what changed by reading the file's new bytes instead of stat-ing every session directory.

`sessions/.changes` holds one line per change: the session directory's name (64 hex digits) and a
newline. A writer appends the line after the record file is in its final place (or after a session
directory was removed), so a reader that sees the line finds the change on disk. Each append is one
`O_APPEND` write of whole lines well under PIPE_BUF: on a local filesystem the kernel places each
such write at the end of the file as one piece, so concurrent writers never interleave their lines.

A reader keeps its position and reads only what was appended since. It cannot trust the journal,
and says so (`changes()` returns None, the caller then revalidates every directory), when the file
is missing, was replaced (another inode: rotated) or shrank, or holds a line that is not a directory
name (torn by a crash, or by appends from several hosts over NFS, which has no atomic append).

The journal is a hint, never the truth: it is not synced, and a writer that does not append (an
older server, a copy made with `cp`) is seen only by the index's periodic full revalidation.
Growth: past `ROTATE_BYTES` the writer that crossed it replaces the file with an empty one.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable

JOURNAL_NAME = ".changes"  # hidden, and not a session directory name: listings pass over it
# About 64,000 changes. Each rotation costs every reader one full revalidation; nobody reads old lines.
ROTATE_BYTES = 4 * 1024 * 1024
# Bytes per write: whole lines, under PIPE_BUF (4096 on Linux), which POSIX names for atomic writes.
_WRITE_BYTES = 4096

_OPEN_APPEND = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
# O_NONBLOCK: a FIFO put in its place cannot block the open.
_OPEN_READ = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)
_OPEN_NEW = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def journal_path(sessions_dir: str | os.PathLike[str]) -> str:
    return os.path.join(os.fspath(sessions_dir), JOURNAL_NAME)


def create(sessions_dir: str | os.PathLike[str]) -> None:
    """Make the journal if it is missing, so readers use it from now on (raises OSError)."""
    os.close(os.open(journal_path(sessions_dir), _OPEN_APPEND, 0o600))


def append(sessions_dir: str | os.PathLike[str], dir_names: Iterable[str], *, rotate_bytes: int = ROTATE_BYTES) -> None:
    """Append one line per directory name; rotate the journal once it is past `rotate_bytes` (raises OSError).

    The file is opened for each append rather than kept open: a writer then never appends to a
    journal another writer has already rotated away, except within this call, and a reader that saw
    the rotation revalidates every directory after it, which finds this writer's change too.
    """
    data = "".join(f"{name}\n" for name in dir_names).encode("ascii")
    if not data:
        return
    path = journal_path(sessions_dir)
    fd = os.open(path, _OPEN_APPEND, 0o600)
    try:
        line = data.index(b"\n") + 1  # every line has the same length
        step = max(line, _WRITE_BYTES // line * line)
        for start in range(0, len(data), step):
            chunk = data[start : start + step]
            if os.write(fd, chunk) != len(chunk):
                raise OSError(f"short write to {path}")  # only a full disk does this to a regular file
        size = os.fstat(fd).st_size
    finally:
        os.close(fd)
    if size > rotate_bytes:
        rotate(sessions_dir)


def rotate(sessions_dir: str | os.PathLike[str]) -> None:
    """Replace the journal with an empty file (a new inode, which every reader notices)."""
    path = journal_path(sessions_dir)
    tmp = f"{path}.{os.getpid()}.tmp"
    os.close(os.open(tmp, _OPEN_NEW, 0o600))
    try:
        os.replace(tmp, path)
    except OSError:
        os.unlink(tmp)
        raise


def append_or_remove(sessions_dir: str | os.PathLike[str], dir_names: Iterable[str]) -> OSError | None:
    """`append`, never raising: if it fails, the journal is removed (if it can be), so readers
    revalidate every directory instead of missing these changes; the next append makes a new one."""
    try:
        append(sessions_dir, sorted(dir_names))
        return None
    except OSError as exc:
        try:
            os.unlink(journal_path(sessions_dir))
        except OSError:
            pass
        return exc


class JournalReader:
    """One reader's position in the journal. Not thread-safe: the index calls it under its refresh lock."""

    def __init__(self, sessions_dir: str | os.PathLike[str], is_name: Callable[[str], object]) -> None:
        self.path = journal_path(sessions_dir)
        self._is_name = is_name
        self._file: tuple[int, int] | None = None  # (st_dev, st_ino) of the journal being followed
        self._offset = 0

    def changes(self) -> set[str] | None:
        """The directory names appended since the last call, or None when the journal cannot say what
        changed (missing, rotated, truncated, garbled): the caller must then revalidate everything.

        Either way the position moves to the journal's end as it is now, so a revalidation that
        starts after this call, together with the lines read next time, misses nothing.
        """
        try:
            st = os.stat(self.path, follow_symlinks=False)
        except OSError:
            self._file = None
            return None
        ident = (st.st_dev, st.st_ino)
        if ident != self._file or st.st_size < self._offset:
            self._file, self._offset = ident, st.st_size
            return None
        if st.st_size == self._offset:
            return set()
        try:
            fd = os.open(self.path, _OPEN_READ)
            try:
                fst = os.fstat(fd)
                if (fst.st_dev, fst.st_ino) != ident:  # rotated between the stat and the open
                    self._file, self._offset = (fst.st_dev, fst.st_ino), fst.st_size
                    return None
                data = os.pread(fd, fst.st_size - self._offset, self._offset)
            finally:
                os.close(fd)
        except OSError:
            self._file = None
            return None
        end = data.rfind(b"\n") + 1  # a line still being written is read next time
        self._offset += end
        names: set[str] = set()
        for line in data[:end].split(b"\n")[:-1]:
            name = line.decode("ascii", "replace")
            if not self._is_name(name):
                return None
            names.add(name)
        return names
