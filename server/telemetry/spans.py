"""The telemetry of one model call: its SERVER and CLIENT spans, and the call metrics they feed.

Telemetry (service.py) picks the class per call: spans when tracing is on and the sampler keeps the
call, metrics only otherwise. The attributes come from attributes.py, the metrics from metrics.py.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Mapping
from typing import Any

from opentelemetry.context import Context
from opentelemetry.trace import SpanKind, Status, StatusCode, Tracer, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from middleware.correlation import Correlation
from server.logs import RateLimitedLog
from server.telemetry.attributes import (
    OPERATION,
    PROVIDER_NAME,
    api_type,
    content_input_attributes,
    content_output_attributes,
    record_error,
    request_attributes,
    response_attributes,
    root_input_attributes,
    root_output_attributes,
    session_attributes,
    token_count_attributes,
)
from server.telemetry.environment import EXPORT_LOG_INTERVAL_S
from server.telemetry.metrics import Attrs, CallMetrics

log = logging.getLogger("switchyard_model.telemetry")

_limited = RateLimitedLog(log, EXPORT_LOG_INTERVAL_S)  # a failing call must not flood the log

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

    def answered_by(self, model: str | None) -> None:
        """The model Switchyard says answered (its `x-model-router-selected-model` header), if it said.

        It outranks the answer's own `model`, which names the route where Switchyard answers so
        (a `noop` route, a router, an engine serving under the route's name).
        """

    def finish(self, response: dict[str, Any] | None = None, error: BaseException | None = None) -> None:
        """The call ended (a chat.completion dict, or the error that ended it)."""

    def injection(self, info: dict[str, Any]) -> None:
        """The call's token-injection outcome (the record's `injection` object)."""


NOOP_SPAN = CallSpan()


class MeteredCall(CallSpan):
    """A call without spans: metrics only, and the caller's trace context passed on to Switchyard."""

    __slots__ = ("_metrics", "_attrs", "_incoming", "_started", "_ttfc", "_done", "_answered_by")

    def __init__(self, metrics: CallMetrics, metric_attrs: Attrs, incoming: dict[str, str]) -> None:
        self._metrics = metrics
        self._attrs = metric_attrs
        self._incoming = incoming
        self._started = _clock()
        self._ttfc: float | None = None
        self._done = False
        self._answered_by: str | None = None
        self._metrics.call_started(metric_attrs)

    def upstream_headers(self, headers: dict[str, str]) -> None:
        # No span of ours to parent Switchyard's: forward the caller's, so its trace still joins up.
        if self._incoming:
            headers.update(self._incoming)

    def answered_by(self, model: str | None) -> None:
        if isinstance(model, str) and model:
            self._answered_by = model

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
            answered_by = self._answered_by
            if response is not None and answered_by is not None and response.get("model") != answered_by:
                response = {**response, "model": answered_by}  # a shallow copy: the caller's answer is its own
            self._metrics.call_finished(self._attrs, duration, response, error)
            self._on_finish(response, error)
        except Exception:
            _limited.warning("telemetry failed to finish a call", exc_info=True)

    def injection(self, info: dict[str, Any]) -> None:
        try:
            outcome = info.get("fallback_reason") or "injected"
            route = dict(self._attrs).get("gen_ai.request.model", "")
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


class UnsampledCall(MeteredCall):
    """A call the sampler left out: metrics only, and Switchyard is told the trace is not sampled, so
    its own (parent-based) exporter leaves the call out too instead of starting a trace of its own."""

    __slots__ = ()

    def upstream_headers(self, headers: dict[str, str]) -> None:
        if self._incoming:
            headers.update(self._incoming)
        else:
            headers["traceparent"] = f"00-{random.getrandbits(128):032x}-{random.getrandbits(64):016x}-00"


class TracedCall(MeteredCall):
    """A call with its SERVER span (this server handling the request: the call's envelope, a CHAIN
    to OpenInference readers) and CLIENT span (the model call to Switchyard, whose own spans become
    its children through the traceparent we inject)."""

    __slots__ = ("_server", "_client", "_capture_content", "_usage_on_client")

    def __init__(
        self,
        metrics: CallMetrics,
        metric_attrs: Attrs,
        incoming: dict[str, str],
        *,
        tracer: Tracer,
        capture_content: bool,
        usage_on_client: bool,
        upstream_attrs: Mapping[str, Any],
        api: str,
        route: str,
        request: dict[str, Any],
        correlation: Correlation | None,
        stream: bool,
        scope: Mapping[str, Any],
        client_request: Any,
    ) -> None:
        """`upstream_attrs` are Switchyard's server.address/server.port; `capture_content` puts the
        messages on the spans; `usage_on_client` puts the token usage on our CLIENT span."""
        self._capture_content = capture_content
        self._usage_on_client = usage_on_client
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
            **upstream_attrs,
        }
        if self._capture_content:
            client_attrs.update(content_input_attributes(request))
        self._server = tracer.start_span(server_name, context=parent, kind=SpanKind.SERVER, attributes=server_attrs)
        self._client = tracer.start_span(
            f"{OPERATION} {route}" if route else OPERATION,
            context=set_span_in_context(self._server, parent),
            kind=SpanKind.CLIENT,
            attributes=client_attrs,
        )
        # Counted in flight only once the spans exist, so a failure above leaves no stray count.
        super().__init__(metrics, metric_attrs, incoming)

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
