"""Reading capture files safely: regular files only, never blocked on open, never past a size cap once decompressed.

Anyone who can write into the capture directory can leave a FIFO named `*.json` (an open for
reading would wait forever for a writer), a sparse file of gigabytes, or a small compressed file
that expands to gigabytes. Every reader of record files (the index, the session API, the rollout
workers, the CLI) goes through here, so none of them hangs or runs out of memory on such a file:
it is skipped as unreadable, like a torn one.
"""

from __future__ import annotations

import logging
import os
import stat
import zlib

import zstandard

from server.logs import RateLimitedLog

# A record holds one request (at most `max_body_bytes`, 32 MiB by default, as sent) and its answer
# with token ids: far below this. A file above it, on disk or once decompressed, is not read.
MAX_RECORD_BYTES = 128 * 1024 * 1024

OPEN_READ = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)

_warnings = RateLimitedLog(logging.getLogger("switchyard_model.capture"), 60.0)


class TooBig(ValueError):
    """A file or its decompressed content is over `MAX_RECORD_BYTES`."""


def open_regular(path: str | os.PathLike[str]) -> int | None:
    """A read descriptor for `path` if it is a regular file (no symlink, FIFO, device), else None.

    O_NONBLOCK makes opening a FIFO return at once instead of waiting for a writer.
    """
    try:
        fd = os.open(path, OPEN_READ)
    except OSError:
        return None
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            return fd
    except OSError:
        pass
    os.close(fd)
    _warnings.warning("skipping %s: not a regular file", os.fspath(path))
    return None


def read_file(path: str | os.PathLike[str], limit: int = MAX_RECORD_BYTES) -> bytes | None:
    """A regular file's bytes, or None (absent, not regular, or over `limit`: sparse files included)."""
    fd = open_regular(path)
    if fd is None:
        return None
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            _warnings.warning("skipping %s: %d bytes, over the %d-byte limit", os.fspath(path), size, limit)
            return None
        chunks = []
        total = 0
        while True:
            chunk = os.read(fd, min(1 << 20, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:  # it grew while being read
                return None
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def gunzip(data: bytes, limit: int = MAX_RECORD_BYTES) -> bytes:
    """A gzip member decompressed; TooBig past `limit`, zlib.error or EOFError if damaged."""
    decompressor = zlib.decompressobj(wbits=31)
    out = decompressor.decompress(data, limit + 1)
    if len(out) > limit or decompressor.unconsumed_tail:
        raise TooBig(f"decompresses to more than {limit} bytes")
    if not decompressor.eof:
        raise EOFError("truncated gzip data")
    return out


def unzstd(decompressor: zstandard.ZstdDecompressor, data: bytes, limit: int = MAX_RECORD_BYTES) -> bytes:
    """A zstd frame decompressed; TooBig past `limit` (checked before anything is allocated when the
    frame states its size), zstandard.ZstdError if damaged."""
    declared = zstandard.frame_content_size(data)
    if declared > limit:
        raise TooBig(f"states {declared} bytes, over {limit}")
    if declared >= 0:
        return decompressor.decompress(data)
    try:
        return decompressor.decompress(data, max_output_size=limit)
    except zstandard.ZstdError as exc:
        raise TooBig(f"decompresses to more than {limit} bytes") from exc
