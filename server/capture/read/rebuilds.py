"""Rollout rebuilds kept away from the calls being served: a worker process, one at a time, results cached by session state.

A rebuild parses every record of a session tree (tens of MB for a long agent session) and walks its
tokens; on the server's own interpreter that holds the GIL for whole seconds, which the streams being
served feel as stalls. Here the work runs in a separate process (`workers` of them, 1 by default, so
rebuild memory is that of one session at a time however many requests arrive), identical requests
share one rebuild, and the result is cached under the tree's state (each session's record count and
first and last capture time), so asking again after nothing changed costs a dictionary look-up.
`workers=0` builds in a thread of the serving process instead, still one at a time. The worker runs
at the lowest CPU priority (Linux's SCHED_IDLE, else nice 10): on a machine short of cores it yields
to the calls being served.

A large answer (over 1 MiB) never enters the serving process as one object: the worker writes it to
a file, and the response sends that file, from the HTTP server's own threads where it can (granian
does, through ASGI's pathsend extension), else read piece by piece. Passed through the worker's pipe
and handed to the HTTP server whole, a 43 MB rollout held the GIL for copies of tens of
milliseconds each, which the streams being served felt as stalls; read piece by piece in the
server, each piece still cost the event loop a hop and a copy. Other reads
that parse a whole session run here too (`run`): its records (`completions`), the viewer's timeline.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import shutil
import signal
import tempfile
import threading
import time
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any, TypeVar

import orjson

from server.capture.catalog.index_view import IndexView
from server.capture.catalog.runs import LATEST, RunChoice, children_in
from server.capture.catalog.sessions import in_scope, pick, tree_records
from server.capture.rollout import reconstruct_tree
from server.capture.rollout.chains import ChainsEnvelope, chains_tree
from server.capture.store import UnknownSession, read_session_records
from server.capture.write.record import SCHEMA_VERSION
from server.files import process_temp_dir

log = logging.getLogger("switchyard_model.capture")

CHAINS = "chains"

# Rollouts larger than this are spooled to a file rather than passed back and held as bytes.
INLINE_BYTES = 1 << 20

_T = TypeVar("_T")
_Lost = tuple[tuple[str, int], ...]  # (session id, records lost to capture failures), non-zero only
_State = tuple[tuple[str, int, str, str, tuple[str | None, ...]], ...]
_CacheKey = tuple[str, bool, RunChoice | None, _State, _Lost, str]  # ..., "rollout" or "chains"


class SpooledBody:
    """A large answer (a rollout, a session's records) as a file in the builder's spool directory,
    which every response that sends it reads from (the HTTP server itself, where it can send files).

    The file is removed once nothing refers to the body (the cache evicted it and the last response
    finished) and `RETIRE_GRACE_S` have passed: granian opens a file it was asked to send (ASGI's
    pathsend) just after the response's last message, so the name must outlive the response a little.
    """

    def __init__(self, path: str) -> None:
        """Blocking (a stat, and removing files whose grace has passed): call it in a thread."""
        _remove_retired()
        self.path = path
        self.stat = os.stat(path)
        self.size = self.stat.st_size
        weakref.finalize(self, _retire, path)

    def __len__(self) -> int:
        return self.size


SPOOL_PREFIX = "switchyard-model-rollouts-"  # a `process_temp_dir`: a killed server's spool is found


# Long past the moment an HTTP server sending a spooled file opens it; once open, removing the name
# does not disturb the transfer.
RETIRE_GRACE_S = 30.0
_retired: deque[tuple[float, str]] = deque()  # (when it may go, path), oldest first
_retired_lock = threading.Lock()


def _retire(path: str) -> None:
    """A spooled file no body refers to any more: removed once the grace has passed, when a later
    body is spooled (or with its directory when the builder closes). Only noted here: this runs
    wherever the last reference drops, often on the event loop, which must not wait for disk."""
    with _retired_lock:
        _retired.append((time.monotonic() + RETIRE_GRACE_S, path))


def _remove_retired() -> None:
    now = time.monotonic()
    while True:
        with _retired_lock:
            if not _retired or _retired[0][0] > now:
                return
            _, path = _retired.popleft()
        try:
            os.unlink(path)
        except OSError:
            pass


SessionBody = bytes | SpooledBody


class RebuildUnavailable(RuntimeError):
    """The rebuild worker died (e.g. out of memory); the next request starts a fresh one."""


def _init_worker() -> None:
    """A rebuild worker runs below the serving process's priority, and ignores Ctrl-C: the signal
    reaches the whole process group, but the server stops the pool itself (no traceback from here)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _lower_priority()


def tree_of(index: IndexView, session_id: str) -> dict[str, list[str]]:
    """The session and its descendants as {session id: child ids}, from one index snapshot."""
    if index.session_info(session_id) is None:
        raise UnknownSession(session_id)
    tree: dict[str, list[str]] = {}
    pending = [session_id]
    while pending:  # iterative with a visited check: crafted parent ids may form cycles
        current = pending.pop()
        if current in tree:
            continue
        tree[current] = children = children_in(index, current, None)
        pending.extend(children)
    return tree


def rollout_json(
    sessions_dir: str,
    session_id: str,
    tree: dict[str, list[str]],
    allow_partial: bool,
    lost: _Lost = (),
    choice: RunChoice | None = RunChoice(),  # noqa: B008 - frozen: the latest dispatch
    session_runs: dict[str, dict[str, Any]] | None = None,
    view: str = "rollout",
) -> bytes:
    """The serialized rollout of `session_id` with its sub-agents, from the records `choice` picks
    (by default the latest dispatch; None: all runs, unsplit); `session_runs` are the index entries (runs, first and last capture
    time) of each session of `tree` (raises RolloutError, UnknownSession, UnknownDispatch). `view`
    "chains" gives every session's chains (`chains_tree`) instead.

    Runs in the worker process: it reads the records itself, so only the ids and the result cross.
    """
    load_records, narrowed = tree_records(lambda sid: read_session_records(sessions_dir, sid), session_id, choice)
    known = session_runs or {}
    scope = narrowed.scope

    def in_tree(sid: str) -> list[str]:
        children = tree.get(sid, [])
        if scope is None:
            return children
        return [child for child in children if scope.overlaps(known.get(child, {"runs": (None,)}))]

    children_of = in_scope(in_tree, load_records, narrowed)
    lost_by_session = dict(lost)
    if view == CHAINS:
        body = chains_tree(session_id, load_records, children_of, lost_records=lambda sid: lost_by_session.get(sid, 0))
        envelope: ChainsEnvelope = {
            "schema_version": SCHEMA_VERSION,
            **body,
            "dispatch": narrowed.dispatch,
            "dispatches": narrowed.dispatches,
        }
        return orjson.dumps(envelope)
    rollout = reconstruct_tree(
        session_id,
        load_records,
        children_of,
        allow_partial=allow_partial,
        lost_records=lambda sid: lost_by_session.get(sid, 0),
    )
    rollout["dispatch"], rollout["dispatches"] = narrowed.dispatch, narrowed.dispatches
    return orjson.dumps(rollout)


def completions_json(sessions_dir: str, session_id: str, lost_records: int) -> bytes | int:
    """The `/completions` envelope of `session_id`, or how many files were skipped when it has no
    readable record (raises UnknownSession). Runs in the worker: a long session's records are tens
    of MB to parse and serialise."""
    records, skipped = read_session_records(sessions_dir, session_id)
    if not records:
        return skipped
    return orjson.dumps(
        {
            "schema_version": SCHEMA_VERSION,
            "session_id": session_id,
            "completions": records,
            "skipped": skipped,
            # Records capture failed to write (disk full, ...): the session is not whole.
            "lost_records": lost_records,
        }
    )


def build_rollout(spool_dir: str, inline_bytes: int, *args: object) -> bytes | str:
    """`rollout_json(*args)`, spooled when large (runs in the worker)."""
    return spool(spool_dir, inline_bytes, rollout_json(*args))  # type: ignore[arg-type]


def build_completions(spool_dir: str, inline_bytes: int, *args: object) -> bytes | str | int:
    """`completions_json(*args)`, spooled when large (runs in the worker)."""
    body = completions_json(*args)  # type: ignore[arg-type]
    return body if isinstance(body, int) else spool(spool_dir, inline_bytes, body)


def spool(spool_dir: str, inline_bytes: int, body: bytes) -> bytes | str:
    """`body` itself if at most `inline_bytes`, else written to a new file in `spool_dir` and that
    file's path."""
    if len(body) <= inline_bytes:
        return body
    fd, path = tempfile.mkstemp(prefix="body-", suffix=".json", dir=spool_dir)
    try:
        with open(fd, "wb") as out:
            out.write(body)
    except BaseException:
        os.unlink(path)
        raise
    return path


class RolloutBuilder:
    """Builds rollouts off the serving interpreter, bounded and cached (see the module docstring)."""

    def __init__(
        self,
        sessions_dir: str | Path,
        *,
        workers: int = 1,
        cache_bytes: int = 64 << 20,
        inline_bytes: int = INLINE_BYTES,
    ) -> None:
        self.sessions_dir = str(sessions_dir)
        self.workers = max(0, workers)
        self.cache_bytes = max(0, cache_bytes)
        self.inline_bytes = max(0, inline_bytes)
        self._cache: OrderedDict[_CacheKey, SessionBody] = OrderedDict()
        self._cached_bytes = 0
        self._inflight: dict[_CacheKey, asyncio.Future[SessionBody]] = {}
        self._pool: Executor | None = None
        self._pool_lock = threading.Lock()
        self._spool_dir: str | None = None  # made at the first rebuild, removed by close()
        self.rebuilds = 0  # rebuilds actually run (not served from the cache or shared)

    def _spool(self) -> str:
        with self._pool_lock:
            if self._spool_dir is None:
                self._spool_dir = process_temp_dir(SPOOL_PREFIX)
                # Removed at exit also for a builder nobody closes (the session routes' fallback).
                weakref.finalize(self, shutil.rmtree, self._spool_dir, True)
            return self._spool_dir

    async def _spool_ready(self) -> str:
        """The spool directory; made (and dead servers' spools removed) in a thread, off the event loop."""
        made = self._spool_dir
        return made if made is not None else await asyncio.to_thread(self._spool)

    def _executor(self) -> Executor:
        with self._pool_lock:
            if self._pool is None:
                if self.workers:
                    # spawn, not fork: the serving process has threads (and Switchyard's runtime).
                    self._pool = ProcessPoolExecutor(
                        self.workers, mp_context=multiprocessing.get_context("spawn"), initializer=_init_worker
                    )
                else:
                    self._pool = ThreadPoolExecutor(1, thread_name_prefix="rollout-rebuild")
            return self._pool

    async def rollout(
        self,
        index: IndexView,
        session_id: str,
        *,
        allow_partial: bool = True,
        lost_records: Callable[[str], int] | None = None,
        run: str = LATEST,
        view: str = "rollout",
    ) -> SessionBody:
        """The rollout JSON for `session_id` as of `index` (bytes, or a SpooledBody when large), from
        the records `run` picks (`latest`, a run id, `legacy`, `all`; `#<n>` for dispatch n) (raises
        RolloutError, UnknownSession, UnknownRun, UnknownDispatch, RebuildUnavailable). Call with an index snapshot taken after the store was flushed.
        `view="chains"` builds the session's chains (`chains_tree`) instead, cached the same way.

        `lost_records` (the store's) says which sessions lost records to a capture failure: they are
        part of the cache key, so a mark made after a rollout was cached is never hidden by it.
        """
        choice = pick(index, session_id, run)
        tree = tree_of(index, session_id)
        lost: _Lost = ()
        if lost_records is not None:
            counts = await asyncio.to_thread(lambda: [(sid, lost_records(sid)) for sid in sorted(tree)])
            lost = tuple((sid, n) for sid, n in counts if n)
        key: _CacheKey = (session_id, allow_partial, choice, _state_of(index, tree), lost, view)
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            return cached
        task = self._inflight.get(key)
        if task is None:
            # Its own task, not the requester's: a client that goes away does not cancel a rebuild
            # that other requests wait for.
            task = asyncio.ensure_future(self._build(key, tree))
            self._inflight[key] = task
            task.add_done_callback(lambda done: self._settled(key, done))
        return await asyncio.shield(task)

    async def run(self, fn: Callable[..., _T], *args: Any) -> _T:
        """`fn(*args)` where rollouts are rebuilt (the worker process, or the builder's thread), in
        turn with them; other reads that parse a whole session (the viewer's timeline) use it too."""
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor(), fn, *args)
        except BrokenProcessPool as exc:
            self._reset_pool()
            raise RebuildUnavailable("the rollout worker process died; try again") from exc

    async def _build(self, key: _CacheKey, tree: dict[str, list[str]]) -> SessionBody:
        session_id, allow_partial, choice, state, lost, view = key
        self.rebuilds += 1
        built = await self.run(
            build_rollout,
            await self._spool_ready(),
            self.inline_bytes,
            self.sessions_dir,
            session_id,
            tree,
            allow_partial,
            lost,
            choice,
            {
                sid: {"runs": runs, "first_captured_at": first, "last_captured_at": last}
                for sid, _, first, last, runs in state
            },
            view,
        )
        body = await _opened(built)
        self._remember(key, body)
        return body

    async def completions(self, session_id: str, lost_records: int) -> SessionBody | int:
        """The `/completions` envelope of `session_id` (bytes, or a SpooledBody when large), or the
        count of skipped files when it has no readable record (raises UnknownSession,
        RebuildUnavailable). Built where rollouts are, not cached: a live session changes."""
        built = await self.run(
            build_completions, await self._spool_ready(), self.inline_bytes, self.sessions_dir, session_id, lost_records
        )
        return built if isinstance(built, int) else await _opened(built)

    def _settled(self, key: _CacheKey, task: asyncio.Future[SessionBody]) -> None:
        if self._inflight.get(key) is task:
            del self._inflight[key]
        if not task.cancelled():
            task.exception()  # retrieved here, so a rebuild every waiter gave up on logs no warning

    def _remember(self, key: _CacheKey, body: SessionBody) -> None:
        if len(body) > self.cache_bytes:
            return
        self._cache[key] = body
        self._cached_bytes += len(body)
        while self._cached_bytes > self.cache_bytes:
            _, evicted = self._cache.popitem(last=False)
            self._cached_bytes -= len(evicted)

    def _reset_pool(self) -> None:
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        self._reset_pool()
        self._cache.clear()
        self._cached_bytes = 0
        spool, self._spool_dir = self._spool_dir, None
        if spool is not None:
            shutil.rmtree(spool, ignore_errors=True)


async def _opened(built: bytes | str) -> SessionBody:
    """What the worker built: bytes as they are, a spooled file's path as a SpooledBody."""
    if isinstance(built, bytes):
        return built
    return await asyncio.to_thread(SpooledBody, built)


# A rebuild is background work: where CPU is short, the calls being served should win it. Under
# Linux's SCHED_IDLE policy a serving thread that wakes up takes the CPU from the worker at once; a
# nice level only shrinks the worker's share (docs/benchmarks.md, "Reads beside calls").
# Where the policy is missing or refused, nice 10.
WORKER_NICENESS = 10


def _lower_priority() -> None:
    try:
        os.nice(WORKER_NICENESS)
    except OSError:
        pass
    idle = getattr(os, "SCHED_IDLE", None)
    if idle is not None:
        try:
            os.sched_setscheduler(0, idle, os.sched_param(0))
        except OSError:
            pass


def _state_of(index: IndexView, tree: dict[str, list[str]]) -> _State:
    """What a rollout depends on, per session of the tree: a new record changes it."""
    state = []
    for sid in sorted(tree):
        info = index.session_info(sid)
        if info is not None:
            state.append(
                (sid, info["record_count"], info["first_captured_at"], info["last_captured_at"], tuple(info["runs"]))
            )
    return tuple(state)
