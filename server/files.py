"""Private files: atomic writes (a reader sees the old file or the whole new one, never a torn one), and
temporary folders named after their process, so a killed server's are found and removed."""

from __future__ import annotations

import contextlib
import os
import shutil
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


def process_temp_dir(prefix: str) -> str:
    """A new private folder `<prefix><pid>-<random>` in the temp directory, for this process's files.

    The folders of the same prefix whose process is gone (a server killed with SIGKILL never removes
    its own) are removed first: what they hold may be large, or secret.
    """
    _remove_orphaned_temp_dirs(prefix)
    return tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-")  # mode 0700


def _remove_orphaned_temp_dirs(prefix: str) -> None:
    """Remove the `process_temp_dir` folders of `prefix` whose process no longer runs."""
    root = tempfile.gettempdir()
    try:
        names = [name for name in os.listdir(root) if name.startswith(prefix)]
    except OSError:
        return
    for name in names:
        pid = name[len(prefix) :].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # someone else's process
        return True
    return True
