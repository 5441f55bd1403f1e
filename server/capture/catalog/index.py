"""The session index: which sessions a capture directory holds, with parents, counts and times, read from disk.

The disk is the truth; memory is only a cache of it. Several processes (the workers of one server,
or a server and an offline reader) can write and read one capture directory, so before answering,
the index checks each session directory's modification time and rescans only the ones that changed.
What a record file contributes (its session, parent and time) is read once per process and added
to its directory's tally (`SessionTally`); a directory quiet for `TALLY_KEPT_S` keeps only its
entry, so memory grows with the sessions, not the calls.

A directory whose mtime is within `racy_window_ns` of when it was last scanned is rescanned on every
look, however its mtime reads: file times come from a coarse clock, so a file added in the same tick
as the scan could leave the mtime unchanged. Once a directory has been quiet longer than the window,
any later change moves its mtime. (Git's "racily clean" rule, for the same reason.)

With a change journal (`journal.py`: every writer names the directory it changed in one shared
append-only file), a look reads the journal's new lines and rescans only the directories they name,
instead of stat-ing every directory. For writers that do not append (an older server, a copy), a
rolling sweep still checks every directory as above, a slice per look, once per half of
`full_revalidation_s`, so their changes appear within about that long and no single look pays for
all directories; between looks the store's keeper thread carries the sweep on (`keep_up`). When
the journal cannot say what changed (missing, rotated, truncated, garbled), the look checks every
directory at once. The types the index answers with are in `index_view`.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from server.capture.catalog.index_view import IndexView, RecordHeader, SessionEntry, SessionTally
from server.capture.write.marks import read_mark

# A directory modified this recently is rescanned every time. Covers the filesystem clock's tick
# and modest clock differences between a network filesystem's server and this host.
RACY_WINDOW_NS = 2_000_000_000
# With a change journal: records from a writer that does not append to it appear within about this
# long (the rolling sweep checks every directory, a slice per look, once per half of it). Long,
# because each check is a stat and some Python under the GIL (about 25 us) in a server serving
# streams: on 10,000 sessions, 5 s meant about 0.1 s of it per second of reading; 30 s, 17 ms.
FULL_REVALIDATION_S = 30.0
# How often the store keeps the sweep going between looks (`SessionIndex.keep_up`).
KEEP_UP_INTERVAL_S = 0.25
# A session with no record added for this long keeps only its entry: the index lets go of its tally
# (every file name, about 120 bytes a record), and counts its files again if it ever changes. Memory
# then grows with the sessions, not the calls; a session written to again after this long costs the
# next look one read of each of its record headers (about 5 ms for 200 records, off the event loop).
TALLY_KEPT_S = 15.0


@contextlib.contextmanager
def _open_dir(path: str) -> Iterator[int | None]:
    """The directory open for `dir_fd` stats (no path to build or resolve per session), or None."""
    try:
        fd: int | None = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        fd = None
    try:
        yield fd
    finally:
        if fd is not None:
            os.close(fd)


def _entry_of_lost_session(path: str, dir_name: str) -> SessionEntry | None:
    """A session that has no record but a capture-failure mark (every record was lost, e.g. to a full
    disk): listed with no records, so it never reads as a session that did not run."""
    mark = read_mark(Path(path))
    session_id = mark.get("session_id") if mark is not None else None
    # The mark's id must be the one the directory is named after: a mark cannot speak for another session.
    if not isinstance(session_id, str) or hashlib.sha256(session_id.encode("utf-8")).hexdigest() != dir_name:
        return None
    assert mark is not None
    first, last = mark.get("first_lost_at"), mark.get("last_lost_at")
    return SessionEntry(
        session_id=session_id,
        parent_session_id=None,
        record_count=0,
        first_captured_at=first if isinstance(first, str) else "",
        last_captured_at=last if isinstance(last, str) else "",
        runs=(),
    )


@dataclass(slots=True)
class _DirState:
    mtime_ns: int
    scanned_ns: int  # wall clock just before the scan that produced `entry`
    entry: SessionEntry | None


class SessionIndex:
    """Sessions under `sessions_dir`, derived from the record files and cached by directory mtime.

    `list_files(dir)` gives a session directory's record files; `read_header(path, dir_name)` reads
    one (None if unreadable or foreign). With `revalidate=False` the disk is read once, on the first
    look, and afterwards only this process's own writes (`note_written`) are seen: correct only for a
    directory that one process owns alone. `journal_changes` is a `JournalReader.changes`: the
    directories changed since the last call, or None when everything must be revalidated.
    """

    def __init__(
        self,
        sessions_dir: str | os.PathLike[str],
        *,
        list_files: Callable[[str], list[str]],
        read_header: Callable[[str, str], RecordHeader | None],
        is_session_dir_name: Callable[[str], bool],
        on_skipped: Callable[[int], None] = lambda n: None,
        revalidate: bool = True,
        racy_window_ns: int = RACY_WINDOW_NS,
        journal_changes: Callable[[], set[str] | None] | None = None,
        full_revalidation_s: float = FULL_REVALIDATION_S,
        tally_kept_s: float = TALLY_KEPT_S,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self.sessions_dir = os.fspath(sessions_dir)
        self.revalidate = revalidate
        self._list_files = list_files
        self._read_header = read_header
        self._is_session_dir_name = is_session_dir_name
        self._on_skipped = on_skipped
        self._racy_window_ns = racy_window_ns
        self._journal_changes = journal_changes
        self._clock = clock
        self._tally_kept_ns = int(tally_kept_s * 1e9)
        # The rolling sweep (with a journal): the directories listed when it began, how far it got.
        self._sweep_period_ns = int(full_revalidation_s * 1e9) // 2
        self._sweep: list[str] = []
        self._sweep_pos = 0
        self._sweep_began_ns = 0
        self._last_look_ns = -(1 << 62)  # when a reader last asked for a view (keep_up works only after)
        self._next_let_go_ns = 0  # when keep_up next looks for quiet tallies
        self.full_revalidations = 0  # looks that checked every directory at once (for tests)
        self.checked_dirs = 0  # directories stat-ed so far (for tests)

        self._refresh_lock = threading.Lock()  # one refresh at a time; its file I/O runs under it
        self._lock = threading.Lock()  # guards the maps below; held only briefly
        self._loaded = False
        self._top: _DirState | None = None  # the sessions/ directory itself (entry unused)
        self._top_names: list[str] = []
        self._dirs: dict[str, _DirState] = {}
        # Per session directory: its files added up (each read once), while it is recent or written to.
        self._tallies: dict[str, SessionTally] = {}
        self._dirty: set[str] = set()  # directories this process wrote to since the last look
        self._last_refresh_began_ns = -1  # monotonic
        self._view: IndexView | None = None
        # Changes refreshes found since the last look, applied to the view only when someone looks:
        # each application copies the view's maps (a megabyte or so at 10,000 sessions), and the
        # keeper refreshes four times a second.
        self._unviewed: dict[str, SessionEntry | None] = {}

    # ---- what readers call -------------------------------------------------------------------

    def view(self) -> IndexView:
        """The index as the disk has it now (or, without revalidation, as this process left it)."""
        self._last_look_ns = self._clock()
        if self.revalidate or not self._loaded:
            self.refresh()
        else:
            self._apply_own_writes()
        with self._lock:
            if self._view is None:
                self._view = IndexView([state.entry for state in self._dirs.values() if state.entry is not None])
            elif self._unviewed:
                self._view = self._view.updated(self._unviewed)
            self._unviewed = {}
            return self._view

    def __len__(self) -> int:
        with self._lock:
            if self._view is not None and not self._unviewed:
                return len(self._view)
            return sum(1 for s in self._dirs.values() if s.entry is not None)

    @property
    def sweeps(self) -> bool:
        """Whether looks follow the change journal, with the rolling sweep for writers that do not append."""
        return self.revalidate and self._journal_changes is not None and self._sweep_period_ns > 0

    def keep_up(self) -> None:
        """Between looks, do what the next look would: read the journal and check the sweep's slice.

        Called every `KEEP_UP_INTERVAL_S` by the store. Without it, the first look after a pause
        longer than the sweep's period checks every directory at once (10,000 stats, ~0.1 s of a
        thread holding the GIL in turns, felt by the calls being served); kept up, each tick checks
        about 170 of them. Only while looks come (within two full periods of the last): an idle index
        stats nothing. Looks or not, it lets go of the tallies of sessions quiet for `tally_kept_s`,
        so a server nobody reads from does not keep a name for every record it wrote.
        """
        now = self._clock()
        # Not while a refresh runs: a scan adds to the tally it started from.
        if self.revalidate and now >= self._next_let_go_ns and self._refresh_lock.acquire(blocking=False):
            try:
                self._next_let_go_ns = now + self._tally_kept_ns // 4
                with self._lock:
                    kept = self._tally_kept_ns
                    for name in [name for name, tally in self._tallies.items() if now - tally.touched_ns > kept]:
                        del self._tallies[name]  # if written since the last look, it is dirty: counted anew
            finally:
                self._refresh_lock.release()
        if not (self.sweeps and self._loaded):
            return
        if self._clock() - self._last_look_ns > 4 * self._sweep_period_ns:
            return
        self.refresh()

    # ---- what the writer calls ---------------------------------------------------------------

    def note_written(self, dir_name: str, file_name: str, header: RecordHeader) -> set[str | None] | None:
        """A record this process just wrote: its header is known, so no rescan needs to parse it.

        Returns the runs known in the directory before it when it is the first record of its run
        there that this process knows of (so the writer can warn of a reused session), else None.
        """
        with self._lock:
            tally = self._tallies.get(dir_name)
            if tally is None:
                tally = self._tallies[dir_name] = SessionTally()
            earlier = None
            if header.server_run not in tally.runs():  # the usual case answers here
                known = self._known_runs(dir_name)
                earlier = known if header.server_run not in known else None
            tally.add(file_name, header)
            tally.touched_ns = self._clock()
            self._dirty.add(dir_name)
            return earlier

    def known_runs(self, dir_name: str) -> set[str | None]:
        """The runs of the records this process knows in a session directory (from its scans and its
        own writes); reads nothing."""
        with self._lock:
            return self._known_runs(dir_name)

    def _known_runs(self, dir_name: str) -> set[str | None]:
        tally, state = self._tallies.get(dir_name), self._dirs.get(dir_name)
        runs = tally.runs() if tally is not None else set()
        if state is not None and state.entry is not None:
            runs.update(state.entry.runs)
        return runs

    def forget(self, dir_name: str) -> None:
        """A session directory this process just removed."""
        with self._lock:
            self._tallies.pop(dir_name, None)
            self._dirty.discard(dir_name)
            if self._dirs.pop(dir_name, None) is not None:
                self._view = None
            if self._top is not None:
                self._top_names = [name for name in self._top_names if name != dir_name]

    # ---- refreshing --------------------------------------------------------------------------

    def refresh(self) -> None:
        """Bring the cache in line with the disk, rescanning only directories whose mtime moved.

        Concurrent callers share work: one that waited for the lock while another refresh ran from
        start to end takes that refresh's result, which saw the disk as it was after the call began.
        """
        asked_ns = self._clock()
        with self._refresh_lock:
            if self._last_refresh_began_ns > asked_ns:
                return
            self._last_refresh_began_ns = began_ns = self._clock()
            started_ns = time.time_ns()
            # Read before any directory is looked at: a change appended later is read next time.
            changes = self._journal_changes() if self._journal_changes is not None else None
            if changes is not None and self._loaded and self._sweep_period_ns > 0:
                self._follow(changes, began_ns, started_ns)
                return
            names = self._session_dir_names(started_ns)
            with self._lock:
                old, dirty = dict(self._dirs), set(self._dirty)
                self._dirty.clear()
            fresh: dict[str, _DirState] = {}
            changed = set(old) != set(names)
            with _open_dir(self.sessions_dir) as top_fd:
                changed = self._revalidate(names, old, dirty, fresh, top_fd, started_ns) or changed
            with self._lock:
                self._dirs = fresh
                for gone in set(self._tallies) - set(fresh):
                    if gone not in self._dirty:
                        del self._tallies[gone]
                if changed:
                    self._view = None
                self._loaded = True
                self.full_revalidations += 1
            self._sweep, self._sweep_pos, self._sweep_began_ns = [], 0, began_ns

    def _follow(self, changes: set[str], now_ns: int, started_ns: int) -> None:
        """A look with the journal: rescan the directories it named and this process wrote to, and
        check the rolling sweep's next slice (in proportion to the time since the sweep began)."""
        check: set[str] = set()
        period = self._sweep_period_ns
        for _ in range(2):  # after a long quiet spell: finish the sweep, and make a whole new one
            if self._sweep_pos >= len(self._sweep) and now_ns - self._sweep_began_ns >= period:
                listed = list(self._session_dir_names(started_ns))
                with self._lock:
                    check.update(set(self._dirs).symmetric_difference(listed))  # new ones scanned, gone ones dropped
                self._sweep, self._sweep_pos = listed, 0
                self._sweep_began_ns = max(self._sweep_began_ns + period, now_ns - period)
            elapsed = max(0, now_ns - self._sweep_began_ns)
            due = len(self._sweep) if elapsed >= period else -(-len(self._sweep) * elapsed // period)
            check.update(self._sweep[self._sweep_pos : due])
            self._sweep_pos = max(self._sweep_pos, due)
        self._update(check, changes, started_ns)

    def _update(self, check: set[str], changed: set[str], started_ns: int) -> None:
        """Check `check` by mtime, rescan `changed` and this process's own writes whatever their mtime."""
        with self._lock:
            forced = {name for name in changed | self._dirty if self._is_session_dir_name(name)}
            self._dirty.clear()
            names = check | forced
            if not names:
                return
            # Only the named directories: a copy of the whole map per read would cost O(sessions).
            old = {name: self._dirs[name] for name in names if name in self._dirs}
        fresh: dict[str, _DirState] = {}
        with _open_dir(self.sessions_dir) as top_fd:
            # A directory that is gone (deleted) is simply not put back.
            self._revalidate(list(names), old, forced, fresh, top_fd, started_ns)
        by_session: dict[str, SessionEntry | None] = {}
        for name in names:
            before, after = old.get(name), fresh.get(name)
            entry_before = before.entry if before is not None else None
            entry_after = after.entry if after is not None else None
            either = entry_after or entry_before
            if either is not None and entry_before != entry_after:
                by_session[either.session_id] = entry_after
        with self._lock:
            for name in names:
                state = fresh.get(name)
                if state is not None:
                    self._dirs[name] = state
                    continue
                self._dirs.pop(name, None)
                if name not in self._dirty:
                    self._tallies.pop(name, None)
            if by_session and self._view is not None:
                self._unviewed.update(by_session)

    def _revalidate(
        self,
        names: list[str],
        old: dict[str, _DirState],
        dirty: set[str],
        fresh: dict[str, _DirState],
        top_fd: int | None,
        started_ns: int,
    ) -> bool:
        """Fill `fresh` with every session directory's state, rescanning the changed ones; True if any changed."""
        changed = False
        self.checked_dirs += len(names)
        for name in names:
            path = os.path.join(self.sessions_dir, name)
            try:
                if top_fd is not None:
                    st = os.stat(name, dir_fd=top_fd, follow_symlinks=False)
                else:
                    st = os.stat(path, follow_symlinks=False)
            except OSError:
                changed = True
                continue
            if not stat.S_ISDIR(st.st_mode):
                continue
            state = old.get(name)
            if state is not None and name not in dirty and self._still_valid(state, st.st_mtime_ns):
                fresh[name] = state
            else:
                entry = self._scan_dir(name, path)
                fresh[name] = _DirState(st.st_mtime_ns, started_ns, entry)
                changed = changed or state is None or state.entry != entry
            if self.revalidate and started_ns - st.st_mtime_ns > self._tally_kept_ns:
                self._let_tally_go(name)  # no file added for long: at once (a restart reads old sessions)
        return changed

    def _still_valid(self, state: _DirState, mtime_ns: int) -> bool:
        return mtime_ns == state.mtime_ns and mtime_ns < state.scanned_ns - self._racy_window_ns

    def _session_dir_names(self, started_ns: int) -> list[str]:
        try:
            mtime_ns = os.stat(self.sessions_dir).st_mtime_ns
        except OSError:
            self._top, self._top_names = None, []
            return []
        if self._top is not None and self._still_valid(self._top, mtime_ns):
            return self._top_names
        try:
            with os.scandir(self.sessions_dir) as entries:
                names = [entry.name for entry in entries if self._is_session_dir_name(entry.name)]
        except OSError:
            names = []
        self._top, self._top_names = _DirState(mtime_ns, started_ns, None), names
        return names

    def _scan_dir(self, dir_name: str, path: str) -> SessionEntry | None:
        """Add up a session directory's files, reading only those its tally has not counted yet."""
        with self._lock:  # before listing: every name known now is a file already in place
            tally = self._tallies.get(dir_name)
            known = set(tally.names) if tally is not None else set()
        files = {os.path.basename(file_path): file_path for file_path in self._list_files(path)}
        recount = not known.issubset(files)  # a counted file is gone: count the directory again
        read = [
            (name, self._read_header(file_path, dir_name))
            for name, file_path in files.items()
            if recount or name not in known
        ]
        skipped = sum(1 for _, header in read if header is None)
        with self._lock:
            current = self._tallies.get(dir_name)
            if recount or current is None:
                new = SessionTally(self._clock())
                if current is not None and not current.names.issubset(known | files.keys()):
                    self._dirty.add(dir_name)  # a file written after the listing: the next look reads it
                current = self._tallies[dir_name] = new
            for name, header in read:
                current.add(name, header)  # a name the writer noted meanwhile counts once
            if read:
                current.touched_ns = self._clock()
            entry = current.entry()
        if skipped:
            self._on_skipped(skipped)
        return entry if entry is not None else _entry_of_lost_session(path, dir_name)

    def _let_tally_go(self, dir_name: str) -> None:
        """A quiet directory keeps only its entry; a later change counts its files again."""
        if dir_name not in self._tallies:  # most checks: already let go (a dict lookup needs no lock)
            return
        with self._lock:
            if dir_name not in self._dirty:
                self._tallies.pop(dir_name, None)

    def _apply_own_writes(self) -> None:
        """Without revalidation: fold this process's own writes into the cache, reading nothing."""
        with self._lock:
            if not self._dirty:
                return
            for name in self._dirty:
                tally = self._tallies.get(name)
                state = self._dirs.get(name)
                entry = tally.entry() if tally is not None else None
                if state is None:
                    self._dirs[name] = _DirState(-1, 0, entry)
                else:
                    state.entry = entry
            self._dirty.clear()
            self._view = None
