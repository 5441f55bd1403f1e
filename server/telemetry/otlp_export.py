"""The OTLP exporters (HTTP, or gRPC when asked) the environment asks for; metric export (ours, and a Switchyard's we run) off where the endpoint takes only traces.

The protocol is OTLP http/protobuf unless `OTEL_EXPORTER_OTLP_(<SIGNAL>_)PROTOCOL` says `grpc` (or,
under Gym's telemetry environment, unless it says HTTP: nemo-lens exports gRPC by default). The gRPC
exporter needs `opentelemetry-exporter-otlp-proto-grpc`; without it, export falls back to HTTP with
one warning.

Phoenix and Langfuse take spans only: their `/v1/metrics` answers 404 or 405, and an exporter posting
there would log an error every export interval. Before its first export, the metric exporter asks
the endpoint once with an empty (valid) request; 404, 405 or 501 turns metric export off for good,
with one INFO line. `GET /metrics` is not affected. A Switchyard this server hosts or launches is
asked about the same way before it starts, and told to export no metrics there.
"""

from __future__ import annotations

import logging
import os
import ssl
from typing import Any

import httpx
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData
from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.util.re import parse_env_headers

from server.telemetry.environment import GRPC, HTTP_PROTOBUF, env_true, exporter_names, otlp_endpoint, otlp_protocol

log = logging.getLogger("switchyard_model.telemetry")

# What a traces-only OTLP endpoint answers on /v1/metrics.
_NO_METRICS_HERE = (404, 405, 501)
_PROBE_TIMEOUT_S = 5.0


def span_exporter(*, default_protocol: str = HTTP_PROTOBUF, need_endpoint: bool = True) -> SpanExporter | None:
    """The OTLP span exporter, if `OTEL_TRACES_EXPORTER` allows it and an endpoint is configured
    (`need_endpoint=False`: or not, the exporter's own default then, as nemo-lens under Gym)."""
    if "otlp" not in exporter_names("OTEL_TRACES_EXPORTER") or (need_endpoint and not otlp_endpoint("TRACES")):
        return None
    if _grpc_chosen("TRACES", default_protocol):
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
        except ImportError:
            _no_grpc("traces")
        else:
            grpc_spans: SpanExporter = GrpcSpanExporter()
            return grpc_spans
    return OTLPSpanExporter()


def metric_exporter(*, default_protocol: str = HTTP_PROTOBUF, need_endpoint: bool = True) -> MetricExporter | None:
    """The OTLP metric exporter, if `OTEL_METRICS_EXPORTER` allows it and an endpoint is configured
    (`need_endpoint` as for spans)."""
    chosen = exporter_names("OTEL_METRICS_EXPORTER")
    if "none" in chosen or "otlp" not in chosen or (need_endpoint and not otlp_endpoint("METRICS")):
        return None
    if _grpc_chosen("METRICS", default_protocol):
        try:
            from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
                OTLPMetricExporter as GrpcMetricExporter,
            )
        except ImportError:
            _no_grpc("metrics")
        else:
            # No probe for a traces-only endpoint: the backends that take only traces take HTTP.
            grpc_metrics: MetricExporter = GrpcMetricExporter()
            return grpc_metrics
    return _MetricExporterThatAsksFirst()


def _grpc_chosen(signal: str, default_protocol: str) -> bool:
    """Whether the signal goes over gRPC; any protocol but gRPC and http/protobuf is warned about
    and exported as http/protobuf (http/json too, as nemo-lens does)."""
    protocol = otlp_protocol(signal, default_protocol)
    if protocol == GRPC:
        return True
    if protocol != HTTP_PROTOBUF:
        log.warning("OTLP protocol %r is not supported; exporting %s as OTLP http/protobuf", protocol, signal.lower())
    return False


def _no_grpc(signal: str) -> None:
    log.warning(
        "OTLP gRPC was asked for, but opentelemetry-exporter-otlp-proto-grpc is not installed; "
        "exporting %s as OTLP http/protobuf",
        signal,
    )


def metrics_url() -> str:
    """Where metrics go: the signal's own endpoint as given, else the base endpoint + /v1/metrics."""
    own = os.environ.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")
    if own:
        return own
    # Unset (possible only under Gym's telemetry, which exports to the SDK's default): the SDK's default.
    return (os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or "http://localhost:4318").rstrip("/") + "/v1/metrics"


def takes_metrics(url: str) -> bool | None:
    """Whether the OTLP endpoint accepts metrics: False on 404/405/501, None if it cannot be reached."""
    raw = os.environ.get("OTEL_EXPORTER_OTLP_METRICS_HEADERS") or os.environ.get("OTEL_EXPORTER_OTLP_HEADERS", "")
    headers = {"Content-Type": "application/x-protobuf", **parse_env_headers(raw, liberal=True)}
    ca_file = os.environ.get("OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE") or os.environ.get(
        "OTEL_EXPORTER_OTLP_CERTIFICATE"
    )
    try:
        reply = httpx.post(
            url,
            content=b"",
            headers=headers,
            timeout=_PROBE_TIMEOUT_S,
            verify=ssl.create_default_context(cafile=ca_file) if ca_file else True,
        )
    except (httpx.HTTPError, OSError, ValueError):  # unreachable, or a bad certificate file
        return None
    return reply.status_code not in _NO_METRICS_HERE


def switchyard_environment() -> dict[str, str]:
    """What to add to the environment of a Switchyard this server runs: `OTEL_METRICS_EXPORTER=none`
    where the OTLP endpoint takes no metrics (asked here, once, before Switchyard starts).

    Switchyard 0.3.0 exports metrics to the same OTLP endpoint as its spans, and against a
    traces-only one logs "failed to flush OpenTelemetry metrics" every export interval; it honours
    `OTEL_METRICS_EXPORTER=none` (spans still go). Blocking (at most the probe's timeout): call
    from a thread. Nothing is added when the environment already chooses, or exports nothing.
    """
    if env_true("OTEL_SDK_DISABLED") or os.environ.get("OTEL_METRICS_EXPORTER") or not otlp_endpoint("METRICS"):
        return {}
    url = metrics_url()
    if takes_metrics(url) is not False:  # it does, or cannot be reached now: Switchyard keeps its default
        return {}
    log.info("OpenTelemetry: %s takes no metrics (a traces-only endpoint): Switchyard's metric export is off", url)
    return {"OTEL_METRICS_EXPORTER": "none"}


class _MetricExporterThatAsksFirst(OTLPMetricExporter):
    """The OTLP metric exporter, asking the endpoint (on the reader's thread, never a call's) whether
    it takes metrics before the first export, and doing nothing from then on if it does not."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._takes_metrics: bool | None = None

    def export(
        self, metrics_data: MetricsData, timeout_millis: float | None = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        if self._takes_metrics is None:
            url = metrics_url()
            self._takes_metrics = takes_metrics(url)  # unreachable: ask again next time
            if self._takes_metrics is False:
                log.info(
                    "OpenTelemetry: %s takes no metrics (a traces-only endpoint): OTLP metric export is off; "
                    "GET /metrics still serves them",
                    url,
                )
        if self._takes_metrics is False:
            return MetricExportResult.SUCCESS
        result = super().export(metrics_data, timeout_millis, **kwargs)
        if result is MetricExportResult.SUCCESS:
            self._takes_metrics = True  # it took them: no need to ask again
        return result
