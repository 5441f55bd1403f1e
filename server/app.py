"""create_app(settings): the routes, the middleware stack, and the lifespan that owns Switchyard."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Match, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from middleware.auth import AuthMiddleware, BearerKeys, reject, speaks_anthropic
from middleware.correlation import RefusedIds, correlate, publish, unpublish
from middleware.hosts import HostAllowList, is_json_request, refuse_content_type, refuse_host
from server.api import conversations, models, stored_responses
from server.api.chat import ChatCompletions
from server.api.messages import messages_handlers
from server.api.responses import Responses
from server.config import Settings
from server.errors import OpenAIError, error_response, send_error
from server.http import BodyBudget
from server.http.admission import Admission, limits
from server.lifespan import lifespan
from server.request_owner import Owners
from server.state import AppState
from server.switchyard.proxy import build_proxy
from server.telemetry import prometheus
from server.telemetry.service import Telemetry

log = logging.getLogger("switchyard_model.app")


def _path_meant(request: Request) -> str | None:
    """The path a client most likely meant when its base URL lacked `/v1` (or had it twice), if this
    app serves that path."""
    path = request.url.path
    candidate = path[len("/v1") :] if path.startswith("/v1/v1/") else "/v1" + path
    if candidate == path or not path.startswith("/"):
        return None
    scope = {**request.scope, "path": candidate}
    for route in request.app.routes:
        match, _ = route.matches(scope)
        if match != Match.NONE:
            return candidate
    return None


async def _http_exception(request: Request, exc: HTTPException) -> Response:
    if exc.status_code == 404:
        message = f"no such endpoint: {request.method} {request.url.path}"
        suggestion = _path_meant(request)
        if suggestion is not None:
            message += f"; did you mean {suggestion}?"
        error = OpenAIError(404, message, code="endpoint_not_found")
    elif exc.status_code == 405:
        error = OpenAIError(
            405,
            f"method {request.method} is not allowed on {request.url.path}",
            code="method_not_allowed",
            headers=dict(exc.headers or {}),
        )
    else:
        error = OpenAIError(exc.status_code, str(exc.detail))
    return error_response(error)


async def _openai_error(request: Request, exc: OpenAIError) -> Response:
    return error_response(exc)


async def _unhandled(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    return error_response(OpenAIError(500, "internal server error", code="internal_error"))


class ServerApp(Starlette):
    """Starlette, with the model calls (three APIs on four POST paths) dispatched in one pure ASGI layer.

    A model call goes from here straight to its handler: correlation, the Bearer check and the
    dispatch are done inline, instead of through Starlette's error middleware, two middlewares and
    the router. Every layer is a coroutine frame that each resumption of the call passes through (a
    model call resumes a dozen times) and, for some, a `send` wrapper on every message; the handlers
    answer every error themselves, so they need none of it. Anything else (and a wrong method, for
    the 405) goes on to Starlette, which runs the auth middleware and the routes.
    """

    def __init__(
        self,
        *,
        model_handlers: dict[str, ASGIApp],
        refused_ids: RefusedIds,
        auth: BearerKeys,
        hosts: HostAllowList,
        bodies: BodyBudget,
        admission: Admission,
        **starlette: Any,
    ) -> None:
        super().__init__(**starlette)
        self.model_handlers = model_handlers
        self.refused_ids = refused_ids
        self.auth = auth
        self.hosts = hosts
        self.bodies = bodies
        self.admission = admission

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        if not self.hosts.allows(scope):  # before anything else: a rebound name gets nothing
            await refuse_host(send)
            return
        # Outermost: the Gym prefix is stripped before auth and dispatch look at the path.
        scope, send, corr = correlate(scope, send, self.refused_ids)
        # The request's body bytes count against the process's budget until its answer is over.
        hold = self.bodies.hold(scope)
        if hold is None:
            await send_error(send, self.bodies.busy_error(), anthropic=speaks_anthropic(scope))
            return
        token = publish(corr)
        # Every body under its deadline, and counted as a call in flight once it is whole (a 503 beyond).
        admitted = self.admission.receiver(receive)
        try:
            receive = hold.receive(admitted)
            post = scope["method"] == "POST"
            handler = self.model_handlers.get(scope["path"]) if post else None
            if handler is None:
                if post and not is_json_request(scope):  # every POST route takes JSON, and only JSON
                    await refuse_content_type(send)
                else:
                    await super().__call__(scope, receive, send)
            elif not self.auth.allows(scope):
                await reject(send, scope)
            elif not is_json_request(scope):  # a cross-site form or text/plain POST
                await refuse_content_type(send)
            else:
                await handler(scope, receive, send)
        finally:
            hold.release()
            admitted.release()
            unpublish(token)


def create_app(
    settings: Settings, *, on_ready: Callable[[AppState], None] | None = None, server_run: str | None = None
) -> ServerApp:
    """Build the ASGI app. Nothing starts here: Switchyard, the upstream client and capture start in
    the lifespan, on the event-loop thread (the hosted server is thread-affine). `on_ready(state)` is
    called once the server can take calls. `server_run` is the run id its records carry (the
    workers of one `serve` share the parent's); by default a fresh one."""
    state = AppState(settings=settings, proxy=build_proxy(settings), telemetry=Telemetry(settings), on_ready=on_ready)
    if server_run is not None:
        state.server_run = server_run
    state.owners = Owners(settings.api_keys, settings.session_api_keys)
    state.telemetry.refused_ids_source(state.refused_ids.counts)

    # The three model APIs on their four POST paths, each keyed by its handler's own `path`.
    endpoints = (ChatCompletions(state), Responses(state), *messages_handlers(state).values())
    model_handlers: dict[str, ASGIApp] = {endpoint.path: endpoint for endpoint in endpoints}
    routes = [
        *(Route(path, handler, methods=["POST"]) for path, handler in model_handlers.items()),
        *models.routes,
        *prometheus.routes,
    ]
    session_reads = None
    if settings.capture:
        from server import viewer
        from server.api import session_views, sessions
        from server.api.session_access import SessionAccess, SessionReads

        # Every session route checks the caller's key with `access`.
        session_reads = SessionReads(state, access=SessionAccess(state.owners))
        routes += [*sessions.routes, *session_views.routes, *viewer.routes]
    # Registered whatever the settings: with the store off they answer why in an OpenAI error.
    routes += [*stored_responses.routes, *conversations.routes]

    exception_handlers: dict[Any, Callable[..., Any]] = {
        HTTPException: _http_exception,
        OpenAIError: _openai_error,
        Exception: _unhandled,
    }
    keys: dict[str, Any] = {
        "api_keys": settings.api_keys,
        "session_api_keys": settings.session_api_keys,
        "metrics_open": settings.metrics_open,
    }
    app = ServerApp(
        model_handlers=model_handlers,
        refused_ids=state.refused_ids,
        auth=BearerKeys(**keys),
        hosts=HostAllowList(settings.host, settings.allowed_hosts),
        bodies=BodyBudget(settings.max_body_bytes_in_flight, settings.max_body_bytes),
        admission=Admission(limits(settings).calls, settings.request_body_timeout_s),
        routes=routes,
        middleware=[Middleware(AuthMiddleware, **keys)],
        lifespan=lambda app: lifespan(state),
        exception_handlers=exception_handlers,
    )
    app.state.switchyard = state  # what every route shares (`server.api.shared.app_state`)
    if session_reads is not None:
        session_reads.install(app)
    return app
