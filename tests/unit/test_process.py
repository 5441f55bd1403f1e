"""The collector a `serve` process runs with: the startup heap frozen, young collections rarer, cycles still freed."""

from __future__ import annotations

import subprocess
import sys

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
