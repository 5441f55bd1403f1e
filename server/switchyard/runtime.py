"""What Switchyard's native runtime reads from this process's environment: its worker-thread count, and NO_PROXY.

Used by every way of running Switchyard: hosted in this process, launched as a child, or hosted in a
process of its own (host.py); and by the benchmarks, which size it the same way.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from server.config import ConfigError

_LOOPBACK = "127.0.0.1,localhost,::1"

# Switchyard's Tokio runtime reads its worker count from this variable, once, when the process's
# first native server starts (the runtime is shared and outlives it); unset, one worker per core.
TOKIO_THREADS_ENV = "TOKIO_WORKER_THREADS"
# Hosted in this process, Switchyard serves one event loop's calls and keeps pace with it on a few
# threads (its CPU per call is 0.5-3x the loop's: docs/benchmarks.md). A worker per core of a big
# node, in every server of a server-per-rollout fleet, only adds threads, memory and work stealing.
HOSTED_THREADS_MAX = 4


def ensure_no_proxy_for_loopback() -> None:
    """Switchyard honours HTTP_PROXY even for 127.0.0.1 upstreams; keep loopback traffic direct."""
    for var in ("NO_PROXY", "no_proxy"):
        current = os.environ.get(var, "")
        missing = [h for h in _LOOPBACK.split(",") if h not in current.split(",")]
        if missing:
            os.environ[var] = ",".join([p for p in [current, *missing] if p])


def switchyard_threads(setting: int | None, *, hosted: bool, cpus: int | None = None) -> int | None:
    """The worker threads to ask of Switchyard's runtime; None leaves its default (one per core).

    `switchyard_threads` wins, then a `TOKIO_WORKER_THREADS` the user set (checked here: Switchyard
    itself panics on a bad one), then the hosted default.
    """
    if setting is not None:
        return setting
    value = os.environ.get(TOKIO_THREADS_ENV)
    if value is not None:
        try:
            threads = int(value)
        except ValueError:
            threads = 0
        if threads < 1:
            raise ConfigError(
                f"{TOKIO_THREADS_ENV}={value!r} is not a positive integer (Switchyard's worker threads); "
                "unset it or set switchyard_threads"
            )
        return threads  # passed on as written here, so Switchyard reads a plain number
    if not hosted:
        return None
    return min(HOSTED_THREADS_MAX, cpus or available_cpus())


def available_cpus() -> int:
    """The cores this process may run on (its affinity), as Tokio counts them."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


@contextlib.contextmanager
def environment_set(name: str, value: str | None) -> Iterator[None]:
    """`name` set to `value` (None: left as it is) for the duration, then put back."""
    if value is None:
        yield
        return
    saved = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = saved
