"""Gym's file lineage resolver, made safe for a rollout whose token file is replaced by a new one on the same inode.

Gym 0.7.0's `FileLineageStore` remembers how far it has read each rollout's `<id>.tokens.jsonl` as
(inode, byte offset). Gym's collector deletes a rollout's files before every dispatch (rollout ids
repeat), and a dispatch's first call resolves no parent, so the resolver is not asked again until the
second call, when the new file exists. A file system that hands the freed inode straight back (ext4
does) makes the new file look like the old one grown or unchanged: the resolver goes on from the old
offset, misses or misreads the new dispatch's first entry and resolves against the old dispatch, so
Gym's builder masks the rollout. Gym stays as it is; this subclass also remembers the bytes of the
last line it read and, when they are no longer at that offset, reads the file from its start.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

# A line's identity: where it starts, where it ends and a digest of its bytes.
Mark = tuple[int, int, bytes]

_store_class: type | None = None


def _digest(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()


def _still_there(path: Path, mark: Mark) -> bool:
    """Whether the file at `path` holds, at the mark's offsets, the bytes the mark was taken from."""
    start, end, digest = mark
    try:
        with path.open("rb") as handle:
            handle.seek(start)
            data = handle.read(end - start)
    except OSError:
        return False
    return len(data) == end - start and _digest(data) == digest


def _build_store_class() -> type:
    from nemo_gym.token_id_capture.lineage import FileLineageStore, IncrementalLineageStore

    class DispatchSafeFileLineageStore(FileLineageStore):  # type: ignore[misc]
        """Gym's `FileLineageStore` whose cursor is (inode, offset, mark of the last line read)."""

        def _fetch_new_entries(self, rollout_id: str, cursor: Any) -> tuple[list[tuple[Any, Any]], Any]:
            mark: Mark | None = None
            if cursor is not None:
                inode, offset, mark = cursor
                if mark is not None and not _still_there(self._store.path_for(rollout_id), mark):
                    # Another file on the same inode: a new dispatch of the rollout. Gym's base
                    # class drops the rollout's cached lineage and reads again from the start.
                    raise IncrementalLineageStore.CursorReset
                cursor = (inode, offset)
            items, gym_cursor = super()._fetch_new_entries(rollout_id, cursor)
            if gym_cursor is None:
                return items, None
            inode, offset = gym_cursor
            if items:
                start = items[-1][1]
                with self._store.path_for(rollout_id).open("rb") as handle:
                    handle.seek(start)
                    mark = (start, offset, _digest(handle.read(offset - start)))
            return items, (inode, offset, mark)

    return DispatchSafeFileLineageStore


def dispatch_safe_file_lineage_store(root: str | Path, **kwargs: Any) -> Any:
    """Gym's `FileLineageStore` over `root` (a token store directory), immune to inode reuse."""
    global _store_class
    if _store_class is None:
        _store_class = _build_store_class()
    return _store_class(root, **kwargs)
