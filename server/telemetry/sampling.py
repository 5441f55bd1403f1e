"""Which model calls get spans: the caller's sampled flag, else at most a set number of new traces a second."""

from __future__ import annotations

import time
from collections.abc import Mapping


class RateCappedSampler:
    """Which calls get spans: parent-based, and at most `per_s` new traces a second.

    A caller's traceparent decides for its call (sampled flag set: traced; clear: not). A call that
    starts a trace is traced while the rate stays under `per_s` (a token bucket holding one second of
    burst), so above that rate the traced share is per_s / rate. 0 traces every call. The decision is
    made before any span object exists: an unsampled call costs what a span-less call costs."""

    __slots__ = ("per_s", "_tokens", "_last")

    def __init__(self, per_s: float) -> None:
        self.per_s = per_s
        self._tokens = per_s
        self._last = time.monotonic()

    def sample(self, incoming: Mapping[str, str]) -> bool:
        traceparent = incoming.get("traceparent")
        if traceparent:  # well-formed (incoming_trace_headers checked): "00-<trace>-<span>-<flags>"
            return bool(int(traceparent[-2:], 16) & 1)
        if self.per_s <= 0:
            return True
        now = time.monotonic()
        self._tokens = min(self.per_s, self._tokens + (now - self._last) * self.per_s)
        self._last = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False
