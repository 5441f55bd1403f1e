"""The state file: workers that start together all open it (the crash CI once saw at `--workers 2`)."""

from __future__ import annotations

import multiprocessing

from server.stateful import db as state_db

WORKERS = 6


def _open_at_the_barrier(directory: str, barrier, results, take_turns: bool) -> None:
    if not take_turns:  # the negative control: every worker goes straight at SQLite
        state_db.fcntl.flock = lambda fd, op: None
    barrier.wait()
    try:
        state_db.StateDB(directory).open()
        results.put("")
    except Exception as exc:  # noqa: BLE001 - the error is the result
        results.put(repr(exc))


def _round(directory, take_turns: bool) -> list[str]:
    """Start WORKERS processes that open one fresh state file at the same moment; their errors."""
    ctx = multiprocessing.get_context("forkserver")  # children of a clean process, not of pytest and its threads
    barrier, results = ctx.Barrier(WORKERS), ctx.Queue()
    procs = [
        ctx.Process(target=_open_at_the_barrier, args=(str(directory), barrier, results, take_turns))
        for _ in range(WORKERS)
    ]
    for proc in procs:
        proc.start()
    errors = [results.get(timeout=60) for _ in procs]
    for proc in procs:
        proc.join(60)
    return [error for error in errors if error]


def test_workers_opening_a_new_state_file_together_all_succeed(tmp_path):
    for attempt in range(25):
        assert _round(tmp_path / str(attempt), take_turns=True) == []


def test_without_taking_turns_some_worker_is_refused(tmp_path):
    """Negative control: the same race without the directory lock ends in "database is locked"."""
    for attempt in range(200):
        errors = _round(tmp_path / str(attempt), take_turns=False)
        if errors:
            assert "database is locked" in errors[0]
            return
    raise AssertionError("200 rounds of racing workers, and SQLite never refused one")


def test_a_directory_that_cannot_be_locked_still_opens(tmp_path, monkeypatch, caplog):
    """Some network mounts refuse flock: the state file opens as it did before workers took turns."""

    def refuse(fd, op):
        raise OSError(37, "No locks available")

    monkeypatch.setattr(state_db.fcntl, "flock", refuse)
    db = state_db.StateDB(tmp_path)
    db.open()
    assert db.connection().execute("PRAGMA journal_mode").fetchone() == ("wal",)
    assert "cannot lock" in caplog.text
    db.close()
