"""Bearer-token access control (pure ASGI): one key set for model calls, a stricter one for sessions."""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from server.errors import OpenAIError, send_error

# Always open: liveness probes must not need a model key. `/metrics` takes one unless `metrics_open`.
_OPEN_PATHS = frozenset({"/health"})
_METRICS = "/metrics"
# The viewer's static files hold no data (the page asks for a key and sends it with each API call);
# a browser navigation cannot carry a Bearer header, so they must load without one.
_OPEN_PREFIX = "/ui/"


def _matches(presented: bytes, keys: tuple[bytes, ...]) -> bool:
    # Compare against every key, without stopping early, so timing does not reveal which one was close.
    found = False
    for key in keys:
        found |= hmac.compare_digest(presented, key)
    return found


def presented_key(scope: Scope) -> bytes:
    """The key a request presents: `Authorization: Bearer <key>`, else Anthropic's `x-api-key`; b"" if none."""
    headers: list[tuple[bytes, bytes]] = scope["headers"]
    for name, value in headers:
        if name == b"authorization":
            if value[:7].lower() == b"bearer ":
                return value[7:].strip()
            break
    for name, value in headers:
        if name == b"x-api-key":
            return value.strip()
    return b""


class BearerKeys:
    """Which requests may go on: model endpoints take `api_keys`; session endpoints (`/v1/sessions...`,
    which expose prompts) take `session_api_keys` when set, else the `api_keys` rule. With no keys
    configured at all everything is open, which is why the server binds 127.0.0.1 by default.
    """

    def __init__(self, *, api_keys: list[str], session_api_keys: list[str], metrics_open: bool = False) -> None:
        self.model_keys = tuple(k.encode() for k in api_keys)
        self.session_keys = tuple(k.encode() for k in session_api_keys) or self.model_keys
        # Scrapers on a trusted network read /metrics without a key; else it takes a model key, as
        # /v1/models does.
        self.metrics_open = metrics_open

    def allows(self, scope: Scope) -> bool:
        """An open path, no keys configured, or a matching key (`presented_key`)."""
        path = scope["path"]
        if path in _OPEN_PATHS or path == "/ui" or path.startswith(_OPEN_PREFIX):
            return True
        if path == _METRICS and self.metrics_open:
            return True
        keys = self.session_keys if path.startswith("/v1/sessions") else self.model_keys
        if not keys:
            return True
        presented = presented_key(scope)
        return bool(presented) and _matches(presented, keys)


class AuthMiddleware:
    """Pure ASGI: a 401 in the OpenAI shape for an HTTP request `BearerKeys` does not allow."""

    def __init__(
        self, app: ASGIApp, *, api_keys: list[str], session_api_keys: list[str], metrics_open: bool = False
    ) -> None:
        self.app = app
        self.keys = BearerKeys(api_keys=api_keys, session_api_keys=session_api_keys, metrics_open=metrics_open)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.keys.allows(scope):
            await self.app(scope, receive, send)
        else:
            await reject(send, scope)


def speaks_anthropic(scope: Scope) -> bool:
    """A Messages API call, or any request of an Anthropic client (they all send `anthropic-version`)."""
    return scope["path"].startswith("/v1/messages") or any(name == b"anthropic-version" for name, _ in scope["headers"])


async def reject(send: Send, scope: Scope | None = None) -> None:
    error = OpenAIError(
        401,
        "missing or invalid API key (send Authorization: Bearer <key>, or x-api-key: <key>)",
        code="invalid_api_key",
        headers={"www-authenticate": "Bearer"},
    )
    await send_error(send, error, anthropic=scope is not None and speaks_anthropic(scope))
