"""What trace dashboards (Phoenix, Langfuse) read: the root's input and output, usage on one span, no metric errors."""

from __future__ import annotations

import json
import logging

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from server.telemetry.attributes import flat_tool
from server.telemetry.environment import usage_on_our_span
from server.telemetry.service import Telemetry
from tests.support.otlp_receiver import OtlpReceiver
from tests.support.telemetry import CALLER_TRACE_ID, REQUEST, RESPONSE, SESSION, sample, scope, settings, split

RESPONSES_REQUEST = {"model": "demo", "input": "what is the weather in Paris?", "instructions": "be brief"}


def _one_call(tel: Telemetry, **kwargs) -> None:
    span = tel.start_call(
        api=kwargs.pop("api", "chat"),
        route="demo",
        request=REQUEST,
        correlation=SESSION,
        stream=False,
        scope=scope(),
        **kwargs,
    )
    span.upstream_headers({})
    span.finish(RESPONSE)


def test_root_span_carries_the_request_as_the_client_sent_it_and_the_models_text():
    exporter = InMemorySpanExporter()
    tel = Telemetry(settings(otel_capture_content=True), span_exporter=exporter)
    _one_call(tel, api="responses", client_request=RESPONSES_REQUEST)
    server, client = split(exporter.get_finished_spans())
    # The Responses request, not the chat translation sent upstream (that one is on the CLIENT span).
    assert json.loads(server.attributes["input.value"]) == RESPONSES_REQUEST
    assert server.attributes["input.mime_type"] == "application/json"
    assert server.attributes["output.value"] == "secret answer"
    assert server.attributes["output.mime_type"] == "text/plain"
    assert "secret question" in client.attributes["gen_ai.input.messages"]
    assert "input.value" not in client.attributes
    tel.shutdown()


def test_without_content_capture_the_root_carries_no_input_or_output():
    exporter = InMemorySpanExporter()
    tel = Telemetry(settings(), span_exporter=exporter)
    _one_call(tel, api="responses", client_request=RESPONSES_REQUEST)
    for span in exporter.get_finished_spans():
        assert not {"input.value", "output.value"} & set(span.attributes)
        assert "Paris" not in repr(dict(span.attributes)) and "secret" not in repr(dict(span.attributes))
    tel.shutdown()


def test_usage_left_to_switchyard_is_on_no_span_of_ours_but_still_in_the_metrics():
    exporter = InMemorySpanExporter()
    tel = Telemetry(settings(otel_token_usage="switchyard"), span_exporter=exporter)
    _one_call(tel)
    for span in exporter.get_finished_spans():
        assert not [k for k in span.attributes if k.startswith(("gen_ai.usage.", "llm.token_count."))]
    _, client = split(exporter.get_finished_spans())
    assert client.attributes["llm.model_name"] == "mock-model"
    assert sample(tel.prometheus_text(), "gen_ai_client_token_usage_sum", gen_ai_token_type="input") == 12
    tel.shutdown()


@pytest.mark.parametrize(
    ("choice", "launched", "exporting", "rust_log", "ours"),
    [
        ("auto", True, True, None, False),  # a launched Switchyard exports to the same place: its span counts
        ("auto", True, True, "warn,libsy=info", False),
        ("auto", True, True, "warn", True),  # RUST_LOG=warn switches Switchyard's spans off
        ("auto", False, True, None, True),  # attach mode: we cannot know what Switchyard exports
        ("auto", True, False, None, True),  # console or a test exporter only
        ("ours", True, True, None, True),
        ("switchyard", False, False, None, False),
    ],
)
def test_which_span_carries_usage(monkeypatch, choice, launched, exporting, rust_log, ours):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    if rust_log is None:
        monkeypatch.delenv("RUST_LOG", raising=False)
    else:
        monkeypatch.setenv("RUST_LOG", rust_log)
    # A server that launches Switchyard is one without switchyard_base_url, given a deployment instead.
    config = (
        settings(otel_token_usage=choice, switchyard_base_url=None, deployment="deploy.toml")
        if launched
        else settings(otel_token_usage=choice)
    )
    assert config.launches_proxy is launched
    assert usage_on_our_span(config, exporting_otlp=exporting) is ours


def test_a_traces_only_endpoint_gets_one_metrics_probe_and_no_error_is_logged(monkeypatch, caplog):
    caplog.set_level(logging.INFO)
    with OtlpReceiver(traces_only=True) as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
        monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "100")
        tel = Telemetry(settings())
        _one_call(tel)
        receiver.wait_for(lambda: len([r for r in receiver.requests if r.path == "/v1/metrics"]) >= 1)
        _one_call(tel)
        tel.force_flush()
        tel.force_flush()
        tel.shutdown()
        assert receiver.wait_for(lambda: receiver.spans(CALLER_TRACE_ID))
    metric_posts = [r for r in receiver.requests if r.path == "/v1/metrics"]
    assert [r.size for r in metric_posts] == [0]  # the empty probe, and no export after it
    problems = [r for r in caplog.records if r.name.startswith("opentelemetry") and r.levelno >= logging.WARNING]
    assert problems == []
    assert any("takes no metrics" in r.getMessage() for r in caplog.records)


def test_an_endpoint_that_takes_metrics_still_gets_them(monkeypatch):
    with OtlpReceiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
        tel = Telemetry(settings())
        _one_call(tel)
        tel.shutdown()
        assert receiver.wait_for(lambda: receiver.metrics("gen_ai.client.operation.duration"))
        lengths = [r.size for r in receiver.requests if r.path == "/v1/metrics"]
        assert lengths[0] == 0 and any(length > 0 for length in lengths[1:])


def test_tool_definitions_take_the_conventions_flat_shape():
    nested = {
        "type": "function",
        "function": {"name": "lookup", "description": "find", "parameters": {"type": "object"}},
    }
    assert flat_tool(nested) == {
        "type": "function",
        "name": "lookup",
        "description": "find",
        "parameters": {"type": "object"},
    }
    responses_tool = {"type": "function", "name": "lookup", "parameters": {}}
    assert flat_tool(responses_tool) == responses_tool
    # Every definition needs a name: a built-in tool gets its type.
    assert flat_tool({"type": "web_search"}) == {"type": "web_search", "name": "web_search"}
