"""What a server process sets for itself: dying with its parent (Linux), and a collector tuned for serving."""

from __future__ import annotations

import ctypes
import gc
import os
import signal

_PR_SET_PDEATHSIG = 1

# Set by a parent that wants its `serve` child gone when it dies (LocalServer, the workers' supervisor).
PARENT_PID_ENV = "SWITCHYARD_MODEL_PARENT_PID"


def die_with_parent(expected_parent_pid: int | None = None, sig: int = signal.SIGTERM) -> bool:
    """Have `sig` sent to this process when the thread that started it exits. False where unsupported.

    Call it first thing in the child. If the parent already died before the call (this process was
    handed to another parent), the signal is sent at once, so the child never outlives it.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if expected_parent_pid is not None and os.getppid() != expected_parent_pid:
        os.kill(os.getpid(), sig)
    return True


def die_with_parent_from_env() -> None:
    """In a `serve` child: honour `SWITCHYARD_MODEL_PARENT_PID` if the parent set it."""
    value = os.environ.pop(PARENT_PID_ENV, "")
    if value.isdigit():
        die_with_parent(int(value))


# Allocations (net of frees) between two young-generation collections; CPython's default is 700.
_YOUNG_COLLECTION_EVERY = 20_000
_OLDER_COLLECTION_EVERY = 20  # collections of one generation between two of the next


def calm_the_collector() -> None:
    """Make the cyclic garbage collector cheap per call, once a `serve` process is up (not in an embedding app).

    At 64 concurrent calls the collector ran every few calls, each time walking the live objects of
    every call in flight, and its full collections walked the whole startup heap (Switchyard's
    bindings, OpenTelemetry, the app): tens of microseconds per call on the event loop. The startup
    heap lives as long as the process, so it is frozen out of the collector's reach, and young
    collections run ~30x less often (most of a call's objects are freed by reference counting
    before one runs). Cycles are still collected; they wait a little longer. Measured in
    docs/benchmarks.md.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(_YOUNG_COLLECTION_EVERY, _OLDER_COLLECTION_EVERY, _OLDER_COLLECTION_EVERY)
