"""Spans of a model call (SERVER and CLIENT, attributes, errors, trace context) and the OTel configuration."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from middleware.correlation import Correlation
from server.errors import OpenAIError
from server.logs import OncePerInterval
from server.telemetry import environment
from server.telemetry.metrics import DURATION_BUCKETS
from server.telemetry.service import Telemetry
from server.telemetry.spans import CallSpan
from tests.support.otlp_receiver import OtlpReceiver
from tests.support.procs import free_port
from tests.support.telemetry import (
    CALLER_SPAN_ID,
    CALLER_TRACE_ID,
    CALLER_TRACEPARENT,
    REQUEST,
    RESPONSE,
    SESSION,
    hex_id,
    metric_points,
    sample,
    scope,
    settings,
    split,
)


# ---- spans -----------------------------------------------------------------------------------------
def test_non_stream_call_makes_a_server_span_and_a_client_child_in_the_callers_trace(traced):
    tel, exporter, _ = traced
    span = tel.start_call(
        api="chat", route="demo", request=REQUEST, correlation=Correlation(), stream=False, scope=scope()
    )
    headers = {"x-request-id": "r1"}
    span.upstream_headers(headers)
    span.finish(RESPONSE)

    server, client = split(exporter.get_finished_spans())
    # The SERVER span is the call's envelope, named after the request; the CLIENT span is the model call.
    assert server.name == "POST /v1/chat/completions" and client.name == "chat demo"
    # The caller's traceparent parents the SERVER span; the CLIENT span is its child.
    assert hex_id(server.context.trace_id, 32) == CALLER_TRACE_ID
    assert hex_id(server.parent.span_id, 16) == CALLER_SPAN_ID and server.parent.is_remote
    assert client.context.trace_id == server.context.trace_id
    assert client.parent.span_id == server.context.span_id
    # What goes to Switchyard names the CLIENT span, so Switchyard's spans become its children.
    assert headers["traceparent"] == f"00-{CALLER_TRACE_ID}-{hex_id(client.context.span_id, 16)}-01"
    assert headers["x-request-id"] == "r1"

    attrs = dict(client.attributes)
    assert attrs["gen_ai.operation.name"] == "chat"
    assert attrs["gen_ai.provider.name"] == "switchyard"
    assert attrs["gen_ai.request.model"] == "demo"
    assert attrs["openai.api.type"] == "chat_completions"
    assert attrs["gen_ai.request.temperature"] == 0.2
    assert attrs["gen_ai.request.top_p"] == 0.9
    assert attrs["gen_ai.request.max_tokens"] == 64
    assert attrs["gen_ai.request.seed"] == 7
    assert tuple(attrs["gen_ai.request.stop_sequences"]) == ("\n\n",)
    assert attrs["gen_ai.response.id"] == "chatcmpl-123"
    assert attrs["gen_ai.response.model"] == "mock-model"
    assert tuple(attrs["gen_ai.response.finish_reasons"]) == ("stop",)
    assert attrs["gen_ai.usage.input_tokens"] == 12
    assert attrs["gen_ai.usage.output_tokens"] == 5
    assert attrs["gen_ai.usage.cache_read.input_tokens"] == 4
    assert attrs["server.address"] == "127.0.0.1" and attrs["server.port"] == 4000
    assert "gen_ai.request.stream" not in attrs and "error.type" not in attrs
    # OpenInference's names too: Phoenix shows the model that answered and adds up these counts.
    assert attrs["openinference.span.kind"] == "LLM"
    assert attrs["llm.model_name"] == "mock-model"
    assert (attrs["llm.token_count.prompt"], attrs["llm.token_count.completion"]) == (12, 5)
    assert attrs["llm.token_count.total"] == 17 and attrs["llm.token_count.prompt_details.cache_read"] == 4
    assert client.status.status_code == server.status.status_code == StatusCode.OK

    server_attrs = dict(server.attributes)
    # The envelope is a CHAIN, not a second model call: no gen_ai.* but the session's conversation id.
    assert server_attrs["openinference.span.kind"] == "CHAIN"
    assert [key for key in server_attrs if key.startswith("gen_ai.")] == []
    assert server_attrs["http.request.method"] == "POST" and server_attrs["url.path"] == "/v1/chat/completions"
    # Usage is counted once per trace: on the CLIENT span only.
    assert not any(key.startswith(("gen_ai.usage.", "llm.")) for key in server_attrs)
    # No message content unless asked for.
    for s in (server, client):
        assert not any(
            key.startswith(("gen_ai.input", "gen_ai.output.messages", "gen_ai.tool")) for key in s.attributes
        )
        assert "secret" not in repr(dict(s.attributes))


def test_stream_span_covers_the_whole_stream_and_records_time_to_first_chunk(traced, clock):
    tel, exporter, reader = traced
    span = tel.start_call(
        api="responses",
        route="demo",
        request={**REQUEST, "stream": True},
        correlation=Correlation(),
        stream=True,
        scope=scope(),
    )
    span.upstream_headers({})
    clock.now += 0.25
    span.first_chunk()
    clock.now += 0.5
    span.first_chunk()  # only the first one counts
    time.sleep(0.05)  # spans use the wall clock: the end must come after the last chunk
    span.finish(RESPONSE)

    server, client = split(exporter.get_finished_spans())
    assert client.attributes["gen_ai.request.stream"] is True
    for s in (server, client):
        assert s.attributes["openai.api.type"] == "responses"
        assert s.attributes["gen_ai.response.time_to_first_chunk"] == pytest.approx(0.25)
        # ...and an event on the timeline, once.
        (event,) = [e for e in s.events if e.name == "gen_ai.first_chunk"]
        assert event.attributes["gen_ai.response.time_to_first_chunk"] == pytest.approx(0.25)
    assert client.end_time - client.start_time >= 50_000_000

    points = metric_points(reader, "gen_ai.client.operation.time_to_first_chunk")
    assert len(points) == 1 and points[0].count == 1 and points[0].sum == pytest.approx(0.25)
    assert tuple(points[0].explicit_bounds) == DURATION_BUCKETS
    duration = metric_points(reader, "gen_ai.client.operation.duration")
    assert duration[0].sum == pytest.approx(0.75)


def test_upstream_failure_sets_error_type_and_error_status(traced):
    tel, exporter, reader = traced
    span = tel.start_call(
        api="chat", route="demo", request=REQUEST, correlation=Correlation(), stream=False, scope=scope()
    )
    span.upstream_headers({})
    span.finish(None, OpenAIError(502, "cannot connect to the upstream", code="upstream_unreachable"))

    server, client = split(exporter.get_finished_spans())
    for s in (server, client):
        assert s.attributes["error.type"] == "502"
        assert s.status.status_code == StatusCode.ERROR
        assert "cannot connect" in s.status.description
        assert "gen_ai.response.id" not in s.attributes
    assert client.attributes["switchyard_model.error.code"] == "upstream_unreachable"
    (point,) = metric_points(reader, "gen_ai.client.operation.duration")
    assert point.attributes["error.type"] == "502"


def test_cancelled_and_unexpected_errors_have_their_own_error_types(traced):
    tel, exporter, _ = traced
    for error in (asyncio.CancelledError(), ValueError("boom")):
        span = tel.start_call(
            api="chat", route="demo", request=REQUEST, correlation=Correlation(), stream=True, scope=scope(None)
        )
        span.finish(None, error)
    spans = exporter.get_finished_spans()
    types = {s.attributes["error.type"] for s in spans}
    assert types == {"cancelled", "ValueError"}
    assert all(s.status.status_code == StatusCode.ERROR for s in spans)
    # The unexpected error keeps its traceback as an exception event; a cancellation needs none.
    value_server = next(s for s in spans if s.kind == SpanKind.SERVER and s.attributes["error.type"] == "ValueError")
    assert [e.name for e in value_server.events] == ["exception"]


def test_responses_shaped_usage_is_understood_too(traced):
    """A passthrough (`upstream_api: responses`) call finishes with a Responses object."""
    tel, exporter, _ = traced
    span = tel.start_call(api="responses", route="demo", request={}, correlation=Correlation(), stream=False, scope={})
    span.finish(
        {
            "id": "resp_1",
            "object": "response",
            "model": "mock-model",
            "usage": {"input_tokens": 30, "output_tokens": 4, "input_tokens_details": {"cached_tokens": 8}},
        }
    )
    _, client = split(exporter.get_finished_spans())
    assert client.attributes["gen_ai.usage.input_tokens"] == 30
    assert client.attributes["gen_ai.usage.output_tokens"] == 4
    assert client.attributes["gen_ai.usage.cache_read.input_tokens"] == 8
    assert sample(tel.prometheus_text(), "gen_ai_client_token_usage_sum", gen_ai_token_type="input") == 30


def test_correlated_call_carries_session_rollout_and_parent_on_both_spans(traced):
    tel, exporter, _ = traced
    span = tel.start_call(
        api="responses", route="demo", request=REQUEST, correlation=SESSION, stream=False, scope=scope()
    )
    span.finish(RESPONSE)
    for s in split(exporter.get_finished_spans()):
        assert s.attributes["gen_ai.conversation.id"] == "rollout-7"
        assert s.attributes["session.id"] == "rollout-7"
        assert s.attributes["switchyard_model.parent_session.id"] == "rollout-6"
        assert s.attributes["switchyard_model.rollout.id"] == "rollout-7"
        assert s.attributes["switchyard_model.route"] == "demo"
        assert s.attributes["switchyard_model.session.source"] == "path:ng-rollout"


def test_uncorrelated_call_without_traceparent_starts_a_new_trace_without_session_attributes(traced):
    tel, exporter, _ = traced
    span = tel.start_call(api="chat", route="demo", request=REQUEST, correlation=Correlation(), stream=False, scope={})
    span.finish(RESPONSE)
    server, client = split(exporter.get_finished_spans())
    assert server.parent is None
    assert hex_id(server.context.trace_id, 32) != CALLER_TRACE_ID
    assert client.parent.span_id == server.context.span_id
    for s in (server, client):
        assert "session.id" not in s.attributes and "gen_ai.conversation.id" not in s.attributes


def test_malformed_traceparent_is_ignored(traced):
    tel, exporter, _ = traced
    span = tel.start_call(
        api="chat",
        route="demo",
        request=REQUEST,
        correlation=Correlation(),
        stream=False,
        scope=scope("00-not-a-trace-context"),
    )
    span.finish(RESPONSE)
    server, _ = split(exporter.get_finished_spans())
    assert server.parent is None


def test_finish_is_idempotent_and_the_in_flight_count_returns_to_zero(traced):
    tel, exporter, reader = traced
    span = tel.start_call(
        api="chat", route="demo", request=REQUEST, correlation=Correlation(), stream=False, scope=scope()
    )
    (active,) = metric_points(reader, "switchyard_model.calls.active")
    assert active.value == 1
    span.finish(RESPONSE)
    span.finish(None, OpenAIError(502, "late"))
    span.first_chunk()
    assert len(exporter.get_finished_spans()) == 2
    (active,) = metric_points(reader, "switchyard_model.calls.active")
    assert active.value == 0
    assert metric_points(reader, "gen_ai.client.operation.duration")[0].count == 1


def test_message_content_only_when_opted_in():
    exporter = InMemorySpanExporter()
    tel = Telemetry(settings(otel_capture_content=True), span_exporter=exporter)
    request = {**REQUEST, "tools": [{"type": "function", "function": {"name": "lookup", "parameters": {}}}]}
    response = {
        **RESPONSE,
        "choices": [
            {
                "index": 0,
                "finish_reason": "tool_calls",
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
                    ],
                },
            }
        ],
    }
    span = tel.start_call(
        api="chat", route="demo", request=request, correlation=Correlation(), stream=False, scope=scope()
    )
    span.finish(response)
    server, client = split(exporter.get_finished_spans())
    inputs = json.loads(client.attributes["gen_ai.input.messages"])
    assert inputs[1] == {"role": "user", "parts": [{"type": "text", "content": "secret question"}]}
    outputs = json.loads(client.attributes["gen_ai.output.messages"])
    assert outputs == [
        {
            "role": "assistant",
            "finish_reason": "tool_calls",
            "parts": [{"type": "tool_call", "id": "call_1", "name": "lookup", "arguments": "{}"}],
        }
    ]
    # The conventions' flat shape (gen-ai-tool-definitions.json), not Chat Completions' nested one.
    assert json.loads(client.attributes["gen_ai.tool.definitions"]) == [
        {"type": "function", "name": "lookup", "parameters": {}}
    ]
    # Messages stay on the CLIENT span, the one that stands for the model call; the root carries
    # the call's input (as the client sent it) and output for list views.
    assert "gen_ai.input.messages" not in server.attributes
    assert json.loads(server.attributes["input.value"]) == request
    assert server.attributes["input.mime_type"] == "application/json"
    assert json.loads(server.attributes["output.value"])["tool_calls"][0]["function"]["name"] == "lookup"
    assert server.attributes["output.mime_type"] == "application/json"
    tel.shutdown()


# ---- configuration -----------------------------------------------------------------------------------
def test_without_an_exporter_there_are_no_spans_but_trace_context_and_metrics_still_flow(monkeypatch):
    tel = Telemetry(settings())
    assert tel.enabled is False
    span = tel.start_call(api="chat", route="demo", request=REQUEST, correlation=SESSION, stream=False, scope=scope())
    assert not hasattr(span, "_server")
    headers: dict[str, str] = {}
    span.upstream_headers(headers)
    # Nothing of ours to parent Switchyard's spans, so the caller's context is passed on unchanged.
    assert headers == {"traceparent": CALLER_TRACEPARENT}
    span.finish(RESPONSE)
    bare = tel.start_call(api="chat", route="demo", request=REQUEST, correlation=SESSION, stream=False, scope={})
    no_headers: dict[str, str] = {}
    bare.upstream_headers(no_headers)
    assert no_headers == {}
    bare.finish(RESPONSE)
    assert "gen_ai_client_operation_duration_seconds_count{" in tel.prometheus_text()
    assert sample(tel.prometheus_text(), "gen_ai_client_operation_duration_seconds_count") == 2
    tel.shutdown()


def test_sdk_disabled_turns_everything_off(monkeypatch):
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    tel = Telemetry(settings(otel_console=True), span_exporter=InMemorySpanExporter())
    span = tel.start_call(api="chat", route="demo", request=REQUEST, correlation=SESSION, stream=False, scope=scope())
    assert type(span) is CallSpan
    span.finish(RESPONSE)
    assert tel.prometheus_text() == ""
    tel.shutdown()


def test_sampler_from_the_environment_still_propagates_an_unsampled_context(monkeypatch):
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")
    exporter = InMemorySpanExporter()
    tel = Telemetry(settings(), span_exporter=exporter)
    span = tel.start_call(
        api="chat", route="demo", request=REQUEST, correlation=SESSION, stream=False, scope=scope(None)
    )
    headers: dict[str, str] = {}
    span.upstream_headers(headers)
    span.finish(RESPONSE)
    assert exporter.get_finished_spans() == ()
    assert re.fullmatch(r"00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}", headers["traceparent"])
    assert int(headers["traceparent"][-2:], 16) & 1 == 0  # the sampled flag is off
    assert sample(tel.prometheus_text(), "gen_ai_client_operation_duration_seconds_count") == 1
    tel.shutdown()


def test_providers_are_per_instance_and_never_global():
    before = trace.get_tracer_provider()
    first, second = InMemorySpanExporter(), InMemorySpanExporter()
    tel_a = Telemetry(settings(), span_exporter=first)
    tel_b = Telemetry(settings(), span_exporter=second)
    tel_a.start_call(api="chat", route="a", request=REQUEST, correlation=SESSION, stream=False, scope={}).finish(
        RESPONSE
    )
    assert {s.name for s in first.get_finished_spans()} == {"chat_completions", "chat a"}  # scope has no path
    assert second.get_finished_spans() == ()
    assert 'gen_ai_request_model="a"' not in tel_b.prometheus_text()
    assert trace.get_tracer_provider() is before
    tel_a.shutdown()
    tel_b.shutdown()
    tel_a.shutdown()  # idempotent


def test_otlp_export_uses_the_standard_environment(monkeypatch):
    with OtlpReceiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
        monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment.name=test,team=rl")
        tel = Telemetry(settings())
        assert tel.enabled
        span = tel.start_call(
            api="chat", route="demo", request=REQUEST, correlation=SESSION, stream=False, scope=scope()
        )
        span.upstream_headers({})
        span.finish(RESPONSE)
        tel.shutdown()  # flushes the batch processor and the periodic metric reader
        spans = receiver.wait_for(lambda: receiver.spans(CALLER_TRACE_ID))
        assert {(s.kind, s.name) for s in spans} == {("SERVER", "POST /v1/chat/completions"), ("CLIENT", "chat demo")}
        for s in spans:
            assert s.service_name == "switchyard-model"
            assert s.resource["deployment.environment.name"] == "test" and s.resource["team"] == "rl"
            assert s.attributes["session.id"] == "rollout-7"
        (duration,) = receiver.wait_for(lambda: receiver.metrics("gen_ai.client.operation.duration"))
        assert duration.kind == "histogram" and duration.unit == "s"
        assert tuple(duration.points[0]["explicit_bounds"]) == DURATION_BUCKETS
        assert all(r.content_type == "application/x-protobuf" for r in receiver.requests)


def test_service_name_comes_from_otel_service_name(monkeypatch):
    with OtlpReceiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", receiver.endpoint + "/v1/traces")
        monkeypatch.setenv("OTEL_SERVICE_NAME", "policy-server")
        tel = Telemetry(settings())
        tel.start_call(
            api="chat", route="demo", request=REQUEST, correlation=SESSION, stream=False, scope=scope()
        ).finish(RESPONSE)
        tel.shutdown()
        spans = receiver.wait_for(lambda: receiver.spans(CALLER_TRACE_ID))
        assert {s.service_name for s in spans} == {"policy-server"}
        # Only the traces endpoint was given: metrics are not pushed anywhere.
        assert not any(r.path == "/v1/metrics" for r in receiver.requests)

        # The setting outranks the environment (which a hosted Switchyard shares with us).
        tel = Telemetry(settings(otel_service_name="policy-front"))
        tel.start_call(api="chat", route="named", request=REQUEST, correlation=SESSION, stream=False, scope={}).finish(
            RESPONSE
        )
        tel.shutdown()
        named = receiver.wait_for(lambda: [s for s in receiver.spans() if s.name == "chat named"])
        assert {s.service_name for s in named} == {"policy-front"}


def test_a_dead_collector_never_affects_calls_and_is_logged_once_per_interval(monkeypatch, caplog):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1")  # seconds, as the Python exporter reads it
    for name in environment.EXPORTER_LOGGERS:
        for f in logging.getLogger(name).filters:
            if isinstance(f, OncePerInterval):
                f.reset()
    caplog.set_level(logging.WARNING)
    tel = Telemetry(settings())
    assert tel.enabled
    for _ in range(3):
        started = time.monotonic()
        span = tel.start_call(
            api="chat", route="demo", request=REQUEST, correlation=SESSION, stream=False, scope=scope()
        )
        span.upstream_headers({})
        span.finish(RESPONSE)
        assert time.monotonic() - started < 0.9  # the call never waits on the exporter (1 s timeout)
        tel.force_flush(timeout_s=5)
    started = time.monotonic()
    tel.shutdown(timeout_s=3)
    assert time.monotonic() - started < 4
    per_logger: dict[str, int] = {}
    for record in caplog.records:
        if record.name.startswith("opentelemetry"):
            per_logger[record.name] = per_logger.get(record.name, 0) + 1
    # Three failed span exports (and metric exports) without the filter; one line per logger with it.
    assert per_logger.get("opentelemetry.exporter.otlp.proto.http.trace_exporter") == 1
    assert all(count == 1 for count in per_logger.values()), per_logger


def test_injection_outcome_goes_on_both_spans_and_into_the_counter(traced):
    tel, exporter, _ = traced
    for info in (
        {"transport": "vllm", "chain": "chain_1", "injected_len": 42, "fallback_reason": None},
        {"transport": "vllm", "chain": None, "injected_len": 0, "fallback_reason": "echo_mismatch"},
    ):
        span = tel.start_call(
            api="chat", route="demo", request=REQUEST, correlation=Correlation(), stream=False, scope=scope()
        )
        span.injection(info)
        span.finish(RESPONSE)
    spans = exporter.get_finished_spans()
    first_server, first_client = split(spans[:2])
    for s in (first_server, first_client):
        assert s.attributes["switchyard_model.injection.outcome"] == "injected"
        assert s.attributes["switchyard_model.injection.injected_len"] == 42
        assert s.attributes["switchyard_model.injection.chain"] == "chain_1"
    assert split(spans[2:])[0].attributes["switchyard_model.injection.outcome"] == "echo_mismatch"
    assert tel.metrics.injection == {
        (("gen_ai.request.model", "demo"), ("outcome", "injected")): 1,
        (("gen_ai.request.model", "demo"), ("outcome", "echo_mismatch")): 1,
    }
