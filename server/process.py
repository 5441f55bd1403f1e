"""Child-process lifetime on Linux: a child asks the kernel to signal it when its parent dies."""

from __future__ import annotations

import ctypes
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
