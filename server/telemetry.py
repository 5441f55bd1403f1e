"""OpenTelemetry spans and metrics for model calls (interface; a no-op until configured)."""

from __future__ import annotations

from typing import Any


class CallSpan:
    """The telemetry of one model call: a SERVER span and the CLIENT span of its upstream call."""

    def upstream_headers(self, headers: dict[str, str]) -> None:
        """Add trace-context headers (traceparent) for the upstream call."""

    def first_chunk(self) -> None:
        """The upstream's first streamed chunk arrived."""

    def finish(self, response: dict[str, Any] | None = None, error: BaseException | None = None) -> None:
        """The call ended (a chat.completion dict, or the error that ended it)."""


_NOOP_SPAN = CallSpan()


class Telemetry:
    def __init__(self, settings: Any = None) -> None:
        self.enabled = False

    def start_call(self, *, api: str, route: str, request: dict, correlation: Any, stream: bool, scope: dict) -> CallSpan:
        return _NOOP_SPAN

    def shutdown(self) -> None:
        pass
