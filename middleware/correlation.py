"""Ties each request to its rollout/session: resolves ids from path and headers, strips the Gym prefix."""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass, replace

from starlette.types import ASGIApp, Receive, Scope, Send

from server.ids import valid_id

ROLLOUT_PREFIX = b"/ng-rollout/"

# Header sources in precedence order, split around the `proxy_x_session_id` body field, which ranks
# between them but can only be read once the handler has parsed the body.
_HEADERS_ABOVE_BODY = (b"x-switchyard-session-id", b"proxy_x_session_id")
_HEADERS_BELOW_BODY = (b"x-session-id", b"thread-id", b"session-id")
_PARENT_HEADERS = (b"x-parent-session-id", b"x-codex-parent-thread-id")


@dataclass(frozen=True, slots=True)
class Correlation:
    """Who made this call: the session (and its parent) it belongs to, and the Gym rollout if any."""

    session_id: str | None = None
    parent_session_id: str | None = None
    rollout_id: str | None = None
    source: str | None = None  # where session_id came from, for logs and spans
    request_id: str | None = None
    # Set when the session came from a source ranked above the body field; the body cannot override.
    _outranks_body: bool = False

    def with_body_session_id(self, body_value: object) -> Correlation:
        """Apply the `proxy_x_session_id` body field, which ranks below the path and two headers."""
        if self._outranks_body or not isinstance(body_value, str):
            return self
        session_id = valid_id(body_value)
        if session_id is None:
            return self
        return replace(self, session_id=session_id, source="body:proxy_x_session_id")


UNCORRELATED = Correlation()
_current: ContextVar[Correlation] = ContextVar("switchyard_model_correlation", default=UNCORRELATED)


def current_correlation() -> Correlation:
    return _current.get()


def resolve(path: str, headers: list[tuple[bytes, bytes]]) -> tuple[Correlation, str | None]:
    """Work out the correlation of a request; returns it and the path with any Gym prefix removed."""
    rollout_id = None
    new_path = None
    if path.startswith("/ng-rollout/"):
        # Like Gym's model-server middleware: strip any prefix, but only trust a well-formed id.
        _, _, rest = path.partition("/ng-rollout/")
        candidate, slash, tail = rest.partition("/")
        if slash:
            new_path = "/" + tail
            rollout_id = valid_id(candidate)

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
            return valid_id(raw.decode("ascii"))
        except UnicodeDecodeError:
            return None

    # The first source present decides, in the order docs/http-api.md gives; if its id is malformed the call
    # goes on uncorrelated rather than falling through to a weaker source.
    session_id, source, outranks = None, None, False
    if path.startswith("/ng-rollout/") and new_path is not None:
        session_id, source, outranks = rollout_id, "path:ng-rollout", True
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
    for name in _PARENT_HEADERS:
        if parent_id := header_id(name):
            parent = parent_id
            break
    request_id = None
    raw_request_id = found.get(b"x-request-id")
    if raw_request_id:
        try:
            request_id = valid_id(raw_request_id.decode("ascii"))
        except UnicodeDecodeError:
            request_id = None
    corr = Correlation(session_id, parent, rollout_id, source, request_id, outranks)
    return corr, new_path


class CorrelationMiddleware:
    """Pure ASGI: publishes the request's Correlation in a ContextVar and strips `/ng-rollout/<id>`."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        corr, new_path = resolve(scope["path"], scope["headers"])
        if new_path is not None:
            scope = dict(scope)
            scope["path"] = new_path
            scope["raw_path"] = new_path.encode("utf-8", "surrogateescape")
        token = _current.set(corr)
        try:
            await self.app(scope, receive, send)
        finally:
            _current.reset(token)
