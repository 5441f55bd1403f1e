"""What a non-model route reads from the app serving it: its AppState (`app_state`) and the response store (`response_store`)."""

from __future__ import annotations

from starlette.requests import Request

from server.errors import OpenAIError
from server.state import AppState
from server.stateful.service import Stateful


def app_state(request: Request) -> AppState:
    """The AppState of the app serving `request` (`app.state.switchyard`, set by `create_app`)."""
    state: AppState = request.app.state.switchyard
    return state


def response_store(request: Request, needed_by: str) -> Stateful:
    """The response store; a 404 naming what needs it while it is turned off (`response_store: false`)."""
    stateful = app_state(request).response_store
    if stateful is None:
        raise OpenAIError(
            404,
            f"{needed_by} need the response store, which is turned off (response_store: false)",
            code="response_store_disabled",
        )
    return stateful
