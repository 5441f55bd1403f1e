"""The lifespan: start Switchyard, the upstream client and capture in order; stop them in reverse."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from server.errors import OpenAIError
from server.http.admission import limits
from server.state import AppState
from server.switchyard import provenance
from server.switchyard.discovery import discover_context_lengths
from server.upstream.client import Upstream

log = logging.getLogger("switchyard_model.app")


@contextlib.asynccontextmanager
async def lifespan(state: AppState) -> AsyncIterator[None]:
    """Runs on the event-loop thread: the hosted Switchyard is thread-affine, so it is created and closed here."""
    settings = state.settings
    try:
        await state.proxy.start()
        state.telemetry.set_upstream(state.proxy.root_url)
        state.upstream = Upstream(
            state.proxy.root_url + "/v1",
            api_key=settings.switchyard_api_key,
            default_headers=settings.default_headers,
            timeout_s=settings.upstream_timeout_s,
            connect_timeout_s=settings.upstream_connect_timeout_s,
            max_connections=limits(settings).upstream,
        )
        try:
            default_route, state.routes = await discover_routes(state.upstream)
        except OpenAIError as exc:
            if not settings.switchyard_model:
                raise RuntimeError(f"cannot list Switchyard's routes at {state.proxy.root_url}: {exc}") from exc
            # An attached Switchyard may come up later; calls fail with 502/503 until it does.
            log.warning(
                "cannot list Switchyard's routes at %s (%s); serving route %r anyway",
                state.proxy.root_url,
                exc,
                settings.switchyard_model,
            )
            default_route = None
        state.route = settings.switchyard_model or default_route or ""
        if not state.route:
            raise RuntimeError("Switchyard exposes no route; set switchyard_model")
        configured = {settings.switchyard_model, *settings.model_aliases.values()}
        unknown = {route for route in configured if route} - state.routes
        if unknown and state.routes:
            log.warning("routes %s are not among Switchyard's routes %s", sorted(unknown), sorted(state.routes))
        if settings.max_concurrent_requests:
            state.semaphore = asyncio.Semaphore(settings.max_concurrent_requests)
        if settings.gym is not None:
            from server.capture.gym.calls import GymCallLog
            from server.capture.gym.tokens import GymTokenCapture

            try:
                state.gym_tokens = GymTokenCapture.from_gym_settings(settings.gym, settings.workers)
                state.gym_calls = GymCallLog.from_gym_settings(settings.gym)
            except (ValueError, OSError) as exc:
                raise RuntimeError(f"Gym's capture settings: {exc}") from exc
        if settings.capture:
            from server.capture.store import CaptureStore
            from server.capture.write.handoff import CaptureHandoff

            state.capture_store = CaptureStore(
                settings.capture_dir,
                queue_size=settings.capture_queue_size,
                capture_uncorrelated=settings.capture_uncorrelated,
                compress=settings.capture_compress,
                encoding=settings.capture_encoding,
                fsync=settings.capture_fsync,
                fsync_window_ms=settings.capture_fsync_window_ms,
                server_run=state.server_run,
                full_revalidation_s=settings.capture_index_rescan_s,
            )
            # Earlier runs' records are indexed in the background: calls are served meanwhile.
            await asyncio.to_thread(state.capture_store.start, index_in_background=True)
            from server.capture.read.rebuilds import RolloutBuilder

            state.rollouts = RolloutBuilder(
                state.capture_store.sessions_dir,
                workers=settings.rollout_workers,
                cache_bytes=settings.rollout_cache_mb << 20,
            )
            state.closers.append(state.rollouts.close)
            state.capture_handoff = CaptureHandoff(settings, state.capture_store)
            state.telemetry.capture_stats_source(state.capture_store.stats)
        if state.proxy.rendered is not None:
            state.max_model_lens.update(await discover_context_lengths(state.proxy.rendered.text))
        if settings.token_injection and state.capture_store is not None:
            from server.injection.setup import build_injector

            store = state.capture_store
            state.injector, close = build_injector(
                settings,
                default_route=state.route,
                deployment_text=state.proxy.rendered.text if state.proxy.rendered else None,
                read_records=lambda session_id: store.read_completions(session_id)[0],
                max_model_len_for=state.max_model_lens.get,
            )
            state.closers.append(close)
        if settings.response_store:
            from server.stateful.service import Stateful

            stateful = Stateful(settings, state.server_run)
            await asyncio.to_thread(stateful.open)
            state.response_store = stateful
        state.ready = True
        log.info(
            "serving route %r through Switchyard at %s (%s); server run %s",
            state.route,
            state.proxy.root_url,
            state.proxy.mode,
            state.server_run,
        )
        if settings.condition_dir:
            await asyncio.to_thread(
                provenance.write_manifest,
                settings.condition_dir,
                route=state.route,
                mode=state.proxy.mode,
                proxy_root_url=state.proxy.root_url,
                deployment_path=str(state.proxy.deployment_path) if state.proxy.deployment_path else None,
                rendered_text=state.proxy.rendered.redacted_text if state.proxy.rendered else None,
                session_id_headers=settings.session_id_headers,
                proxy_provenance=settings.proxy_provenance,
            )
        if state.on_ready is not None:
            state.on_ready(state)
    except BaseException as exc:
        state.startup_error = exc
        await shutdown(state)
        raise
    try:
        yield
    finally:
        if settings.condition_dir and state.proxy.root_url:  # while Switchyard still answers
            await provenance.snapshot_stats(
                settings.condition_dir,
                state.proxy.root_url,
                mode=state.proxy.mode,
                api_key=settings.switchyard_api_key,
                default_headers=settings.default_headers,
            )
        await shutdown(state)


async def discover_routes(upstream: Upstream) -> tuple[str | None, frozenset[str]]:
    """Switchyard's default route and all its route ids, from its /v1/models."""
    models = await upstream.get_json("/models")
    ids = frozenset(m["id"] for m in models.get("data") or [] if isinstance(m.get("id"), str))
    return models.get("default_model") or (min(ids) if ids else None), ids


async def shutdown(state: AppState) -> None:
    """Undo whatever the lifespan got to; safe to call twice. The proxy is closed last."""
    state.ready = False
    try:
        if state.response_store is not None:
            # Runs first: each still going records itself cancelled, while capture and the store are up.
            await state.response_store.runs.shutdown()
        while state.closers:
            state.closers.pop()()
        if state.gym_tokens is not None:
            gym_tokens, state.gym_tokens = state.gym_tokens, None
            await gym_tokens.close()
        if state.capture_store is not None:
            store, state.capture_store, state.capture_handoff = state.capture_store, None, None
            await asyncio.to_thread(store.close)
        if state.upstream is not None:
            upstream, state.upstream = state.upstream, None
            await upstream.aclose()
        if state.response_store is not None:
            stateful, state.response_store = state.response_store, None
            await asyncio.to_thread(stateful.close)
        state.telemetry.shutdown()
    finally:
        await state.proxy.close()
