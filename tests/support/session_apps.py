"""A Starlette app serving the session routes over one capture store, for unit tests (no server, no keys)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from starlette.applications import Starlette
from starlette.routing import BaseRoute

from server.api import sessions
from server.api.session_access import FixedCapture, SessionReads
from server.capture.read.rebuilds import RolloutBuilder
from server.capture.store import CaptureStore


def sessions_app(
    store: CaptureStore | None,
    rollouts: RolloutBuilder | None = None,
    *,
    routes: Sequence[BaseRoute] = sessions.routes,
    **starlette: Any,
) -> Starlette:
    """`routes` (the /v1/sessions ones by default) reading `store` (None: capture is off); rollouts are
    rebuilt by `rollouts`, else in a thread."""
    app = Starlette(routes=list(routes), **starlette)
    SessionReads(FixedCapture(store, rollouts)).install(app)
    return app
