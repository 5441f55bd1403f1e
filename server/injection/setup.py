"""Build the Injector from the settings and the deployment: one `/tokenize` endpoint (or local renderer) per route."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from server.capture.write.record import CaptureRecord
from server.config import Settings
from server.injection.breaker import RouteBreaker
from server.injection.histories import HistoryCache
from server.injection.id_fields import id_field_for
from server.injection.injector import Injector
from server.injection.tokenize import TokenizeClient
from server.switchyard import discovery

log = logging.getLogger("switchyard_model.injection")


def tokenize_clients(settings: Settings, deployment_text: str | None) -> dict[str, TokenizeClient]:
    """route -> its engine's /tokenize client. `""` is the fallback for every route (attach mode, or an override).

    In launch mode each passthrough route's target `base_url` names its engine: `/tokenize` is at
    that server's root (the base URL without `/v1`).
    """
    timeout = settings.injection_tokenize_timeout_s
    if settings.injection_tokenize_base_url:
        return {"": TokenizeClient(settings.injection_tokenize_base_url, timeout_s=timeout)}
    clients: dict[str, TokenizeClient] = {}
    for upstream in discovery.route_upstreams(deployment_text or ""):
        key = os.environ.get(upstream.api_key_env or "") or None
        clients[upstream.route_id] = TokenizeClient(upstream.base_url, api_key=key, timeout_s=timeout)
    return clients


def build_injector(
    settings: Settings,
    *,
    default_route: str,
    deployment_text: str | None,
    read_records: Callable[[str], list[CaptureRecord]] | None,
    max_model_len_for: Callable[[str], int | None],
) -> tuple[Injector, Callable[[], None]]:
    """The Injector and a function that releases its connections. Raises RuntimeError naming what is missing."""
    renderers: dict[str, Any] = {}
    clients: dict[str, TokenizeClient] = {}
    if settings.injection_transport == "nemo_rl":
        pass  # NeMo-RL's engine renders its template and splices: nothing is rendered here
    elif settings.injection_bridge == "renderers":
        from server.injection.renderers_bridge import RendererTokenizer, renderer_factory

        assert settings.injection_renderer_model
        try:
            renderers[""] = RendererTokenizer(renderer_factory(settings.injection_renderer_model))
        except ImportError as exc:
            raise RuntimeError(
                f"injection_bridge: renderers needs the [tito] extra (pip install 'switchyard-model[tito]'): {exc}"
            ) from exc
    else:
        clients = tokenize_clients(settings, deployment_text)
        if default_route not in clients and "" not in clients:
            for client in clients.values():
                client.close()
            raise RuntimeError(
                f"token_injection: no /tokenize endpoint for route {default_route!r}; set injection_tokenize_base_url "
                "(the engine's root URL), or give the route a passthrough target with a base_url in the deployment"
            )
    table: dict[str, Any] = {**clients, **renderers}

    def tokenizer_for(route: str) -> Any:
        return table.get(route) or table.get("")

    injector = Injector(
        id_field=id_field_for(settings.injection_transport, settings.injection_vllm_field),
        tokenizer_for=tokenizer_for,
        read_records=read_records,
        max_model_len_for=max_model_len_for,
        cache=HistoryCache(max_sessions=settings.injection_cache_sessions, ttl_s=settings.injection_cache_ttl_s),
        breaker=RouteBreaker(settings.injection_mismatch_limit, settings.injection_pause_s),
        rebuild_wait_s=settings.injection_rebuild_wait_s,
    )
    where = ", ".join(f"{route or '*'} -> {c.base_url}/tokenize" for route, c in clients.items()) or (
        "local renderer" if renderers else "the engine splices; no /tokenize"
    )
    log.info("token injection on (%s transport; %s)", settings.injection_transport, where)

    def close() -> None:
        for client in clients.values():
            client.close()

    return injector, close
