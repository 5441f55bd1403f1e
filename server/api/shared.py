"""What a non-model route reads from the app serving it: `app_state(request)`, the AppState `create_app` set."""

from __future__ import annotations

from starlette.requests import Request

from server.state import AppState


def app_state(request: Request) -> AppState:
    """The AppState of the app serving `request` (`app.state.switchyard`, set by `create_app`)."""
    state: AppState = request.app.state.switchyard
    return state
