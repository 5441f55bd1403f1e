"""Stop injecting on a route whose engine keeps ignoring or rejecting the token ids, for a while."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

log = logging.getLogger("switchyard_model.injection")


class RouteBreaker:
    """After `limit` failed injections in a row on a route, pause injection there for `pause_s`.

    One warning per pause: an engine without the field would otherwise log on every call.
    """

    def __init__(self, limit: int, pause_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = limit
        self.pause_s = pause_s
        self._clock = clock
        self._failures: dict[str, int] = {}
        self._paused_until: dict[str, float] = {}

    def paused(self, route: str) -> bool:
        until = self._paused_until.get(route)
        if until is None:
            return False
        if self._clock() < until:
            return True
        del self._paused_until[route]
        self._failures[route] = 0
        return False

    def failed(self, route: str, reason: str) -> None:
        count = self._failures.get(route, 0) + 1
        self._failures[route] = count
        if count >= self.limit and route not in self._paused_until:
            self._paused_until[route] = self._clock() + self.pause_s
            log.warning(
                "token injection paused on route %r for %gs: %d injections in a row fell back (last: %s); "
                "does the engine accept the token-id field (injection_transport)?",
                route,
                self.pause_s,
                count,
                reason,
            )

    def succeeded(self, route: str) -> None:
        self._failures[route] = 0
