"""OpenTelemetry for model calls: a SERVER and a CLIENT span per call, GenAI metrics, OTLP export and /metrics."""

from __future__ import annotations

import asyncio
import logging
import math
import os
import re
import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

import orjson
from opentelemetry.context import Context
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter, MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from server.errors import OpenAIError

log = logging.getLogger("switchyard_model.telemetry")

# The GenAI semantic conventions we follow, pinned: they are still "Development" and keep changing
# (the next release replaces gen_ai.client.token.usage with counters).
SEMCONV_VERSION = "1.41.1"
SCHEMA_URL = f"https://opentelemetry.io/schemas/{SEMCONV_VERSION}"
INSTRUMENTATION_NAME = "switchyard_model"
DEFAULT_SERVICE_NAME = "switchyard-model"
# We call Switchyard, which picks the real backend per route; the backend shows as gen_ai.response.model.
PROVIDER_NAME = "switchyard"
OPERATION = "chat"

# Advisory bucket boundaries from the conventions' metric definitions.
DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)
TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864)

DURATION_METRIC = "gen_ai.client.operation.duration"
TOKEN_METRIC = "gen_ai.client.token.usage"
TTFC_METRIC = "gen_ai.client.operation.time_to_first_chunk"
ACTIVE_METRIC = "switchyard_model.calls.active"
CAPTURE_RECORDS_METRIC = "switchyard_model.capture.records"
CAPTURE_QUEUE_METRIC = "switchyard_model.capture.queue.depth"

PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Exporter complaints (collector down) are let through once per this many seconds per logger.
EXPORT_LOG_INTERVAL_S = 60.0
_EXPORTER_LOGGERS = (
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "opentelemetry.exporter.otlp.proto.http.metric_exporter",
    "opentelemetry.exporter.otlp.common.http",
    "opentelemetry.sdk._shared_internal",
    "opentelemetry.sdk.trace.export",
    "opentelemetry.sdk.metrics._internal.export",
)

_PROPAGATOR = TraceContextTextMapPropagator()
_TRACEPARENT = re.compile(r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")
_TRUE = {"1", "true", "yes", "on"}
Attrs = tuple[tuple[str, Any], ...]  # metric attributes, hashable and in a fixed order
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
        self.capture_content = bool(getattr(settings, "otel_capture_content", False)) or _env_true(
            "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
        )
        self.disabled = _env_true("OTEL_SDK_DISABLED")
        self.enabled = False  # spans are being made
        self._tracer = None
        self._tracer_provider: TracerProvider | None = None
        self._meter_provider: MeterProvider | None = None
        self.metrics: CallMetrics | None = None
        self._server_attrs: dict[str, Any] = {}
        self._metric_attrs_cache: dict[tuple[str, str], Attrs] = {}
        self._shutdown = False
        base_url = getattr(settings, "switchyard_base_url", None)
        if base_url:
            self.set_upstream(base_url)
        if self.disabled:
            return
        _tame_exporter_logs()
        resource = _resource(getattr(settings, "otel_service_name", None))
        self._setup_tracing(settings, resource, span_exporter)
        self._setup_metrics(resource, metric_reader)

    # ---- setup ---------------------------------------------------------------------------------
    def _setup_tracing(self, settings: Any, resource: Resource, test_exporter: SpanExporter | None) -> None:
        chosen = _exporter_names("OTEL_TRACES_EXPORTER")
        processors = []
        targets = []
        if test_exporter is not None:
            # Tests want finished spans at once, not after a batch delay.
            processors.append(SimpleSpanProcessor(test_exporter))
            targets.append(type(test_exporter).__name__)
        if "none" not in chosen:
            if "otlp" in chosen and _otlp_endpoint("TRACES"):
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

                _warn_if_not_http_protobuf("TRACES")
                exporter = OTLPSpanExporter()
                processors.append(BatchSpanProcessor(exporter))
                targets.append(f"OTLP {getattr(exporter, '_endpoint', '')}".strip())
            if "console" in chosen or getattr(settings, "otel_console", False):
                from opentelemetry.sdk.trace.export import ConsoleSpanExporter

                processors.append(BatchSpanProcessor(ConsoleSpanExporter()))
                targets.append("console")
        if not processors:
            return
        log.info("OpenTelemetry: spans go to %s", ", ".join(targets))
        # The sampler comes from OTEL_TRACES_SAMPLER(_ARG), read by the SDK.
        provider = TracerProvider(resource=resource, shutdown_on_exit=True)
        for processor in processors:
            provider.add_span_processor(processor)
        self._tracer_provider = provider
        self._tracer = provider.get_tracer(INSTRUMENTATION_NAME, _package_version(), schema_url=SCHEMA_URL)
        self.enabled = True

    def _setup_metrics(self, resource: Resource, test_reader: MetricReader | None) -> None:
        self.metrics = CallMetrics()
        readers: list[MetricReader] = [] if test_reader is None else [test_reader]
        exporting = False
        chosen = _exporter_names("OTEL_METRICS_EXPORTER")
        if "none" not in chosen and "otlp" in chosen and _otlp_endpoint("METRICS"):
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

            _warn_if_not_http_protobuf("METRICS")
            # The export interval comes from OTEL_METRIC_EXPORT_INTERVAL, read by the SDK.
            readers.append(PeriodicExportingMetricReader(OTLPMetricExporter()))
            exporting = True
        if not readers:
            return  # /metrics only: the plain aggregator is all there is
        views = [
            View(instrument_name=name, aggregation=ExplicitBucketHistogramAggregation(bounds))
            for name, bounds in (
                (DURATION_METRIC, DURATION_BUCKETS),
                (TTFC_METRIC, DURATION_BUCKETS),
                (TOKEN_METRIC, TOKEN_BUCKETS),
            )
        ]
        provider = MeterProvider(
            metric_readers=readers,
            resource=resource,
            views=views,
            exemplar_filter=AlwaysOffExemplarFilter(),
            shutdown_on_exit=exporting,
        )
        self._meter_provider = provider
        self.metrics.mirror_to(provider.get_meter(INSTRUMENTATION_NAME, _package_version(), schema_url=SCHEMA_URL))

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

    # ---- calls ---------------------------------------------------------------------------------
    def start_call(
        self, *, api: str, route: str, request: dict, correlation: Any, stream: bool, scope: dict
    ) -> CallSpan:
        """Begin the telemetry of one model call; never raises (telemetry must not fail a call)."""
        if self.metrics is None:
            return _NOOP_SPAN
        try:
            incoming = _incoming_trace_headers(scope)
            metric_attrs = self._metric_attrs(api, route)
            if self._tracer is None:
                return _MeteredCall(self, metric_attrs, incoming)
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
            )
        except Exception:
            _throttled_warning("start", "telemetry could not start a call's spans", exc_info=True)
            return _NOOP_SPAN

    def _metric_attrs(self, api: str, route: str) -> Attrs:
        key = (api, route)
        attrs = self._metric_attrs_cache.get(key)
        if attrs is None:
            attrs = (
                ("gen_ai.operation.name", OPERATION),
                ("gen_ai.provider.name", PROVIDER_NAME),
                ("gen_ai.request.model", route),
                ("openai.api.type", _api_type(api)),
                *self._server_attrs.items(),
            )
            self._metric_attrs_cache[key] = attrs
        return attrs

    # ---- /metrics --------------------------------------------------------------------------------
    def prometheus_text(self) -> str:
        """The current metrics in the Prometheus text exposition format (0.0.4)."""
        return self.metrics.prometheus_text() if self.metrics is not None else ""

    def metrics_route(self) -> Route:
        """`GET /metrics` for Prometheus scrapers."""

        async def metrics(request: Request) -> Response:
            return Response(self.prometheus_text(), media_type=PROMETHEUS_CONTENT_TYPE)

        return Route("/metrics", metrics, methods=["GET"])

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
                _throttled_warning("first-chunk", "telemetry failed on a first chunk", exc_info=True)

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
            _throttled_warning("finish", "telemetry failed to finish a call", exc_info=True)

    def _on_first_chunk(self, ttfc: float) -> None:
        pass

    def _on_finish(self, response: dict[str, Any] | None, error: BaseException | None) -> None:
        pass


class _TracedCall(_MeteredCall):
    """A call with its SERVER span (this server handling the request) and CLIENT span (the call to
    Switchyard, whose own spans become its children through the traceparent we inject)."""

    __slots__ = ("_server", "_client", "_capture_content")

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
        scope: dict,
    ) -> None:
        self._capture_content = tel.capture_content
        parent = _PROPAGATOR.extract(incoming, context=Context()) if incoming else Context()
        name = f"{OPERATION} {route}" if route else OPERATION
        common = {
            "gen_ai.operation.name": OPERATION,
            "gen_ai.provider.name": PROVIDER_NAME,
            "gen_ai.request.model": route,
            "openai.api.type": _api_type(api),
            **_session_attributes(correlation, route),
            **_request_attributes(request, stream),
        }
        server_attrs = dict(common)
        method, path = (scope.get("method"), scope.get("path")) if isinstance(scope, dict) else (None, None)
        if isinstance(method, str):
            server_attrs["http.request.method"] = method
        if isinstance(path, str):
            server_attrs["url.path"] = path
        client_attrs = {**common, **tel._server_attrs}
        if self._capture_content:
            client_attrs.update(_content_input_attributes(request))
        tracer = tel._tracer
        self._server = tracer.start_span(name, context=parent, kind=SpanKind.SERVER, attributes=server_attrs)
        self._client = tracer.start_span(
            name, context=set_span_in_context(self._server, parent), kind=SpanKind.CLIENT, attributes=client_attrs
        )
        # Counted in flight only once the spans exist, so a failure above leaves no stray count.
        super().__init__(tel, metric_attrs, incoming)

    def upstream_headers(self, headers: dict[str, str]) -> None:
        try:
            _PROPAGATOR.inject(headers, context=set_span_in_context(self._client, Context()))
        except Exception:
            _throttled_warning("inject", "telemetry could not add trace headers", exc_info=True)

    def _on_first_chunk(self, ttfc: float) -> None:
        for span in (self._client, self._server):
            span.set_attribute("gen_ai.response.time_to_first_chunk", ttfc)

    def _on_finish(self, response: dict[str, Any] | None, error: BaseException | None) -> None:
        client, server = self._client, self._server
        try:
            if client.is_recording():
                if response is not None:
                    attrs = _response_attributes(response)
                    # Token usage goes on the CLIENT span only: backends that sum usage over a
                    # trace (Langfuse, Phoenix) would count it twice otherwise.
                    server.set_attributes({k: v for k, v in attrs.items() if not k.startswith("gen_ai.usage.")})
                    if self._capture_content:
                        attrs.update(_content_output_attributes(response))
                    client.set_attributes(attrs)
                if error is not None:
                    _record_error(client, error)
                    _record_error(server, error)
        finally:
            client.end()
            server.end()


# ---- attribute builders ---------------------------------------------------------------------------
def _api_type(api: str) -> str:
    return "responses" if api == "responses" else "chat_completions"


def error_type(error: BaseException) -> str:
    """A low-cardinality `error.type`: the HTTP status of an OpenAIError, `cancelled` for a gone
    client, else the exception's qualified class name."""
    if isinstance(error, OpenAIError):
        return str(error.status)
    if isinstance(error, asyncio.CancelledError):
        return "cancelled"
    cls = type(error)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def _record_error(span: Any, error: BaseException) -> None:
    span.set_attribute("error.type", error_type(error))
    if isinstance(error, OpenAIError):
        if error.code:
            span.set_attribute("switchyard_model.error.code", error.code)
        description = error.message
    elif isinstance(error, asyncio.CancelledError):
        description = "cancelled: the client went away or the server is shutting down"
    else:
        span.record_exception(error)
        description = f"{type(error).__name__}: {error}"
    span.set_status(Status(StatusCode.ERROR, description[:500]))


def _session_attributes(correlation: Any, route: str) -> dict[str, Any]:
    attrs: dict[str, Any] = {"switchyard_model.route": route}
    if correlation is None:
        return attrs
    session_id = getattr(correlation, "session_id", None)
    if session_id:
        attrs["gen_ai.conversation.id"] = session_id
        attrs["session.id"] = session_id
    for field, key in (
        ("parent_session_id", "switchyard_model.parent_session.id"),
        ("rollout_id", "switchyard_model.rollout.id"),
        ("source", "switchyard_model.session.source"),
        ("request_id", "switchyard_model.request.id"),
    ):
        value = getattr(correlation, field, None)
        if value:
            attrs[key] = value
    return attrs


_FLOAT_PARAMS = (
    ("temperature", "gen_ai.request.temperature"),
    ("top_p", "gen_ai.request.top_p"),
    ("frequency_penalty", "gen_ai.request.frequency_penalty"),
    ("presence_penalty", "gen_ai.request.presence_penalty"),
)
_INT_PARAMS = (("top_k", "gen_ai.request.top_k"), ("seed", "gen_ai.request.seed"))


def _request_attributes(request: dict, stream: bool) -> dict[str, Any]:
    attrs: dict[str, Any] = {}
    if stream:
        attrs["gen_ai.request.stream"] = True
    if not isinstance(request, dict):
        return attrs
    for key, attr in _FLOAT_PARAMS:
        value = request.get(key)
        if _is_number(value):
            attrs[attr] = float(value)
    for key, attr in _INT_PARAMS:
        value = request.get(key)
        if _is_int(value):
            attrs[attr] = value
    max_tokens = request.get("max_completion_tokens", request.get("max_tokens"))
    if _is_int(max_tokens):
        attrs["gen_ai.request.max_tokens"] = max_tokens
    choices = request.get("n")
    if _is_int(choices) and choices != 1:
        attrs["gen_ai.request.choice.count"] = choices
    stop = request.get("stop")
    if isinstance(stop, str):
        attrs["gen_ai.request.stop_sequences"] = (stop,)
    elif isinstance(stop, list) and stop and all(isinstance(s, str) for s in stop):
        attrs["gen_ai.request.stop_sequences"] = tuple(stop)
    fmt = request.get("response_format")
    if isinstance(fmt, dict) and isinstance(fmt.get("type"), str):
        attrs["gen_ai.output.type"] = "json" if fmt["type"] in ("json_object", "json_schema") else fmt["type"]
    tier = request.get("service_tier")
    if isinstance(tier, str):
        attrs["openai.request.service_tier"] = tier
    return attrs


def _response_attributes(response: dict[str, Any]) -> dict[str, Any]:
    attrs: dict[str, Any] = {}
    for key, attr in (
        ("id", "gen_ai.response.id"),
        ("model", "gen_ai.response.model"),
        ("system_fingerprint", "openai.response.system_fingerprint"),
        ("service_tier", "openai.response.service_tier"),
    ):
        value = response.get(key)
        if isinstance(value, str) and value:
            attrs[attr] = value
    choices = response.get("choices")
    if isinstance(choices, list):
        reasons = tuple(
            c["finish_reason"] for c in choices if isinstance(c, dict) and isinstance(c.get("finish_reason"), str)
        )
        if reasons:
            attrs["gen_ai.response.finish_reasons"] = reasons
    usage = response.get("usage")
    if isinstance(usage, dict):
        # Chat Completions names first, then the Responses API's (a passthrough reply).
        for paths, attr in (
            ((("prompt_tokens",), ("input_tokens",)), "gen_ai.usage.input_tokens"),
            ((("completion_tokens",), ("output_tokens",)), "gen_ai.usage.output_tokens"),
            (
                (("prompt_tokens_details", "cached_tokens"), ("input_tokens_details", "cached_tokens")),
                "gen_ai.usage.cache_read.input_tokens",
            ),
            (
                (("completion_tokens_details", "reasoning_tokens"), ("output_tokens_details", "reasoning_tokens")),
                "gen_ai.usage.reasoning.output_tokens",
            ),
        ):
            for path in paths:
                value: Any = usage
                for key in path:
                    value = value.get(key) if isinstance(value, dict) else None
                if _is_int(value):
                    attrs[attr] = value
                    break
    return attrs


# ---- opt-in content (gen_ai.input.messages / gen_ai.output.messages, as JSON strings) ----------------
def _content_input_attributes(request: dict) -> dict[str, str]:
    attrs = {}
    messages = request.get("messages") if isinstance(request, dict) else None
    if isinstance(messages, list):
        attrs["gen_ai.input.messages"] = _json([_message_parts(m) for m in messages if isinstance(m, dict)])
    tools = request.get("tools") if isinstance(request, dict) else None
    if isinstance(tools, list) and tools:
        attrs["gen_ai.tool.definitions"] = _json(tools)
    return attrs


def _content_output_attributes(response: dict[str, Any]) -> dict[str, str]:
    out = []
    for choice in response.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        message = _message_parts(choice.get("message") if isinstance(choice.get("message"), dict) else {})
        message["role"] = "assistant"
        if isinstance(choice.get("finish_reason"), str):
            message["finish_reason"] = choice["finish_reason"]
        out.append(message)
    return {"gen_ai.output.messages": _json(out)}


def _message_parts(message: dict[str, Any]) -> dict[str, Any]:
    """A chat message in the conventions' role/parts shape."""
    role = message.get("role") if isinstance(message.get("role"), str) else "user"
    parts: list[dict[str, Any]] = []
    content = message.get("content")
    if role == "tool":
        parts.append({"type": "tool_call_response", "id": message.get("tool_call_id"), "response": content})
    elif isinstance(content, str):
        if content:
            parts.append({"type": "text", "content": content})
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append({"type": "text", "content": part["text"]})
            elif isinstance(part, dict):
                parts.append({"type": str(part.get("type", "unknown"))})
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if isinstance(reasoning, str) and reasoning:
        parts.insert(0, {"type": "reasoning", "content": reasoning})
    for call in message.get("tool_calls") or ():
        if isinstance(call, dict):
            fn = call.get("function") if isinstance(call.get("function"), dict) else {}
            parts.append(
                {"type": "tool_call", "id": call.get("id"), "name": fn.get("name"), "arguments": fn.get("arguments")}
            )
    return {"role": role, "parts": parts}


def _json(value: Any) -> str:
    return orjson.dumps(value, default=str).decode()


# ---- helpers -------------------------------------------------------------------------------------
def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _incoming_trace_headers(scope: dict) -> dict[str, str]:
    """The request's W3C trace context (traceparent, tracestate), if well-formed."""
    headers = scope.get("headers") if isinstance(scope, dict) else None
    if not headers:
        return {}
    traceparent = None
    states = []
    for name, value in headers:
        lowered = name.lower()
        if lowered == b"traceparent" and traceparent is None:
            traceparent = value.decode("latin-1").strip().lower()
        elif lowered == b"tracestate":
            states.append(value.decode("latin-1").strip())
    if traceparent is None or not _TRACEPARENT.match(traceparent):
        return {}
    out = {"traceparent": traceparent}
    state = ",".join(s for s in states if s)
    if state and len(state) <= 512 and state.isprintable():
        out["tracestate"] = state
    return out


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in _TRUE


def _exporter_names(var: str) -> set[str]:
    return {n.strip().lower() for n in os.environ.get(var, "otlp").split(",") if n.strip()}


def _otlp_endpoint(signal: str) -> str | None:
    """The OTLP endpoint for a signal, only if one is configured: we never export to a default."""
    return os.environ.get(f"OTEL_EXPORTER_OTLP_{signal}_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")


def _warn_if_not_http_protobuf(signal: str) -> None:
    protocol = os.environ.get(f"OTEL_EXPORTER_OTLP_{signal}_PROTOCOL") or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
    if protocol and protocol.strip() != "http/protobuf":
        log.warning(
            "OTEL_EXPORTER_OTLP_PROTOCOL=%s is not supported; exporting %s as OTLP http/protobuf",
            protocol,
            signal.lower(),
        )


def _resource(service_name: str | None) -> Resource:
    """The `otel_service_name` setting wins, then OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES, then ours.

    The setting exists because a hosted Switchyard reads the same process environment: there,
    OTEL_SERVICE_NAME would give both services one name."""
    resource = Resource.create({"service.version": _package_version()})
    if service_name:
        resource = resource.merge(Resource({"service.name": service_name}))
    elif str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": DEFAULT_SERVICE_NAME}))
    return resource


_VERSION: str | None = None


def _package_version() -> str:
    global _VERSION
    if _VERSION is None:
        try:
            from importlib.metadata import version

            _VERSION = version("switchyard-model")
        except Exception:
            _VERSION = "0"
    return _VERSION


class _OncePerInterval(logging.Filter):
    """Lets a logger's warnings through once per interval; says how many it held back meanwhile."""

    def __init__(self, interval_s: float) -> None:
        super().__init__()
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._last: float | None = None
        self._held = 0

    def reset(self) -> None:
        with self._lock:
            self._last, self._held = None, 0

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        now = time.monotonic()
        with self._lock:
            if self._last is not None and now - self._last < self.interval_s:
                self._held += 1
                return False
            self._last = now
            held, self._held = self._held, 0
        if held:
            record.msg = f"{record.msg} [{held} similar telemetry export messages suppressed]"
        return True


_tame_lock = threading.Lock()


def _tame_exporter_logs() -> None:
    """The OTLP exporter logs every failed export (and each retry); a dead collector would flood the
    log. Once per process, limit each exporter logger to one warning per EXPORT_LOG_INTERVAL_S."""
    with _tame_lock:
        for name in _EXPORTER_LOGGERS:
            logger = logging.getLogger(name)
            if not any(isinstance(f, _OncePerInterval) for f in logger.filters):
                logger.addFilter(_OncePerInterval(EXPORT_LOG_INTERVAL_S))


_own_warnings: dict[str, float] = {}


def _throttled_warning(key: str, message: str, *, exc_info: bool = False) -> None:
    now = time.monotonic()
    last = _own_warnings.get(key)
    if last is not None and now - last < EXPORT_LOG_INTERVAL_S:
        return
    _own_warnings[key] = now
    log.warning(message, exc_info=exc_info)


# ---- call metrics and their Prometheus text -------------------------------------------------------
_DESCRIPTIONS = {
    DURATION_METRIC: "Duration of model calls through Switchyard",
    TTFC_METRIC: "Time from the start of a streamed call to its first chunk",
    TOKEN_METRIC: "Input and output tokens per model call",
    ACTIVE_METRIC: "Model calls in flight",
    CAPTURE_RECORDS_METRIC: "Capture records by outcome: written, failed (write error), dropped (queue full)",
    CAPTURE_QUEUE_METRIC: "Capture records waiting to be written",
}
_CAPTURE_OUTCOMES = ("written", "failed", "dropped")


class _Histogram:
    """Explicit-bucket histogram series keyed by attribute tuples; a bound is inclusive, as in OTel."""

    __slots__ = ("bounds", "series")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.series: dict[Attrs, list] = {}  # attrs -> [bucket counts, sum, count]

    def record(self, value: float, attrs: Attrs) -> None:
        entry = self.series.get(attrs)
        if entry is None:
            entry = self.series[attrs] = [[0] * (len(self.bounds) + 1), 0, 0]
        entry[0][bisect_left(self.bounds, value)] += 1
        entry[1] += value
        entry[2] += 1


class CallMetrics:
    """The call metrics, kept in plain Python: recording costs a few microseconds (the OTel SDK's
    measurement path costs tens per measurement). They are what GET /metrics shows; when an OTLP or
    test metric reader is configured, each measurement is also recorded into SDK instruments of
    the same names, for export."""

    def __init__(self) -> None:
        self.duration = _Histogram(DURATION_BUCKETS)
        self.ttfc = _Histogram(DURATION_BUCKETS)
        self.tokens = _Histogram(TOKEN_BUCKETS)
        self.active: dict[Attrs, int] = {}
        self.capture_stats: Callable[[], Mapping[str, int]] | None = None
        self._sdk: tuple[Any, Any, Any] | None = None  # duration, ttfc, tokens SDK histograms

    def mirror_to(self, meter: Any) -> None:
        self._sdk = tuple(
            meter.create_histogram(name, unit=unit, description=_DESCRIPTIONS[name])
            for name, unit in ((DURATION_METRIC, "s"), (TTFC_METRIC, "s"), (TOKEN_METRIC, "{token}"))
        )
        meter.create_observable_up_down_counter(
            ACTIVE_METRIC, callbacks=[self._observe_active], unit="{call}", description=_DESCRIPTIONS[ACTIVE_METRIC]
        )
        meter.create_observable_counter(
            CAPTURE_RECORDS_METRIC,
            callbacks=[self._observe_capture_records],
            unit="{record}",
            description=_DESCRIPTIONS[CAPTURE_RECORDS_METRIC],
        )
        meter.create_observable_gauge(
            CAPTURE_QUEUE_METRIC,
            callbacks=[self._observe_capture_queue],
            unit="{record}",
            description=_DESCRIPTIONS[CAPTURE_QUEUE_METRIC],
        )

    # ---- recording (event-loop thread) --------------------------------------------------------
    def call_started(self, attrs: Attrs) -> None:
        self.active[attrs] = self.active.get(attrs, 0) + 1

    def first_chunk(self, attrs: Attrs, seconds: float) -> None:
        self.ttfc.record(seconds, attrs)
        if self._sdk is not None:
            self._sdk[1].record(seconds, dict(attrs))

    def call_finished(
        self, attrs: Attrs, seconds: float, response: dict[str, Any] | None, error: BaseException | None
    ) -> None:
        self.active[attrs] = self.active.get(attrs, 0) - 1
        model = response.get("model") if response else None
        if isinstance(model, str):
            attrs += (("gen_ai.response.model", model),)
        if error is not None:
            attrs += (("error.type", error_type(error)),)
        self.duration.record(seconds, attrs)
        sdk = self._sdk
        if sdk is not None:
            sdk[0].record(seconds, dict(attrs))
        usage = response.get("usage") if response else None
        if not isinstance(usage, dict):
            return
        for chat_key, responses_key, token_type in (
            ("prompt_tokens", "input_tokens", "input"),
            ("completion_tokens", "output_tokens", "output"),
        ):
            count = usage.get(chat_key, usage.get(responses_key))
            if _is_int(count) and count >= 0:
                token_attrs = attrs + (("gen_ai.token.type", token_type),)
                self.tokens.record(count, token_attrs)
                if sdk is not None:
                    sdk[2].record(count, dict(token_attrs))

    # ---- reading --------------------------------------------------------------------------------
    def read_capture_stats(self) -> Mapping[str, int] | None:
        if self.capture_stats is None:
            return None
        try:
            return self.capture_stats()
        except Exception:
            _throttled_warning("capture-stats", "reading the capture store's counters failed", exc_info=True)
            return None

    # The SDK calls these from its export thread: copy the dict before walking it.
    def _observe_active(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(count, dict(attrs)) for attrs, count in list(self.active.items())]

    def _observe_capture_records(self, options: CallbackOptions) -> Iterable[Observation]:
        stats = self.read_capture_stats()
        return [Observation(int(stats.get(o, 0)), {"outcome": o}) for o in _CAPTURE_OUTCOMES] if stats else []

    def _observe_capture_queue(self, options: CallbackOptions) -> Iterable[Observation]:
        stats = self.read_capture_stats()
        return [Observation(int(stats.get("queue_depth", 0)))] if stats else []

    def prometheus_text(self) -> str:
        """Everything in the Prometheus text exposition format (0.0.4)."""
        out: list[str] = []
        _value_family(out, ACTIVE_METRIC, "{call}", "gauge", list(self.active.items()))
        for name, unit, histogram in (
            (DURATION_METRIC, "s", self.duration),
            (TTFC_METRIC, "s", self.ttfc),
            (TOKEN_METRIC, "{token}", self.tokens),
        ):
            _histogram_family(out, name, unit, histogram)
        stats = self.read_capture_stats()
        if stats:
            _value_family(
                out,
                CAPTURE_RECORDS_METRIC,
                "{record}",
                "counter",
                [((("outcome", o),), int(stats.get(o, 0))) for o in _CAPTURE_OUTCOMES],
            )
            _value_family(out, CAPTURE_QUEUE_METRIC, "{record}", "gauge", [((), int(stats.get("queue_depth", 0)))])
        return "\n".join(out) + "\n" if out else ""


_UNIT_SUFFIXES = {"s": "seconds", "ms": "milliseconds", "By": "bytes", "1": ""}


def prometheus_name(name: str, unit: str, counter: bool = False) -> str:
    """The OTel → Prometheus name mapping: dots become underscores, the unit is a suffix (annotation
    units such as `{token}` are dropped), counters end in `_total`."""
    base = _sanitize(name)
    suffix = _UNIT_SUFFIXES.get(unit)
    if suffix is None:
        suffix = _sanitize(re.sub(r"\{[^}]*\}", "", unit or "")).strip("_")
    if suffix and not base.endswith("_" + suffix):
        base += "_" + suffix
    if counter and not base.endswith("_total"):
        base += "_total"
    return base


def _sanitize(name: str) -> str:
    cleaned = re.sub(r"[^a-zA-Z0-9_:]", "_", name)
    return "_" + cleaned if cleaned[:1].isdigit() else cleaned


def _number(value: float | int) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    value = float(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


def _label_value(value: Any) -> str:
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, (list, tuple)):
        text = ",".join(str(v) for v in value)
    else:
        text = str(value)
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(attrs: Iterable[tuple[str, Any]], extra: tuple[str, str] | None = None) -> str:
    pairs = [f'{_sanitize(k)}="{_label_value(v)}"' for k, v in attrs]
    if extra is not None:
        pairs.append(f'{extra[0]}="{extra[1]}"')
    return "{" + ",".join(pairs) + "}" if pairs else ""


def _header(out: list[str], name: str, otel_name: str, kind: str) -> None:
    help_text = _DESCRIPTIONS.get(otel_name, "").replace("\\", "\\\\").replace("\n", "\\n")
    if help_text:
        out.append(f"# HELP {name} {help_text}")
    out.append(f"# TYPE {name} {kind}")


def _value_family(out: list[str], otel_name: str, unit: str, kind: str, series: list[tuple[Attrs, int]]) -> None:
    if not series:
        return
    name = prometheus_name(otel_name, unit, counter=kind == "counter")
    _header(out, name, otel_name, kind)
    out.extend(f"{name}{_labels(attrs)} {_number(value)}" for attrs, value in series)


def _histogram_family(out: list[str], otel_name: str, unit: str, histogram: _Histogram) -> None:
    series = list(histogram.series.items())
    if not series:
        return
    name = prometheus_name(otel_name, unit)
    _header(out, name, otel_name, "histogram")
    bounds = [_number(float(b)) for b in histogram.bounds] + ["+Inf"]
    for attrs, (counts, total, count) in series:
        cumulative = 0
        for le, bucket in zip(bounds, counts):
            cumulative += bucket
            out.append(f"{name}_bucket{_labels(attrs, ('le', le))} {cumulative}")
        out.append(f"{name}_sum{_labels(attrs)} {_number(total)}")
        out.append(f"{name}_count{_labels(attrs)} {count}")
