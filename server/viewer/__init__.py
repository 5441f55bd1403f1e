"""The rollout viewer: static pages (vanilla ES modules + CSS, shipped in the package) served at /ui/."""

from __future__ import annotations

from pathlib import Path

from starlette.routing import Mount
from starlette.staticfiles import StaticFiles

STATIC_DIR = Path(__file__).resolve().parent / "static"

# The page talks only to this server; nothing may be fetched from anywhere else, and no inline
# script or style may run even if some text slipped into the DOM as markup.
_SECURITY_HEADERS = [
    (
        b"content-security-policy",
        b"default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
        b"base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-cache"),
]


class _WithSecurityHeaders:
    """Adds the headers above to every static answer (pure ASGI)."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        async def send_with_headers(message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *_SECURITY_HEADERS]}
            await send(message)

        await self.app(scope, receive, send_with_headers)


def ui_mount(path: str = "/ui") -> Mount:
    """The viewer's static files at `path` (index.html for the directory itself)."""
    return Mount(path, app=_WithSecurityHeaders(StaticFiles(directory=STATIC_DIR, html=True)), name="ui")
