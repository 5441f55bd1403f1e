"""What the OTEL_* environment asks of this server: exporters, endpoints, the resource; and quieter exporter logs."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from typing import Any

from opentelemetry.sdk.resources import Resource

from server.config import Settings
from server.logs import OncePerInterval

log = logging.getLogger("switchyard_model.telemetry")

DEFAULT_SERVICE_NAME = "switchyard-model"
_TRUE = {"1", "true", "yes", "on"}

# Exporter complaints (collector down) are let through once per this many seconds per logger.
EXPORT_LOG_INTERVAL_S = 60.0
EXPORTER_LOGGERS = (
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "opentelemetry.exporter.otlp.proto.http.metric_exporter",
    "opentelemetry.exporter.otlp.proto.grpc.exporter",
    "opentelemetry.exporter.otlp.common.http",
    "opentelemetry.sdk._shared_internal",
    "opentelemetry.sdk.trace.export",
    "opentelemetry.sdk.metrics._internal.export",
)


def env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in _TRUE


def exporter_names(var: str) -> set[str]:
    return {n.strip().lower() for n in os.environ.get(var, "otlp").split(",") if n.strip()}


def otlp_endpoint(signal: str) -> str | None:
    """The OTLP endpoint for a signal, only if one is configured: we never export to a default."""
    return os.environ.get(f"OTEL_EXPORTER_OTLP_{signal}_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")


def usage_on_our_span(settings: Settings | None, *, exporting_otlp: bool, grpc: bool = False) -> bool:
    """Whether our CLIENT span carries a call's token usage: the `otel_token_usage` setting, or on
    `auto`, unless the Switchyard this server launches exports its spans into the same traces
    (it reads this same environment), where its model-call span carries the usage already.

    Not over gRPC (`grpc`: our spans go out over OTLP gRPC): Switchyard 0.3.0's exporter speaks
    OTLP/HTTP only, so its spans do not reach a gRPC collector."""
    choice = settings.otel_token_usage if settings is not None else "auto"
    if choice in ("ours", "switchyard"):
        return choice == "ours"
    launched = settings is not None and settings.launches_proxy
    return not (exporting_otlp and not grpc and launched and switchyard_exports_spans())


def switchyard_exports_spans() -> bool:
    """Whether a Switchyard reading this environment exports spans: an OTLP traces endpoint, and a
    RUST_LOG that keeps INFO (it filters Switchyard's spans as well as its log lines)."""
    if env_true("OTEL_SDK_DISABLED") or "otlp" not in exporter_names("OTEL_TRACES_EXPORTER"):
        return False
    if not otlp_endpoint("TRACES"):
        return False
    rust_log = os.environ.get("RUST_LOG", "").lower()
    return not rust_log or any(level in rust_log for level in ("info", "debug", "trace"))


GRPC = "grpc"
HTTP_PROTOBUF = "http/protobuf"


def otlp_protocol(signal: str, default: str = HTTP_PROTOBUF) -> str:
    """The OTLP protocol asked for one signal (`OTEL_EXPORTER_OTLP_<SIGNAL>_PROTOCOL`, then
    `OTEL_EXPORTER_OTLP_PROTOCOL`), else `default`: http/protobuf when started by hand, gRPC (as
    nemo-lens and the OTel SDK default) when Gym's telemetry environment is in charge."""
    protocol = os.environ.get(f"OTEL_EXPORTER_OTLP_{signal}_PROTOCOL") or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
    return (protocol or default).strip().lower()


def resource_for(service_name: str | None, gym_attributes: Mapping[str, Any] | None = None) -> Resource:
    """The `otel_service_name` setting wins, then Gym's per-server name (with Gym's run id and server
    identity: `gym_attributes`), then OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES, then ours.

    The setting exists because a hosted Switchyard reads the same process environment: there,
    OTEL_SERVICE_NAME would give both services one name."""
    resource = Resource.create({"service.version": package_version()})
    if gym_attributes:
        resource = resource.merge(Resource(dict(gym_attributes)))
    if service_name:
        resource = resource.merge(Resource({"service.name": service_name}))
    elif str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": DEFAULT_SERVICE_NAME}))
    return resource


_VERSION: str | None = None


def package_version() -> str:
    global _VERSION
    if _VERSION is None:
        try:
            from importlib.metadata import version

            _VERSION = version("switchyard-model")
        except Exception:
            _VERSION = "0"
    return _VERSION


_tame_lock = threading.Lock()


def tame_exporter_logs() -> None:
    """The OTLP exporter logs every failed export (and each retry); a dead collector would flood the
    log. Once per process, limit each exporter logger to one warning per EXPORT_LOG_INTERVAL_S."""
    with _tame_lock:
        for name in EXPORTER_LOGGERS:
            logger = logging.getLogger(name)
            if not any(isinstance(f, OncePerInterval) for f in logger.filters):
                logger.addFilter(OncePerInterval(EXPORT_LOG_INTERVAL_S))
