"""The collector and allocator a `serve` process runs with: the startup heap frozen, young collections rarer, cycles
still freed; large buffers given back when freed."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from tests.support.procs import REPO

# Run in a child: the settings are process-wide and must not leak into the test process.
_CHILD = """
import gc, weakref
from server.process import calm_the_collector

class Node:
    pass

startup = [Node() for _ in range(1000)]
calm_the_collector()
assert gc.get_freeze_count() >= len(startup), gc.get_freeze_count()
assert gc.get_threshold()[0] > 700, gc.get_threshold()

# A reference cycle made while serving is still freed, once enough allocations have happened.
a, b = Node(), Node()
a.other, b.other = b, a
freed = weakref.ref(a)
del a, b
assert freed() is not None  # only the collector can free a cycle
churn = [[] for _ in range(gc.get_threshold()[0] + 100)]
assert freed() is None, "the cycle outlived a young collection"
print("ok")
"""


def test_startup_heap_frozen_and_cycles_still_collected():
    done = subprocess.run([sys.executable, "-c", _CHILD], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


# A large free first (glibc then raises its threshold to 8 MiB), then a hundred 1 MiB buffers, each
# followed by a small block that stays: freed, the buffers give their memory back only if mapped.
_ALLOCATOR_CHILD = """
import sys
from server.process import steady_the_allocator

def rss_mib():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20

if sys.argv[1] == "steady":
    assert steady_the_allocator()
big = bytearray(8 << 20)
del big
buffers, kept = [], []
for _ in range(100):
    buffers.append(bytearray(1 << 20))
    kept.append(bytearray(600))  # above the interpreter's small-object size: from the C heap
peak = rss_mib()
del buffers
print(round(peak - rss_mib()))
"""


def _given_back_mib(mode: str) -> int:
    done = subprocess.run(
        [sys.executable, "-c", _ALLOCATOR_CHILD, mode], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return int(done.stdout)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the setting is glibc's")
def test_large_buffers_freed_while_serving_are_given_back():
    assert _given_back_mib("steady") >= 90
    # Negative control: glibc's own behaviour keeps the freed megabytes behind the small blocks.
    assert _given_back_mib("default") <= 10
