"""What the session index answers with: each record file's header, each session's tally of its files
and its entry, and an immutable snapshot of the entries sorted by id (`IndexView`). `index` keeps them
in line with the disk."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class RecordHeader:
    """What one record file tells the index."""

    session_id: str
    parent_session_id: str | None  # already checked to be a valid id other than the session's own
    captured_at: str
    uuid: str
    server_run: str | None = None  # the run that wrote it; None for records from before runs were recorded
    # How its session was named: header, path, body, stored or inferred (None: not said).
    identified_by: str | None = None


@dataclass(frozen=True, slots=True)
class SessionEntry:
    session_id: str
    parent_session_id: str | None
    record_count: int
    first_captured_at: str
    last_captured_at: str
    runs: tuple[str | None, ...] = (None,)  # the server runs that wrote it, in order of their first record
    identified_by: str | None = None  # how its first record's session was named (RecordHeader.identified_by)

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
            # header, path, body (the client named it), stored (a stored response's), inferred (from
            # the conversation: docs/capture.md#calls-without-a-session-id), or None (older records).
            "identified_by": self.identified_by,
        }


class SessionTally:
    """A session directory's records added up one file at a time: its entry, without keeping headers.

    A file counts once, by name (a record's file is named by its uuid, and its header never
    changes). A file that could not be read is remembered, so a rescan does not read it again, and
    counts once a header for it comes (the writer wrote it anew). The parent is that of the earliest
    record naming one, and runs are ordered by their first record; ties on `captured_at` are broken
    by uuid, so every process derives the same entry whatever order it read the files in.
    """

    __slots__ = (
        "names",
        "unreadable",
        "count",
        "session_id",
        "first",
        "last",
        "parent_key",
        "run_keys",
        "touched_ns",
        "source_key",
    )

    def __init__(self, touched_ns: int = 0) -> None:
        self.touched_ns = touched_ns  # when a file was last added (the index's clock)
        self.names: set[str] = set()
        self.unreadable: set[str] | None = None
        self.count = 0
        self.session_id = ""
        self.first = self.last = ""
        self.parent_key: tuple[str, str, str] | None = None  # (captured_at, uuid, parent)
        self.run_keys: tuple[tuple[str, str, str | None], ...] = ()  # (captured_at, uuid, run), one a run
        self.source_key: tuple[str, str, str | None] | None = None  # (captured_at, uuid, how named) of the first

    def add(self, file_name: str, header: RecordHeader | None) -> None:
        if file_name in self.names:
            if header is None or not self.unreadable or file_name not in self.unreadable:
                return
            self.unreadable.discard(file_name)
        else:
            self.names.add(file_name)
            if header is None:
                if self.unreadable is None:
                    self.unreadable = set()
                self.unreadable.add(file_name)
                return
        at = header.captured_at
        if not self.count:
            self.session_id, self.first, self.last = header.session_id, at, at
        elif at < self.first:
            self.first = at
        elif at > self.last:
            self.last = at
        self.count += 1
        if header.parent_session_id is not None:
            key = (at, header.uuid, header.parent_session_id)
            if self.parent_key is None or key < self.parent_key:
                self.parent_key = key
        source_key = (at, header.uuid, header.identified_by)
        if self.source_key is None or source_key[:2] < self.source_key[:2]:
            self.source_key = source_key
        run_key = (at, header.uuid, header.server_run)
        earliest = next((key for key in self.run_keys if key[2] == header.server_run), None)
        if earliest is None or run_key < earliest:
            others = tuple(key for key in self.run_keys if key is not earliest)
            self.run_keys = tuple(sorted((*others, run_key)))

    def runs(self) -> set[str | None]:
        return {run for _, _, run in self.run_keys}

    def entry(self) -> SessionEntry | None:
        if not self.count:
            return None
        return SessionEntry(
            session_id=self.session_id,
            parent_session_id=self.parent_key[2] if self.parent_key is not None else None,
            record_count=self.count,
            first_captured_at=self.first,
            last_captured_at=self.last,
            runs=tuple(run for _, _, run in self.run_keys),
            identified_by=self.source_key[2] if self.source_key is not None else None,
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
    ) -> list[dict[str, Any]]:
        """Sessions sorted by id; `after` is the last id of the previous page."""
        return list(itertools.islice(self.iter_sessions(parent, roots_only, after), max(0, limit)))

    def iter_sessions(
        self, parent: str | None = None, roots_only: bool = False, after: str | None = None
    ) -> Iterator[dict[str, Any]]:
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

    def session_info(self, session_id: str) -> dict[str, Any] | None:
        entry = self._by_id.get(session_id)
        return entry.as_dict(self._parent_missing(entry)) if entry is not None else None

    def _parent_missing(self, entry: SessionEntry) -> bool:
        return entry.parent_session_id is not None and entry.parent_session_id not in self._by_id

    def children(self, session_id: str) -> list[str]:
        return list(self._children.get(session_id, ()))
