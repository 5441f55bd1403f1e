"""create_app(settings): the routes, the middleware stack, and the lifespan that owns Switchyard."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from dataclasses import dataclass, field
from collections.abc import Callable
from typing import Any

import httpx
import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from middleware.auth import AuthMiddleware
from middleware.correlation import CorrelationMiddleware
from server import profiles, provenance
from server.asgi import send_error
from server.calls import ModelEndpoints
from server.config import Settings
from server.errors import OpenAIError
from server.proxy import SwitchyardProxy, build_proxy
from server.telemetry import Telemetry
from server.upstream import Upstream

log = logging.getLogger("switchyard_model.app")


@dataclass
class AppState:
    """Everything the handlers share; filled in by the lifespan, empty before it runs."""

    settings: Settings
    proxy: SwitchyardProxy
    upstream: Upstream | None = None
    store: Any = None  # server.capture.store.CaptureStore when capture is on
    telemetry: Telemetry = field(default_factory=Telemetry)
    semaphore: asyncio.Semaphore | None = None
    route: str = ""  # the default route (switchyard_model, or Switchyard's default)
    routes: frozenset[str] = frozenset()  # every route Switchyard exposes
    max_model_lens: dict[str, int] = field(default_factory=dict)  # discovered from vLLM upstreams
    ready: bool = False
    on_ready: Callable[[], None] | None = None  # the CLI prints where it listens
    startup_error: BaseException | None = None  # why the lifespan failed, for the CLI's exit message

    def route_for(self, requested: Any) -> str:
        """The Switchyard route for a request's `model` (the configured route wins, as in Gym)."""
        aliases = self.settings.model_aliases
        if aliases and isinstance(requested, str) and requested in aliases:
            return aliases[requested]
        if self.settings.strict_models:
            if isinstance(requested, str) and requested in self.routes:
                return requested
            known = sorted(self.routes | set(aliases))
            raise OpenAIError(404, f"the model {requested!r} does not exist here; known models: {known}",
                              param="model", code="model_not_found")
        return self.route


def _json(status: int, payload: Any, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(payload), status_code=status, media_type="application/json", headers=headers)


def _error_response(error: OpenAIError) -> Response:
    return _json(error.status, error.to_dict(), error.headers)


async def _http_exception(request: Request, exc: HTTPException) -> Response:
    if exc.status_code == 404:
        error = OpenAIError(404, f"no such endpoint: {request.method} {request.url.path}", code="endpoint_not_found")
    elif exc.status_code == 405:
        error = OpenAIError(405, f"method {request.method} is not allowed on {request.url.path}",
                            code="method_not_allowed", headers=dict(exc.headers or {}))
    else:
        error = OpenAIError(exc.status_code, str(exc.detail))
    return _error_response(error)


async def _openai_error(request: Request, exc: OpenAIError) -> Response:
    return _error_response(exc)


async def _unhandled(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    return _error_response(OpenAIError(500, "internal server error", code="internal_error"))


class _RequiresReady:
    """Answers 503 until the lifespan has brought Switchyard up (and after it went down)."""

    def __init__(self, state: AppState, endpoint) -> None:
        self.state = state
        self.endpoint = endpoint

    async def __call__(self, scope, receive, send) -> None:
        if not self.state.ready or self.state.proxy.is_running() is False:
            await send_error(send, OpenAIError(503, "Switchyard is not running", code="proxy_unavailable"))
            return
        await self.endpoint(scope, receive, send)


class ModelCallFastPath:
    """Pure ASGI: sends `POST` to the two model endpoints straight to their handlers.

    Starlette's router and exception middleware add a route scan and two `send` wrappers to every
    call and every streamed chunk; these handlers answer every error themselves, so they skip both.
    Anything else (and a wrong method, for the 405) goes on to Starlette.
    """

    def __init__(self, app, *, handlers: dict[str, Any]) -> None:
        self.app = app
        self.handlers = handlers

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            handler = self.handlers.get(scope["path"])
            if handler is not None:
                await handler(scope, receive, send)
                return
        await self.app(scope, receive, send)


async def _discover_routes(upstream: Upstream) -> tuple[str | None, frozenset[str]]:
    """Switchyard's default route and all its route ids, from its /v1/models."""
    models = await upstream.get_json("/models")
    ids = frozenset(m["id"] for m in models.get("data") or [] if isinstance(m.get("id"), str))
    return models.get("default_model") or (min(ids) if ids else None), ids


def create_app(settings: Settings) -> Starlette:
    """Build the ASGI app. Nothing starts here: Switchyard, the upstream client and capture start in
    the lifespan, on the event-loop thread (the hosted server is thread-affine)."""
    state = AppState(settings=settings, proxy=build_proxy(settings), telemetry=Telemetry(settings))
    endpoints = ModelEndpoints(state)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        try:
            await state.proxy.start()
            state.telemetry.set_upstream(state.proxy.root_url)
            state.upstream = Upstream(
                state.proxy.root_url + "/v1",
                api_key=settings.switchyard_api_key,
                default_headers=settings.default_headers,
                timeout_s=settings.upstream_timeout_s,
                connect_timeout_s=settings.upstream_connect_timeout_s,
                max_connections=settings.upstream_max_connections,
            )
            try:
                default_route, state.routes = await _discover_routes(state.upstream)
            except (httpx.HTTPError, ValueError) as exc:
                if not settings.switchyard_model:
                    raise RuntimeError(f"cannot list Switchyard's routes at {state.proxy.root_url}: {exc}") from exc
                # An attached Switchyard may come up later; calls fail with 502/503 until it does.
                log.warning("cannot list Switchyard's routes at %s (%s); serving route %r anyway",
                            state.proxy.root_url, exc, settings.switchyard_model)
                default_route = None
            state.route = settings.switchyard_model or default_route
            if not state.route:
                raise RuntimeError("Switchyard exposes no route; set switchyard_model")
            unknown = {settings.switchyard_model, *settings.model_aliases.values()} - state.routes - {None}
            if unknown and state.routes:
                log.warning("routes %s are not among Switchyard's routes %s", sorted(unknown), sorted(state.routes))
            if settings.max_concurrent_requests:
                state.semaphore = asyncio.Semaphore(settings.max_concurrent_requests)
            if settings.capture:
                from server.capture.store import CaptureStore

                state.store = CaptureStore(settings.capture_dir, queue_size=settings.capture_queue_size,
                                           capture_uncorrelated=settings.capture_uncorrelated,
                                           compress=settings.capture_compress)
                await asyncio.to_thread(state.store.start)  # indexes what earlier runs recorded
                state.telemetry.capture_stats_source(state.store.stats)
            await _discover_context_lengths(state)
            state.ready = True
            log.info("serving route %r through Switchyard at %s (%s)", state.route, state.proxy.root_url,
                     state.proxy.mode)
            if settings.condition_dir:
                await asyncio.to_thread(
                    provenance.write_manifest, settings.condition_dir, route=state.route, mode=state.proxy.mode,
                    proxy_root_url=state.proxy.root_url,
                    deployment_path=str(state.proxy.deployment_path) if state.proxy.deployment_path else None,
                    rendered_text=state.proxy.rendered.redacted_text if state.proxy.rendered else None,
                    session_id_headers=settings.session_id_headers)
            if state.on_ready is not None:
                state.on_ready()
        except BaseException as exc:
            state.startup_error = exc
            await _shutdown(state)
            raise
        try:
            yield
        finally:
            if settings.condition_dir and state.proxy.root_url:  # while Switchyard still answers
                await provenance.snapshot_stats(settings.condition_dir, state.proxy.root_url)
            await _shutdown(state)

    async def health(request: Request) -> Response:
        up = await _proxy_up(state)
        body = {
            "status": "ok" if up else "unavailable",
            "mode": state.proxy.mode,
            "route": state.route or None,
            "proxy": {"url": state.proxy.root_url, "up": up},
        }
        if state.store is not None:
            body["capture"] = state.store.stats()
        return _json(200 if up else 503, body)

    async def models(request: Request) -> Response:
        if not state.ready:
            raise OpenAIError(503, "Switchyard is not running", code="proxy_unavailable")
        try:
            upstream_models = await state.upstream.get_json("/models")
        except (httpx.HTTPError, ValueError) as exc:
            raise OpenAIError(502, f"cannot list Switchyard's routes: {exc}", code="upstream_error") from exc
        data = []
        for entry in upstream_models.get("data") or []:
            caps = entry.get("capabilities") or {}
            data.append({
                "id": entry.get("id"),
                "object": "model",
                "created": entry.get("created", 0),
                "owned_by": entry.get("owned_by", "switchyard"),
                "max_model_len": caps.get("context_window") or state.max_model_lens.get(entry.get("id")),
            })
        return _json(200, {"object": "list", "data": data})

    model_handlers = {
        "/v1/chat/completions": _RequiresReady(state, endpoints.chat_completions),
        "/v1/responses": _RequiresReady(state, endpoints.responses),
    }
    routes = [
        *(Route(path, handler, methods=["POST"]) for path, handler in model_handlers.items()),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        # NeMo Gym probes its servers' liveness at `/`.
        Route("/", lambda request: _json(200, {"status": "ok"}), methods=["GET"]),
        state.telemetry.metrics_route(),
    ]
    if settings.capture:
        from server.sessions import session_routes

        routes += session_routes(lambda: state.store)

    app = Starlette(
        routes=routes,
        # Outermost first: the Gym prefix is stripped before auth looks at the path.
        middleware=[
            Middleware(CorrelationMiddleware),
            Middleware(AuthMiddleware, api_keys=settings.api_keys, session_api_keys=settings.session_api_keys),
            Middleware(ModelCallFastPath, handlers=model_handlers),
        ],
        lifespan=lifespan,
        exception_handlers={HTTPException: _http_exception, OpenAIError: _openai_error, Exception: _unhandled},
    )
    app.state.switchyard = state
    return app


async def _discover_context_lengths(state: AppState) -> None:
    """For routes without a context_window, ask their vLLM upstream for max_model_len (best-effort)."""
    if state.proxy.rendered is None:
        return
    for upstream in profiles.route_upstreams(state.proxy.rendered.text):
        if upstream.context_window is not None:
            continue
        key = os.environ.get(upstream.api_key_env or "")
        headers = {"authorization": f"Bearer {key}"} if key else {}
        async with httpx.AsyncClient(headers=headers, trust_env=False, timeout=5.0) as client:
            length = await profiles.discover_max_model_len(upstream.base_url, upstream.model, client)
        if length is not None:
            state.max_model_lens[upstream.route_id] = length


async def _shutdown(state: AppState) -> None:
    """Undo whatever the lifespan got to; safe to call twice. The proxy is closed last."""
    state.ready = False
    try:
        if state.store is not None:
            store, state.store = state.store, None
            await asyncio.to_thread(store.close)
        if state.upstream is not None:
            upstream, state.upstream = state.upstream, None
            await upstream.aclose()
        state.telemetry.shutdown()
    finally:
        await state.proxy.close()


async def _proxy_up(state: AppState) -> bool:
    if not state.ready or state.upstream is None or state.proxy.is_running() is False:
        return False
    return await state.upstream.healthy(state.proxy.root_url)
