"""Browser-attack guards (pure ASGI): the Host allow-list against DNS rebinding, JSON-only bodies against CSRF.

A page on another site can make a browser send requests to a server on 127.0.0.1: by pointing its
own name at 127.0.0.1 (DNS rebinding, then the `Host` header carries the attacker's name), or by a
cross-site form or `fetch` POST, which a browser sends without asking first only with a
`text/plain`, form or missing content type. So a request must name an allowed host, and a model
call must say `application/json` (a client without a browser may leave the type out; a browser
never can, since it always sends `Origin` on such a POST).
"""

from __future__ import annotations

import ipaddress
import socket

from starlette.types import ASGIApp, Receive, Scope, Send

from server.errors import OpenAIError, send_error

_LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")
_WILDCARDS = ("0.0.0.0", "::", "")


def _host_name(value: bytes) -> str:
    """The host part of a `Host` header, lower-cased, without the port (IPv6 stays in brackets)."""
    text = value.decode("latin-1").strip().lower()
    if text.startswith("["):
        end = text.find("]")
        return text[: end + 1] if end > 0 else text
    return text.rsplit(":", 1)[0] if text.count(":") == 1 else text


def _is_ip_literal(name: str) -> bool:
    try:
        ipaddress.ip_address(name[1:-1] if name.startswith("[") else name)
    except ValueError:
        return False
    return True


class HostAllowList:
    """The names a request's `Host` may carry: the bound address, `localhost`, `127.0.0.1`, `[::1]`, and
    `allowed_hosts`. Bound to every interface (`0.0.0.0`, `::`), any IP address and the machine's
    host name are allowed too: a rebinding attack needs a name of the attacker's, and a client that
    dials an address sends that address.
    `"*"` in `allowed_hosts` turns the check off."""

    def __init__(self, bound_host: str, allowed_hosts: list[str] | tuple[str, ...] = ()) -> None:
        bound = bound_host.strip().lower()
        if ":" in bound and not bound.startswith("["):
            bound = f"[{bound}]"
        extra = [h.strip().lower() for h in allowed_hosts]
        self.any_host = "*" in extra
        self.any_ip = bound_host in _WILDCARDS or bound in ("[::]",)
        # Bound to every interface, this machine's own name is one clients use too.
        own = (socket.gethostname().lower(),) if self.any_ip else ()
        self.names = frozenset((*_LOOPBACK_NAMES, bound, *own, *extra))

    def allows(self, scope: Scope) -> bool:
        if self.any_host:
            return True
        for name, value in scope["headers"]:
            if name == b"host":
                host = _host_name(value)
                return host in self.names or (self.any_ip and _is_ip_literal(host))
        return False  # HTTP/1.1 requires Host; only a hand-made request lacks it


def is_json_request(scope: Scope) -> bool:
    """A JSON content type; or none at all from a client that is not a browser (no `Origin`)."""
    content_type: bytes | None = None
    browser = False
    headers: list[tuple[bytes, bytes]] = scope["headers"]
    for name, value in headers:
        if name == b"content-type":
            content_type = value
        elif name == b"origin" or name == b"sec-fetch-site":
            browser = True
    if content_type is None:
        return not browser
    media = content_type.split(b";", 1)[0].strip().lower()
    return media == b"application/json" or (media.startswith(b"application/") and media.endswith(b"+json"))


async def refuse_host(send: Send) -> None:
    await send_error(
        send,
        OpenAIError(
            421,
            "this server does not answer to that Host name (add it to allowed_hosts if it is yours)",
            code="host_not_allowed",
        ),
    )


async def refuse_content_type(send: Send) -> None:
    await send_error(
        send,
        OpenAIError(
            415, "send the request body as JSON, with Content-Type: application/json", code="unsupported_media_type"
        ),
    )


class HostCheckMiddleware:
    """Pure ASGI: a 421 for an HTTP request whose Host is not on the allow-list."""

    def __init__(self, app: ASGIApp, *, hosts: HostAllowList) -> None:
        self.app = app
        self.hosts = hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.hosts.allows(scope):
            await self.app(scope, receive, send)
        else:
            await refuse_host(send)
