"""Ties each request to its rollout/session: resolves ids from path and headers, strips the Gym prefix."""

from __future__ import annotations

import logging
import threading
from contextvars import ContextVar, Token
from dataclasses import dataclass, replace

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.ids import MAX_ID_LENGTH, valid_id, valid_rollout_id
from server.logs import RateLimitedLog

log = logging.getLogger("switchyard_model.correlation")

# Set on the response when an id the client sent was refused: the sources, comma-separated.
REFUSED_ID_HEADER = b"x-switchyard-model-refused-id"

# Header sources in precedence order, split around the `proxy_x_session_id` body field, which ranks
# between them but can only be read once the handler has parsed the body.
_HEADERS_ABOVE_BODY = (b"x-switchyard-session-id", b"proxy_x_session_id")
_HEADERS_BELOW_BODY = (b"x-session-id", b"thread-id", b"session-id", b"x-claude-code-session-id")
# Claude Code sends its session id on a sub-agent's calls too, with this header naming the agent:
# such a call belongs to a child session, `<session id>/<agent id>`, whose parent is the session.
_AGENT_HEADER = b"x-claude-code-agent-id"
_PARENT_HEADERS = (b"x-parent-session-id", b"x-codex-parent-thread-id")
# Gym's training-token-capture segment, which may follow the rollout id: `/ng-rollout/<id>/training-token-capture/v1/...`.
_TRAINING_SEGMENT = "training-token-capture/"


@dataclass(frozen=True, slots=True)
class Correlation:
    """Who made this call: the session (and its parent) it belongs to, and the Gym rollout if any."""

    session_id: str | None = None
    parent_session_id: str | None = None
    rollout_id: str | None = None
    source: str | None = None  # where session_id came from, for logs and spans
    request_id: str | None = None
    # Sources (`header:x-session-id`, `path:ng-rollout`, ...) whose id was present but refused.
    refused: tuple[str, ...] = ()
    # Set when the session came from a source ranked above the body field; the body cannot override.
    _outranks_body: bool = False
    # The call came on Gym's training path (`/ng-rollout/<id>/training-token-capture/...`).
    training_capture: bool = False

    def with_body_session_id(self, body_value: object) -> Correlation:
        """Apply the `proxy_x_session_id` body field, which ranks below the path and two headers."""
        if self._outranks_body or not isinstance(body_value, str):
            return self
        session_id = valid_id(body_value)
        if session_id is None:
            return replace(self, refused=(*self.refused, "body:proxy_x_session_id"))
        return replace(self, session_id=session_id, source="body:proxy_x_session_id")


UNCORRELATED = Correlation()
_current: ContextVar[Correlation] = ContextVar("switchyard_model_correlation", default=UNCORRELATED)


def current_correlation() -> Correlation:
    return _current.get()


def resolve(path: str, headers: list[tuple[bytes, bytes]]) -> tuple[Correlation, str | None]:
    """Work out the correlation of a request; returns it and the path with any Gym prefix removed."""
    rollout_id = None
    new_path = None
    training = False
    refused: list[str] = []
    if path.startswith("/ng-rollout/"):
        # Like Gym's model-server middleware: strip any prefix, but only trust a well-formed id.
        _, _, rest = path.partition("/ng-rollout/")
        candidate, slash, tail = rest.partition("/")
        if slash:
            training = tail.startswith(_TRAINING_SEGMENT)
            new_path = "/" + (tail[len(_TRAINING_SEGMENT) :] if training else tail)
            rollout_id = valid_rollout_id(candidate)

    found: dict[bytes, bytes] = {}
    for name, value in headers:
        lowered = name.lower()
        if lowered not in found:
            found[lowered] = value

    def header_id(name: bytes) -> str | None:
        raw = found.get(name)
        if raw is None:
            return None
        try:
            value = valid_id(raw.decode("ascii"))
        except UnicodeDecodeError:
            value = None
        if value is None:
            refused.append("header:" + name.decode("latin-1"))
        return value

    # The first source present decides, in the order docs/http-api.md gives; if its id is malformed the call
    # goes on uncorrelated rather than falling through to a weaker source.
    session_id, source, outranks = None, None, False
    if path.startswith("/ng-rollout/") and new_path is not None:
        session_id, source, outranks = rollout_id, "path:ng-rollout", True
        if rollout_id is None:
            refused.append("path:ng-rollout")
    else:
        for name in _HEADERS_ABOVE_BODY:
            if name in found:
                session_id, source, outranks = header_id(name), "header:" + name.decode(), True
                break
        else:
            for name in _HEADERS_BELOW_BODY:
                if name in found:
                    session_id, source = header_id(name), "header:" + name.decode()
                    break
    if session_id is None:
        source = None
    parent = None
    for name in _PARENT_HEADERS:  # unlike the session, a refused parent falls through to the next
        if parent_id := header_id(name):
            parent = parent_id
            break
    if session_id is not None and _AGENT_HEADER in found and (agent := header_id(_AGENT_HEADER)):
        child = valid_id(f"{session_id}/{agent}")
        if child is None:  # too long together: the call stays in the session, and says why
            refused.append("header:x-claude-code-agent-id")
        else:
            session_id, parent = child, session_id
    request_id = None
    raw_request_id = found.get(b"x-request-id")
    if raw_request_id:
        try:
            request_id = valid_id(raw_request_id.decode("ascii"))
        except UnicodeDecodeError:
            request_id = None
    corr = Correlation(session_id, parent, rollout_id, source, request_id, tuple(refused), outranks)
    if training:
        corr = replace(corr, training_capture=True)
    return corr, new_path


def id_rule(source: str) -> str:
    """The rule an id from `source` (`header:x-session-id`, `path:ng-rollout`, ...) must follow, in words."""
    if source == "path:ng-rollout":
        return (
            f"it must be 1-{MAX_ID_LENGTH} characters in Gym's charset [A-Za-z0-9._-], starting with a letter or digit"
        )
    return f"it must be 1-{MAX_ID_LENGTH} printable ASCII characters without spaces, and not only dots"


class RefusedIds:
    """Counts ids refused by the correlation rules, per source, and warns about them (rate-limited).

    A refused session id means a call that is served but not captured: it must never pass unnoticed.
    """

    def __init__(self, interval_s: float = 30.0) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}
        self._warnings = RateLimitedLog(log, interval_s)

    def note(self, sources: tuple[str, ...], path: str) -> None:
        with self._lock:
            for source in sources:
                self._counts[source] = self._counts.get(source, 0) + 1
        for source in sources:
            # One window per source (the source is part of the message; sources are a fixed set of
            # names). The id itself is not logged: it is exactly what was judged unsafe to echo.
            self._warnings.warning(
                f"refused the id in {source} on %s ({id_rule(source)}); the call goes on without it", path
            )

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def total(self) -> int:
        with self._lock:
            return sum(self._counts.values())


class CorrelationMiddleware:
    """Pure ASGI: publishes the request's Correlation in a ContextVar and strips `/ng-rollout/<id>`."""

    def __init__(self, app: ASGIApp, refused_ids: RefusedIds | None = None) -> None:
        self.app = app
        self.refused_ids = refused_ids if refused_ids is not None else RefusedIds()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        scope, send, corr = correlate(scope, send, self.refused_ids)
        token = _current.set(corr)
        try:
            await self.app(scope, receive, send)
        finally:
            _current.reset(token)


def correlate(scope: Scope, send: Send, refused_ids: RefusedIds) -> tuple[Scope, Send, Correlation]:
    """An HTTP request's correlation, its scope without the Gym prefix, and a `send` naming refused ids.

    The caller publishes the correlation (`publish`) for the handler; the middleware above does, and
    so does the app's own dispatch of the model endpoints (one layer instead of several).
    """
    corr, new_path = resolve(scope["path"], scope["headers"])
    if new_path is not None:
        scope = dict(scope)
        scope["path"] = new_path
        scope["raw_path"] = new_path.encode("utf-8", "surrogateescape")
    if corr.refused:
        refused_ids.note(corr.refused, scope["path"])
        send = _with_refused_header(send, corr.refused)
    return scope, send, corr


def publish(corr: Correlation) -> Token[Correlation]:
    """Make `corr` the current correlation (`current_correlation()`); undo with `unpublish(token)`."""
    return _current.set(corr)


def unpublish(token: Token[Correlation]) -> None:
    _current.reset(token)


def _with_refused_header(send: Send, sources: tuple[str, ...]) -> Send:
    """Wraps `send` so the response says which ids were refused (the client otherwise cannot tell)."""
    value = ", ".join(sources).encode("ascii")

    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", ()), (REFUSED_ID_HEADER, value)]}
        await send(message)

    return sending
