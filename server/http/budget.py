"""The request-body budget: bytes of request bodies a process holds at once (503 beyond), and freed heap given back after large ones.

A request's body costs this server a few times its bytes while the call runs (the bytes, the parsed
body, the JSON sent upstream, the capture record), so a count limit alone lets a handful of
maximum-size bodies take gigabytes. Each request with a body holds its declared length (or, sent
chunked, the bytes as they arrive) from before its body is read until its answer is over; a request
that does not fit gets a fast 503 with `Retry-After`, without its body being read. One request
always fits when nothing else is held, so a body under `max_body_bytes` is never refused on an
idle server.

Freed memory: glibc keeps freed heap in its arenas, so a process that once held a few large bodies
stays that large. After a large request ends, `malloc_trim(0)` (on a worker thread, at most one at
a time) hands the free pages back; see docs/operations.md for the figures.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
from collections.abc import Callable

from starlette.types import Message, Receive, Scope

from server.errors import OpenAIError

log = logging.getLogger("switchyard_model.http")

# A request whose body held at least this many bytes trims the heap when it ends.
TRIM_AFTER_BYTES = 4 * 1024 * 1024
TRIM_DELAY_S = 0.5


# glibc's mallopt parameters, and the values set (see `_libc`).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD_BYTES = 1024 * 1024
TRIM_THRESHOLD_BYTES = 8 * 1024 * 1024


def _libc() -> ctypes.CDLL | None:
    """glibc, with the fixed thresholds set; None where malloc is not glibc's (musl, macOS).

    glibc raises its mmap threshold each time a large block is freed (up to 32 MiB), and its trim
    threshold to twice that: after one large body, blocks of tens of MiB come from a thread's arena
    and stay resident when freed (`malloc_trim` releases the free pages inside an arena, not the
    top of a thread's arena). Fixed thresholds keep every block from 1 MiB on in a mapping of its
    own, unmapped when freed, and let an arena's free top go back past 8 MiB.
    """
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        if libc is None or not hasattr(libc, "malloc_trim") or not hasattr(libc, "mallopt"):
            return None
    except OSError:
        return None
    libc.malloc_trim.argtypes = [ctypes.c_size_t]
    libc.malloc_trim.restype = ctypes.c_int
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.mallopt.restype = ctypes.c_int
    libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
    libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    return libc


class BodyBudget:
    """The request-body bytes this process holds (`held`), at most `limit` at once."""

    def __init__(self, limit: int, largest_body: int, *, trim: bool = True) -> None:
        self.limit = limit
        # A longer declared length is refused (413) once that many bytes were read: it never holds more.
        self.largest_body = largest_body
        self.held = 0
        self.refused = 0  # requests answered 503 for want of room, since start
        libc = _libc() if trim else None
        self._malloc_trim: Callable[[int], int] | None = libc.malloc_trim if libc is not None else None
        self.trims = 0  # heap trims done, since start
        self._trim_timer: asyncio.TimerHandle | None = None
        self._trim_task: asyncio.Task[None] | None = None
        self._trimming = False
        self._trim_again = False

    def hold(self, scope: Scope) -> BodyHold | None:
        """The hold of a request: its declared length taken now; None (refuse it) when that does not fit.

        A request without a body holds nothing (the shared `NO_BODY`); one sent chunked takes its
        bytes as they arrive (`BodyHold.receive`)."""
        length, unknown = _declared_body(scope)
        length = min(length, self.largest_body)
        if not length and not unknown:
            return NO_BODY
        if length and not self._fits(length):
            self.refused += 1
            return None
        self.held += length
        return BodyHold(self, length, unknown)

    def _fits(self, n: int, own: int = 0) -> bool:
        """`n` more bytes fit: within the limit, or nothing but the asker's own `own` bytes is held."""
        return self.held == own or self.held + n <= self.limit

    def _release(self, n: int) -> None:
        self.held -= n
        if n >= TRIM_AFTER_BYTES and self._malloc_trim is not None:
            self._schedule_trim()

    def _schedule_trim(self) -> None:
        # A moment later, not at once: the request's last buffers (the answer's, the record's) are
        # freed just after its hold. Each large request re-arms the timer; one trim runs at a time.
        loop = asyncio.get_running_loop()
        if self._trim_timer is not None:
            self._trim_timer.cancel()
        self._trim_timer = loop.call_later(TRIM_DELAY_S, self._start_trim)

    def _start_trim(self) -> None:
        self._trim_timer = None
        if self._trimming:
            self._trim_again = True
            return
        self._trimming = True
        self._trim_task = asyncio.get_running_loop().create_task(self._trim())  # kept: a bare task may be collected

    async def _trim(self) -> None:
        trim = self._malloc_trim
        assert trim is not None
        try:
            while True:
                self._trim_again = False
                await asyncio.to_thread(trim, 0)  # ctypes lets go of the GIL; the loop runs meanwhile
                self.trims += 1
                if not self._trim_again:
                    return
        except Exception:
            log.exception("malloc_trim failed")
        finally:
            self._trimming = False

    def busy_error(self) -> OpenAIError:
        return OpenAIError(
            503,
            f"this server is holding {self.held} bytes of request bodies already, and takes at most "
            f"{self.limit} at once (max_body_bytes_in_flight); retry shortly",
            code="request_bodies_busy",
            headers={"retry-after": "1"},
        )


class BodyHold:
    """One request's share of the budget; `release()` gives it back when the request is over."""

    __slots__ = ("budget", "bytes", "_counting")

    def __init__(self, budget: BodyBudget | None, declared: int, counting: bool) -> None:
        self.budget = budget
        self.bytes = declared
        self._counting = counting

    def receive(self, receive: Receive) -> Receive:
        """`receive`, taking each chunk of a body sent without a length (a 503 once one does not fit)."""
        if not self._counting:
            return receive
        budget = self.budget
        assert budget is not None

        async def counting() -> Message:
            message = await receive()
            size = len(message.get("body", b""))
            if size:
                if not budget._fits(size, own=self.bytes):
                    budget.refused += 1
                    raise budget.busy_error()
                budget.held += size
                self.bytes += size
            return message

        return counting

    def release(self) -> None:
        if self.budget is not None and self.bytes:
            held, self.bytes = self.bytes, 0
            self.budget._release(held)


NO_BODY = BodyHold(None, 0, False)


_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


def _declared_body(scope: Scope) -> tuple[int, bool]:
    """(Content-Length, whether the body's length is unknown: sent chunked, or over HTTP/2 without
    a length). A malformed length counts as unknown: its bytes are counted as they arrive."""
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return max(int(value), 0), False
            except ValueError:
                return 0, True
    return 0, scope["method"] in _BODY_METHODS
