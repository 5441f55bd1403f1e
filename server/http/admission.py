"""Admission per worker: a deadline for each request body, and a fast 503 beyond the calls a worker can hold.

A slow client must not be able to hold the server, and a surplus of calls must get an answer, not a
wait. Three layers share the work:

- the HTTP server bounds connections per worker (granian's backpressure, uvicorn's
  `limit_concurrency`) and how long a connection may take to deliver a request head, which is also
  how long it may sit idle between requests (granian's `header_read_timeout`, which hyper applies to
  fresh, trickling and idle keep-alive connections alike; uvicorn's `timeout_keep_alive`);
- `BodyReceiver` gives each request's body a deadline from the app's first read of it: a body that
  has not fully arrived by then gets a 408 and the connection is closed;
- `Admission` counts calls in flight: a request is a call from the moment its whole body has
  arrived until its answer is over. Beyond `calls` of them, the next gets a 503 with `Retry-After`
  at once. GETs (`/health` among them) never read a body and are never counted or refused here.

Counting from the body's end, not from the request head, keeps requests that are still receiving
their body (one descriptor each, and bounded in time by the deadline) from taking the places of
calls, which each hold an upstream connection (two to four descriptors).

`limits(settings)` sizes all of it from the process's open-file limit, which it first raises to its
hard limit: the one resource that, run out of, makes a worker fail every request at once.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from dataclasses import dataclass
from typing import TYPE_CHECKING

from starlette.types import Message, Receive

from server.errors import OpenAIError

if TYPE_CHECKING:
    from server.config import Settings

log = logging.getLogger("switchyard_model.admission")

# Descriptors kept out of the sizing: capture files, the index, logs, Switchyard's own, idle pools.
RESERVED_FDS = 1024
# Upper bounds when the open-file limit is large: one event loop does not serve more calls well.
MAX_DERIVED_CALLS = 8192
MAX_DERIVED_CONNECTIONS = 32768
# How long a refused client is asked to wait before trying again.
RETRY_AFTER_S = 1
# How often expired body deadlines are looked for (at most; a quarter of the deadline when shorter).
SWEEP_S = 1.0


def open_file_limit() -> int:
    """Raise this process's soft open-file limit to its hard limit (once is enough; idempotent) and return it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = 1 << 20
    if soft == resource.RLIM_INFINITY or soft >= hard:
        return hard if soft == resource.RLIM_INFINITY else soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError) as exc:  # e.g. a container that forbids it: size from what we have
        log.warning("cannot raise the open-file limit from %d to %d: %s", soft, hard, exc)
        return soft
    return hard


@dataclass(frozen=True)
class Limits:
    """What one worker process admits; each field is a setting's value or, unset, derived here."""

    calls: int  # calls in flight (bodies received, answers not yet over); a 503 beyond
    connections: int  # client connections held open at once; the HTTP server accepts no more
    upstream: int  # connections to Switchyard (the pool); a call beyond them waits for one
    open_files: int  # the process's open-file limit the others were sized from
    fds_per_call: int  # descriptors one call in flight holds in this process


def limits(settings: Settings) -> Limits:
    """Size this worker: every descriptor the limits allow must fit under the open-file limit.

    A call in flight holds its client connection and one upstream connection; with Switchyard
    hosted in this process, also Switchyard's side of that connection and its connection to the
    engine. Connections beyond the calls are client connections between calls (keep-alive), bodies
    still arriving, and room for `/health` and for the 503s. Derived: a quarter of a descriptor per
    call is kept for those, i.e. calls = (limit - reserve) / (fds per call + 1/4), and connections
    take what is left (each bounded above by MAX_DERIVED_*).
    """
    nofile = open_file_limit()
    fds_per_call = 4 if settings.mode == "launch-hosted" else 2
    budget = max(nofile - RESERVED_FDS, 64)
    calls = settings.max_calls_in_flight or max(16, min(MAX_DERIVED_CALLS, budget * 4 // (4 * fds_per_call + 1)))
    upstream = settings.upstream_max_connections or calls
    if settings.max_connections_per_worker:
        connections = settings.max_connections_per_worker
    else:
        left = budget - calls * (fds_per_call - 1)
        connections = max(calls + 64, min(MAX_DERIVED_CONNECTIONS, left))
    needed = connections + calls * (fds_per_call - 1) + RESERVED_FDS
    if needed > nofile:
        log.warning(
            "admission: %d connections and %d calls in flight need about %d open files, over this process's "
            "limit of %d; raise the limit (ulimit -n) or lower max_connections_per_worker / max_calls_in_flight",
            connections,
            calls,
            needed,
            nofile,
        )
    return Limits(calls=calls, connections=connections, upstream=upstream, open_files=nofile, fds_per_call=fds_per_call)


class Admission:
    """The calls in flight in this worker, against its limit, and each request's body deadline.

    Deadlines are kept without a timer per request (one costs ~20 µs of the event loop per call): a
    body still arriving is registered in arrival order, which, all deadlines being the same length
    after arrival, is deadline order; one sweep every SWEEP_S (while any is registered) ends the
    expired ones at the front. A 408 thus comes up to SWEEP_S after the deadline.
    """

    __slots__ = ("limit", "body_timeout_s", "in_flight", "peak", "refused", "timed_out", "_reading", "_sweep")

    def __init__(self, limit: int, body_timeout_s: float) -> None:
        self.limit = limit
        self.body_timeout_s = body_timeout_s
        self.in_flight = 0
        self.peak = 0
        self.refused = 0  # 503s answered
        self.timed_out = 0  # 408s answered
        self._reading: dict[BodyReceiver, None] = {}  # bodies under their deadline, oldest first
        self._sweep: asyncio.TimerHandle | None = None

    def receiver(self, receive: Receive) -> BodyReceiver:
        """`receive` for one request: its body under the deadline, its admission once the body is in."""
        return BodyReceiver(self, receive)

    def stats(self) -> dict[str, int]:
        return {
            "calls_in_flight": self.in_flight,
            "peak_calls_in_flight": self.peak,
            "max_calls_in_flight": self.limit,
            "refused_calls": self.refused,
            "body_timeouts": self.timed_out,
            "bodies_arriving": len(self._reading),
        }

    def _watch(self, receiver: BodyReceiver, loop: asyncio.AbstractEventLoop) -> None:
        self._reading[receiver] = None
        if self._sweep is None:
            self._sweep = loop.call_later(self._sweep_every(), self._expire, loop)

    def _sweep_every(self) -> float:
        return min(SWEEP_S, self.body_timeout_s / 4)

    def _expire(self, loop: asyncio.AbstractEventLoop) -> None:
        now = loop.time()
        reading = self._reading
        while reading:
            oldest = next(iter(reading))
            if oldest.deadline > now:
                break
            del reading[oldest]
            oldest.expire()
        self._sweep = loop.call_later(self._sweep_every(), self._expire, loop) if reading else None


class BodyReceiver:
    """One request's `receive`: bounded in time until its body is whole, then counted as a call.

    `release()` must be called when the request is over (ServerApp does it in a `finally`).
    """

    __slots__ = ("admission", "receive", "deadline", "task", "whole", "counted", "waiting", "expired")

    def __init__(self, admission: Admission, receive: Receive) -> None:
        self.admission = admission
        self.receive = receive
        self.deadline = 0.0
        self.task: asyncio.Task[object] | None = None
        self.whole = False
        self.counted = False
        self.waiting = False  # inside `await receive()`: where an expiry cancels
        self.expired = False

    async def __call__(self) -> Message:
        if self.whole:  # after the body: the disconnect watcher's wait, unbounded by design
            return await self.receive()
        admission = self.admission
        if self.task is None:  # the first read of the body starts its deadline
            loop = asyncio.get_running_loop()
            self.task = asyncio.current_task()
            self.deadline = loop.time() + admission.body_timeout_s
            admission._watch(self, loop)
        if self.expired:
            raise self._timed_out()
        self.waiting = True
        try:
            message = await self.receive()
        except asyncio.CancelledError:
            if self.expired and self.task is not None:
                self.task.uncancel()  # our own cancel, handled here: the 408 is answered normally
                raise self._timed_out() from None
            raise
        finally:
            self.waiting = False
        if message["type"] != "http.request":  # a disconnect: nothing to admit
            self._done()
        elif not message.get("more_body", False):
            self._done()
            if admission.in_flight >= admission.limit:
                admission.refused += 1
                raise OpenAIError(
                    503,
                    f"this server is at its limit of {admission.limit} calls in flight per worker "
                    "(max_calls_in_flight); retry shortly",
                    code="server_overloaded",
                    headers={"retry-after": str(RETRY_AFTER_S)},
                )
            admission.in_flight += 1
            admission.peak = max(admission.peak, admission.in_flight)
            self.counted = True
        return message

    def expire(self) -> None:
        """The deadline passed (called by the sweep): a read in progress is cancelled into a 408."""
        self.expired = True
        if self.waiting and self.task is not None:
            self.task.cancel()

    def _timed_out(self) -> OpenAIError:
        self.whole = True  # nothing more is read from this request
        self.admission.timed_out += 1
        return OpenAIError(
            408,
            f"the request body did not arrive within {self.admission.body_timeout_s:g}s (request_body_timeout_s)",
            code="request_timeout",
            headers={"connection": "close"},
        )

    def _done(self) -> None:
        self.whole = True
        self.admission._reading.pop(self, None)

    def release(self) -> None:
        self.admission._reading.pop(self, None)  # a request that stopped reading early (a 413, an error)
        if self.counted:
            self.counted = False
            self.admission.in_flight -= 1
