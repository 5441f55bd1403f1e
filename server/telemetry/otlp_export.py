"""The OTLP/HTTP exporters the environment asks for; metric export (ours, and a Switchyard's we run) off where the endpoint takes only traces.

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
from opentelemetry.sdk.metrics.export import MetricExportResult, MetricsData
from opentelemetry.util.re import parse_env_headers

from server.telemetry.environment import env_true, exporter_names, otlp_endpoint, warn_if_not_http_protobuf

log = logging.getLogger("switchyard_model.telemetry")

# What a traces-only OTLP endpoint answers on /v1/metrics.
_NO_METRICS_HERE = (404, 405, 501)
_PROBE_TIMEOUT_S = 5.0


def span_exporter() -> OTLPSpanExporter | None:
    """The OTLP span exporter, if `OTEL_TRACES_EXPORTER` allows it and an endpoint is configured."""
    if "otlp" not in exporter_names("OTEL_TRACES_EXPORTER") or not otlp_endpoint("TRACES"):
        return None
    warn_if_not_http_protobuf("TRACES")
    return OTLPSpanExporter()


def metric_exporter() -> OTLPMetricExporter | None:
    """The OTLP metric exporter, if `OTEL_METRICS_EXPORTER` allows it and an endpoint is configured."""
    chosen = exporter_names("OTEL_METRICS_EXPORTER")
    if "none" in chosen or "otlp" not in chosen or not otlp_endpoint("METRICS"):
        return None
    warn_if_not_http_protobuf("METRICS")
    return _MetricExporterThatAsksFirst()


def metrics_url() -> str:
    """Where metrics go: the signal's own endpoint as given, else the base endpoint + /v1/metrics."""
    own = os.environ.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")
    if own:
        return own
    return (os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or "").rstrip("/") + "/v1/metrics"


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
