"""`sessions view`: serve one capture directory, read-only, with the viewer and the session read API, on loopback.

A folder written by a server with API keys holds every key's sessions, each marked with its owner
tag (`server.request_owner`). Served as is, anyone who reaches the port would read them all; so on such a
folder every session request must present a key, and sees the sessions that key wrote (the tag of
the presented key, computed here: the folder's keys need not be known). `--all-tenants` serves
every session without a key, and says so at start.
"""

from __future__ import annotations

import os
import socket
import sys
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from middleware.auth import presented_key, reject
from middleware.hosts import HostAllowList, HostCheckMiddleware
from server.api import session_views, sessions
from server.api.session_access import FixedCapture, SessionAccess, SessionReads
from server.capture.catalog.session_owners import OWNER_FILE
from server.capture.catalog.summary import SummaryCache
from server.capture.store import SESSIONS_SUBDIR, CaptureStore
from server.errors import OpenAIError, error_response
from server.request_owner import Owners, owner_tag
from server.viewer import routes as ui_routes


def is_keyed(capture_dir: str | Path) -> bool:
    """Whether a server with API keys wrote into `capture_dir`: some session has an owner file."""
    try:
        with os.scandir(Path(capture_dir) / SESSIONS_SUBDIR) as entries:
            return any(entry.is_dir() and os.path.exists(os.path.join(entry.path, OWNER_FILE)) for entry in entries)
    except OSError:
        return False


class PresentedKeyOwners(Owners):
    """Owners for a folder whose keys are not known here: a request is whoever its key's tag is.

    No key is an admin (only `--all-tenants` shows every session), and an unknown key's tag simply
    owns nothing. Tags (a scrypt each) are remembered for the last few keys."""

    _REMEMBERED = 64

    def __init__(self) -> None:
        super().__init__(api_keys=["(keys of the folder's server)"], session_api_keys=[])
        self._recent: OrderedDict[bytes, str] = OrderedDict()

    def tag(self, scope: Scope) -> str:
        key = presented_key(scope)
        tag = self._recent.get(key)
        if tag is None:
            tag = self._recent[key] = owner_tag(key)
            if len(self._recent) > self._REMEMBERED:
                self._recent.popitem(last=False)
        return tag

    def is_admin(self, scope: Scope) -> bool:
        return False


class KeyRequired:
    """Pure ASGI: a 401 for a session request without a key (the viewer's page asks for one)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1/") and not presented_key(scope):
            await reject(send, scope)
        else:
            await self.app(scope, receive, send)


def create_view_app(
    capture_dir: str | Path,
    *,
    summary_full_read_bytes: int = 4_000_000,
    host: str = "127.0.0.1",
    by_key: bool = False,
) -> Starlette:
    """An app that reads `capture_dir` and never writes to it: GET session endpoints and `/ui/`.

    `summary_full_read_bytes`: see `SummaryCache` (larger sessions are listed pending at first).
    `host`: the bound address; requests naming another host (DNS rebinding) get a 421.
    `by_key`: each session request needs a key and sees only what that key wrote (a keyed folder)."""
    store = CaptureStore.open_read_only(capture_dir)
    reads = SessionReads(FixedCapture(store), summaries=SummaryCache(full_read_bytes=summary_full_read_bytes))
    if by_key:
        reads.access = SessionAccess(PresentedKeyOwners())
    read_routes: list[BaseRoute] = [
        route for route in sessions.routes if route.methods is not None and "DELETE" not in route.methods
    ]

    async def to_ui(request: Request) -> RedirectResponse:
        return RedirectResponse("/ui/")

    guards = [Middleware(HostCheckMiddleware, hosts=HostAllowList(host))]
    if by_key:
        guards.append(Middleware(KeyRequired))
    app = Starlette(
        middleware=guards,
        exception_handlers={HTTPException: _as_openai_error},
        routes=[
            *read_routes,
            *session_views.routes,
            Route("/", to_ui, methods=["GET"]),
            *ui_routes,
        ],
    )
    reads.install(app)
    return app


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
    all_tenants: bool = False,
) -> None:
    """Serve until interrupted. The socket is bound and listening before the URL is announced, so
    whoever reads the URL (a person, a test) can connect at once; port 0 picks a free port.

    A keyed folder (`is_keyed`) is served per key unless `all_tenants`, which is then said on stderr."""
    if not Path(capture_dir).is_dir():
        raise FileNotFoundError(f"no such capture directory: {capture_dir}")
    keyed = is_keyed(capture_dir)
    by_key = keyed and not all_tenants
    app = create_view_app(capture_dir, summary_full_read_bytes=summary_full_read_bytes, host=host, by_key=by_key)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    url = f"http://{host}:{sock.getsockname()[1]}/ui/"
    if keyed and all_tenants:
        print(
            f"WARNING: {capture_dir} was written with API keys, and --all-tenants serves EVERY key's sessions "
            f"to anyone who can reach {host}:{sock.getsockname()[1]}, with no key",
            file=sys.stderr,
            flush=True,
        )
    elif by_key:
        print(
            f"{capture_dir} was written with API keys: the viewer asks for one, and shows the sessions it wrote",
            file=sys.stderr,
            flush=True,
        )
    (announce or _print_url)(url)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    server.run(sockets=[sock])


def _print_url(url: str) -> None:
    print(f"switchyard-model viewer (read-only): {url}", flush=True)
    sys.stdout.flush()
