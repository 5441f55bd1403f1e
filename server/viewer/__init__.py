"""The rollout viewer: static pages (vanilla ES modules + CSS, shipped in the package) served at /ui/.

`__all__` lists `routes` and the module `offline` (the viewer served without the model server),
whose names are not re-exported: `offline` imports `routes` from here, which would be a cycle.
"""

from __future__ import annotations

import functools
from pathlib import Path

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from server.errors import OpenAIError, error_response

__all__ = ["offline", "routes"]

STATIC_DIR = Path(__file__).resolve().parent / "static"
_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
}

# The page talks only to this server; nothing may be fetched from anywhere else, and no inline
# script or style may run even if some text slipped into the DOM as markup.
SECURITY_HEADERS = {
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-cache",
}


@functools.cache
def _files() -> dict[str, tuple[bytes, str]]:
    """Every shipped file by name, read once (on the first request). Requests are looked up here, so no
    request path ever reaches the filesystem (nothing to traverse)."""
    return {
        path.name: (path.read_bytes(), _TYPES[path.suffix])
        for path in STATIC_DIR.iterdir()
        if path.is_file() and path.suffix in _TYPES
    }


async def to_folder(request: Request) -> Response:
    # Relative: never built from the request's Host header.
    return RedirectResponse("/ui/", headers=SECURITY_HEADERS)


async def static(request: Request) -> Response:
    """index.html for the folder, else one shipped file."""
    name = request.path_params["path"] or "index.html"
    found = _files().get(name)
    if found is None:
        error = OpenAIError(404, f"no such viewer file: {name[:200]!r}", code="endpoint_not_found")
        return error_response(error, headers=SECURITY_HEADERS)
    body, media_type = found
    return Response(body, media_type=media_type, headers=SECURITY_HEADERS)


routes = [
    Route("/ui", to_folder, methods=["GET"]),
    Route("/ui/{path:path}", static, methods=["GET"]),
]
