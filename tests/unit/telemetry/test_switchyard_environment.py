"""What a Switchyard this server runs is told about metric export: none where the OTLP endpoint takes none."""

from __future__ import annotations

import pytest

from server.telemetry.otlp_export import switchyard_environment
from tests.support.otlp_receiver import OtlpReceiver
from tests.support.procs import free_port
from tests.support.telemetry import OTEL_VARS


@pytest.fixture(autouse=True)
def clean_otel_env(monkeypatch):
    for name in OTEL_VARS:
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("traces_only, told", [(True, {"OTEL_METRICS_EXPORTER": "none"}), (False, {})])
def test_told_to_export_none_only_where_the_endpoint_takes_none(monkeypatch, traces_only, told):
    with OtlpReceiver(traces_only=traces_only) as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
        assert switchyard_environment() == told
        assert [r.path for r in receiver.requests] == ["/v1/metrics"]  # asked once


@pytest.mark.parametrize(
    "extra", [{"OTEL_METRICS_EXPORTER": "otlp"}, {"OTEL_SDK_DISABLED": "true"}], ids=["chosen", "disabled"]
)
def test_the_environments_own_choice_stands_unasked(monkeypatch, extra):
    with OtlpReceiver(traces_only=True) as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
        for name, value in extra.items():
            monkeypatch.setenv(name, value)
        assert switchyard_environment() == {}
        assert receiver.requests == []


def test_no_endpoint_or_an_unreachable_one_leaves_switchyard_as_it_is(monkeypatch):
    assert switchyard_environment() == {}
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{free_port()}")
    assert switchyard_environment() == {}
