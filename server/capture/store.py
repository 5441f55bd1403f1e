"""The capture store: one file per call under sessions/<sha256(id)>/, written, indexed, read back, deleted.

It both writes (through write/) and reads (through read/), so it sits above both, in capture/.

Writing (the queue, the writer thread, syncs, failure marks) is `writer.RecordWriter`'s job; the
`.delta` file format (a record as what it adds to an earlier one) is `diff`'s; reading record
files is `record_files`'s (its session-id checks and errors are re-exported here for callers).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import threading
import time
import uuid as uuid_module
from collections.abc import Callable
from pathlib import Path
from typing import Any

from server.capture.catalog.index import FULL_REVALIDATION_S, KEEP_UP_INTERVAL_S, SessionIndex
from server.capture.catalog.index_view import IndexView
from server.capture.catalog.runs import LEGACY
from server.capture.catalog.session_owners import Claim, SessionOwners
from server.capture.read.record_files import InvalidSessionId as InvalidSessionId
from server.capture.read.record_files import UnknownSession as UnknownSession
from server.capture.read.record_files import check_session_id as check_session_id
from server.capture.read.record_files import (
    header_of,
    peek_head,
    read_header,
    record_files,
    record_key,
)
from server.capture.read.record_files import read_session_records as read_session_records
from server.capture.read.record_files import session_dir_name as session_dir_name
from server.capture.write import journal
from server.capture.write.diff import DIFF_SUFFIX
from server.capture.write.record import CaptureRecord, RecordHead, RecordInput, validate_record
from server.capture.write.writer import CALL, RECORD, RecordWriter
from server.ids import is_valid_session_id, uncorrelated_session_id
from server.logs import RateLimitedLog

log = logging.getLogger("switchyard_model.capture")

SESSIONS_SUBDIR = "sessions"
_SESSION_DIR_NAME = re.compile(r"[0-9a-f]{64}")
# A record's uuid becomes its file name: same charset as session ids, so never hidden or a path.
_RECORD_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")


class CaptureStore:
    """Writes capture records off the event loop and serves them back by session.

    Several processes may write and read one capture directory (the workers of one server): every
    read goes to the disk, and the session index is a cache of it, brought up to date on each look
    from the change journal (the directories other writers named since the last look), and every
    `full_revalidation_s` against every directory's mtime (`shared_index=False` trusts memory
    instead: only for a directory one process owns alone). `change_journal=False` neither appends
    to the journal nor reads it, as an older server did: every look then revalidates every directory.
    """

    def __init__(
        self,
        capture_dir: str | Path,
        *,
        queue_size: int = 10000,
        capture_uncorrelated: bool = False,
        compress: bool = False,
        encoding: str = "full",
        shared_index: bool = True,
        fsync: str = "batch",
        fsync_window_ms: float = 10.0,
        server_run: str | None = None,
        change_journal: bool = True,
        full_revalidation_s: float = FULL_REVALIDATION_S,
        index_clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self.capture_dir = Path(capture_dir)
        # The id of this server run, written into every record it builds (docs/capture.md#server-runs).
        self.server_run = server_run
        # Opt-in compact encoding: `<uuid>.json.gz` (gzip, level 1). Both kinds are always read, so
        # the setting can change between runs on one directory; readers that know only the plain
        # `.json` layout see only the uncompressed records.
        self.compress = compress
        self.sessions_dir = self.capture_dir / SESSIONS_SUBDIR
        self.capture_uncorrelated = capture_uncorrelated
        self._read_only = False
        self.change_journal = change_journal

        self._state_lock = threading.Lock()  # started/closed
        self._started = False
        self._closed = False
        # The first scan of what earlier runs recorded runs on a thread of its own (see `start`).
        self._index_scan: threading.Thread | None = None
        self._indexed = threading.Event()
        self._stopping = threading.Event()  # ends the index keeper
        self._keeper: threading.Thread | None = None
        # First writes into a session made before that scan finished: their check for a session
        # reused across runs waits for it (the runs already there are not known before).
        self._reuse_checks_lock = threading.Lock()
        self._pending_reuse_checks: list[tuple[str, str | None, str]] = []

        self._index = SessionIndex(
            self.sessions_dir,
            list_files=record_files,
            read_header=read_header,
            is_session_dir_name=_SESSION_DIR_NAME.fullmatch,  # type: ignore[arg-type]
            on_skipped=lambda n: self._count("_skipped", n),
            revalidate=shared_index,
            journal_changes=(
                journal.JournalReader(self.sessions_dir, _SESSION_DIR_NAME.fullmatch).changes
                if change_journal and shared_index
                else None
            ),
            full_revalidation_s=full_revalidation_s,
            clock=index_clock,
        )
        self.writer = RecordWriter(
            self.capture_dir,
            self.sessions_dir,
            session_dir_name=session_dir_name,
            on_new_record=self._note,
            io_lock=threading.Lock(),
            on_batch_written=self._journal_append,
            queue_size=queue_size,
            compress=compress,
            encoding=encoding,
            fsync=fsync,
            fsync_window_ms=fsync_window_ms,
        )

        self.owners = SessionOwners(self.sessions_dir)  # which key wrote each session, when keys are set

        self._count_lock = threading.Lock()
        self._skipped = 0
        self._rejected = 0
        self._uncorrelated = 0
        self._journal_failed = 0
        # One limiter per kind of trouble, so a flood of one never hides the first of another.
        self._errors = RateLimitedLog(log, 30.0)  # each kind of failure logged at most every 30 s

    @classmethod
    def open_read_only(cls, capture_dir: str | Path) -> CaptureStore:
        """A store that indexes an existing directory and never writes, creates or deletes anything."""
        store = cls(capture_dir, queue_size=1)
        store._read_only = True
        store._closed = True
        store.writer.close(0, write_queued=False)  # every submit is refused
        store._index.refresh()
        store._indexed.set()
        return store

    # ---- lifecycle -------------------------------------------------------------------------

    def start(self, *, index_in_background: bool = False) -> None:
        """Start the writer, then index what is already on disk. Idempotent.

        `index_in_background` (the server's choice): the index is built on a thread of its own, so
        a restart on a large directory answers calls at once instead of after reading every
        record's head; a reader of the index (the session list, a rollout) waits for that first
        scan, since the index's refresh lock is held through it, so no reader sees a partial list.
        """
        with self._state_lock:
            if self._started:
                return
            if self._closed:
                raise RuntimeError("capture store is closed")
            self._started = True
        self.writer.start()
        if self.change_journal:
            try:
                journal.create(self.sessions_dir)  # readers follow it from now on
            except OSError as exc:
                self._errors.warning("capture change journal not usable: %s", exc)
        if self._index.revalidate:
            self._keeper = threading.Thread(target=self._keep_index_up, name="capture-index-keeper", daemon=True)
            self._keeper.start()
        if not index_in_background:
            self._index_existing()
            return
        self._index_scan = threading.Thread(target=self._index_existing, name="capture-index", daemon=True)
        self._index_scan.start()

    def _keep_index_up(self) -> None:
        """The index kept up between reads: its rolling sweep advanced, quiet tallies let go (`keep_up`)."""
        while not self._stopping.wait(KEEP_UP_INTERVAL_S):
            try:
                self._index.keep_up()
            except Exception:  # a read will meet the same trouble and report it; this thread stays
                log.debug("index keep-up failed", exc_info=True)

    def _index_existing(self) -> None:
        try:
            self._index.refresh()  # on the background thread, a failure is reported by threading's hook
        finally:  # readers refresh on their own; the held-back reuse checks are made either way
            with self._reuse_checks_lock:
                self._indexed.set()
                pending, self._pending_reuse_checks = self._pending_reuse_checks, []
            for session_id, run, dir_name in pending:
                self._warn_if_reused(session_id, run, self._index.known_runs(dir_name))

    def wait_indexed(self, timeout: float | None = None) -> bool:
        """Wait until what earlier runs recorded is in the index (the first scan); False on timeout."""
        return self._indexed.wait(timeout)

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until everything submitted so far is in its file. False on timeout or if not running."""
        return self.writer.flush(timeout)

    def close(self, timeout: float = 10.0) -> None:
        """Write what is queued, sync it, then stop. Idempotent; later submits are dropped."""
        with self._state_lock:
            if self._closed:
                return
            self._closed = True
        self._stopping.set()
        if self._keeper is not None:
            self._keeper.join(timeout)
        self.writer.close(timeout, write_queued=not self._read_only)
        if self._index_scan is not None:  # its deferred warnings belong to this run's log
            self._index_scan.join(timeout)

    # ---- submitting ------------------------------------------------------------------------

    def submit_call(self, call: RecordInput) -> bool:
        """Queue one call without waiting for it (any thread, never blocks). False if not accepted.

        Its `chat_request` / `chat_response` are handed over (see `RecordInput`).
        """
        accepted = self._accepted(call)
        return accepted is not None and self.writer.enqueue(CALL, accepted)

    async def write_call(self, call: RecordInput, *, timeout: float = 30.0) -> bool:
        """Queue one call and wait until its record is in its file (synced too under `fsync: always`).

        True when the record is kept; False when it was not captured (uncorrelated), could not be
        written, was dropped, or `timeout` passed first (it may still be written later). The event
        loop never blocks: the writer thread ends the wait. The dicts are handed over as in
        `submit_call`.
        """
        accepted = self._accepted(call)
        if accepted is None:
            return False
        return await self.writer.write(CALL, accepted, timeout)

    def _accepted(self, call: RecordInput) -> RecordInput | None:
        """The call made ready for its record (this run, sane ids; it is handed over, so changed in
        place), or None when it is not captured."""
        if not is_valid_session_id(call.session_id):
            if not self.capture_uncorrelated:
                self._count("_uncorrelated")
                return None
            # Each uncorrelated call is its own session: nothing ties it to any other call.
            call.record_uuid = call.record_uuid or str(uuid_module.uuid4())
            call.session_id = uncorrelated_session_id(call.record_uuid)
            call.parent_session_id = None
        elif call.parent_session_id is not None and not is_valid_session_id(call.parent_session_id):
            call.parent_session_id = None
        call.server_run = self.server_run
        return call

    def submit(self, record: CaptureRecord) -> bool:
        """Queue a prebuilt record. False (and counted) if it is malformed, the queue is full or closed."""
        problem = validate_record(record)
        if problem is None and not _RECORD_NAME.fullmatch(record["uuid"]):
            problem = "uuid is not usable as a file name"
        if problem is not None:
            self._count("_rejected")
            self._errors.error("capture record rejected: %s", problem)
            return False
        return self.writer.enqueue(RECORD, record)

    # ---- capture's own health ----------------------------------------------------------------

    @property
    def degraded(self) -> bool:
        """True while capture cannot write (a record, a sync or a lost-record mark failed, and no write has worked since)."""
        return self.writer.degraded_reason is not None

    def lost_records(self, session_id: str) -> int:
        """How many records this session lost to capture failures (this run, or any earlier one)."""
        return self.writer.lost.lost(session_dir_name(check_session_id(session_id)))

    # ---- index -----------------------------------------------------------------------------

    def _note(self, record: CaptureRecord, name: str) -> None:
        """Tell the index about a record this process wrote, so no rescan has to parse it again."""
        dir_name = session_dir_name(record["session_id"])
        header = header_of(record)
        earlier = self._index.note_written(dir_name, name, header)
        if earlier is not None:  # this run's first record in the session
            with self._reuse_checks_lock:
                check_now = self._indexed.is_set()
                if not check_now:
                    self._pending_reuse_checks.append((record["session_id"], header.server_run, dir_name))
            if check_now:
                self._warn_if_reused(record["session_id"], header.server_run, earlier)

    def _warn_if_reused(self, session_id: str, run: str | None, known: set[str | None]) -> None:
        """Once per session and run: say so when this run writes into a session an earlier run wrote."""
        earlier = known - {run}
        if not earlier:
            return
        shown = ", ".join(sorted(r or LEGACY for r in earlier))
        log.warning(
            "session %r was already written by an earlier server run (%s); server run %s now writes into it. Its "
            "rollout covers its latest conversation by default; ?run=all merges the runs (docs/capture.md#server-runs)",
            session_id[:200],
            shown,
            run or LEGACY,
        )

    def _journal_append(self, dir_names: set[str]) -> None:
        """Name changed directories in the change journal (the writer thread, once per batch; never raises)."""
        if self.change_journal and (error := journal.append_or_remove(self.sessions_dir, dir_names)) is not None:
            self._count("_journal_failed")
            self._errors.error("capture change journal append failed: %s", error)

    # ---- reads (sync; HTTP handlers call them from a worker thread) --------------------------

    def index_view(self) -> IndexView:
        """The session index as the disk has it now: one consistent snapshot for a whole request."""
        return self._index.view()

    def list_sessions(
        self,
        parent: str | None = None,
        roots_only: bool = False,
        limit: int = 1000,
        after: str | None = None,
    ) -> list[dict[str, Any]]:
        """Sessions sorted by id; `after` is the last id of the previous page."""
        return self._index.view().list_sessions(parent=parent, roots_only=roots_only, limit=limit, after=after)

    def session_info(self, session_id: str) -> dict[str, Any] | None:
        return self._index.view().session_info(session_id)

    def children(self, session_id: str) -> list[str]:
        return self._index.view().children(session_id)

    def read_completions(self, session_id: str) -> tuple[list[CaptureRecord], int]:
        """The session's records ordered by (captured_at, uuid), and how many files were skipped."""
        return read_session_records(self.sessions_dir, session_id)

    def session_bytes(self, session_id: str) -> int:
        """How many bytes the session's record files hold (0 if it has none): what a full read costs."""
        directory = os.path.join(self.sessions_dir, session_dir_name(check_session_id(session_id)))
        total = 0
        for path in record_files(directory):
            try:
                total += os.stat(path, follow_symlinks=False).st_size
            except OSError:
                continue
        return total

    def read_record_heads(self, session_id: str) -> list[RecordHead] | None:
        """The small leading fields of each of the session's records (ids, times, model, route, latency,
        validity, finish reason, token counts), read from each file's first block, in record order.

        None when any file is not one this server wrote whole with its token counts set (compressed,
        foreign, torn, counts missing): the caller then reads the records in full.
        """
        directory = os.path.join(self.sessions_dir, session_dir_name(check_session_id(session_id)))
        if os.path.islink(directory) or not os.path.isdir(directory):
            raise UnknownSession(session_id)
        heads = []
        for path in record_files(directory):
            head = peek_head(path) if path.endswith((".json", DIFF_SUFFIX)) else None
            if head is None:
                return None
            if head.get("session_id") != session_id:
                continue  # filed under another session: not served here (as in read_session_records)
            heads.append(head)
        heads.sort(key=record_key)
        return heads

    def delete_session(self, session_id: str) -> int:
        """Remove a session's files and directory; returns how many records were removed."""
        check_session_id(session_id)
        if self._read_only:
            raise RuntimeError("capture store is read-only")
        directory = self.sessions_dir / session_dir_name(session_id)
        with self.writer.io_lock:
            if directory.is_symlink() or not directory.is_dir():
                raise UnknownSession(session_id)
            count = len(record_files(str(directory)))
            shutil.rmtree(directory)
            if self.writer.diff is not None:
                self.writer.diff.forget(session_id)
            self.writer.made_dirs.discard(str(directory))
            self._index.forget(directory.name)
            self.owners.forget(directory.name)
            self._journal_append({directory.name})  # so other processes drop it at once
        return count

    def session_owner(self, session_id: str) -> str | None:
        """The owner tag of the key that wrote the session (None: unowned or absent)."""
        return self.owners.owner(session_dir_name(check_session_id(session_id)))

    def session_standing(self, session_id: str) -> str | None:
        """Its owner tag; "" when it holds records but no owner; None when new (blocks: a thread)."""
        return self.owners.standing(session_dir_name(check_session_id(session_id)))

    def claim_session(self, session_id: str, tag: str) -> Claim:
        """Make `tag` the owner of a new session (blocks: a thread); see `SessionOwners.claim`."""
        if self._read_only:
            raise RuntimeError("capture store is read-only")
        return self.owners.claim(session_dir_name(check_session_id(session_id)), tag)

    def release_session(self, session_id: str, tag: str) -> None:
        """Undo a claim that `claim_session` MADE for a call that was then refused (blocks: a thread)."""
        self.owners.release(session_dir_name(check_session_id(session_id)), tag)

    def known_claim(self, session_id: str) -> str | None:
        """The owner remembered in memory, if any (never touches the disk: safe on the event loop)."""
        return self.owners.known(session_dir_name(session_id))

    def known_standing(self, session_id: str) -> str | None:
        """`session_standing` as remembered in memory, or None when not remembered (never touches the disk)."""
        return self.owners.known_standing(session_dir_name(session_id))

    # ---- counters ----------------------------------------------------------------------------

    def _count(self, name: str, n: int = 1) -> None:
        with self._count_lock:
            setattr(self, name, getattr(self, name) + n)

    def stats(self) -> dict[str, Any]:
        """Counters for /health and telemetry; plain reads, no locks taken."""
        writer = self.writer
        counts = writer.counts
        return {
            "status": "degraded" if writer.degraded_reason is not None else "ok",
            "server_run": self.server_run,
            "degraded_reason": writer.degraded_reason,
            "written": counts["written"],
            "failed": counts["failed"],
            "dropped": counts["dropped"],
            "timed_out": counts["timed_out"],
            "queue_depth": writer.queue_depth(),
            "skipped": self._skipped,
            "rejected": self._rejected,
            "uncorrelated": self._uncorrelated,
            "journal_failed": self._journal_failed,
            "sessions": len(self._index),
            "indexed": self._indexed.is_set(),  # false while the first scan after a start runs
            "sessions_with_lost_records": writer.lost.sessions,
            "fsync": writer.fsync,
            "syncs": writer.group_sync.syncs,
            "synced": writer.group_sync.synced_records,
            "sync_failed": counts["sync_failed"],
        }
