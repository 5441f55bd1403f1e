"""Which model server stands behind each passthrough route, and its `max_model_len` (asked from vLLM)."""

from __future__ import annotations

import logging
import os
import tomllib
from dataclasses import dataclass

import httpx

log = logging.getLogger("switchyard_model.discovery")


@dataclass(frozen=True)
class RouteUpstream:
    """A passthrough route and the one model behind it (enough to ask that model's server)."""

    route_id: str
    base_url: str
    model: str
    api_key_env: str | None
    context_window: int | None


def route_upstreams(text: str) -> list[RouteUpstream]:
    """Passthrough routes of a rendered deployment with their target's base URL and model id.

    Only a passthrough route has one model whose `max_model_len` is the route's context window.
    """
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return []
    clients, targets = doc.get("llm_clients") or {}, doc.get("targets") or {}
    found = []
    for route in (doc.get("routes") or {}).values():
        if not isinstance(route, dict) or route.get("type") != "passthrough":
            continue
        target = targets.get(route.get("target")) or {}
        client = clients.get(target.get("llm_client")) or {}
        if not (
            isinstance(route.get("id"), str)
            and isinstance(client.get("base_url"), str)
            and isinstance(target.get("id"), str)
        ):
            continue
        window = route.get("context_window")
        found.append(
            RouteUpstream(
                route["id"],
                client["base_url"],
                target["id"],
                client.get("api_key_env"),
                window if isinstance(window, int) and not isinstance(window, bool) else None,
            )
        )
    return found


def _int_len(entry: object) -> int | None:
    value = entry.get("max_model_len") if isinstance(entry, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


async def discover_max_model_len(base_url: str, model: str, client: httpx.AsyncClient) -> int | None:
    """Ask a vLLM server's /v1/models for `max_model_len`; None when it does not say (never raises).

    The entry whose id is `model` wins; otherwise the first entry that carries one (a vLLM server
    serves one base model, and its LoRA adapters share its length).
    """
    root = base_url.rstrip("/")
    url = root + "/models" if root.endswith("/v1") else root + "/v1/models"
    try:
        response = await client.get(url, timeout=5.0)
        response.raise_for_status()
        data = response.json().get("data") or []
    except (httpx.HTTPError, ValueError, AttributeError) as exc:
        log.warning("cannot read max_model_len from %s: %s", url, type(exc).__name__)
        return None
    if not isinstance(data, list):
        return None
    for entry in data:
        if isinstance(entry, dict) and entry.get("id") == model and _int_len(entry) is not None:
            return _int_len(entry)
    return next((length for length in map(_int_len, data) if length is not None), None)


async def discover_context_lengths(deployment_text: str) -> dict[str, int]:
    """`max_model_len` for each passthrough route without a `context_window`, asked from its vLLM
    server (best-effort: a route whose server does not say is left out)."""
    lengths: dict[str, int] = {}
    for upstream in route_upstreams(deployment_text):
        if upstream.context_window is not None:
            continue
        key = os.environ.get(upstream.api_key_env or "")
        headers = {"authorization": f"Bearer {key}"} if key else {}
        async with httpx.AsyncClient(headers=headers, trust_env=False, timeout=5.0) as client:
            length = await discover_max_model_len(upstream.base_url, upstream.model, client)
        if length is not None:
            lengths[upstream.route_id] = length
    return lengths
