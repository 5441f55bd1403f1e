"""Gym's telemetry environment (`NEMO_GYM_OTEL_*`, read as nemo-lens reads it), followed when Gym starts this server.

NeMo Gym's launcher turns its `telemetry:` block into environment variables before it starts each
server: `NEMO_GYM_OTEL_ENABLED`, `_RUN_ID`, `_TRACES_ENABLED`, `_METRICS_ENABLED`, `_EXPORTER`,
`_SERVICE_NAME_PER_SERVER` (nemo-lens falls back to `NEMO_LENS_<KEY>` for each), `OTEL_SERVICE_NAME`
and `OTEL_EXPORTER_OTLP_*`. Its own servers then export over OTLP gRPC unless the protocol says
HTTP, to the SDK's default endpoint when none is set, each as `<service name>/<server name>`, with
the run id as `nemo.run.id` on their resource. This server does the same when Gym started it (the
Gym entrypoint sets `settings.gym`), so its spans land in the rollout's trace beside Gym's.

When Gym's switch is not set at all (Gym's telemetry off, or a Gym without it), nothing here
applies and the standard `OTEL_*` environment decides, as for a server started by hand.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from server.config import Settings

_PREFIX = "NEMO_GYM_OTEL"
_FALLBACK_PREFIX = "NEMO_LENS"
_TRUE = {"1", "true", "yes", "on"}

# nemo-lens's default service name, when OTEL_SERVICE_NAME is unset.
LENS_DEFAULT_SERVICE = "nemo"
# Gym's type for a model server, on the resource as its own servers put it.
GYM_SERVER_TYPE = "responses_api_models"
CONSOLE = "console"


def _read(key: str) -> str:
    """`NEMO_GYM_OTEL_<key>`, else `NEMO_LENS_<key>`, stripped ("" when neither is set)."""
    for prefix in (_PREFIX, _FALLBACK_PREFIX):
        value = os.environ.get(f"{prefix}_{key}", "").strip()
        if value:
            return value
    return ""


def _flag(key: str, default: bool) -> bool:
    value = _read(key).lower()
    return default if not value else value in _TRUE


@dataclass(frozen=True, slots=True)
class GymTelemetry:
    """What Gym's telemetry environment asks of this server process."""

    enabled: bool
    traces: bool
    metrics: bool
    exporter: str  # "otlp" or "console", as nemo-lens's `exporter`
    run_id: str
    service_name: str  # this server's own: `<group>/<server name>` unless Gym turned that off
    service_group: str  # OTEL_SERVICE_NAME as Gym set it: the whole fleet's
    server_name: str | None

    def resource_attributes(self) -> dict[str, Any]:
        """The resource Gym's own servers report (nemo-lens's run id, Gym's server identity)."""
        attrs: dict[str, Any] = {"service.name": self.service_name, "nemo.gym.service_group": self.service_group}
        attrs["nemo.gym.server.type"] = GYM_SERVER_TYPE
        if self.server_name:
            attrs["nemo.gym.server.name"] = self.server_name
        if self.run_id:
            attrs["nemo.run.id"] = self.run_id
            attrs["service.instance.id"] = f"{self.run_id}-rank0"  # each Gym server is rank 0 of its own world
        return attrs


def gym_telemetry(settings: Settings | None) -> GymTelemetry | None:
    """Gym's telemetry settings for a server Gym started (`settings.gym` set) whose environment sets
    Gym's switch (on or off); None otherwise, leaving the standard `OTEL_*` environment in charge."""
    if settings is None or settings.gym is None:
        return None
    switch = _read("ENABLED").lower()
    if not switch:
        return None
    group = os.environ.get("OTEL_SERVICE_NAME", "").strip() or LENS_DEFAULT_SERVICE
    server_name = settings.gym.get("server_name")
    server_name = server_name if isinstance(server_name, str) and server_name else None
    per_server = _flag("SERVICE_NAME_PER_SERVER", True)
    return GymTelemetry(
        enabled=switch in _TRUE,
        traces=_flag("TRACES_ENABLED", True),
        metrics=_flag("METRICS_ENABLED", True),
        exporter=_read("EXPORTER").lower() or "otlp",
        run_id=_read("RUN_ID"),
        service_name=f"{group}/{server_name}" if server_name and per_server else group,
        service_group=group,
        server_name=server_name,
    )
