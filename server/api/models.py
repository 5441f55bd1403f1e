"""GET /v1/models (Switchyard's routes, with max_model_len where known), GET /health and GET / (`routes`)."""

from __future__ import annotations

import time
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from server.api.shared import app_state
from server.errors import OpenAIError
from server.state import AppState


async def proxy_up(state: AppState) -> bool:
    """Switchyard is serving: started (not restarting), and answering its health check."""
    if not state.ready or state.upstream is None or state.proxy.is_known_down():
        return False
    return await state.upstream.healthy(state.proxy.root_url)


def json_response(status: int, payload: Any, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(payload), status_code=status, media_type="application/json", headers=headers)


def _anthropic_model(entry: dict[str, Any]) -> dict[str, Any]:
    """One route as Anthropic's model object: every field its SDK's `ModelInfo` declares, `null` where a
    route has nothing to say (a route is never deprecated; its capabilities and line are unknown)."""
    return {
        "type": "model",
        "id": entry["id"],
        "display_name": entry["id"],
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(entry["created"] or 0)),
        "lifecycle": "active",
        "deprecated_at": None,
        "retires_at": None,
        "line": None,
        "capabilities": None,
        "max_input_tokens": entry["max_model_len"],
        # The engine takes any output up to the context left by the prompt: no fixed cap to name.
        "max_tokens": None,
    }


def _anthropic_list(data: list[dict[str, Any]]) -> dict[str, Any]:
    """The model list as Anthropic's `GET /v1/models` shapes it (one page: every route)."""
    models = [_anthropic_model(entry) for entry in data]
    return {
        "data": models,
        "has_more": False,
        "first_id": models[0]["id"] if models else None,
        "last_id": models[-1]["id"] if models else None,
    }


async def health(request: Request) -> Response:
    state = app_state(request)
    up = await proxy_up(state)
    body: dict[str, Any] = {
        "status": "ok" if up else "unavailable",
        "mode": state.proxy.mode,
        "http_server": state.settings.http_server,
        "route": state.route or None,
        # Switchyard takes calls with no key and no record: with keys set, its address is not
        # published on this open route.
        "proxy": {
            "url": None if state.settings.api_keys else state.proxy.root_url,
            "up": up,
            "threads": state.proxy.threads,
        },
        # Ids the correlation rules refused: those calls were served but not tied to a session.
        "correlation": {"refused_ids": state.refused_ids.counts()},
    }
    if state.capture_store is not None:
        body["capture"] = state.capture_store.stats()
    admission = getattr(request.app, "admission", None)  # ServerApp's (server/http/admission.py)
    if admission is not None:
        body["admission"] = admission.stats()
    return json_response(200 if up else 503, body)


async def list_models(request: Request) -> Response:
    state = app_state(request)
    if not state.ready or state.upstream is None:
        raise OpenAIError(503, "Switchyard is not running", code="proxy_unavailable")
    try:
        upstream_models = await state.upstream.get_json("/models")
    except OpenAIError as exc:
        raise OpenAIError(502, f"cannot list Switchyard's routes: {exc.message}", code="upstream_error") from exc
    data = []
    for entry in upstream_models.get("data") or []:
        caps = entry.get("capabilities") or {}
        data.append(
            {
                "id": entry.get("id"),
                "object": "model",
                "created": entry.get("created", 0),
                "owned_by": entry.get("owned_by", "switchyard"),
                "max_model_len": caps.get("context_window") or state.max_model_lens.get(entry.get("id")),
            }
        )
    if "anthropic-version" in request.headers:  # Anthropic's clients list models in their own shape
        return json_response(200, _anthropic_list(data))
    return json_response(200, {"object": "list", "data": data})


async def root(request: Request) -> Response:
    """NeMo Gym probes its servers' liveness here."""
    return json_response(200, {"status": "ok"})


routes = [
    Route("/v1/models", list_models, methods=["GET"]),
    Route("/health", health, methods=["GET"]),
    Route("/", root, methods=["GET"]),
]
