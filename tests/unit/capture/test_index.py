"""The session index is a cache of the disk: two stores on one directory agree with an offline reader."""

from __future__ import annotations

import os
import random

import pytest

from server.capture import store as store_module
from server.capture.catalog.index import SessionIndex
from server.capture.catalog.index_view import IndexView, RecordHeader, SessionEntry, SessionTally
from server.capture.read import record_files as record_files_module
from server.capture.store import CaptureStore, session_dir_name
from server.capture.write import journal as journal_module
from server.capture.write.record import RecordInput
from tests.support.captures import captured_call as call
from tests.support.procs import wait_for


def alternate(writers: list[CaptureStore], calls: list[dict]) -> None:
    """Each call goes to the next writer in turn, as a load balancer spreads one session's calls."""
    for i, kwargs in enumerate(calls):
        writer = writers[i % len(writers)]
        assert writer.submit_call(RecordInput(**kwargs))
        assert writer.flush(10)


def session_calls() -> list[dict]:
    # Root's calls alternate between the writers; the sub-agent's land on the second one only.
    return [
        call("root", captured_at="2026-01-01T00:00:01.000000+00:00"),
        call("root", captured_at="2026-01-01T00:00:02.000000+00:00"),
        call("root", captured_at="2026-01-01T00:00:03.000000+00:00"),
        call("sub", parent="root", captured_at="2026-01-01T00:00:04.000000+00:00"),
        call("other", captured_at="2026-01-01T00:00:05.000000+00:00"),
        call("sub", parent="root", captured_at="2026-01-01T00:00:06.000000+00:00"),
    ]


def answers(store: CaptureStore) -> dict:
    return {
        "sessions": store.list_sessions(),
        "roots": store.list_sessions(roots_only=True),
        "children": store.children("root"),
        "root": store.session_info("root"),
    }


def two_writers(tmp_path, shared: bool) -> tuple[CaptureStore, CaptureStore]:
    first = CaptureStore(tmp_path, shared_index=shared)
    second = CaptureStore(tmp_path, shared_index=shared)
    first.start()
    second.start()
    return first, second


def test_two_stores_on_one_directory_answer_like_an_offline_reader(tmp_path):
    first, second = two_writers(tmp_path, shared=True)
    try:
        alternate([first, second], session_calls())
        truth = answers(CaptureStore.open_read_only(tmp_path))
        assert truth["children"] == ["sub"] and truth["root"]["record_count"] == 3
        assert answers(first) == truth
        assert answers(second) == truth
    finally:
        first.close()
        second.close()


def test_negative_control_an_index_kept_in_memory_disagrees(tmp_path):
    """The same writes, with each store trusting its own memory: the failure the shared index removes."""
    first, second = two_writers(tmp_path, shared=False)
    try:
        alternate([first, second], session_calls())
        truth = answers(CaptureStore.open_read_only(tmp_path))
        seen_by_first = answers(first)
        assert seen_by_first != truth
        # The first writer saw half of root's records and never heard of its sub-agent.
        assert seen_by_first["root"]["record_count"] == 2
        assert seen_by_first["children"] == []
    finally:
        first.close()
        second.close()


def test_a_delete_by_one_store_is_seen_by_the_other(tmp_path):
    first, second = two_writers(tmp_path, shared=True)
    try:
        alternate([first, second], session_calls())
        assert second.children("root") == ["sub"]
        assert first.delete_session("sub") == 2
        assert second.children("root") == []
        assert "sub" not in [s["session_id"] for s in second.list_sessions()]
        # And captured again through the other store, both see it come back.
        alternate([second], [call("sub", parent="root")])
        assert first.session_info("sub")["record_count"] == 1
        assert first.children("root") == ["sub"]
    finally:
        first.close()
        second.close()


class CountingReader:
    """Wraps the store's header reader, counting file reads."""

    def __init__(self) -> None:
        self.reads = 0

    def __call__(self, path: str, dir_name: str) -> RecordHeader | None:
        self.reads += 1
        return record_files_module.read_header(path, dir_name)


def index_on(tmp_path, reader: CountingReader, **kwargs) -> SessionIndex:
    return SessionIndex(
        tmp_path / "sessions",
        list_files=record_files_module.record_files,
        read_header=reader,
        is_session_dir_name=store_module._SESSION_DIR_NAME.fullmatch,  # type: ignore[arg-type]
        **kwargs,
    )


def age_directories(tmp_path, seconds: float = 60.0) -> None:
    """Set every capture directory's mtime into the past: quiet for longer than the racy window."""
    sessions = tmp_path / "sessions"
    for path in [sessions, *sessions.iterdir()]:
        stat = path.stat()
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns - int(seconds * 1e9)))


def test_each_record_file_is_read_once_per_process(tmp_path):
    writer = CaptureStore(tmp_path)
    writer.start()
    alternate([writer], session_calls())
    age_directories(tmp_path)
    reader = CountingReader()
    index = index_on(tmp_path, reader, tally_kept_s=NEVER)  # quiet directories keep their tallies
    assert len(index.view()) == 3
    assert reader.reads == 6
    index.view()
    assert reader.reads == 6  # nothing changed on disk: no file is read again
    alternate([writer], [call("root")])
    assert index.view().session_info("root")["record_count"] == 4
    assert reader.reads == 7  # only the new file
    writer.close()


def test_a_directory_changed_within_the_racy_window_is_rescanned_even_if_its_mtime_did_not_move(tmp_path):
    writer = CaptureStore(tmp_path)
    writer.start()
    alternate([writer], [call("root")])
    directory = tmp_path / "sessions" / session_dir_name("root")

    def add_a_record_keeping_the_mtime() -> None:
        before = directory.stat()
        alternate([writer], [call("root")])
        os.utime(directory, ns=(before.st_atime_ns, before.st_mtime_ns))  # as a coarse clock tick would

    index = index_on(tmp_path, CountingReader())
    assert index.view().session_info("root")["record_count"] == 1
    add_a_record_keeping_the_mtime()
    assert index.view().session_info("root")["record_count"] == 2

    # Negative control: with no racy window, the unchanged mtime hides the new record.
    blind = index_on(tmp_path, CountingReader(), racy_window_ns=-(10**18))
    assert blind.view().session_info("root")["record_count"] == 2
    add_a_record_keeping_the_mtime()
    assert blind.view().session_info("root")["record_count"] == 2
    assert index.view().session_info("root")["record_count"] == 3
    writer.close()


@pytest.mark.parametrize("order", [(0, 1), (1, 0)])
def test_the_earliest_record_naming_a_parent_decides_it_whatever_the_read_order(order):
    headers = [
        RecordHeader("s", "parent-b", "2026-01-01T00:00:01+00:00", "uuid-b"),
        RecordHeader("s", "parent-a", "2026-01-01T00:00:01+00:00", "uuid-a"),
        RecordHeader("s", None, "2026-01-01T00:00:00+00:00", "uuid-0"),
    ]
    tally = SessionTally()
    for header in (headers[order[0]], headers[order[1]], headers[2]):
        tally.add(header.uuid, header)
    entry = tally.entry()
    assert entry is not None
    assert entry.parent_session_id == "parent-a"  # same time: the smaller uuid wins, in every process
    assert entry.record_count == 3 and entry.first_captured_at == "2026-01-01T00:00:00+00:00"


def header(uuid: str, at: str, parent: str | None = None, run: str | None = "run-a") -> RecordHeader:
    return RecordHeader("s", parent, f"2026-01-01T00:00:{at}+00:00", uuid, run)


def test_a_tally_counts_each_file_once_and_an_unreadable_one_once_it_is_written():
    tally = SessionTally()
    tally.add("a.json", header("a", "05"))
    tally.add("a.json", header("a", "05"))  # seen by a scan and by the writer's note
    tally.add("b.json", None)  # unreadable
    tally.add("b.json", None)
    assert tally.entry() == SessionEntry(
        "s", None, 1, "2026-01-01T00:00:05+00:00", "2026-01-01T00:00:05+00:00", ("run-a",)
    )
    tally.add("b.json", header("b", "09", parent="p", run="run-b"))  # written anew
    tally.add("c.json", header("c", "01", run="run-b"))
    assert tally.entry() == SessionEntry(
        "s", "p", 3, "2026-01-01T00:00:01+00:00", "2026-01-01T00:00:09+00:00", ("run-b", "run-a")
    )


def test_a_tally_gives_the_entry_of_its_headers_in_any_order_with_repeats():
    rng = random.Random(3)
    headers = [
        header(f"u{i:02d}", f"{rng.randint(0, 9):02d}", rng.choice([None, "p1", "p2"]), rng.choice(["r1", "r2", None]))
        for i in range(40)
    ]
    readable = [(h.captured_at, h.uuid, h) for h in headers]
    with_parent = sorted(key for key in readable if key[2].parent_session_id)
    first_of_run: dict = {}
    for key in sorted(readable):
        first_of_run.setdefault(key[2].server_run, key)
    expected = SessionEntry(
        "s",
        with_parent[0][2].parent_session_id,
        40,
        min(h.captured_at for h in headers),
        max(h.captured_at for h in headers),
        tuple(sorted(first_of_run, key=lambda run: first_of_run[run][:2])),
    )
    for _ in range(20):
        tally = SessionTally()
        for h in rng.sample(headers, len(headers)) + rng.sample(headers, 10):
            tally.add(h.uuid + ".json", h)
        assert tally.entry() == expected


def test_a_quiet_directory_keeps_only_its_entry_and_is_counted_anew_when_it_changes(tmp_path):
    writer = CaptureStore(tmp_path)
    writer.start()
    alternate([writer], [call("root") for _ in range(5)] + [call("other")])
    age_directories(tmp_path, seconds=120)
    reader = CountingReader()
    index = index_on(tmp_path, reader, tally_kept_s=60)
    assert index.view().session_info("root")["record_count"] == 5
    assert reader.reads == 6 and not index._tallies  # no file names kept for quiet sessions
    alternate([writer], [call("root")])  # another process (no note to this index) adds a record
    assert index.view().session_info("root")["record_count"] == 6
    assert reader.reads == 12  # the changed directory is counted anew, the quiet one is not read
    assert index.known_runs(session_dir_name("other")) == {None}  # from its entry: no tally needed
    # A record this index is told of (as the writer tells it) on a quiet session: the note and the
    # files read again add up to each record once.
    age_directories(tmp_path, seconds=120)
    index.view()
    assert not index._tallies
    alternate([writer], [call("root")])
    directory = tmp_path / "sessions" / session_dir_name("root")
    newest = max(directory.iterdir(), key=lambda path: path.stat().st_mtime_ns)
    index.note_written(directory.name, newest.name, record_files_module.read_header(str(newest), directory.name))
    assert index.view().session_info("root")["record_count"] == 7
    writer.close()


def test_a_server_nobody_reads_from_lets_the_tallies_of_quiet_sessions_go(tmp_path):
    """Its writer notes every record; without keep_up letting quiet tallies go, a name per record stays."""
    writer = CaptureStore(tmp_path, shared_index=False)  # writes the files; this test plays its notes
    writer.start()
    now = [0]
    reader = CountingReader()
    index = index_on(tmp_path, reader, tally_kept_s=15, clock=lambda: now[0])
    sessions = tmp_path / "sessions"
    for i in range(3):
        alternate([writer], [call(f"s{i}") for _ in range(4)])
    for directory in filter(os.path.isdir, sessions.iterdir()):
        for path in directory.iterdir():
            index.note_written(directory.name, path.name, record_files_module.read_header(str(path), directory.name))
    assert sum(len(tally.names) for tally in index._tallies.values()) == 12
    now[0] += 10 * 10**9
    index.keep_up()
    assert len(index._tallies) == 3  # written 10 s ago: kept
    now[0] += 6 * 10**9
    index.keep_up()
    assert not index._tallies  # quiet for 16 s: let go, though no reader ever looked
    assert [index.view().session_info(f"s{i}")["record_count"] for i in range(3)] == [4, 4, 4]
    assert reader.reads == 12  # the first look counts them from their files
    writer.close()


# ---- the change journal ----------------------------------------------------------------------

NEVER = 1e9  # seconds: no periodic full revalidation within a test


def ids(store: CaptureStore) -> list[str]:
    return [s["session_id"] for s in store.list_sessions()]


def test_the_journal_shows_another_writers_record_without_revalidating_every_directory(tmp_path):
    reader = CaptureStore(tmp_path, full_revalidation_s=NEVER)
    writer = CaptureStore(tmp_path)
    reader.start()
    writer.start()
    try:
        assert ids(reader) == []
        alternate([writer], [call("a"), call("a"), call("b", parent="a")])
        assert ids(reader) == ["a", "b"]
        assert reader.session_info("a")["record_count"] == 2 and reader.children("a") == ["b"]
        assert reader._index.full_revalidations == 1  # the one at start; the rest came from the journal
        assert writer.delete_session("b") == 1
        assert ids(reader) == ["a"] and reader.children("a") == []
        assert reader._index.full_revalidations == 1
    finally:
        reader.close()
        writer.close()


def test_negative_control_a_writer_that_does_not_append_is_unseen_until_a_full_revalidation(tmp_path):
    """What makes the record above visible is the journal: the same write without it is not seen."""
    reader = CaptureStore(tmp_path, full_revalidation_s=NEVER)
    every_look = CaptureStore(tmp_path, full_revalidation_s=0)  # no journal shortcut: one stat per directory
    older = CaptureStore(tmp_path, change_journal=False)  # as a server from before the journal writes
    for store in (reader, every_look, older):
        store.start()
    try:
        assert ids(reader) == ids(every_look) == []
        alternate([older], [call("a")])
        assert ids(every_look) == ["a"]  # it is on disk
        assert ids(reader) == []  # but the journal never named it
    finally:
        for store in (reader, every_look, older):
            store.close()


def test_the_rolling_sweep_finds_writers_that_do_not_append_within_the_interval(tmp_path):
    now = [0]
    reader = CaptureStore(tmp_path, full_revalidation_s=0.2, index_clock=lambda: now[0])
    older = CaptureStore(tmp_path, change_journal=False)
    reader.start()
    older.start()
    try:
        alternate([older], [call("a")])
        assert ids(reader) == []  # no time has passed on the index's clock: nothing swept yet
        now[0] += 250_000_000  # the interval has passed: every directory is checked by the next look
        assert ids(reader) == ["a"]
        assert reader._index.full_revalidations == 1  # by the sweep, not by a look at every directory
    finally:
        reader.close()
        older.close()


def forty_sessions_by_an_older_writer(tmp_path) -> CaptureStore:
    """40 sessions written without the journal (as an older server), then a journal for readers."""
    older = CaptureStore(tmp_path, change_journal=False)
    older.start()
    alternate([older], [call(f"s-{i:02d}") for i in range(40)])
    journal_module.create(tmp_path / "sessions")
    return older


def sweeping_index(tmp_path, now: list[int]) -> SessionIndex:
    """An index that follows the journal, with a sweep every 2 s on the clock `now[0]` (ns)."""
    sessions = tmp_path / "sessions"
    return index_on(
        tmp_path,
        CountingReader(),
        journal_changes=journal_module.JournalReader(sessions, store_module._SESSION_DIR_NAME.fullmatch).changes,
        full_revalidation_s=4.0,
        clock=lambda: now[0],
    )


def test_each_look_checks_a_slice_of_the_directories_in_proportion_to_the_time_passed(tmp_path):
    older = forty_sessions_by_an_older_writer(tmp_path)
    now = [0]
    index = sweeping_index(tmp_path, now)
    assert len(index.view()) == 40 and index.checked_dirs == 40  # the first look checks everything
    now[0] += 2_000_000_000  # a sweep period later: a sweep begins
    index.view()
    assert index.checked_dirs == 40
    alternate([older], [call("s-00"), call("s-39")])  # unjournaled changes at both ends of the sweep
    seen = []
    for _ in range(4):
        now[0] += 500_000_000  # a quarter of the period: a quarter of the directories
        checked = index.checked_dirs
        view = index.view()
        assert index.checked_dirs - checked == 10
        seen.append(view.session_info("s-00")["record_count"] + view.session_info("s-39")["record_count"])
    assert seen[-1] == 4  # both found within one sweep
    assert index.full_revalidations == 1
    now[0] += 60_000_000_000  # after a long quiet spell one look checks them all, at once
    alternate([older], [call("s-20")])
    checked = index.checked_dirs
    assert index.view().session_info("s-20")["record_count"] == 2
    assert index.checked_dirs - checked == 40
    older.close()


def test_kept_up_between_looks_a_look_after_a_pause_checks_only_a_slice_and_still_sees_every_change(tmp_path):
    older = forty_sessions_by_an_older_writer(tmp_path)
    now = [0]
    kept, control = sweeping_index(tmp_path, now), sweeping_index(tmp_path, now)
    for index in (kept, control):
        index.view()
    alternate([older], [call("s-20")])  # a writer that does not append, during the pause
    for _ in range(20):  # a 5 s pause, the store's keeper ticking every 0.25 s (for `kept` only)
        now[0] += 250_000_000
        checked = kept.checked_dirs
        kept.keep_up()
        assert kept.checked_dirs - checked <= 6  # a few directories a tick, never all at once
    looks = {}
    for name, index in (("kept", kept), ("control", control)):
        checked = index.checked_dirs
        looks[name] = (index.view().session_info("s-20")["record_count"], index.checked_dirs - checked)
    assert looks["kept"][0] == looks["control"][0] == 2  # both see the change within the interval
    assert looks["kept"][1] <= 6  # kept up: the look itself checks a slice
    assert looks["control"][1] == 40  # the control: the look after the pause checks every directory
    # Idle (no look for over two full intervals): the keeper stats nothing.
    now[0] += 9_000_000_000
    checked = kept.checked_dirs
    kept.keep_up()
    assert kept.checked_dirs == checked
    older.close()


def test_the_keeper_finds_changes_but_only_a_look_copies_the_view(tmp_path, monkeypatch):
    """Applying changes copies the view's maps (O(sessions)): once a look, not once a keeper tick."""
    older = forty_sessions_by_an_older_writer(tmp_path)
    now = [0]
    index = sweeping_index(tmp_path, now)
    index.view()
    copies = []
    real_updated = IndexView.updated
    monkeypatch.setattr(
        IndexView, "updated", lambda view, changes: copies.append(dict(changes)) or real_updated(view, changes)
    )
    for i in range(20):  # ticks while another writer adds records
        alternate([older], [call(f"s-{i:02d}")])
        now[0] += 250_000_000
        index.keep_up()
    for _ in range(16):  # 4 s more: the sweep has checked every directory since its change
        now[0] += 250_000_000
        index.keep_up()
    assert copies == []
    view = index.view()
    assert len(copies) == 1 and len(copies[0]) == 20  # every change the ticks found, in one copy
    assert [view.session_info(f"s-{i:02d}")["record_count"] for i in (0, 19, 20)] == [2, 2, 1]
    older.close()


def test_the_store_keeps_its_index_up_on_a_thread_of_its_own(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(store_module, "KEEP_UP_INTERVAL_S", 0.01)
    monkeypatch.setattr(SessionIndex, "keep_up", lambda self: calls.append(1))
    store = CaptureStore(tmp_path)
    store.start()
    try:
        assert wait_for(lambda: len(calls) >= 3, 10, interval=0.01)
    finally:
        store.close()
    assert store._keeper is not None and not store._keeper.is_alive()  # stopped with the store
    alone = CaptureStore(tmp_path / "alone", shared_index=False)  # one process's own index: nothing to keep up
    alone.start()
    try:
        assert alone._keeper is None
    finally:
        alone.close()


@pytest.mark.parametrize("trouble", ["removed", "rotated", "garbled"])
def test_a_journal_that_cannot_say_what_changed_makes_the_reader_revalidate_everything(tmp_path, trouble):
    reader = CaptureStore(tmp_path, full_revalidation_s=NEVER)
    older = CaptureStore(tmp_path, change_journal=False)
    reader.start()
    older.start()
    try:
        assert ids(reader) == []
        alternate([older], [call("a")])
        path = journal_module.journal_path(tmp_path / "sessions")
        if trouble == "removed":
            os.unlink(path)
        elif trouble == "rotated":
            journal_module.rotate(tmp_path / "sessions")
        else:
            with open(path, "ab") as handle:
                handle.write(b"not a directory name\n")
        assert ids(reader) == ["a"]
        assert reader._index.full_revalidations == 2
    finally:
        reader.close()
        older.close()


def test_a_failed_append_removes_the_journal_so_readers_revalidate(tmp_path, monkeypatch):
    reader = CaptureStore(tmp_path, full_revalidation_s=NEVER)
    writer = CaptureStore(tmp_path)
    reader.start()
    writer.start()
    try:
        assert ids(reader) == []

        def full_disk(*args, **kwargs):
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(journal_module, "append", full_disk)
        alternate([writer], [call("a")])  # the record is kept; its journal line is not
        assert writer.stats()["journal_failed"] == 1 and writer.stats()["written"] == 1
        assert not os.path.exists(journal_module.journal_path(tmp_path / "sessions"))
        assert ids(reader) == ["a"]
    finally:
        reader.close()
        writer.close()


def entry(session_id: str, parent: str | None, count: int = 1) -> SessionEntry:
    return SessionEntry(session_id, parent, count, "2026-01-01T00:00:00+00:00", "2026-01-01T00:00:01+00:00")


def test_an_updated_view_equals_one_built_from_scratch():
    rng = random.Random(7)
    names = [f"s{i:03d}" for i in range(60)]
    current: dict[str, SessionEntry] = {}
    view = IndexView([])
    for _ in range(300):
        changes: dict[str, SessionEntry | None] = {}
        for session_id in rng.sample(names, rng.randint(1, 5)):
            if session_id in current and rng.random() < 0.3:
                changes[session_id] = None
            else:
                parent = rng.choice([None, None, *names[:8]])
                changes[session_id] = entry(session_id, parent if parent != session_id else None, rng.randint(1, 9))
        for session_id, new in changes.items():
            if new is None:
                current.pop(session_id, None)
            else:
                current[session_id] = new
        view = view.updated(changes)
        scratch = IndexView(list(current.values()))
        assert view.list_sessions(limit=1000) == scratch.list_sessions(limit=1000)
        assert view.list_sessions(roots_only=True, limit=1000) == scratch.list_sessions(roots_only=True, limit=1000)
        for parent in names[:8]:
            assert view.children(parent) == scratch.children(parent)
