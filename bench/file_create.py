"""What a new file costs on a filesystem before and after a burst of deletions (the capture writer makes one per record).

Usage: python bench/file_create.py [--dir DIR] [--files N] [--waits 1,5,15,30,60,120]

Probes the CPU (user + system, this process) of creating 200 empty files in a fresh directory under
DIR (default: the system's temp folder, where the benchmarks put their capture folders), then writes
N record-sized files (107 KB) beside it, deletes them, and probes again at each wait (seconds after
the deletion). It also says whether DIR's filesystem is ext4 without a journal: such an ext4 will not
reuse an inode freed in the last 60 s (300 s while the inode table is not yet written back), and
each new file scans past every such inode, so creation costs far more for minutes after deletions.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)


def ext4_journal(path: Path) -> str:
    """`ext4, no journal`, `ext4, journal`, or the filesystem type, for the filesystem holding `path`."""
    best, device, kind = "", "", ""
    for line in Path("/proc/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) > 2 and str(path).startswith(fields[1]) and len(fields[1]) > len(best):
            best, device, kind = fields[1], fields[0], fields[2]
    if kind != "ext4":
        return kind or "unknown"
    task = Path("/sys/fs/ext4") / os.path.basename(device) / "journal_task"
    try:
        return "ext4, no journal" if task.read_text().strip() == "<none>" else "ext4, journal"
    except OSError:
        return "ext4"


def probe(root: Path, n: int = 200) -> float:
    """CPU µs per new empty file, in a fresh directory under `root`."""
    directory = Path(tempfile.mkdtemp(dir=root))
    samples = []
    for i in range(n):
        c0 = time.process_time()
        os.close(os.open(directory / f"f{i}", _NEW, 0o600))
        samples.append(time.process_time() - c0)
    # process_time ticks coarsely: the mean, not the median, of many calls.
    return statistics.mean(samples) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default=tempfile.gettempdir())
    parser.add_argument("--files", type=int, default=3000)
    parser.add_argument("--waits", default="1,5,15,30,60,120")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="file-create-", dir=args.dir))
    try:
        print(f"{root}: {ext4_journal(root)}")
        print(f"before: {probe(root):.0f} µs per new file")
        burst = root / "burst"
        burst.mkdir()
        data = os.urandom(107_000)
        for i in range(args.files):
            fd = os.open(burst / f"r{i}.json", _NEW, 0o600)
            os.write(fd, data)
            os.close(fd)
        os.sync()
        shutil.rmtree(burst)
        deleted = time.monotonic()
        for wait in (float(w) for w in args.waits.split(",")):
            time.sleep(max(0.0, deleted + wait - time.monotonic()))
            print(f"{wait:5.0f} s after deleting {args.files} files: {probe(root):.0f} µs per new file", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
