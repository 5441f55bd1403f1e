"""Rate-limited logging: a repeating complaint is logged once per interval, the next one says how many were held back.

Used wherever a failure can repeat on every call (capture writes, telemetry, a dead OTLP collector),
so a broken dependency shows in the log without flooding it.
"""

from __future__ import annotations

import logging
import threading
import time


class _Gate:
    """Lets one event through per interval; counts the ones it holds back (thread-safe)."""

    __slots__ = ("interval_s", "_last", "_held", "_lock")

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._last: float | None = None
        self._held = 0
        self._lock = threading.Lock()

    def admit(self) -> int | None:
        """None to hold this event back, else how many were held back since the last one let through."""
        now = time.monotonic()
        with self._lock:
            if self._last is not None and now - self._last < self.interval_s:
                self._held += 1
                return None
            self._last = now
            held, self._held = self._held, 0
            return held

    def reset(self) -> None:
        with self._lock:
            self._last, self._held = None, 0


class RateLimitedLog:
    """Logs through `logger`, each distinct message (its format string) at most once per `interval_s`."""

    def __init__(self, logger: logging.Logger, interval_s: float = 60.0) -> None:
        self.logger = logger
        self.interval_s = interval_s
        self._gates: dict[str, _Gate] = {}
        self._lock = threading.Lock()

    def log(self, level: int, message: str, *args: object, exc_info: bool = False) -> bool:
        """Log unless the same message was logged within the interval; True if it was logged."""
        with self._lock:
            gate = self._gates.get(message)
            if gate is None:
                gate = self._gates[message] = _Gate(self.interval_s)
        held = gate.admit()
        if held is None:
            return False
        if held:
            message += " (%d similar messages suppressed)"
            args = (*args, held)
        self.logger.log(level, message, *args, exc_info=exc_info)
        return True

    def warning(self, message: str, *args: object, exc_info: bool = False) -> bool:
        return self.log(logging.WARNING, message, *args, exc_info=exc_info)

    def error(self, message: str, *args: object, exc_info: bool = False) -> bool:
        return self.log(logging.ERROR, message, *args, exc_info=exc_info)

    def reset(self) -> None:
        with self._lock:
            self._gates.clear()


class OncePerInterval(logging.Filter):
    """A filter for a logger we do not own (a library's): its warnings pass once per interval.

    Records below WARNING always pass; the warning let through after a quiet spell says how many
    were held back meanwhile.
    """

    def __init__(self, interval_s: float) -> None:
        super().__init__()
        self._gate = _Gate(interval_s)

    def reset(self) -> None:
        self._gate.reset()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        held = self._gate.admit()
        if held is None:
            return False
        if held:
            record.msg = f"{record.msg} [{held} similar messages suppressed]"
        return True
