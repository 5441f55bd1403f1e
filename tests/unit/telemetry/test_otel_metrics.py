"""The call histograms reach OTel readers from CallMetrics' own aggregates, and agree with the SDK's."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.metrics import Histogram as SdkHistogram
from opentelemetry.sdk.metrics.export import AggregationTemporality, InMemoryMetricReader

from middleware.correlation import Correlation
from server.telemetry.service import Telemetry
from tests.support.telemetry import REQUEST, RESPONSE, metric_points, scope, settings

DURATION = "gen_ai.client.operation.duration"
TOKENS = "gen_ai.client.token.usage"


def run_calls(tel: Telemetry, clock, durations: list[float]) -> None:
    for seconds in durations:
        span = tel.start_call(
            api="chat", route="demo", request=REQUEST, correlation=Correlation(), stream=False, scope=scope(None)
        )
        clock.now += seconds
        span.finish(RESPONSE)


def points_by_name(reader: InMemoryMetricReader) -> dict[str, list]:
    out: dict[str, list] = {}
    for rm in reader.get_metrics_data().resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                out.setdefault(metric.name, []).extend(metric.data.data_points)
    return out


def test_cumulative_reader_gets_our_aggregates_without_recording_each_call_into_the_sdk(clock):
    reader = InMemoryMetricReader()
    tel = Telemetry(settings(), metric_reader=reader)
    assert tel.metrics._sdk is None  # no per-call SDK recording: the cost this path removes
    run_calls(tel, clock, [0.05, 0.3, 3.0])

    (point,) = metric_points(reader, DURATION)
    assert point.count == 3 and point.sum == pytest.approx(3.35)
    assert point.min == pytest.approx(0.05) and point.max == pytest.approx(3.0)
    assert sum(point.bucket_counts) == 3 and len(point.bucket_counts) == len(point.explicit_bounds) + 1
    assert point.attributes == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "switchyard",
        "gen_ai.request.model": "demo",
        "openai.api.type": "chat_completions",
        "server.address": "127.0.0.1",  # the port is on spans only: a hosted Switchyard's changes each start
        "gen_ai.response.model": "mock-model",
    }
    tokens = {p.attributes["gen_ai.token.type"]: p for p in metric_points(reader, TOKENS)}
    assert tokens["input"].sum == 36 and tokens["output"].sum == 15

    run_calls(tel, clock, [0.1])
    (point,) = metric_points(reader, DURATION)
    assert point.count == 4  # cumulative: the next collection still holds the first three
    tel.shutdown()


def test_our_points_match_what_the_sdk_aggregates_from_the_same_calls(clock):
    """Negative control and cross-check: a delta reader makes the SDK record every call itself; the
    first delta then covers the same calls, so both paths must give the same numbers."""
    ours_reader = InMemoryMetricReader()
    sdk_reader = InMemoryMetricReader(preferred_temporality={SdkHistogram: AggregationTemporality.DELTA})
    ours, sdk = Telemetry(settings(), metric_reader=ours_reader), Telemetry(settings(), metric_reader=sdk_reader)
    assert ours.metrics._sdk is None and sdk.metrics._sdk is not None
    for tel in (ours, sdk):
        run_calls(tel, clock, [0.012, 0.07, 0.07, 1.5, 30.0])
    ours_data, sdk_data = points_by_name(ours_reader), points_by_name(sdk_reader)  # one delta collection only
    for name in (DURATION, TOKENS):
        a, b = ours_data.get(name, []), sdk_data.get(name, [])
        assert len(a) == len(b) > 0
        key = (lambda p: p.attributes.get("gen_ai.token.type", "")) if name == TOKENS else (lambda p: "")
        for p, q in zip(sorted(a, key=key), sorted(b, key=key)):
            assert p.attributes == q.attributes
            assert (p.count, list(p.bucket_counts), list(p.explicit_bounds)) == (
                q.count,
                list(q.bucket_counts),
                list(q.explicit_bounds),
            )
            assert p.sum == pytest.approx(q.sum) and p.min == pytest.approx(q.min) and p.max == pytest.approx(q.max)
    ours.shutdown()
    sdk.shutdown()
