"""Trace sampling: parent-based, and at most `otel_traces_per_s` new traces a second above that call rate."""

from __future__ import annotations

import re

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from middleware.correlation import Correlation
from server.telemetry import sampling as sampling_module
from server.telemetry.sampling import RateCappedSampler
from server.telemetry.service import Telemetry
from tests.support.telemetry import CALLER_TRACE_ID, REQUEST, RESPONSE, metric_points, scope, settings

UNSAMPLED = re.compile(r"^00-[0-9a-f]{32}-[0-9a-f]{16}-00$")


def sampled_flag(traceparent: str) -> bool:
    return bool(int(traceparent[-2:], 16) & 1)


class FrozenTime:
    """time.monotonic for the sampler: stands still unless a test moves it."""

    def __init__(self) -> None:
        self.now = 500.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def frozen(monkeypatch) -> FrozenTime:
    fake = FrozenTime()
    monkeypatch.setattr(sampling_module, "time", fake)
    return fake


def make(per_s: float):
    exporter, reader = InMemorySpanExporter(), InMemoryMetricReader()
    tel = Telemetry(settings(otel_traces_per_s=per_s), span_exporter=exporter, metric_reader=reader)
    return tel, exporter, reader


def call(tel: Telemetry, traceparent: str | None = None) -> dict[str, str]:
    span = tel.start_call(
        api="chat", route="demo", request=REQUEST, correlation=Correlation(), stream=False, scope=scope(traceparent)
    )
    headers: dict[str, str] = {}
    span.upstream_headers(headers)
    span.finish(RESPONSE)
    return headers


def test_a_burst_above_the_cap_traces_the_cap_and_tells_switchyard_the_rest_are_unsampled(frozen):
    tel, exporter, reader = make(5)
    sent = [call(tel) for _ in range(20)]
    assert len(exporter.get_finished_spans()) == 5 * 2  # SERVER and CLIENT per traced call
    traced, unsampled = sent[:5], sent[5:]
    assert all(sampled_flag(h["traceparent"]) for h in traced)
    assert all(UNSAMPLED.match(h["traceparent"]) for h in unsampled)
    assert len({h["traceparent"] for h in unsampled}) == 15  # a trace of its own each, never shared
    # Every call is still measured, traced or not.
    [duration] = metric_points(reader, "gen_ai.client.operation.duration")
    assert duration.count == 20
    tel.shutdown()


def test_the_cap_refills_with_time(frozen):
    tel, exporter, _ = make(5)
    for _ in range(10):
        call(tel)
    assert len(exporter.get_finished_spans()) == 10
    frozen.now += 0.5  # two and a half traces' worth: two more
    for _ in range(10):
        call(tel)
    assert len(exporter.get_finished_spans()) == 14
    tel.shutdown()


def test_zero_traces_every_call(frozen):
    """Negative control: without the cap the same burst is traced whole."""
    tel, exporter, _ = make(0)
    for _ in range(20):
        call(tel)
    assert len(exporter.get_finished_spans()) == 40
    tel.shutdown()


def test_the_callers_sampled_flag_decides_whatever_the_rate(frozen):
    tel, exporter, _ = make(1)
    call(tel)  # uses up the bucket
    sampled = f"00-{CALLER_TRACE_ID}-b7ad6b7169203331-01"
    not_sampled = f"00-{CALLER_TRACE_ID}-b7ad6b7169203331-00"
    headers = call(tel, sampled)
    assert len(exporter.get_finished_spans()) == 4  # traced though over the cap: the caller traces it
    assert headers["traceparent"].startswith(f"00-{CALLER_TRACE_ID}-") and sampled_flag(headers["traceparent"])
    headers = call(tel, not_sampled)
    assert len(exporter.get_finished_spans()) == 4
    assert headers["traceparent"] == not_sampled  # passed on as is: Switchyard joins the caller's decision
    tel.shutdown()


def test_sampler_alone():
    sampler = RateCappedSampler(0)
    assert sampler.sample({}) is True
    assert sampler.sample({"traceparent": f"00-{CALLER_TRACE_ID}-b7ad6b7169203331-00"}) is False
    assert sampler.sample({"traceparent": f"00-{CALLER_TRACE_ID}-b7ad6b7169203331-03"}) is True  # flag bit 0
