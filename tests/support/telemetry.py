"""Shared pieces for the telemetry tests: a sample request, answer and correlation, settings, scopes, a fake clock."""

from __future__ import annotations

from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.trace import SpanKind
from prometheus_client.parser import text_string_to_metric_families

from middleware.correlation import Correlation
from server.config import Settings

CALLER_TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
CALLER_SPAN_ID = "b7ad6b7169203331"
CALLER_TRACEPARENT = f"00-{CALLER_TRACE_ID}-{CALLER_SPAN_ID}-01"

REQUEST = {
    "model": "demo",
    "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "secret question"}],
    "temperature": 0.2,
    "top_p": 0.9,
    "max_tokens": 64,
    "stop": ["\n\n"],
    "seed": 7,
}
RESPONSE = {
    "id": "chatcmpl-123",
    "object": "chat.completion",
    "model": "mock-model",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "secret answer"}, "finish_reason": "stop"}],
    "usage": {
        "prompt_tokens": 12,
        "completion_tokens": 5,
        "total_tokens": 17,
        "prompt_tokens_details": {"cached_tokens": 4},
    },
}
SESSION = Correlation(
    session_id="rollout-7",
    parent_session_id="rollout-6",
    rollout_id="rollout-7",
    source="path:ng-rollout",
    request_id="req-abc",
)

OTEL_VARS = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
    "OTEL_TRACES_EXPORTER",
    "OTEL_METRICS_EXPORTER",
    "OTEL_SDK_DISABLED",
    "OTEL_SERVICE_NAME",
    "OTEL_RESOURCE_ATTRIBUTES",
    "OTEL_TRACES_SAMPLER",
    "OTEL_TRACES_SAMPLER_ARG",
    "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
    # Gym's telemetry environment (nemo-lens reads NEMO_LENS_<KEY> where NEMO_GYM_OTEL_<KEY> is unset).
    *(
        f"{prefix}_{key}"
        for prefix in ("NEMO_GYM_OTEL", "NEMO_LENS")
        for key in ("ENABLED", "RUN_ID", "TRACES_ENABLED", "METRICS_ENABLED", "EXPORTER", "SERVICE_NAME_PER_SERVER")
    ),
)


def settings(**fields) -> Settings:
    """Attached to a Switchyard on port 4000, every call traced (no rate cap) unless `fields` say otherwise."""
    return Settings(**{"switchyard_base_url": "http://127.0.0.1:4000/v1", "otel_traces_per_s": 0.0, **fields})


def scope(traceparent: str | None = CALLER_TRACEPARENT, **extra) -> dict:
    headers = [(b"content-type", b"application/json")]
    if traceparent is not None:
        headers.append((b"traceparent", traceparent.encode()))
    return {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": headers, **extra}


class Clock:
    """Replaces the telemetry clock so durations are exact."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def split(spans):
    """(SERVER span, CLIENT span) of one call."""
    assert len(spans) == 2, [s.name for s in spans]
    by_kind = {s.kind: s for s in spans}
    return by_kind[SpanKind.SERVER], by_kind[SpanKind.CLIENT]


def hex_id(value: int, width: int) -> str:
    return format(value, f"0{width}x")


def metric_points(reader: InMemoryMetricReader, name: str) -> list:
    data = reader.get_metrics_data()
    return [
        point
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == name
        for point in m.data.data_points
    ]


def samples(text: str) -> list:
    """Every sample in `text`, as prometheus_client's own parser reads it (it raises on malformed text)."""
    return [sample for family in text_string_to_metric_families(text) for sample in family.samples]


def sample(text: str, name: str, **labels: str) -> float:
    """The one series called `name` whose labels include `labels`."""
    found = [s.value for s in samples(text) if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(found) == 1, (name, labels, found)
    return found[0]


def bucket_bounds(text: str, name: str, **labels: str) -> list[str]:
    """The `le` bounds of one histogram series, in the order they are written."""
    return [
        s.labels["le"]
        for s in samples(text)
        if s.name == name + "_bucket" and all(s.labels.get(k) == v for k, v in labels.items())
    ]
