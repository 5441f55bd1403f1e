"""Atomic, private file writes: a reader sees the old file or the whole new one, never a torn one."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO


@contextlib.contextmanager
def atomic_writer(path: Path | str, *, mode: int = 0o600, fsync: bool = True) -> Iterator[BinaryIO]:
    """A binary handle on a temporary file beside `path`, renamed over `path` when the block ends.

    The file gets `mode` (0600 by default: capture, export and provenance files hold prompts and
    deployment details); `fsync` makes the content durable before the rename publishes it. If the
    block raises, `path` is left as it was and the temporary file is removed.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as handle:
            yield handle
            if fsync:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_atomic(path: Path | str, data: bytes, *, mode: int = 0o600, fsync: bool = True) -> None:
    """Replace `path` with `data` atomically (see `atomic_writer`)."""
    with atomic_writer(path, mode=mode, fsync=fsync) as handle:
        handle.write(data)
