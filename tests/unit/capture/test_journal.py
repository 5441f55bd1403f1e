"""The change journal: readers get exactly the lines appended since their last look, or None when the
journal cannot say what changed (missing, rotated, truncated, garbled)."""

from __future__ import annotations

import os
import re
import threading

from server.capture.write import journal

IS_NAME = re.compile(r"[0-9a-f]{64}").fullmatch


def name(i: int) -> str:
    return f"{i:064x}"


def reader(tmp_path) -> journal.JournalReader:
    return journal.JournalReader(tmp_path, IS_NAME)


def test_a_reader_gets_the_lines_appended_since_its_last_look(tmp_path):
    journal.create(tmp_path)
    journal.append(tmp_path, [name(1)])
    follower = reader(tmp_path)
    assert follower.changes() is None  # first look: it starts at the end, and the caller revalidates all
    assert follower.changes() == set()
    journal.append(tmp_path, [name(2), name(3)])
    journal.append(tmp_path, [name(2)])
    assert follower.changes() == {name(2), name(3)}
    assert follower.changes() == set()


def test_a_missing_journal_says_nothing_can_be_trusted(tmp_path):
    follower = reader(tmp_path)
    assert follower.changes() is None
    assert follower.changes() is None  # still missing
    journal.append(tmp_path, [name(1)])  # appending makes it
    assert follower.changes() is None  # a new file: position at its end, revalidate once
    journal.append(tmp_path, [name(2)])
    assert follower.changes() == {name(2)}


def test_rotation_and_truncation_make_the_reader_revalidate_once(tmp_path):
    journal.create(tmp_path)
    follower = reader(tmp_path)
    follower.changes()
    journal.append(tmp_path, [name(1)])
    journal.rotate(tmp_path)  # the line above is gone with the old file
    assert follower.changes() is None
    journal.append(tmp_path, [name(2)])
    assert follower.changes() == {name(2)}
    os.truncate(journal.journal_path(tmp_path), 0)
    assert follower.changes() is None
    journal.append(tmp_path, [name(3)])
    assert follower.changes() == {name(3)}


def test_append_rotates_past_the_limit(tmp_path):
    journal.create(tmp_path)
    follower = reader(tmp_path)
    follower.changes()
    before = os.stat(journal.journal_path(tmp_path)).st_ino
    for i in range(10):
        journal.append(tmp_path, [name(i)], rotate_bytes=65 * 5)
    assert os.path.getsize(journal.journal_path(tmp_path)) <= 65 * 5
    assert os.stat(journal.journal_path(tmp_path)).st_ino != before
    assert follower.changes() is None


def test_a_line_being_written_is_read_when_it_is_whole(tmp_path):
    journal.create(tmp_path)
    follower = reader(tmp_path)
    follower.changes()
    path = journal.journal_path(tmp_path)
    with open(path, "ab") as handle:
        handle.write(name(7)[:30].encode())
    assert follower.changes() == set()
    with open(path, "ab") as handle:
        handle.write(name(7)[30:].encode() + b"\n")
    assert follower.changes() == {name(7)}


def test_a_garbled_line_makes_the_reader_revalidate(tmp_path):
    journal.create(tmp_path)
    follower = reader(tmp_path)
    follower.changes()
    with open(journal.journal_path(tmp_path), "ab") as handle:
        handle.write(b"\0" * 40 + name(1)[40:].encode() + b"\n")  # as two hosts' appends over NFS can leave it
    assert follower.changes() is None
    journal.append(tmp_path, [name(2)])
    assert follower.changes() == {name(2)}


def test_concurrent_appenders_never_interleave_their_lines(tmp_path):
    journal.create(tmp_path)
    follower = reader(tmp_path)
    follower.changes()
    threads, per_thread = 8, 100

    def appender(t: int) -> None:
        for i in range(per_thread):
            # Batches of varying size, some over one write's worth (4096 bytes), as a busy writer's.
            lines = [name(t * 100_000 + i * 100 + k) for k in range(1 + i % 70)]
            journal.append(tmp_path, lines, rotate_bytes=1 << 30)

    workers = [threading.Thread(target=appender, args=(t,)) for t in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    expected = {
        name(t * 100_000 + i * 100 + k) for t in range(threads) for i in range(per_thread) for k in range(1 + i % 70)
    }
    assert follower.changes() == expected  # every line whole: a torn one would have made this None
