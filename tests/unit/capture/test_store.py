"""Capture store: durable atomic files in the plain `<uuid>.json` layout, the writer thread, the index, reads, deletes."""

from __future__ import annotations

import hashlib
import logging
import os
import stat
import threading
import time

import orjson
import pytest

from server.capture import store as store_module
from server.capture.read import record_files as record_files_module
from server.capture.store import CaptureStore, InvalidSessionId, UnknownSession, session_dir_name
from server.capture.write import writer as writer_module
from server.capture.write.record import RecordInput, build_record, record_of
from tests.support.captures import captured_call as call
from tests.support.captures import chat_response
from tests.support.captures import submit_all as write


def record(session_id, parent=None, **overrides):
    return build_record(**call(session_id, parent, **overrides))


@pytest.fixture
def store(tmp_path):
    capture = CaptureStore(tmp_path / "captures")
    capture.start()
    yield capture
    capture.close()


def session_path(store, session_id):
    return store.capture_dir / "sessions" / hashlib.sha256(session_id.encode()).hexdigest()


def test_record_lands_at_the_former_layout(tmp_path):
    """`encoding="full"` (`capture_encoding: full`) keeps the plain layout of Switchyard's token capture."""
    store = CaptureStore(tmp_path / "captures", encoding="full")
    store.start()
    write(store, call("sess-1", record_uuid="11111111-2222-3333-4444-555555555555"))
    store.close()
    path = session_path(store, "sess-1") / "11111111-2222-3333-4444-555555555555.json"
    assert path.is_file()
    on_disk = orjson.loads(path.read_bytes())
    assert on_disk["session_id"] == "sess-1"
    assert on_disk["generation_token_ids"] == [7, 8]
    assert session_dir_name("sess-1") == path.parent.name
    assert len(path.parent.name) == 64
    assert store.stats()["written"] == 1


def test_files_are_owner_only_and_directories_0700(store):
    write(store, call("sess-1"))
    directory = session_path(store, "sess-1")
    [path] = list(directory.glob("*"))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert stat.S_IMODE((store.capture_dir / "sessions").stat().st_mode) == 0o700
    assert stat.S_IMODE(store.capture_dir.stat().st_mode) == 0o700


def test_no_temporary_files_remain(store):
    write(store, *(call("sess-1") for _ in range(5)))
    names = os.listdir(session_path(store, "sess-1"))
    assert len(names) == 5
    assert all(name.endswith(".json") and not name.startswith(".") for name in names)


def test_record_is_built_on_the_writer_thread(tmp_path, monkeypatch):
    threads = []

    def spy(given):
        threads.append(threading.current_thread())
        return record_of(given)

    monkeypatch.setattr(writer_module, "record_of", spy)
    capture = CaptureStore(tmp_path)
    capture.start()
    try:
        write(capture, call("sess-1"))
    finally:
        capture.close()
    assert threads and threads[0] is not threading.current_thread()


def test_a_reader_never_sees_a_torn_file(store):
    # Long token lists make each write take a while; readers poll the directory meanwhile.
    big = call("busy", chat_response=chat_response(prompt=range(20000), generation=range(2000)))
    problems = []
    stop = threading.Event()

    def read_loop():
        while not stop.is_set():
            try:
                records, skipped = store.read_completions("busy")
            except UnknownSession:
                continue
            if skipped:
                problems.append(skipped)

    readers = [threading.Thread(target=read_loop) for _ in range(2)]
    for reader in readers:
        reader.start()
    try:
        for _ in range(40):
            assert store.submit_call(RecordInput(**big))
        assert store.flush(30)
    finally:
        stop.set()
        for reader in readers:
            reader.join()
    assert problems == []
    assert len(store.read_completions("busy")[0]) == 40


def test_torn_and_foreign_files_are_skipped_and_counted(store, tmp_path):
    write(store, call("sess-1"))
    directory = session_path(store, "sess-1")
    (directory / "0000-torn.json").write_bytes(b'{"schema_version": 1, "uuid": "x", "sess')
    (directory / "not-a-record.json").write_bytes(b"[1, 2, 3]")
    (directory / "README").write_text("ignored: not *.json")
    records, skipped = store.read_completions("sess-1")
    assert len(records) == 1
    assert skipped == 2
    reopened = CaptureStore(store.capture_dir)
    reopened.start()
    try:
        assert reopened.stats()["skipped"] == 2
        assert reopened.session_info("sess-1")["record_count"] == 1
    finally:
        reopened.close()


def test_a_record_in_the_wrong_directory_is_not_served(store):
    write(store, call("victim"), call("other"))
    # A crafted file claiming another session, planted in victim's directory.
    planted = record("other", record_uuid="planted")
    (session_path(store, "victim") / "planted.json").write_bytes(orjson.dumps(planted))
    records, skipped = store.read_completions("victim")
    assert [r["session_id"] for r in records] == ["victim"]
    assert skipped == 1
    other_records, _ = store.read_completions("other")
    assert "planted" not in {r["uuid"] for r in other_records}
    reopened = CaptureStore.open_read_only(store.capture_dir)
    assert reopened.session_info("other")["record_count"] == 1
    assert reopened.stats()["skipped"] == 1


def test_symlinked_record_is_not_followed(store, tmp_path):
    write(store, call("sess-1"))
    outside = tmp_path / "outside.json"
    outside.write_bytes(orjson.dumps(record("sess-1", record_uuid="outside")))
    os.symlink(outside, session_path(store, "sess-1") / "outside.json")
    records, skipped = store.read_completions("sess-1")
    assert "outside" not in {r["uuid"] for r in records}
    assert skipped == 1


def test_ids_a_sanitiser_would_merge_stay_isolated(store):
    # Case-insensitive filesystems and "replace odd chars" sanitisers would merge these.
    ids = ("Tenant-A", "tenant-a", "a.b", "a_b", "a:b", "a/b", "../b", "user@example.com", "swe:django-1234:0")
    write(store, *(call(session_id) for session_id in ids))
    for session_id in ids:
        records, _ = store.read_completions(session_id)
        assert [r["session_id"] for r in records] == [session_id]
    # Hashed: ids holding `/` or `..` are still one directory each, directly under sessions/.
    assert len({session_path(store, s) for s in ids}) == len(ids)
    assert {p.parent for p in (session_path(store, s) for s in ids)} == {store.sessions_dir}


@pytest.mark.parametrize("bad", ["..", ".", "../ secret", "a b", "", "x" * 201, "a\n", "s\u00e9ance"])
def test_invalid_ids_are_refused_before_any_use(store, bad, monkeypatch):
    (store.capture_dir / "secret.json").write_bytes(orjson.dumps(record("secret")))

    def no_filesystem(*args, **kwargs):
        raise AssertionError("an invalid id reached the filesystem")

    monkeypatch.setattr(store_module.os, "scandir", no_filesystem)
    with pytest.raises(InvalidSessionId):
        store.read_completions(bad)
    with pytest.raises(InvalidSessionId):
        store.delete_session(bad)
    monkeypatch.undo()
    assert store.submit_call(RecordInput(**call(bad))) is False  # uncorrelated: not captured by default
    assert store.flush(5)
    assert store.stats()["written"] == 0
    assert store.stats()["uncorrelated"] == 1


def test_uncorrelated_calls_are_captured_only_when_asked(tmp_path):
    capture = CaptureStore(tmp_path, capture_uncorrelated=True)
    capture.start()
    try:
        assert capture.submit_call(RecordInput(**call(None, record_uuid="u-1")))
        assert capture.submit_call(RecordInput(**call("bad id", record_uuid="u-2")))
        assert capture.flush(10)
        ids = [s["session_id"] for s in capture.list_sessions()]
        assert ids == ["uncorrelated-u-1", "uncorrelated-u-2"]
        assert capture.read_completions("uncorrelated-u-1")[0][0]["uuid"] == "u-1"
    finally:
        capture.close()


def test_invalid_parent_is_dropped_not_stored(store):
    write(store, call("child", parent="../ ../etc"))
    records, _ = store.read_completions("child")
    assert records[0]["parent_session_id"] is None
    assert store.session_info("child")["parent_session_id"] is None


def test_records_are_ordered_by_captured_at_then_uuid(store):
    stamps = [
        ("2026-01-01T00:00:02.000000+00:00", "a"),
        ("2026-01-01T00:00:01.000000+00:00", "z"),
        ("2026-01-01T00:00:01.000000+00:00", "b"),
        ("2026-01-01T00:00:00.500000+00:00", "y"),
    ]
    write(store, *(call("sess-1", captured_at=at, record_uuid=u) for at, u in stamps))
    records, skipped = store.read_completions("sess-1")
    assert skipped == 0
    assert [r["uuid"] for r in records] == ["y", "b", "z", "a"]
    info = store.session_info("sess-1")
    assert info["first_captured_at"] == "2026-01-01T00:00:00.500000+00:00"
    assert info["last_captured_at"] == "2026-01-01T00:00:02.000000+00:00"
    assert info["record_count"] == 4


def test_a_new_store_on_the_same_directory_serves_earlier_records(tmp_path):
    first = CaptureStore(tmp_path)
    first.start()
    write(first, call("root-1"), call("root-1"), call("sub-1", parent="root-1"))
    first.close()
    second = CaptureStore(tmp_path)
    second.start()
    try:
        assert [s["session_id"] for s in second.list_sessions()] == ["root-1", "sub-1"]
        assert second.session_info("root-1")["record_count"] == 2
        assert second.children("root-1") == ["sub-1"]
        assert len(second.read_completions("root-1")[0]) == 2
        # And it keeps writing into the same index.
        write(second, call("root-1"))
        assert second.session_info("root-1")["record_count"] == 3
    finally:
        second.close()


def test_full_queue_drops_instead_of_blocking(tmp_path):
    capture = CaptureStore(tmp_path, queue_size=2)  # not started: nothing drains the queue
    started = time.monotonic()
    results = [capture.submit_call(RecordInput(**call("sess-1"))) for _ in range(3)]
    assert time.monotonic() - started < 5  # a blocking submit would never return: nothing drains
    assert results == [True, True, False]
    assert capture.stats()["dropped"] == 1
    assert capture.stats()["queue_depth"] == 2
    capture.close()  # drains what was accepted
    assert capture.stats()["written"] == 2
    assert capture.submit_call(RecordInput(**call("sess-1"))) is False  # closed
    assert capture.stats()["dropped"] == 2


def test_unwritable_directory_counts_failures_and_never_raises(tmp_path, caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    capture = CaptureStore(blocker / "captures")
    with caplog.at_level(logging.ERROR, logger="switchyard_model.capture"):
        capture.start()  # logs, does not raise
        try:
            for _ in range(3):
                assert capture.submit_call(RecordInput(**call("sess-1"))) is True
            assert capture.flush(10)
        finally:
            capture.close()
    stats = capture.stats()
    assert stats["failed"] == 3
    assert stats["written"] == 0
    # Rate-limited: one line about the failing writes, not one per record.
    write_errors = [r for r in caplog.records if "capture write failed" in r.getMessage()]
    assert len(write_errors) == 1


def test_a_failed_build_does_not_stop_the_writer(store):
    unserialisable = call("sess-1", chat_request={"messages": [{"role": "user", "content": {1, 2}}]})
    assert store.submit_call(RecordInput(**unserialisable))
    write(store, call("sess-1"))
    assert store.stats()["failed"] == 1
    assert store.stats()["written"] == 1


def test_prebuilt_records(store):
    assert store.submit(record("sess-1", record_uuid="pre-1"))
    assert store.flush(5)
    assert store.read_completions("sess-1")[0][0]["uuid"] == "pre-1"
    assert store.submit({"not": "a record"}) is False
    assert store.submit(record("sess-1", record_uuid="../escape")) is False
    assert store.stats()["rejected"] == 2


def test_a_record_written_again_under_its_own_name_is_counted_once(store):
    """A caller's own record name may already be on disk: the rename replaces the file, and the index
    (keyed by file name) keeps one entry for it."""
    for _ in range(2):
        assert store.submit(record("sess-1", record_uuid="pre-1"))
        write(store, call("sess-1", record_uuid="own-1"))
    assert store.flush(5)
    files = sorted(p.name.split(".")[0] for p in (store.sessions_dir / session_dir_name("sess-1")).iterdir())
    assert files == ["own-1", "pre-1"]
    assert store.session_info("sess-1")["record_count"] == 2
    assert len(store.list_sessions()) == 1 and store.list_sessions()[0]["record_count"] == 2


def populate(store):
    write(
        store,
        call("root-1", captured_at="2026-01-01T00:00:00.000000+00:00"),
        call("sub-1", parent="root-1"),
        call("sub-2", parent="root-1"),
        call("sub-2", parent="root-1"),
        call("subsub", parent="sub-1"),
        call("root-2"),
    )


def test_list_sessions_fields_and_filters(store):
    populate(store)
    listed = store.list_sessions()
    assert [s["session_id"] for s in listed] == ["root-1", "root-2", "sub-1", "sub-2", "subsub"]
    assert {s["session_id"]: s["parent_session_id"] for s in listed} == {
        "root-1": None,
        "root-2": None,
        "sub-1": "root-1",
        "sub-2": "root-1",
        "subsub": "sub-1",
    }
    sub2 = next(s for s in listed if s["session_id"] == "sub-2")
    assert sub2["record_count"] == 2
    assert sub2["first_captured_at"] <= sub2["last_captured_at"]
    assert [s["session_id"] for s in store.list_sessions(parent="root-1")] == ["sub-1", "sub-2"]
    assert [s["session_id"] for s in store.list_sessions(roots_only=True)] == ["root-1", "root-2"]
    assert store.children("root-1") == ["sub-1", "sub-2"]
    assert store.children("subsub") == []


def test_list_sessions_paging_visits_each_once(store):
    populate(store)
    seen, after = [], None
    while True:
        page = store.list_sessions(limit=2, after=after)
        if not page:
            break
        seen += [s["session_id"] for s in page]
        after = page[-1]["session_id"]
    assert seen == ["root-1", "root-2", "sub-1", "sub-2", "subsub"]


def test_delete_session(store):
    populate(store)
    assert store.delete_session("sub-2") == 2
    assert not session_path(store, "sub-2").exists()
    assert "sub-2" not in [s["session_id"] for s in store.list_sessions()]
    assert store.children("root-1") == ["sub-1"]
    with pytest.raises(UnknownSession):
        store.read_completions("sub-2")
    with pytest.raises(UnknownSession):
        store.delete_session("sub-2")
    # Deleted sessions can be captured again.
    write(store, call("sub-2", parent="root-1"))
    assert store.session_info("sub-2")["record_count"] == 1


def test_unknown_session(store):
    with pytest.raises(UnknownSession):
        store.read_completions("never-seen")
    assert store.session_info("never-seen") is None


def test_close_is_idempotent_and_flushes(tmp_path):
    capture = CaptureStore(tmp_path)
    capture.start()
    for _ in range(20):
        capture.submit_call(RecordInput(**call("sess-1")))
    capture.close()
    capture.close()
    assert capture.stats()["written"] == 20
    assert capture.stats()["queue_depth"] == 0
    assert len(list((tmp_path / "sessions").rglob("*.json"))) == 20


def test_read_only_store_creates_and_writes_nothing(tmp_path):
    missing = tmp_path / "missing"
    reader = CaptureStore.open_read_only(missing)
    assert reader.list_sessions() == []
    assert reader.submit_call(RecordInput(**call("sess-1"))) is False
    reader.close()
    assert not missing.exists()


def test_stats_shape(store):
    stats = store.stats()
    counters = {"written", "failed", "dropped", "timed_out", "queue_depth", "skipped", "syncs", "synced"}
    assert set(stats) >= counters | {"status", "degraded_reason", "fsync"}
    assert all(isinstance(stats[name], int) for name in counters)
    assert (stats["status"], stats["degraded_reason"], stats["fsync"]) == ("ok", None, "batch")


def test_start_indexes_a_large_directory_quickly(tmp_path):
    # 2000 records with 8k-token prompts: the index build is one parse per file, no more.
    sessions = tmp_path / "sessions"
    prompt = list(range(8000))
    for i in range(2000):
        rec = record(f"s-{i % 200}", chat_response=chat_response(prompt=prompt, generation=range(200)))
        directory = sessions / session_dir_name(rec["session_id"])
        directory.mkdir(parents=True, exist_ok=True)
        (directory / f"{rec['uuid']}.json").write_bytes(orjson.dumps(rec))
    started = time.monotonic()
    capture = CaptureStore(tmp_path)
    capture.start()
    elapsed = time.monotonic() - started
    capture.close()
    assert len(capture.list_sessions(limit=10000)) == 200
    assert elapsed < 20, elapsed


def test_compressed_records_are_served_exactly_like_plain_ones(tmp_path):
    """`compress=True` writes `<uuid>.json.gz`; a store reads both kinds, so the setting may change."""
    import gzip as gzip_module

    plain = CaptureStore(tmp_path, encoding="full")
    plain.start()
    assert plain.submit(record("mixed", record_uuid="a-plain", captured_at="2026-01-01T00:00:00.000001+00:00"))
    plain.close()
    packed = CaptureStore(tmp_path, compress=True, encoding="full")
    packed.start()
    assert packed.submit(record("mixed", record_uuid="b-packed", captured_at="2026-01-01T00:00:00.000002+00:00"))
    packed.flush()
    files = sorted(p.name for p in (tmp_path / "sessions").glob("*/*") if p.is_file())
    assert files == ["a-plain.json", "b-packed.json.gz"]
    gz_path = next((tmp_path / "sessions").rglob("*.gz"))
    assert orjson.loads(gzip_module.decompress(gz_path.read_bytes()))["uuid"] == "b-packed"
    records, skipped = packed.read_completions("mixed")
    assert [r["uuid"] for r in records] == ["a-plain", "b-packed"] and skipped == 0
    assert packed.list_sessions()[0]["record_count"] == 2
    gz_path.write_bytes(gz_path.read_bytes()[:20])  # a torn compressed file is skipped, not a crash
    assert [r["uuid"] for r in packed.read_completions("mixed")[0]] == ["a-plain"]
    packed.close()


# ---- the index reads record headers, not whole records ---------------------------------------


def _write_raw(capture_dir, session_id, name, data: bytes):
    directory = capture_dir / "sessions" / session_dir_name(session_id)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / name).write_bytes(data)


def _count_full_parses(monkeypatch):
    parsed = []
    real = record_files_module.load_record

    def counting(path):
        parsed.append(path)
        return real(path)

    monkeypatch.setattr(record_files_module, "load_record", counting)
    return parsed


def test_indexing_reads_headers_not_whole_records(tmp_path, monkeypatch):
    capture_dir = tmp_path / "captures"
    big = record("ses-big", parent="ses-root", chat_request={"messages": [{"role": "user", "content": "x" * 200_000}]})
    _write_raw(capture_dir, "ses-big", f"{big['uuid']}.json", orjson.dumps(big))
    small = record("ses-root")
    _write_raw(capture_dir, "ses-root", f"{small['uuid']}.json", orjson.dumps(small))
    parsed = _count_full_parses(monkeypatch)
    reader = CaptureStore.open_read_only(capture_dir)
    assert parsed == []  # neither file was parsed whole
    assert reader.session_info("ses-big") == {
        "session_id": "ses-big",
        "parent_session_id": "ses-root",
        "parent_missing": False,
        "record_count": 1,
        "first_captured_at": big["captured_at"],
        "last_captured_at": big["captured_at"],
        "runs": [None],
        "identified_by": None,
    }
    assert [s["session_id"] for s in reader.list_sessions()] == ["ses-big", "ses-root"]


def test_records_in_another_layout_are_parsed_whole_and_torn_ones_skipped(tmp_path, monkeypatch):
    """Negative controls for the header read: a record written by another tool (spaces, other key
    order) still counts, via a full parse; a file cut short is skipped, though its head is intact."""
    import json

    capture_dir = tmp_path / "captures"
    foreign = record("ses-foreign")
    _write_raw(capture_dir, "ses-foreign", f"{foreign['uuid']}.json", json.dumps(foreign, indent=1).encode())
    torn = record("ses-torn")
    _write_raw(capture_dir, "ses-torn", f"{torn['uuid']}.json", orjson.dumps(torn)[:-40])
    parsed = _count_full_parses(monkeypatch)
    reader = CaptureStore.open_read_only(capture_dir)
    assert len(parsed) == 2
    assert reader.session_info("ses-foreign")["record_count"] == 1
    assert reader.session_info("ses-torn") is None
    assert reader.stats()["skipped"] == 1


def test_a_header_filed_under_another_session_is_not_indexed(tmp_path):
    capture_dir = tmp_path / "captures"
    stray = record("ses-elsewhere")
    _write_raw(capture_dir, "ses-here", f"{stray['uuid']}.json", orjson.dumps(stray))
    reader = CaptureStore.open_read_only(capture_dir)
    assert reader.session_info("ses-elsewhere") is None and reader.session_info("ses-here") is None


# ---- indexing in the background (the server's start) -------------------------------------------


@pytest.fixture
def earlier_run(tmp_path):
    """A capture directory an earlier server run wrote three sessions into."""
    first = CaptureStore(tmp_path / "captures", server_run="run-a")
    first.start()
    write(first, *(call(f"old-{i}") for i in range(3)))
    first.close()
    return tmp_path / "captures"


@pytest.fixture
def gated_header_reads(monkeypatch):
    """Record heads are read only once the returned event is set; `reading` is set at the first read."""
    gate, reading = threading.Event(), threading.Event()
    real = store_module.read_header

    def gated(path, dir_name):
        reading.set()
        assert gate.wait(20), "the test never opened the gate"
        return real(path, dir_name)

    monkeypatch.setattr(store_module, "read_header", gated)
    yield gate, reading
    gate.set()


def _session_ids(store):
    return {s["session_id"] for s in store.list_sessions(parent=None, roots_only=False, limit=100)}


def test_a_background_start_writes_at_once_and_readers_wait_for_the_whole_index(earlier_run, gated_header_reads):
    gate, reading = gated_header_reads
    store = CaptureStore(earlier_run, server_run="run-b")
    try:
        store.start(index_in_background=True)  # returns while the scan waits at the gate
        assert reading.wait(10)
        assert store.stats()["indexed"] is False
        write(store, call("new-1"))  # a call's record is written while the scan is still going
        listed: dict[str, set[str]] = {}
        reader = threading.Thread(target=lambda: listed.setdefault("ids", _session_ids(store)))
        reader.start()
        reader.join(0.5)
        assert reader.is_alive(), "a reader saw the index before the first scan was done"
        gate.set()
        reader.join(10)
        assert listed["ids"] == {"old-0", "old-1", "old-2", "new-1"}
        assert store.wait_indexed(10) and store.stats()["indexed"] is True
    finally:
        gate.set()
        store.close()


def test_control_the_default_start_waits_for_the_scan(earlier_run, gated_header_reads):
    """What the test above tells apart: a start that indexes first does not return at the gate."""
    gate, reading = gated_header_reads
    store = CaptureStore(earlier_run, server_run="run-b")
    starting = threading.Thread(target=store.start)
    try:
        starting.start()
        assert reading.wait(10)
        starting.join(0.5)
        assert starting.is_alive()
        gate.set()
        starting.join(10)
        assert store.stats()["indexed"] is True and _session_ids(store) == {"old-0", "old-1", "old-2"}
    finally:
        gate.set()
        starting.join(10)
        store.close()


def test_a_session_reused_across_runs_is_still_reported_when_written_before_the_scan_found_it(
    earlier_run, gated_header_reads, caplog
):
    """The check needs the runs already in the session directory: it waits for the scan to know them."""
    gate, reading = gated_header_reads
    caplog.set_level(logging.WARNING, logger="switchyard_model.capture")
    store = CaptureStore(earlier_run, server_run="run-b")
    try:
        store.start(index_in_background=True)
        assert reading.wait(10)
        write(store, call("old-1"), call("new-1"))
        assert not [r for r in caplog.records if "earlier server run" in r.getMessage()]  # not known yet
        gate.set()
        assert store.wait_indexed(10)
    finally:
        gate.set()
        store.close()
    warnings = [r.getMessage() for r in caplog.records if "earlier server run" in r.getMessage()]
    assert len(warnings) == 1 and "'old-1'" in warnings[0] and "run-a" in warnings[0] and "run-b" in warnings[0]
