"""Telemetry, the service of one app: tracer and meter providers, their exporters, and a CallSpan per model call.

The span classes are in spans.py, the metrics in metrics.py, `/metrics` in prometheus.py.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricExporter, MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Tracer

from middleware.correlation import Correlation
from server.config import Settings
from server.logs import RateLimitedLog
from server.telemetry import otel_metrics
from server.telemetry.attributes import OPERATION, PROVIDER_NAME, api_type, incoming_trace_headers
from server.telemetry.environment import (
    EXPORT_LOG_INTERVAL_S,
    GRPC,
    env_true,
    exporter_names,
    otlp_endpoint,
    package_version,
    resource_for,
    tame_exporter_logs,
    usage_on_our_span,
)
from server.telemetry.gym_otel import GymTelemetry, gym_telemetry
from server.telemetry.metrics import Attrs, CallMetrics
from server.telemetry.prometheus import prometheus_text
from server.telemetry.sampling import RateCappedSampler
from server.telemetry.spans import NOOP_SPAN, CallSpan, MeteredCall, TracedCall, UnsampledCall

log = logging.getLogger("switchyard_model.telemetry")

# The GenAI semantic conventions we follow, pinned: they are still "Development" and keep changing
# (the next release replaces gen_ai.client.token.usage with counters).
SEMCONV_VERSION = "1.41.1"
SCHEMA_URL = f"https://opentelemetry.io/schemas/{SEMCONV_VERSION}"
INSTRUMENTATION_NAME = "switchyard_model"

_limited = RateLimitedLog(log, EXPORT_LOG_INTERVAL_S)  # a call whose spans cannot start must not flood the log


class Telemetry:
    """Spans and metrics for one app: providers are per instance, never global, so apps can coexist.

    Tracing is on only when some span exporter is configured (OTLP by `OTEL_EXPORTER_OTLP_*`, the
    console by the `otel_console` setting or `OTEL_TRACES_EXPORTER=console`, or `span_exporter` from
    a test); otherwise calls get a span-less CallSpan that only feeds the metrics. Metrics are always
    collected (for GET /metrics) unless `OTEL_SDK_DISABLED=true`.
    """

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        span_exporter: SpanExporter | None = None,
        metric_reader: MetricReader | None = None,
    ) -> None:
        self.settings = settings
        self.capture_content = (settings is not None and settings.otel_capture_content) or env_true(
            "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
        )
        self.disabled = env_true("OTEL_SDK_DISABLED")
        self.enabled = False  # spans are being made
        self._tracer: Tracer | None = None
        self._tracer_provider: TracerProvider | None = None
        self._meter_provider: MeterProvider | None = None
        self.metrics: CallMetrics | None = None
        self._server_attrs: dict[str, Any] = {}
        self._metric_attrs_cache: dict[tuple[str, str], Attrs] = {}
        self._shutdown = False
        self._sampler = RateCappedSampler(settings.otel_traces_per_s if settings is not None else 0.0)
        self.usage_on_our_span = True  # gen_ai.usage.* / llm.token_count.* on our CLIENT span
        # Started by Gym with Gym's telemetry switch set: Gym's environment decides what is exported.
        self.gym = gym_telemetry(settings)
        if settings is not None and settings.switchyard_base_url:
            self.set_upstream(settings.switchyard_base_url)
        if self.disabled:
            return
        tame_exporter_logs()
        resource = resource_for(
            settings.otel_service_name if settings is not None else None,
            self.gym.resource_attributes() if self.gym is not None and self.gym.enabled else None,
        )
        self._setup_tracing(settings, resource, span_exporter)
        self._setup_metrics(resource, metric_reader)

    # ---- setup ---------------------------------------------------------------------------------
    def _setup_tracing(self, settings: Settings | None, resource: Resource, test_exporter: SpanExporter | None) -> None:
        chosen = exporter_names("OTEL_TRACES_EXPORTER")
        gym = self.gym
        if gym is not None:
            # Gym's switch (and its traces switch) off: nothing exported, as Gym's own servers.
            chosen = {gym.exporter} if gym.enabled and gym.traces else {"none"}
        processors: list[SpanProcessor] = []
        targets: list[str] = []
        exporter: SpanExporter | None = None
        if test_exporter is not None:
            # Tests want finished spans at once, not after a batch delay.
            processors.append(SimpleSpanProcessor(test_exporter))
            targets.append(type(test_exporter).__name__)
        if "none" not in chosen:
            exporter = _otlp_span_exporter(gym) if "otlp" in chosen else None
            if exporter is not None:
                processors.append(BatchSpanProcessor(exporter))
                targets.append(f"OTLP {getattr(exporter, '_endpoint', '')}".strip())
            if "console" in chosen or (settings is not None and settings.otel_console):
                from opentelemetry.sdk.trace.export import ConsoleSpanExporter

                processors.append(BatchSpanProcessor(ConsoleSpanExporter()))
                targets.append("console")
        if not processors:
            return
        self.usage_on_our_span = usage_on_our_span(
            settings,
            exporting_otlp=any(t.startswith("OTLP") for t in targets),
            grpc=exporter is not None
            and type(exporter).__module__.startswith("opentelemetry.exporter.otlp.proto.grpc"),
        )
        log.info(
            "OpenTelemetry: spans go to %s; token usage on %s spans",
            ", ".join(targets),
            "our CLIENT" if self.usage_on_our_span else "Switchyard's model-call",
        )
        # The sampler comes from OTEL_TRACES_SAMPLER(_ARG), read by the SDK.
        provider = TracerProvider(resource=resource, shutdown_on_exit=True)
        for processor in processors:
            provider.add_span_processor(processor)
        self._tracer_provider = provider
        self._tracer = provider.get_tracer(INSTRUMENTATION_NAME, package_version(), schema_url=SCHEMA_URL)
        self.enabled = True

    def _setup_metrics(self, resource: Resource, test_reader: MetricReader | None) -> None:
        self.metrics = CallMetrics()
        readers: list[MetricReader] = [] if test_reader is None else [test_reader]
        gym = self.gym
        on = gym is None or (gym.enabled and gym.metrics and gym.exporter == "otlp")
        exporter = _otlp_metric_exporter(gym) if on else None
        if exporter is not None:
            # The export interval comes from OTEL_METRIC_EXPORT_INTERVAL, read by the SDK.
            readers.append(PeriodicExportingMetricReader(exporter))
        if not readers:
            return  # /metrics only: the plain aggregator is all there is
        scope = InstrumentationScope(INSTRUMENTATION_NAME, package_version(), SCHEMA_URL)
        self._meter_provider = otel_metrics.meter_provider(
            readers, self.metrics, resource, scope, exporting=exporter is not None
        )

    # ---- wiring --------------------------------------------------------------------------------
    def set_upstream(self, base_url: str) -> None:
        """Where Switchyard listens (server.address/server.port); call once it is known."""
        try:
            parts = urlsplit(base_url)
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            return
        if parts.hostname:
            self._server_attrs = {"server.address": parts.hostname, "server.port": port}
            self._metric_attrs_cache.clear()

    def capture_stats_source(self, fn: Callable[[], Mapping[str, int]]) -> None:
        """Register the capture store's counters (`written`, `failed`, `dropped`, `queue_depth`)."""
        if self.metrics is not None:
            self.metrics.capture_stats = fn

    def refused_ids_source(self, fn: Callable[[], Mapping[str, int]]) -> None:
        """Register the correlation's refused-id counts (source -> count)."""
        if self.metrics is not None:
            self.metrics.refused_ids = fn

    # ---- calls ---------------------------------------------------------------------------------
    def start_call(
        self,
        *,
        api: str,
        route: str,
        request: dict[str, Any],
        correlation: Correlation | None,
        stream: bool,
        scope: Mapping[str, Any],
        client_request: dict[str, Any] | None = None,
    ) -> CallSpan:
        """Begin the telemetry of one model call; never raises (telemetry must not fail a call).

        `request` is the chat request sent upstream; `client_request` the body as the client sent
        it (a Responses request, say), shown as the call's input when content capture is on."""
        if self.metrics is None:
            return NOOP_SPAN
        try:
            incoming = incoming_trace_headers(scope)
            metric_attrs = self._metric_attrs(api, route)
            if self._tracer is None:
                return MeteredCall(self.metrics, metric_attrs, incoming)
            if not self._sampler.sample(incoming):
                return UnsampledCall(self.metrics, metric_attrs, incoming)
            return TracedCall(
                self.metrics,
                metric_attrs,
                incoming,
                tracer=self._tracer,
                capture_content=self.capture_content,
                usage_on_client=self.usage_on_our_span,
                upstream_attrs=self._server_attrs,
                api=api,
                route=route,
                request=request,
                correlation=correlation,
                stream=stream,
                scope=scope,
                client_request=request if client_request is None else client_request,
            )
        except Exception:
            _limited.warning("telemetry could not start a call's spans", exc_info=True)
            return NOOP_SPAN

    def _metric_attrs(self, api: str, route: str) -> Attrs:
        key = (api, route)
        attrs = self._metric_attrs_cache.get(key)
        if attrs is None:
            attrs = (
                ("gen_ai.operation.name", OPERATION),
                ("gen_ai.provider.name", PROVIDER_NAME),
                ("gen_ai.request.model", route),
                ("openai.api.type", api_type(api)),
                # The address, not the port: a hosted Switchyard's port changes with every start (a
                # new series each time) and is one that takes calls with no key (docs/operations.md).
                *((k, v) for k, v in self._server_attrs.items() if k != "server.port"),
            )
            self._metric_attrs_cache[key] = attrs
        return attrs

    # ---- /metrics --------------------------------------------------------------------------------
    def prometheus_text(self) -> str:
        """The current metrics in the Prometheus text exposition format (0.0.4)."""
        return prometheus_text(self.metrics) if self.metrics is not None else ""

    # ---- lifecycle -----------------------------------------------------------------------------
    def force_flush(self, timeout_s: float = 5.0) -> bool:
        """Push out buffered spans and metrics now (tests, and before a planned exit)."""
        ok = True
        if self._tracer_provider is not None:
            ok = self._tracer_provider.force_flush(int(timeout_s * 1000)) and ok
        if self._meter_provider is not None:
            ok = self._meter_provider.force_flush(int(timeout_s * 1000)) and ok
        return ok

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Flush and stop the exporters; idempotent. Waits at most `timeout_s` (a dead collector
        can make an OTLP export retry for its whole timeout; the app's shutdown must not)."""
        if self._shutdown:
            return
        self._shutdown = True
        tracer_provider, meter_provider = self._tracer_provider, self._meter_provider
        self._tracer = None
        if tracer_provider is None and meter_provider is None:
            return

        def stop() -> None:
            for provider in (tracer_provider, meter_provider):
                if provider is None:
                    continue
                try:
                    provider.shutdown()
                except Exception:
                    log.warning("telemetry shutdown failed", exc_info=True)

        worker = threading.Thread(target=stop, name="telemetry-shutdown", daemon=True)
        worker.start()
        worker.join(timeout_s)
        if worker.is_alive():
            log.warning("telemetry: exporters did not flush within %.1fs; unsent spans/metrics are dropped", timeout_s)


def _otlp_span_exporter(gym: GymTelemetry | None) -> SpanExporter | None:
    """The OTLP span exporter, if configured; imported only then (it costs ~0.2 s). Under Gym's
    telemetry, as nemo-lens: gRPC unless the protocol says HTTP, and the default endpoint if none."""
    if gym is None and not otlp_endpoint("TRACES"):
        return None
    from server.telemetry import otlp_export

    if gym is not None:
        return otlp_export.span_exporter(default_protocol=GRPC, need_endpoint=False)
    return otlp_export.span_exporter()


def _otlp_metric_exporter(gym: GymTelemetry | None) -> MetricExporter | None:
    """The OTLP metric exporter, if configured; imported only then, as above."""
    if gym is None and not otlp_endpoint("METRICS"):
        return None
    from server.telemetry import otlp_export

    if gym is not None:
        return otlp_export.metric_exporter(default_protocol=GRPC, need_endpoint=False)
    return otlp_export.metric_exporter()
