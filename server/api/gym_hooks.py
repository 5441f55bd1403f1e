"""What a model call does for NeMo Gym's capture: its training entry and its evaluation exchange, around the call.

A call Gym tied to a rollout (`/ng-rollout/<id>/...`) while Gym's evaluation or training capture is
on gets a `GymCall` for as long as it is handled (a context variable, so the handlers need not pass
it): `open_gym_call` when its body is read, `admitted` and `begin_training_capture` just before dispatch,
`answered` once its whole answer is known (before the last byte goes out), `close_gym_call` at the end.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from contextvars import ContextVar, Token
from dataclasses import dataclass
from typing import Any

import orjson

from middleware.correlation import Correlation
from server.capture.gym.tokens import GymTokenCapture, chat_with_gym_tokens, request_items
from server.errors import OpenAIError
from server.state import AppState

log = logging.getLogger("switchyard_model.calls")


@dataclass(slots=True)
class GymCall:
    """One call's part in Gym's capture."""

    rollout_id: str
    model_call_id: str  # joins the evaluation exchange and the training entry, as in Gym
    started_at: float  # epoch seconds
    items: list[dict[str, Any]] | None = None  # training: the request's items as received, for lineage
    request: dict[str, Any] | None = None  # evaluation: the request as received
    token: Token[Any] | None = None  # training: Gym's capture context, set once the call is about to go out
    logged: bool = False  # evaluation: its exchange is written
    admitted: bool = False  # it passed the session write rule (`ModelEndpoint.admit`)


_current: ContextVar[GymCall | None] = ContextVar("switchyard_model_gym_call", default=None)


def open_gym_call(
    state: AppState,
    body: dict[str, Any],
    corr: Correlation,
    items_of: Callable[[dict[str, Any]], list[dict[str, Any]]] = request_items,
) -> Token[Any] | None:
    """Publish this call's GymCall when it has a rollout id and Gym's capture is on; undo with `close_gym_call`.

    `items_of` gives the items Gym's lineage reads from the body as received (`request_items` of the
    body, or of the Responses request a Messages body stands for)."""
    training = corr.training_capture and state.gym_tokens is not None
    if corr.rollout_id is None or not (training or state.gym_calls is not None):
        return None
    gym_call = GymCall(
        corr.rollout_id,
        uuid.uuid4().hex,
        time.time(),
        items=items_of(body) if training else None,
        request=orjson.loads(orjson.dumps(body)) if state.gym_calls is not None else None,
    )
    return _current.set(gym_call)


def on_training_path() -> bool:
    """The current call is on Gym's training path with Gym's token capture on."""
    gym_call = _current.get()
    return gym_call is not None and gym_call.items is not None


def admitted() -> None:
    """The current call passed the session write rule: from now on Gym's exchange log may hold it."""
    gym_call = _current.get()
    if gym_call is not None:
        gym_call.admitted = True


async def begin_training_capture(state: AppState) -> None:
    """On Gym's training path, just before dispatch: Gym's capture context, parent and intent.

    After the body's checks and the session write rule (the rollout id is one of the sessions the call
    writes: Gym's token store is keyed by the same ownership), so a refused request leaves no intent
    behind (Gym reads a dangling intent as a lost call). A failed intent is a 503: nothing has been
    generated yet.
    """
    gym_call = _current.get()
    gym = state.gym_tokens
    if gym_call is None or gym_call.items is None or gym_call.token is not None or gym is None:
        return
    try:
        gym_call.token = await gym.begin(gym_call.rollout_id, gym_call.model_call_id, gym_call.items)
    except Exception as exc:
        log.warning("Gym's token capture cannot record a call of rollout %s: %s", gym_call.rollout_id, exc)
        raise OpenAIError(
            503, "training-token capture cannot record this call; retry later", code="capture_unavailable"
        ) from exc


async def answered(
    state: AppState,
    api: str,
    chat_response: dict[str, Any],
    served: Callable[[], dict[str, Any]] | None,
    shown: Callable[[], dict[str, Any]] | None = None,
) -> None:
    """The whole answer: into Gym's token store (training) and its exchange log (evaluation). Never raises.

    `served()` gives it as Gym's token capture holds it (a Responses object with its triple); by
    default it is the chat answer with Gym's token fields on `choices[0].message`. `shown()` gives it
    as the client got it, for the exchange, where that differs (a Messages answer); by default `served()`.
    """
    gym_call = _current.get()
    if gym_call is None:
        return
    payload = None
    if gym_call.token is not None:
        payload = served() if served is not None else chat_with_gym_tokens(chat_response)
        await GymTokenCapture.commit(payload, gym_call.items)
    if state.gym_calls is None or gym_call.request is None:
        return
    if shown is not None:
        payload = shown()
    elif payload is None:
        payload = served() if served is not None else chat_with_gym_tokens(chat_response)
    await _log(state, gym_call, api, 200, None, payload)


async def close_gym_call(
    state: AppState, token: Token[Any], api: str, failure: tuple[int | None, str | None], started: bool
) -> None:
    """The call is over: Gym's capture context undone, and an exchange for a call that never completed
    (a refusal, an upstream error, a cut stream, a client gone)."""
    gym_call = _current.get()
    _current.reset(token)
    if gym_call is None:
        return
    if gym_call.token is not None:
        GymTokenCapture.end(gym_call.token)
    # With keys, a call refused before it was admitted writes no exchange either: it may name a
    # rollout that is not its key's, and a refused call leaves nothing behind. (Without keys there is
    # one tenant, and Gym's own servers log refusals too.)
    if not gym_call.logged and (gym_call.admitted or not state.owners.scoped):
        status, category = failure
        if status is None and category is None and started:  # ended in-band, after a 200
            status, category = 200, "upstream_error"
        await _log(state, gym_call, api, status, category, None)


async def _log(
    state: AppState,
    gym_call: GymCall,
    api: str,
    status: int | None,
    category: str | None,
    response: dict[str, Any] | None,
) -> None:
    calls = state.gym_calls
    if calls is None or gym_call.request is None or gym_call.logged:
        return
    gym_call.logged = True
    now = time.time()
    exchange = calls.exchange(
        model_call_id=gym_call.model_call_id,
        dialect=api,
        started_at=gym_call.started_at,
        completed_at=now,
        latency_ms=(now - gym_call.started_at) * 1000.0,
        status_code=status,
        error_category=category,
        request=gym_call.request,
        response=response,
    )
    await calls.record(gym_call.rollout_id, exchange)
