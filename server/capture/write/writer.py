"""The capture writer thread: records into their files before the answer's last byte, group sync, loud failures.

A handler awaits `RecordWriter.write`, which returns once the record is in its final file (and
synced too under `capture_fsync: always`), so a crash never loses a call whose answer was sent.
The thread takes whatever queued up meanwhile as one batch and wakes the batch's handlers with one
call into their event loop (`server.batching`). Under `batch` a committer thread syncs each window's files at once
(`durable.GroupSync`). A write that fails marks its session (`marks.LostRecords`) and degrades
capture until a probe shows the disk works again.
"""

from __future__ import annotations

import gzip
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path

import orjson

from server.batching import Waiter, answer, settle, take_batch
from server.capture.write.diff import DIFF_SUFFIX, DiffEncoder
from server.capture.write.durable import FSYNC_MODES, GroupSync
from server.capture.write.marks import LostRecords
from server.capture.write.record import CaptureRecord, RecordInput, record_of
from server.ids import is_valid_session_id
from server.logs import RateLimitedLog

log = logging.getLogger("switchyard_model.capture")

_OPEN_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)

# How records are written (docs/capture.md): each whole, or as what it adds to an earlier record.
ENCODINGS = ("full", "delta")
# Queue item kinds: a call to build the record of, a prebuilt record, a flush's event, the end.
CALL, RECORD, _FLUSH, _STOP = "call", "record", "flush", "stop"
_Payload = RecordInput | CaptureRecord | threading.Event | None
_Item = tuple[str, _Payload, Waiter | None]
# Most records the writer takes from the queue before it answers their callers (and, under
# `always`, syncs them as one group).
_MAX_BATCH = 256
# The directories the writer remembers having made, so a record's write asks the kernel for none;
# past this many it forgets them all (one per session, so memory would grow with the sessions), and
# the next write into each pays one mkdir that finds it there (~10 us).
MADE_DIRS_KEPT = 4096
# While capture is degraded, how often the idle writer checks whether the disk works again.
_PROBE_INTERVAL_S = 1.0
_PROBE_BYTES = 64 * 1024


class RecordWriter:
    """The queue, the writer and committer threads, and what capture knows about its own failures."""

    def __init__(
        self,
        capture_dir: Path,
        sessions_dir: Path,
        *,
        session_dir_name: Callable[[str], str],
        on_new_record: Callable[[CaptureRecord, str], None],
        io_lock: threading.Lock,
        on_batch_written: Callable[[set[str]], None] = lambda dir_names: None,
        queue_size: int = 10000,
        compress: bool = False,
        encoding: str = "full",
        fsync: str = "batch",
        fsync_window_ms: float = 10.0,
    ) -> None:
        if fsync not in FSYNC_MODES:
            raise ValueError(f"fsync must be one of {FSYNC_MODES}, not {fsync!r}")
        if encoding not in ENCODINGS:
            raise ValueError(f"encoding must be one of {ENCODINGS}, not {encoding!r}")
        self.capture_dir = capture_dir
        self.sessions_dir = sessions_dir
        self._sessions_path = os.fspath(sessions_dir)
        self.compress = compress
        # Only this thread writes, so only it knows each session's recent records: the diffs' bases.
        self.diff = DiffEncoder() if encoding == "delta" else None
        self.fsync = fsync
        self.fsync_window_s = max(0.0, fsync_window_ms / 1000.0)
        self._dir_name = session_dir_name
        self._on_new_record = on_new_record  # the store's index (keyed by file name)
        # The store's change journal: the session directories of a batch's records, before their answers.
        self._on_batch_written = on_batch_written
        # Serialises file writes with the store's deletes, so a delete never races a half-made directory.
        self.io_lock = io_lock
        self.made_dirs: set[str] = set()
        self._pid = os.getpid()  # in temporary file names: two processes never share one

        self._queue: queue.Queue[_Item] = queue.Queue(maxsize=max(1, queue_size))
        self._state_lock = threading.Lock()  # closed, and enqueueing against close
        self._closed = False
        self._thread: threading.Thread | None = None

        # Group commit (`batch`): the writer hands finished files to the committer thread.
        self.group_sync = GroupSync(capture_dir)
        self._commit_cond = threading.Condition()
        self._commit_files: list[str] = []
        self._commit_dirs: set[str] = set()
        self._commit_since = 0.0  # monotonic time of the oldest file waiting for a sync
        self._commit_stop = False
        self._committer: threading.Thread | None = None

        # Failure: what was lost, and whether capture can write right now.
        self.lost = LostRecords(sessions_dir, on_written=on_batch_written)
        self._degraded_reason: str | None = None
        self._next_probe = 0.0

        self._count_lock = threading.Lock()
        self.counts = {"written": 0, "failed": 0, "dropped": 0, "timed_out": 0, "sync_failed": 0}
        # Each kind of trouble (its message) logged at most every 30 s: a flood of one never hides another.
        self._errors = RateLimitedLog(log, 30.0)

    # ---- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        try:
            self.make_dir(self.capture_dir, parents=True)
            self.make_dir(self.sessions_dir)
        except OSError as exc:
            # Capture must not take the server down; every write will fail and be counted.
            self._degrade(f"capture directory {self.sessions_dir} is not usable: {exc}")
        self._thread = threading.Thread(target=self._run, name="capture-writer", daemon=True)
        self._thread.start()
        if self.fsync == "batch":
            self._committer = threading.Thread(target=self._commit_loop, name="capture-commit", daemon=True)
            self._committer.start()

    def flush(self, timeout: float) -> bool:
        """Wait until everything queued so far is in its file. False on timeout or if not running."""
        thread = self._thread
        if thread is None or not thread.is_alive():
            return self._queue.empty()
        done = threading.Event()
        deadline = time.monotonic() + timeout
        try:
            self._queue.put((_FLUSH, done, None), timeout=max(0.0, timeout))
        except queue.Full:
            return False
        return done.wait(max(0.0, deadline - time.monotonic()))

    def close(self, timeout: float, *, write_queued: bool = True) -> None:
        """Write what is queued, sync it, stop. Later enqueues are refused. Idempotent."""
        with self._state_lock:
            if self._closed:
                return
            self._closed = True
        thread = self._thread
        if thread is None:
            # Never started: write what was accepted here rather than lose it.
            if write_queued:
                self._drain_inline()
            return
        deadline = time.monotonic() + timeout
        try:
            self._queue.put((_STOP, None, None), timeout=max(0.0, timeout))
        except queue.Full:
            pass
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            log.warning(
                "capture writer did not finish within %.1fs; %d records may be lost", timeout, self._queue.qsize()
            )
        committer = self._committer
        if committer is not None:
            with self._commit_cond:
                self._commit_stop = True
                self._commit_cond.notify()
            committer.join(max(0.0, deadline - time.monotonic()))

    # ---- enqueueing --------------------------------------------------------------------------

    def enqueue(self, kind: str, payload: RecordInput | CaptureRecord, ack: Waiter | None = None) -> bool:
        """Queue a call's record input or a prebuilt record; any thread, never blocks. False if dropped."""
        with self._state_lock:
            if not self._closed:
                try:
                    self._queue.put_nowait((kind, payload, ack))
                    return True
                except queue.Full:
                    pass
        self.count("dropped")
        self._errors.error("capture queue full or store closed; record dropped")
        self._lose(payload, "capture queue full or store closed")
        return False

    async def write(self, kind: str, payload: RecordInput | CaptureRecord, timeout: float) -> bool:
        """Queue one record and wait (without blocking the event loop) until it is kept; see CaptureStore.write_call."""
        ack = Waiter.here()
        if not self.enqueue(kind, payload, ack):
            return False
        give_up = ack.loop.call_later(timeout, settle, ack.future, False)
        try:
            kept: bool = await ack.future
        finally:
            give_up.cancel()
        if not kept and not ack.answered:
            self.count("timed_out")
            self._errors.error("capture write did not finish within %.1fs; answering without it", timeout)
        return kept

    def queue_depth(self) -> int:
        return self._queue.qsize()

    def count(self, name: str, n: int = 1) -> None:
        with self._count_lock:
            self.counts[name] += n

    # ---- health ------------------------------------------------------------------------------

    @property
    def degraded_reason(self) -> str | None:
        """Why capture cannot write right now (a record, a sync or a lost-record mark failed), or None."""
        return self._degraded_reason

    def _degrade(self, reason: str) -> None:
        if self._degraded_reason is None:
            log.error("capture degraded: %s; calls are still answered, their records are lost", reason)
        self._degraded_reason = reason
        self._next_probe = time.monotonic() + _PROBE_INTERVAL_S

    def _lose(self, payload: RecordInput | CaptureRecord, reason: str) -> None:
        """Mark the session of a record that will not be kept, so its rollout never looks whole."""
        session_id = payload.session_id if isinstance(payload, RecordInput) else payload.get("session_id")
        if isinstance(session_id, str) and is_valid_session_id(session_id):
            self.lost.add(session_id, self._dir_name(session_id), reason)

    # ---- writer ----------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            try:
                first = self._queue.get(timeout=_PROBE_INTERVAL_S if self._degraded_reason is not None else None)
            except queue.Empty:
                self._probe()
                continue
            batch = take_batch(self._queue, first, _MAX_BATCH)
            running = self._handle_batch(batch)
            # Let go of the batch before waiting for the next: its last record (a call's whole
            # request and answer) would otherwise stay alive for as long as the writer idles.
            del first, batch
            if not running:
                return

    def _drain_inline(self) -> None:
        batch = []
        while True:
            try:
                batch.append(self._queue.get_nowait())
            except queue.Empty:
                break
        self._handle_batch(batch)

    def _handle_batch(self, batch: list[_Item]) -> bool:
        """Write a batch, sync it as `fsync` says, answer its waiters. False once told to stop."""
        running = True
        written: list[tuple[str, str]] = []  # (file, directory) of each record kept
        acks: list[tuple[Waiter, bool]] = []
        flushes: list[threading.Event] = []
        for kind, payload, ack in batch:
            if kind == _STOP:
                running = False
            elif isinstance(payload, threading.Event):
                flushes.append(payload)
            elif payload is not None:
                place = self._handle(payload)
                if place is not None:
                    written.append(place)
                if ack is not None:
                    acks.append((ack, place is not None))
        if written:
            self._on_batch_written({os.path.basename(d) for _, d in written})
        if written and self.fsync == "always":
            if not self._sync([f for f, _ in written], {d for _, d in written}):
                acks = [(ack, False) for ack, _ in acks]  # in their files, but not durable as promised
        elif written and self.fsync == "batch":
            with self._commit_cond:
                if not self._commit_files:
                    self._commit_since = time.monotonic()
                self._commit_files.extend(f for f, _ in written)
                self._commit_dirs.update(d for _, d in written)
                self._commit_cond.notify()
        answer(acks)
        if written and self._degraded_reason is not None and not self.lost.pending:
            self._recovered()
        elif self._degraded_reason is not None and time.monotonic() >= self._next_probe:
            self._probe()
        for done in flushes:
            done.set()
        if not running:
            self._commit_now()
        return running

    def _handle(self, payload: RecordInput | CaptureRecord) -> tuple[str, str] | None:
        """Write one record; its (file, directory), or None when it could not be kept."""
        try:
            record = record_of(payload) if isinstance(payload, RecordInput) else payload
            place = self._write(record)
            self.count("written")
            return place
        except Exception as exc:  # a capture failure must never escape into the server
            self.count("failed")
            reason = f"{type(exc).__name__}: {exc}"
            self._errors.error("capture write failed: %s", reason)
            self._lose(payload, reason)
            if isinstance(exc, OSError):  # the disk, not one odd record
                self._degrade(reason)
            self.lost.write_pending()  # usually fails too while the disk is broken; retried by the probe
            return None

    def _sync(self, files: list[str], dirs: set[str]) -> bool:
        try:
            self.group_sync.sync(files, dirs, len(files))
            return True
        except OSError as exc:
            self.count("sync_failed")
            self._errors.error("capture sync failed: %s", exc)
            self._degrade(f"sync failed: {exc}")
            return False

    def _commit_loop(self) -> None:
        """`fsync: batch`: one sync for everything written within the window after the oldest unsynced file."""
        while True:
            with self._commit_cond:
                while not self._commit_files and not self._commit_stop:
                    self._commit_cond.wait()
                if self._commit_stop and not self._commit_files:
                    return
                wait = self._commit_since + self.fsync_window_s - time.monotonic()
                if wait > 0 and not self._commit_stop:
                    self._commit_cond.wait(wait)
                    continue
                files, dirs = self._commit_files, self._commit_dirs
                self._commit_files, self._commit_dirs = [], set()
            self._sync(files, dirs)

    def _commit_now(self) -> None:
        """On close: sync what the committer has not (under `never`, nothing)."""
        if self.fsync != "batch":
            return
        with self._commit_cond:
            files, dirs = self._commit_files, self._commit_dirs
            self._commit_files, self._commit_dirs = [], set()
        if files:
            self._sync(files, dirs)

    def _probe(self) -> None:
        """While degraded: write the pending marks and a probe file; both working means capture is back."""
        self._next_probe = time.monotonic() + _PROBE_INTERVAL_S
        error = self.lost.write_pending()
        if error is None:
            probe = self.capture_dir / f".probe-{os.getpid()}"
            try:
                fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o600)
                try:
                    os.write(fd, bytes(_PROBE_BYTES))
                    os.fsync(fd)
                finally:
                    os.close(fd)
                    try:
                        os.unlink(probe)
                    except OSError:
                        pass
            except OSError as exc:
                error = exc
        if error is None:
            self.made_dirs.clear()  # the tree may have been replaced meanwhile
            self._recovered()
        else:
            self._degraded_reason = f"{type(error).__name__}: {error}"

    def _recovered(self) -> None:
        if self._degraded_reason is not None:
            log.warning(
                "capture recovered (was: %s); %d sessions are marked as having lost records",
                self._degraded_reason,
                self.lost.sessions,
            )
        self._degraded_reason = None

    def _write(self, record: CaptureRecord) -> tuple[str, str]:
        """Write a record into its final place (temp file, then rename); returns (file, directory).

        The rename happens at once, without an fsync: from here a process crash cannot lose the
        record, and power loss is what `fsync` guards against. Four system calls (create, write,
        close, rename) and no more: each lets the event loop's thread take the GIL, and under load
        every hand-back costs more than the call itself.
        """
        encoded = None
        if self.diff is None:
            data = orjson.dumps(record)
            if self.compress:
                data = gzip.compress(data, compresslevel=1, mtime=0)
            suffix = ".json.gz" if self.compress else ".json"
        # Strings, not Paths: a Path per record interns its parts (a name per record kept in the
        # interpreter's table of interned strings) and costs more to build than the call's write.
        directory = os.path.join(self._sessions_path, self._dir_name(record["session_id"]))
        name = record["uuid"]
        with self.io_lock:
            if self.diff is not None:
                # Under the lock a delete of the session cannot come between choosing a base and writing.
                encoded = self.diff.encode(record)
                data, suffix = encoded.data, DIFF_SUFFIX
            file_name = f"{name}{suffix}"
            final = os.path.join(directory, file_name)
            # Hidden and not *.json: readers never pick up a half-written file.
            tmp = os.path.join(directory, f".{name}.{self._pid}.tmp")
            self.make_session_dir(directory)
            try:
                fd = os.open(tmp, _OPEN_NEW, 0o600)
            except FileNotFoundError:
                # Someone removed the tree under us: forget what we made and make it again.
                self.made_dirs.clear()
                self.make_session_dir(directory)
                fd = os.open(tmp, _OPEN_NEW, 0o600)
            try:
                try:
                    _write_all(fd, data)
                finally:
                    os.close(fd)
                os.replace(tmp, final)
            except BaseException:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
                raise
            if encoded is not None:
                encoded.commit(final)
            self._on_new_record(record, file_name)  # a record written again (same uuid) counts once
        return final, directory

    def make_session_dir(self, directory: str) -> None:
        if directory not in self.made_dirs:
            self.make_dir(self.capture_dir, parents=True)
            self.make_dir(self.sessions_dir)
            self.make_dir(directory)

    def make_dir(self, path: str | Path, *, parents: bool = False) -> None:
        key = os.fspath(path)
        if key in self.made_dirs:
            return
        if parents and os.path.dirname(key):
            os.makedirs(os.path.dirname(key), exist_ok=True)
        try:
            os.mkdir(key, 0o700)
        except FileExistsError:
            if not os.path.isdir(key):
                raise
        if len(self.made_dirs) >= MADE_DIRS_KEPT:
            self.made_dirs.clear()
        self.made_dirs.add(key)


def _write_all(fd: int, data: bytes) -> None:
    """os.write until every byte is in (a regular file takes them in one call unless the disk fills)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
