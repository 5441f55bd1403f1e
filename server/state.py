"""AppState: what the handlers share, filled in by the lifespan."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from middleware.correlation import RefusedIds
from server.capture.catalog import inferred
from server.capture.catalog.runs import new_run_id
from server.config import Settings
from server.errors import OpenAIError
from server.request_owner import Owners
from server.switchyard.proxy import SwitchyardProxy
from server.telemetry.service import Telemetry
from server.upstream.client import Upstream

if TYPE_CHECKING:
    from server.capture.gym.calls import GymCallLog
    from server.capture.gym.tokens import GymTokenCapture
    from server.capture.read.rebuilds import RolloutBuilder
    from server.capture.store import CaptureStore
    from server.capture.write.handoff import CaptureHandoff
    from server.injection.injector import Injector
    from server.stateful.service import Stateful


@dataclass
class AppState:
    """Everything the handlers share; filled in by the lifespan, empty before it runs."""

    settings: Settings
    proxy: SwitchyardProxy
    upstream: Upstream | None = None
    capture_store: CaptureStore | None = None  # when capture is on
    rollouts: RolloutBuilder | None = None  # rebuilds rollouts off the event loop; with capture_store
    response_store: Stateful | None = None  # when response_store is on
    capture_handoff: CaptureHandoff | None = None  # the handlers' way into `capture_store`
    telemetry: Telemetry = field(default_factory=Telemetry)
    semaphore: asyncio.Semaphore | None = None
    route: str = ""  # the default route (switchyard_model, or Switchyard's default)
    routes: frozenset[str] = frozenset()  # every route Switchyard exposes
    max_model_lens: dict[str, int] = field(default_factory=dict)  # discovered from vLLM upstreams
    injector: Injector | None = None  # when token_injection is on
    gym_tokens: GymTokenCapture | None = None  # when Gym's token_id_capture is on (its training path)
    gym_calls: GymCallLog | None = None  # when Gym's observability_enabled is on (its evaluation capture)
    closers: list[Callable[[], None]] = field(default_factory=list)  # released at shutdown
    owners: Owners = field(default_factory=lambda: Owners([], []))  # the key behind each request
    refused_ids: RefusedIds = field(default_factory=RefusedIds)  # session ids the correlation rules refused
    # Which session a call without an id continues (session_inference): per process, bounded.
    conversations: inferred.ConversationMap = field(default_factory=inferred.ConversationMap)
    # This server run's id, on every record it captures; the workers of one `serve` share it.
    server_run: str = field(default_factory=new_run_id)
    ready: bool = False
    on_ready: Callable[[AppState], None] | None = None  # called once the server can take calls
    startup_error: BaseException | None = None  # why the lifespan failed, for the CLI's exit message

    def require_upstream(self) -> Upstream:
        """`upstream`, for a model call. Model calls run only after the lifespan made it (they get a 503
        before), so this fails only in a call racing shutdown, with the same 503."""
        if self.upstream is None:
            raise OpenAIError(503, "Switchyard is not running", code="proxy_unavailable")
        return self.upstream

    def route_for(self, requested: Any) -> str:
        """The Switchyard route for a request's `model` (the configured route wins, as in Gym)."""
        aliases = self.settings.model_aliases
        if aliases and isinstance(requested, str) and requested in aliases:
            return aliases[requested]
        if self.settings.strict_models:
            if isinstance(requested, str) and requested in self.routes:
                return requested
            known = sorted(self.routes | set(aliases))
            raise OpenAIError(
                404,
                f"the model {requested!r} does not exist here; known models: {known}",
                param="model",
                code="model_not_found",
            )
        return self.route
