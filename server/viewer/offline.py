"""`sessions view`: serve one capture directory, read-only, with the viewer and the session read API, on loopback."""

from __future__ import annotations

import socket
import sys
from collections.abc import Callable
from pathlib import Path

import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from middleware.hosts import HostAllowList, HostCheckMiddleware
from server.api.session_views import view_routes
from server.api.sessions import session_routes
from server.capture.catalog.summary import SummaryCache
from server.capture.read.store import CaptureStore
from server.errors import OpenAIError, error_response
from server.viewer import ui_routes


def create_view_app(
    capture_dir: str | Path, *, summary_full_read_bytes: int = 4_000_000, host: str = "127.0.0.1"
) -> Starlette:
    """An app that reads `capture_dir` and never writes to it: GET session endpoints and `/ui/`.

    `summary_full_read_bytes`: see `SummaryCache` (larger sessions are listed pending at first).
    `host`: the bound address; requests naming another host (DNS rebinding) get a 421."""
    store = CaptureStore.open_read_only(capture_dir)
    cache = SummaryCache(full_read_bytes=summary_full_read_bytes)
    read_routes: list[BaseRoute] = [
        route
        for route in session_routes(lambda: store, cache=cache)
        if isinstance(route, Route) and route.methods is not None and "DELETE" not in route.methods
    ]

    async def to_ui(request: Request) -> RedirectResponse:
        return RedirectResponse("/ui/")

    return Starlette(
        middleware=[Middleware(HostCheckMiddleware, hosts=HostAllowList(host))],
        exception_handlers={HTTPException: _as_openai_error},
        routes=[
            *read_routes,
            *view_routes(lambda: store, cache),
            Route("/", to_ui, methods=["GET"]),
            *ui_routes(),
        ],
    )


async def _as_openai_error(request: Request, exc: Exception) -> Response:
    """Unknown paths and methods answer in the OpenAI error shape, as on the full server."""
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    error = OpenAIError(status, f"no such endpoint: {request.method} {request.url.path}", code="endpoint_not_found")
    return error_response(error)


def serve(
    capture_dir: str | Path,
    *,
    port: int = 0,
    host: str = "127.0.0.1",
    announce: Callable[[str], None] | None = None,
    summary_full_read_bytes: int = 4_000_000,
) -> None:
    """Serve until interrupted. The socket is bound and listening before the URL is announced, so
    whoever reads the URL (a person, a test) can connect at once; port 0 picks a free port."""
    if not Path(capture_dir).is_dir():
        raise FileNotFoundError(f"no such capture directory: {capture_dir}")
    app = create_view_app(capture_dir, summary_full_read_bytes=summary_full_read_bytes, host=host)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    url = f"http://{host}:{sock.getsockname()[1]}/ui/"
    (announce or _print_url)(url)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    server.run(sockets=[sock])


def _print_url(url: str) -> None:
    print(f"switchyard-model viewer (read-only): {url}", flush=True)
    sys.stdout.flush()
