"""Started by NeMo Gym, the server follows Gym's telemetry environment as Gym's own servers do (nemo-lens):
its switch, gRPC by default, the per-server service name and Gym's run id; by hand, the OTEL_* one as before."""

from __future__ import annotations

import importlib.util

import pytest

from server.telemetry import otlp_export
from server.telemetry.gym_otel import gym_telemetry
from server.telemetry.service import Telemetry
from tests.support.otlp_receiver import OtlpReceiver
from tests.support.telemetry import REQUEST, RESPONSE, SESSION, scope, settings

GYM = {"server_name": "policy_model"}  # what the Gym entrypoint puts in `settings.gym`
HAS_GRPC = importlib.util.find_spec("opentelemetry.exporter.otlp.proto.grpc") is not None


def gym_environment(monkeypatch, endpoint: str, **extra: str) -> None:
    """What Gym 0.7's launcher (`configure_telemetry_env`) puts into a server's environment."""
    values = {
        "NEMO_GYM_OTEL_ENABLED": "1",
        "NEMO_GYM_OTEL_RUN_ID": "run42",
        "NEMO_GYM_OTEL_SPAN_GROUPS": "per_rollout",
        "OTEL_SERVICE_NAME": "nemo-gym",
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        **extra,
    }
    for name, value in values.items():
        monkeypatch.setenv(name, value)


def one_call(tel: Telemetry) -> None:
    span = tel.start_call(api="chat", route="demo", request=REQUEST, correlation=SESSION, stream=False, scope=scope())
    span.upstream_headers({})
    span.finish(RESPONSE)
    tel.shutdown()


def test_under_gym_the_spans_carry_gyms_run_id_and_the_per_server_service_name(monkeypatch):
    with OtlpReceiver() as receiver:
        gym_environment(monkeypatch, receiver.endpoint, OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf")
        tel = Telemetry(settings(gym=GYM))
        assert tel.enabled
        one_call(tel)
        spans = receiver.wait_for(lambda: receiver.spans())
        assert {s.name for s in spans} == {"POST /v1/chat/completions", "chat demo"}
        for s in spans:
            assert s.service_name == "nemo-gym/policy_model"
            assert s.resource["nemo.run.id"] == "run42"
            assert s.resource["nemo.gym.service_group"] == "nemo-gym"
            assert s.resource["nemo.gym.server.name"] == "policy_model"


def test_gyms_switch_off_exports_nothing_even_with_an_endpoint(monkeypatch):
    with OtlpReceiver() as receiver:
        gym_environment(monkeypatch, receiver.endpoint, NEMO_GYM_OTEL_ENABLED="0")
        tel = Telemetry(settings(gym=GYM))
        assert not tel.enabled
        one_call(tel)
        assert receiver.requests == []
    # The control: the same environment for a server started by hand exports (the OTEL_* rules).
    with OtlpReceiver() as receiver:
        gym_environment(monkeypatch, receiver.endpoint, NEMO_GYM_OTEL_ENABLED="0")
        tel = Telemetry(settings())
        one_call(tel)
        assert receiver.wait_for(lambda: receiver.spans())


def test_nemo_lens_fallback_prefix_and_opt_outs(monkeypatch):
    monkeypatch.setenv("NEMO_LENS_ENABLED", "true")
    monkeypatch.setenv("NEMO_GYM_OTEL_SERVICE_NAME_PER_SERVER", "0")
    found = gym_telemetry(settings(gym=GYM))
    assert found is not None and found.enabled
    assert found.service_name == "nemo" and found.run_id == ""  # nemo-lens's default name; no run id given
    assert gym_telemetry(settings()) is None  # not started by Gym
    monkeypatch.delenv("NEMO_LENS_ENABLED")
    assert gym_telemetry(settings(gym=GYM)) is None  # Gym's telemetry not set at all: OTEL_* decides


def test_traces_switch_off_under_gym_makes_no_spans(monkeypatch):
    with OtlpReceiver() as receiver:
        gym_environment(
            monkeypatch,
            receiver.endpoint,
            NEMO_GYM_OTEL_TRACES_ENABLED="0",
            OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
        )
        tel = Telemetry(settings(gym=GYM))
        assert not tel.enabled


def test_protocol_is_grpc_by_default_under_gym_and_http_by_hand(monkeypatch, caplog):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
    assert otlp_export._grpc_chosen("TRACES", "grpc") and not otlp_export._grpc_chosen("TRACES", "http/protobuf")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    assert not otlp_export._grpc_chosen("TRACES", "grpc")  # Gym's user asked for HTTP
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc")
    assert otlp_export._grpc_chosen("TRACES", "http/protobuf")  # the signal's own wins
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json")
    assert not otlp_export._grpc_chosen("TRACES", "grpc")
    assert "not supported" in caplog.text


@pytest.mark.skipif(not HAS_GRPC, reason="opentelemetry-exporter-otlp-proto-grpc is not installed")
def test_under_gym_the_exporters_are_grpc(monkeypatch):
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    gym_environment(monkeypatch, "http://127.0.0.1:4317")
    assert isinstance(otlp_export.span_exporter(default_protocol="grpc", need_endpoint=False), OTLPSpanExporter)
    assert isinstance(otlp_export.metric_exporter(default_protocol="grpc", need_endpoint=False), OTLPMetricExporter)


@pytest.mark.skipif(HAS_GRPC, reason="the fallback is for an installation without the gRPC exporter")
def test_without_the_grpc_exporter_export_falls_back_to_http_and_says_so(monkeypatch, caplog):
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    gym_environment(monkeypatch, "http://127.0.0.1:4317")
    assert isinstance(otlp_export.span_exporter(default_protocol="grpc", need_endpoint=False), OTLPSpanExporter)
    assert "opentelemetry-exporter-otlp-proto-grpc is not installed" in caplog.text


def test_over_grpc_the_usage_stays_on_our_span_as_a_hosted_switchyard_cannot_export_there(monkeypatch):
    """Switchyard 0.3.0's exporter speaks OTLP/HTTP only: a gRPC collector gets none of its spans."""
    from server.telemetry.environment import usage_on_our_span

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317")
    monkeypatch.delenv("RUST_LOG", raising=False)
    launched = settings(switchyard_base_url=None, deployment="deploy.toml")
    assert usage_on_our_span(launched, exporting_otlp=True, grpc=True) is True
    assert usage_on_our_span(launched, exporting_otlp=True, grpc=False) is False  # the control: over HTTP it joins
