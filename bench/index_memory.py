"""What the session index holds in memory: bytes a session and a record, for long and for short sessions.

Usage: python bench/index_memory.py [--sessions N] [--records-per-session N ...]

No server and no network: for each shape, a capture directory is written through `CaptureStore`
(full records), its directories are dated past the index's tally window (as a server restarted on
yesterday's captures sees them), then a fresh read-only store indexes it and lists its sessions,
under tracemalloc. Prints the bytes the index keeps (everything allocated and still alive), per
session and per record: an index whose memory grows with the calls shows it as bytes a record.
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from server.capture.index import TALLY_KEPT_S  # noqa: E402
from server.capture.store import CaptureStore  # noqa: E402
from tests.unit.capture.test_store import call  # noqa: E402


def populate(directory: Path, sessions: int, per_session: int) -> None:
    store = CaptureStore(directory, fsync="never")
    store.start()
    for i in range(sessions):
        parent = f"bench-session-{i - 1:06d}" if i % 3 else None  # a third are roots, as sub-agents make
        for _ in range(per_session):
            while not store.submit_call(**call(f"bench-session-{i:06d}", parent=parent)):
                time.sleep(0.01)  # the writer's queue is full: let it catch up
    store.flush(600)
    store.close()
    past = time.time_ns() - int(4 * TALLY_KEPT_S * 1e9)
    for path in [directory / "sessions", *(directory / "sessions").iterdir()]:
        os.utime(path, ns=(past, past))


def index_bytes(directory: Path) -> tuple[int, int]:
    """(bytes the index keeps, sessions it lists)."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    store = CaptureStore.open_read_only(directory)
    listed = len(store.list_sessions(limit=sys.maxsize))
    gc.collect()
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    kept = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    store.close()
    return kept, listed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=2000)
    parser.add_argument("--records-per-session", type=int, nargs="+", default=[1, 5, 50])
    args = parser.parse_args()
    print(f"{'sessions':>9} {'records':>8} {'kept MiB':>9} {'B/session':>10} {'B/record':>9}")
    for per_session in args.records_per_session:
        root = Path(tempfile.mkdtemp(prefix="switchyard-index-memory-"))
        try:
            populate(root, args.sessions, per_session)
            kept, listed = index_bytes(root)
            records = args.sessions * per_session
            assert listed == args.sessions, (listed, args.sessions)
            print(
                f"{args.sessions:>9} {records:>8} {kept / 2**20:>9.2f} {kept / args.sessions:>10.0f} {kept / records:>9.0f}"
            )
        finally:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
