"""What the session index answers with: each record file's header, each session's entry, and an
immutable snapshot of them all sorted by id (`IndexView`). `index` keeps them in line with the disk."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson


@dataclass(frozen=True, slots=True)
class RecordHeader:
    """What one record file tells the index."""

    session_id: str
    parent_session_id: str | None  # already checked to be a valid id other than the session's own
    captured_at: str
    uuid: str
    server_run: str | None = None  # the run that wrote it; None for records from before runs were recorded


@dataclass(frozen=True, slots=True)
class SessionEntry:
    session_id: str
    parent_session_id: str | None
    record_count: int
    first_captured_at: str
    last_captured_at: str
    runs: tuple[str | None, ...] = (None,)  # the server runs that wrote it, in order of their first record
    # as_dict serialised, by parent_missing: an entry never changes (the index replaces it), so a
    # page of the session list joins these instead of serialising a thousand dicts each time.
    _json: list[bytes | None] = field(default_factory=lambda: [None, None], init=False, compare=False, repr=False)

    def as_json(self, parent_missing: bool = False) -> bytes:
        body = self._json[parent_missing]
        if body is None:
            body = self._json[parent_missing] = orjson.dumps(self.as_dict(parent_missing))
        return body

    def as_dict(self, parent_missing: bool = False) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "parent_session_id": self.parent_session_id,
            # The parent it names has no records (it never made a captured call, or was deleted):
            # the session is then a root for listing and export, so a trainer never loses it.
            "parent_missing": parent_missing,
            "record_count": self.record_count,
            "first_captured_at": self.first_captured_at,
            "last_captured_at": self.last_captured_at,
            # More than one: the session id was used again by a later server run (docs/capture.md#server-runs).
            "runs": list(self.runs),
        }


def summarise(headers: list[RecordHeader]) -> SessionEntry | None:
    """A session's entry from its readable records; the parent of the earliest record that names one wins.

    Ties on `captured_at` are broken by uuid, so every process derives the same parent.
    """
    if not headers:
        return None
    with_parent = [(h.captured_at, h.uuid, h.parent_session_id) for h in headers if h.parent_session_id]
    times = [h.captured_at for h in headers]
    first_of_run: dict[str | None, tuple[str, str]] = {}
    for h in headers:
        key = (h.captured_at, h.uuid)
        if h.server_run not in first_of_run or key < first_of_run[h.server_run]:
            first_of_run[h.server_run] = key
    return SessionEntry(
        session_id=headers[0].session_id,
        parent_session_id=min(with_parent)[2] if with_parent else None,
        record_count=len(headers),
        first_captured_at=min(times),
        last_captured_at=max(times),
        runs=tuple(sorted(first_of_run, key=first_of_run.__getitem__)),
    )


class IndexView:
    """One consistent snapshot of the index; never changes after it is built."""

    def __init__(self, entries: list[SessionEntry]) -> None:
        # A map added here must be patched in `updated` too (its test compares the two ways).
        self._by_id = {entry.session_id: entry for entry in entries}
        self._sorted = sorted(self._by_id)
        children: dict[str, list[str]] = {}
        for session_id in self._sorted:
            parent = self._by_id[session_id].parent_session_id
            if parent is not None:
                children.setdefault(parent, []).append(session_id)
        self._children = children

    def updated(self, changes: dict[str, SessionEntry | None]) -> IndexView:
        """A new view with these sessions replaced (None: removed); this one stays as it was.

        Costs a copy of the maps and a bisect per change, not a sort of every id: what a look pays
        when the change journal named a few directories.
        """
        view = IndexView.__new__(IndexView)
        by_id, ids, children = dict(self._by_id), list(self._sorted), dict(self._children)
        for session_id, entry in changes.items():
            old = by_id.pop(session_id, None)
            old_parent = old.parent_session_id if old is not None else None
            new_parent = entry.parent_session_id if entry is not None else None
            if old is not None and (entry is None or old_parent != new_parent) and old_parent is not None:
                siblings = [child for child in children.get(old_parent, ()) if child != session_id]
                if siblings:
                    children[old_parent] = siblings
                else:
                    children.pop(old_parent, None)
            if entry is None:
                if old is not None:
                    del ids[bisect.bisect_left(ids, session_id)]
                continue
            by_id[session_id] = entry
            if old is None:
                bisect.insort(ids, session_id)
            if new_parent is not None and (old is None or old_parent != new_parent):
                siblings = list(children.get(new_parent, ()))
                bisect.insort(siblings, session_id)
                children[new_parent] = siblings
        view._by_id, view._sorted, view._children = by_id, ids, children
        return view

    def __len__(self) -> int:
        return len(self._by_id)

    def list_sessions(
        self, parent: str | None = None, roots_only: bool = False, limit: int = 1000, after: str | None = None
    ) -> list[dict]:
        """Sessions sorted by id; `after` is the last id of the previous page."""
        return list(itertools.islice(self.iter_sessions(parent, roots_only, after), max(0, limit)))

    def iter_sessions(
        self, parent: str | None = None, roots_only: bool = False, after: str | None = None
    ) -> Iterator[dict]:
        """Sessions sorted by id after `after`, made into dicts only as they are taken."""
        for entry, missing in self.iter_entries(parent, roots_only, after):
            yield entry.as_dict(missing)

    def iter_entries(
        self, parent: str | None = None, roots_only: bool = False, after: str | None = None
    ) -> Iterator[tuple[SessionEntry, bool]]:
        """(entry, whether the parent it names is missing) of the sessions sorted by id after `after`."""
        ids: list[str] = self._children.get(parent, []) if parent is not None else self._sorted
        start = bisect.bisect_right(ids, after) if after is not None else 0
        for session_id in itertools.islice(ids, start, None):
            entry = self._by_id[session_id]
            missing = self._parent_missing(entry)
            if roots_only and entry.parent_session_id is not None and not missing:
                continue
            yield entry, missing

    def session_info(self, session_id: str) -> dict | None:
        entry = self._by_id.get(session_id)
        return entry.as_dict(self._parent_missing(entry)) if entry is not None else None

    def _parent_missing(self, entry: SessionEntry) -> bool:
        return entry.parent_session_id is not None and entry.parent_session_id not in self._by_id

    def children(self, session_id: str) -> list[str]:
        return list(self._children.get(session_id, ()))
