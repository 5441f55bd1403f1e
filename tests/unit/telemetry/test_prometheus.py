"""`GET /metrics`: the call metrics in Prometheus text, read back with prometheus_client's own parser."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from starlette.applications import Starlette
from starlette.testclient import TestClient

from server.errors import OpenAIError
from server.telemetry.metrics import DURATION_BUCKETS, TOKEN_BUCKETS, CallMetrics
from server.telemetry.prometheus import prometheus_name, prometheus_text, routes
from server.telemetry.service import Telemetry
from tests.support.telemetry import (
    REQUEST,
    RESPONSE,
    SESSION,
    bucket_bounds,
    sample,
    samples,
    settings,
)


# ---- /metrics --------------------------------------------------------------------------------------------
def test_metrics_route_serves_prometheus_histograms_with_the_conventions_buckets(clock):
    tel = Telemetry(settings())
    stats = {"written": 7, "failed": 1, "dropped": 2, "queue_depth": 3, "sessions": 4}
    tel.capture_stats_source(lambda: stats)
    app = Starlette(routes=routes)
    app.state.switchyard = SimpleNamespace(telemetry=tel)

    for seconds, prompt_tokens in ((0.05, 10), (3.0, 3000)):
        span = tel.start_call(
            api="responses", route="demo", request=REQUEST, correlation=SESSION, stream=False, scope={}
        )
        clock.now += seconds
        span.finish({**RESPONSE, "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 5}})
    failed = tel.start_call(api="chat", route="demo", request=REQUEST, correlation=SESSION, stream=False, scope={})
    clock.now += 0.01
    failed.finish(None, OpenAIError(504, "upstream timeout"))
    in_flight = tel.start_call(api="chat", route="demo", request=REQUEST, correlation=SESSION, stream=True, scope={})

    with TestClient(app) as client:
        reply = client.get("/metrics")
    assert reply.status_code == 200
    assert reply.headers["content-type"].startswith("text/plain; version=0.0.4")
    text = reply.text
    assert "# TYPE gen_ai_client_operation_duration_seconds histogram" in text
    assert "# TYPE gen_ai_client_token_usage histogram" in text

    ok = {"openai_api_type": "responses", "gen_ai_response_model": "mock-model"}
    name = "gen_ai_client_operation_duration_seconds"
    bounds = bucket_bounds(text, name, openai_api_type="responses", gen_ai_response_model="mock-model")
    assert bounds == [repr(float(b)) for b in DURATION_BUCKETS] + ["+Inf"]
    assert sample(text, name + "_bucket", le="0.04", **ok) == 0
    assert sample(text, name + "_bucket", le="0.08", **ok) == 1
    assert sample(text, name + "_bucket", le="2.56", **ok) == 1
    assert sample(text, name + "_bucket", le="5.12", **ok) == 2
    assert sample(text, name + "_bucket", le="+Inf", **ok) == 2
    assert sample(text, name + "_count", **ok) == 2
    assert sample(text, name + "_sum", **ok) == pytest.approx(3.05)
    assert sample(text, name + "_count", error_type="504") == 1

    tokens = "gen_ai_client_token_usage"
    token_bounds = bucket_bounds(text, tokens, gen_ai_token_type="input")
    assert token_bounds == [repr(float(b)) for b in TOKEN_BUCKETS] + ["+Inf"]
    assert sample(text, tokens + "_bucket", gen_ai_token_type="input", le="4.0") == 0
    assert sample(text, tokens + "_bucket", gen_ai_token_type="input", le="16.0") == 1
    assert sample(text, tokens + "_bucket", gen_ai_token_type="input", le="4096.0") == 2
    assert sample(text, tokens + "_sum", gen_ai_token_type="input") == 3010
    assert sample(text, tokens + "_count", gen_ai_token_type="output") == 2

    assert sample(text, "switchyard_model_calls_active", openai_api_type="chat_completions") == 1
    assert sample(text, "switchyard_model_calls_active", openai_api_type="responses") == 0
    assert sample(text, "switchyard_model_capture_records_total", outcome="written") == 7
    assert sample(text, "switchyard_model_capture_records_total", outcome="failed") == 1
    assert sample(text, "switchyard_model_capture_records_total", outcome="dropped") == 2
    assert sample(text, "switchyard_model_capture_queue_depth") == 3
    stats["written"] = 9
    assert sample(tel.prometheus_text(), "switchyard_model_capture_records_total", outcome="written") == 9
    in_flight.finish(None, asyncio.CancelledError())
    tel.shutdown()


def test_a_failing_capture_stats_source_does_not_break_metrics():
    tel = Telemetry(settings())

    def broken() -> dict:
        raise RuntimeError("store closed")

    tel.capture_stats_source(broken)
    tel.start_call(api="chat", route="demo", request=REQUEST, correlation=SESSION, stream=False, scope={}).finish(
        RESPONSE
    )
    text = tel.prometheus_text()
    assert "switchyard_model_capture_records_total" not in text
    assert sample(text, "gen_ai_client_operation_duration_seconds_count") == 1
    tel.shutdown()


def test_prometheus_names_and_label_escaping():
    assert prometheus_name("gen_ai.client.operation.duration", "s") == "gen_ai_client_operation_duration_seconds"
    assert prometheus_name("gen_ai.client.token.usage", "{token}") == "gen_ai_client_token_usage"
    assert (
        prometheus_name("switchyard_model.capture.records", "{record}", counter=True)
        == "switchyard_model_capture_records_total"
    )
    # Label values with quotes, backslashes and newlines survive a round trip through the parser.
    metrics = CallMetrics()
    awkward = 'say "hi"\\\n'
    metrics.call_started((("a.b", awkward),))
    [active] = [s for s in samples(prometheus_text(metrics)) if s.name == "switchyard_model_calls_active"]
    assert active.labels == {"a_b": awkward} and active.value == 1


def test_injection_outcomes_are_counted_by_route_and_reason():
    tel = Telemetry(settings())
    assert "injection" not in tel.prometheus_text()  # nothing until a call is injected or falls back
    for reason in (None, None, "echo_mismatch"):
        span = tel.start_call(api="chat", route="demo", request=REQUEST, correlation=SESSION, stream=False, scope={})
        span.injection({"transport": "vllm", "fallback_reason": reason})
        span.finish(RESPONSE)
    text = tel.prometheus_text()
    assert sample(text, "switchyard_model_injection_calls_total", outcome="injected", gen_ai_request_model="demo") == 2
    assert sample(text, "switchyard_model_injection_calls_total", outcome="echo_mismatch") == 1
    tel.shutdown()
