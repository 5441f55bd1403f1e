"""OpenTelemetry for model calls: provider setup and OTLP export, and the SERVER and CLIENT span of each call.

The attributes come from attributes.py, the metrics from metrics.py, `/metrics` from prometheus.py.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

from opentelemetry.context import Context
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanKind, Status, StatusCode, Tracer, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from server.logs import RateLimitedLog
from server.telemetry import otel_metrics
from server.telemetry.attributes import (
    OPERATION,
    PROVIDER_NAME,
    api_type,
    content_input_attributes,
    content_output_attributes,
    incoming_trace_headers,
    record_error,
    request_attributes,
    response_attributes,
    root_input_attributes,
    root_output_attributes,
    session_attributes,
    token_count_attributes,
)
from server.telemetry.environment import (
    EXPORT_LOG_INTERVAL_S,
    env_true,
    exporter_names,
    otlp_endpoint,
    package_version,
    resource_for,
    tame_exporter_logs,
    usage_on_our_span,
)
from server.telemetry.metrics import Attrs, CallMetrics
from server.telemetry.prometheus import prometheus_text
from server.telemetry.sampling import RateCappedSampler

log = logging.getLogger("switchyard_model.telemetry")

# The GenAI semantic conventions we follow, pinned: they are still "Development" and keep changing
# (the next release replaces gen_ai.client.token.usage with counters).
SEMCONV_VERSION = "1.41.1"
SCHEMA_URL = f"https://opentelemetry.io/schemas/{SEMCONV_VERSION}"
INSTRUMENTATION_NAME = "switchyard_model"

_limited = RateLimitedLog(log, EXPORT_LOG_INTERVAL_S)  # our own repeating complaints, likewise

_PROPAGATOR = TraceContextTextMapPropagator()
_clock = time.perf_counter  # call timings; tests replace it to get exact durations


class CallSpan:
    """The telemetry of one model call: a SERVER span and the CLIENT span of its upstream call.

    This base class does nothing; it is what a call gets when telemetry is off altogether.
    """

    __slots__ = ()

    def upstream_headers(self, headers: dict[str, str]) -> None:
        """Add trace-context headers (traceparent) for the upstream call."""

    def first_chunk(self) -> None:
        """The upstream's first streamed chunk arrived."""

    def finish(self, response: dict[str, Any] | None = None, error: BaseException | None = None) -> None:
        """The call ended (a chat.completion dict, or the error that ended it)."""

    def injection(self, info: dict[str, Any]) -> None:
        """The call's token-injection outcome (the record's `injection` object)."""


_NOOP_SPAN = CallSpan()


class Telemetry:
    """Spans and metrics for one app: providers are per instance, never global, so apps can coexist.

    Tracing is on only when some span exporter is configured (OTLP by `OTEL_EXPORTER_OTLP_*`, the
    console by the `otel_console` setting or `OTEL_TRACES_EXPORTER=console`, or `span_exporter` from
    a test); otherwise calls get a span-less CallSpan that only feeds the metrics. Metrics are always
    collected (for GET /metrics) unless `OTEL_SDK_DISABLED=true`.
    """

    def __init__(
        self,
        settings: Any = None,
        *,
        span_exporter: SpanExporter | None = None,
        metric_reader: MetricReader | None = None,
    ) -> None:
        self.settings = settings
        self.capture_content = bool(getattr(settings, "otel_capture_content", False)) or env_true(
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
        self._sampler = RateCappedSampler(getattr(settings, "otel_traces_per_s", 0.0) or 0.0)
        self.usage_on_our_span = True  # gen_ai.usage.* / llm.token_count.* on our CLIENT span
        base_url = getattr(settings, "switchyard_base_url", None)
        if base_url:
            self.set_upstream(base_url)
        if self.disabled:
            return
        tame_exporter_logs()
        resource = resource_for(getattr(settings, "otel_service_name", None))
        self._setup_tracing(settings, resource, span_exporter)
        self._setup_metrics(resource, metric_reader)

    # ---- setup ---------------------------------------------------------------------------------
    def _setup_tracing(self, settings: Any, resource: Resource, test_exporter: SpanExporter | None) -> None:
        chosen = exporter_names("OTEL_TRACES_EXPORTER")
        processors: list[SpanProcessor] = []
        targets = []
        if test_exporter is not None:
            # Tests want finished spans at once, not after a batch delay.
            processors.append(SimpleSpanProcessor(test_exporter))
            targets.append(type(test_exporter).__name__)
        if "none" not in chosen:
            exporter = _otlp_exporter("TRACES")
            if exporter is not None:
                processors.append(BatchSpanProcessor(exporter))
                targets.append(f"OTLP {getattr(exporter, '_endpoint', '')}".strip())
            if "console" in chosen or getattr(settings, "otel_console", False):
                from opentelemetry.sdk.trace.export import ConsoleSpanExporter

                processors.append(BatchSpanProcessor(ConsoleSpanExporter()))
                targets.append("console")
        if not processors:
            return
        self.usage_on_our_span = usage_on_our_span(settings, exporting_otlp=any(t.startswith("OTLP") for t in targets))
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
        exporter = _otlp_exporter("METRICS")
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
        request: dict,
        correlation: Any,
        stream: bool,
        scope: Mapping[str, Any],
        client_request: dict | None = None,
    ) -> CallSpan:
        """Begin the telemetry of one model call; never raises (telemetry must not fail a call).

        `request` is the chat request sent upstream; `client_request` the body as the client sent
        it (a Responses request, say), shown as the call's input when content capture is on."""
        if self.metrics is None:
            return _NOOP_SPAN
        try:
            incoming = incoming_trace_headers(scope)
            metric_attrs = self._metric_attrs(api, route)
            if self._tracer is None:
                return _MeteredCall(self, metric_attrs, incoming)
            if not self._sampler.sample(incoming):
                return _UnsampledCall(self, metric_attrs, incoming)
            return _TracedCall(
                self,
                metric_attrs,
                incoming,
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
            return _NOOP_SPAN

    def _metric_attrs(self, api: str, route: str) -> Attrs:
        key = (api, route)
        attrs = self._metric_attrs_cache.get(key)
        if attrs is None:
            attrs = (
                ("gen_ai.operation.name", OPERATION),
                ("gen_ai.provider.name", PROVIDER_NAME),
                ("gen_ai.request.model", route),
                ("openai.api.type", api_type(api)),
                *self._server_attrs.items(),
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


class _MeteredCall(CallSpan):
    """A call without spans: metrics only, and the caller's trace context passed on to Switchyard."""

    __slots__ = ("_metrics", "_attrs", "_incoming", "_started", "_ttfc", "_done")

    def __init__(self, tel: Telemetry, metric_attrs: Attrs, incoming: dict[str, str]) -> None:
        assert tel.metrics is not None, "start_call makes metered calls only when metrics are on"
        self._metrics = tel.metrics
        self._attrs = metric_attrs
        self._incoming = incoming
        self._started = _clock()
        self._ttfc: float | None = None
        self._done = False
        self._metrics.call_started(metric_attrs)

    def upstream_headers(self, headers: dict[str, str]) -> None:
        # No span of ours to parent Switchyard's: forward the caller's, so its trace still joins up.
        if self._incoming:
            headers.update(self._incoming)

    def first_chunk(self) -> None:
        if self._ttfc is None and not self._done:
            try:
                self._ttfc = _clock() - self._started
                self._metrics.first_chunk(self._attrs, self._ttfc)
                self._on_first_chunk(self._ttfc)
            except Exception:
                _limited.warning("telemetry failed on a first chunk", exc_info=True)

    def finish(self, response: dict[str, Any] | None = None, error: BaseException | None = None) -> None:
        if self._done:
            return
        self._done = True
        try:
            duration = _clock() - self._started
            response = response if isinstance(response, dict) else None
            self._metrics.call_finished(self._attrs, duration, response, error)
            self._on_finish(response, error)
        except Exception:
            _limited.warning("telemetry failed to finish a call", exc_info=True)

    def injection(self, info: dict[str, Any]) -> None:
        try:
            outcome = info.get("fallback_reason") or "injected"
            route = dict(self._attrs).get("gen_ai.request.model", "")
            if self._metrics is not None:
                self._metrics.injection_outcome(route, outcome)
            self._on_injection(outcome, info)
        except Exception:
            _limited.warning("telemetry failed to count an injection outcome", exc_info=True)

    def _on_injection(self, outcome: str, info: dict[str, Any]) -> None:
        pass

    def _on_first_chunk(self, ttfc: float) -> None:
        pass

    def _on_finish(self, response: dict[str, Any] | None, error: BaseException | None) -> None:
        pass


class _UnsampledCall(_MeteredCall):
    """A call the sampler left out: metrics only, and Switchyard is told the trace is not sampled, so
    its own (parent-based) exporter leaves the call out too instead of starting a trace of its own."""

    __slots__ = ()

    def upstream_headers(self, headers: dict[str, str]) -> None:
        if self._incoming:
            headers.update(self._incoming)
        else:
            headers["traceparent"] = f"00-{random.getrandbits(128):032x}-{random.getrandbits(64):016x}-00"


class _TracedCall(_MeteredCall):
    """A call with its SERVER span (this server handling the request: the call's envelope, a CHAIN
    to OpenInference readers) and CLIENT span (the model call to Switchyard, whose own spans become
    its children through the traceparent we inject)."""

    __slots__ = ("_server", "_client", "_capture_content", "_usage_on_client")

    def __init__(
        self,
        tel: Telemetry,
        metric_attrs: Attrs,
        incoming: dict[str, str],
        *,
        api: str,
        route: str,
        request: dict,
        correlation: Any,
        stream: bool,
        scope: Mapping[str, Any],
        client_request: Any,
    ) -> None:
        self._capture_content = tel.capture_content
        self._usage_on_client = tel.usage_on_our_span
        parent = _PROPAGATOR.extract(incoming, context=Context()) if incoming else Context()
        sessions = session_attributes(correlation, route)
        # The SERVER span carries no gen_ai.operation.name: dashboards would take it for a second model call.
        server_attrs: dict[str, Any] = {
            "openinference.span.kind": "CHAIN",
            "openai.api.type": api_type(api),
            **sessions,
        }
        method, path = (scope.get("method"), scope.get("path")) if isinstance(scope, dict) else (None, None)
        if isinstance(method, str):
            server_attrs["http.request.method"] = method
        if isinstance(path, str):
            server_attrs["url.path"] = path
        server_name = f"{method} {path}" if isinstance(method, str) and isinstance(path, str) else api_type(api)
        if self._capture_content:
            server_attrs.update(root_input_attributes(client_request))
        client_attrs = {
            "openinference.span.kind": "LLM",
            "gen_ai.operation.name": OPERATION,
            "gen_ai.provider.name": PROVIDER_NAME,
            "gen_ai.request.model": route,
            "openai.api.type": api_type(api),
            **sessions,
            **request_attributes(request, stream),
            **tel._server_attrs,
        }
        if self._capture_content:
            client_attrs.update(content_input_attributes(request))
        tracer = tel._tracer
        assert tracer is not None, "start_call makes traced calls only when tracing is on"
        self._server = tracer.start_span(server_name, context=parent, kind=SpanKind.SERVER, attributes=server_attrs)
        self._client = tracer.start_span(
            f"{OPERATION} {route}" if route else OPERATION,
            context=set_span_in_context(self._server, parent),
            kind=SpanKind.CLIENT,
            attributes=client_attrs,
        )
        # Counted in flight only once the spans exist, so a failure above leaves no stray count.
        super().__init__(tel, metric_attrs, incoming)

    def upstream_headers(self, headers: dict[str, str]) -> None:
        try:
            _PROPAGATOR.inject(headers, context=set_span_in_context(self._client, Context()))
        except Exception:
            _limited.warning("telemetry could not add trace headers", exc_info=True)

    def _on_injection(self, outcome: str, info: dict[str, Any]) -> None:
        attrs = {
            "switchyard_model.injection.outcome": outcome,
            "switchyard_model.injection.transport": info.get("transport") or "",
            "switchyard_model.injection.injected_len": int(info.get("injected_len") or 0),
        }
        if isinstance(info.get("chain"), str):
            attrs["switchyard_model.injection.chain"] = info["chain"]
        self._client.set_attributes(attrs)
        self._server.set_attributes(attrs)

    def _on_first_chunk(self, ttfc: float) -> None:
        # An event as well as the attribute: trace views draw events on the span's timeline.
        for span in (self._client, self._server):
            span.set_attribute("gen_ai.response.time_to_first_chunk", ttfc)
            span.add_event("gen_ai.first_chunk", {"gen_ai.response.time_to_first_chunk": ttfc})

    def _on_finish(self, response: dict[str, Any] | None, error: BaseException | None) -> None:
        client, server = self._client, self._server
        try:
            if client.is_recording():
                if response is not None:
                    attrs = response_attributes(response)
                    usage = {k: attrs.pop(k) for k in list(attrs) if k.startswith("gen_ai.usage.")}
                    # Usage goes on one span per call only: Phoenix and Langfuse add it up over a
                    # trace, and Switchyard's own model-call span carries it when Switchyard exports.
                    if self._usage_on_client:
                        attrs.update(usage)
                        attrs.update(token_count_attributes(usage))
                    model = attrs.get("gen_ai.response.model")
                    if model:
                        attrs["llm.model_name"] = model  # dashboards show the model that answered
                    if self._capture_content:
                        attrs.update(content_output_attributes(response))
                        server.set_attributes(root_output_attributes(response))
                    client.set_attributes(attrs)
                if error is not None:
                    record_error(client, error)
                    record_error(server, error)
                elif response is not None:
                    client.set_status(Status(StatusCode.OK))
                    server.set_status(Status(StatusCode.OK))
        finally:
            client.end()
            server.end()


def _otlp_exporter(signal: str) -> Any:
    """The OTLP exporter for TRACES or METRICS, if configured; imported only then (it costs ~0.2 s)."""
    if not otlp_endpoint(signal):
        return None
    from server.telemetry import otlp_export

    return otlp_export.span_exporter() if signal == "TRACES" else otlp_export.metric_exporter()
