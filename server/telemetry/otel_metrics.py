"""Hand the call histograms that CallMetrics already keeps to OpenTelemetry metric readers when they collect.

Recording every call a second time into the SDK's own histograms cost about 25-50 µs of event-loop
CPU per call (attribute dicts, a frozenset key and a lock per measurement); building the same
data points from our aggregates once per export costs nothing per call. This covers cumulative
readers (the OTLP exporter's default and the in-memory test reader). A reader that asks for delta
histograms gets the SDK path instead (see `attach`), since deltas need per-interval min and max.

The hook is the reader's collect callback, which the SDK sets when a MeterProvider takes the
reader (`MetricReader._set_collect_callback`): we wrap that callback and add our metrics to what it
returns. It is private SDK API; tests/unit/telemetry catch a change (they read every histogram
through a reader).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter, MeterProvider
from opentelemetry.sdk.metrics._internal.instrument import _Histogram
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricReader,
    MetricsData,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from server.telemetry import metrics as m


def meter_provider(
    readers: list[MetricReader],
    calls: m.CallMetrics,
    resource: Resource,
    scope: InstrumentationScope,
    *,
    exporting: bool,
) -> MeterProvider:
    """A MeterProvider for `readers`: the conventions' bucket boundaries, the in-flight and capture
    gauges, and the call histograms handed over at collection (or mirrored, for delta readers)."""
    views = [
        View(instrument_name=name, aggregation=ExplicitBucketHistogramAggregation(bounds))
        for name, bounds in (
            (m.DURATION_METRIC, m.DURATION_BUCKETS),
            (m.TTFC_METRIC, m.DURATION_BUCKETS),
            (m.TOKEN_METRIC, m.TOKEN_BUCKETS),
        )
    ]
    provider = MeterProvider(
        metric_readers=readers,
        resource=resource,
        views=views,
        exemplar_filter=AlwaysOffExemplarFilter(),
        shutdown_on_exit=exporting,
    )
    meter = provider.get_meter(scope.name, scope.version, schema_url=scope.schema_url)
    calls.observe_from(meter)
    if all(reads_cumulative_histograms(reader) for reader in readers):
        attach(readers, calls, resource, scope)
    else:
        calls.mirror_histograms_to(meter)
    return provider


def reads_cumulative_histograms(reader: MetricReader) -> bool:
    temporality = getattr(reader, "_instrument_class_temporality", {}).get(_Histogram)
    return temporality == AggregationTemporality.CUMULATIVE


def attach(
    readers: Sequence[MetricReader], calls: m.CallMetrics, resource: Resource, scope: InstrumentationScope
) -> None:
    """After the MeterProvider has taken `readers`: each collection also returns the call histograms."""
    for reader in readers:
        sdk_collect = reader._collect
        if sdk_collect is None:
            raise RuntimeError("attach the call histograms after the MeterProvider has taken the reader")
        # The SDK annotates its collect callback as (reader, temporality) -> MetricsData, yet calls it as
        # (reader, timeout_millis=...) and takes None from it: its own annotation, not ours, is off.
        reader._set_collect_callback(_with_call_histograms(sdk_collect, calls, resource, scope))  # type: ignore[arg-type]


def _with_call_histograms(
    sdk_collect: Callable[..., Any],  # the SDK's collect, typed loosely as it is called (see attach)
    calls: m.CallMetrics,
    resource: Resource,
    scope: InstrumentationScope,
) -> Callable[..., MetricsData | None]:
    def collect(reader: MetricReader, timeout_millis: float = 10_000) -> MetricsData | None:
        data: MetricsData | None = sdk_collect(reader, timeout_millis=timeout_millis)
        ours = call_histograms(calls)
        if not ours:
            return data
        resource_metrics = list(data.resource_metrics) if data is not None else []
        for i, rm in enumerate(resource_metrics):
            for j, sm in enumerate(rm.scope_metrics):
                if sm.scope == scope:
                    scopes = list(rm.scope_metrics)
                    scopes[j] = ScopeMetrics(scope=sm.scope, metrics=[*sm.metrics, *ours], schema_url=sm.schema_url)
                    resource_metrics[i] = ResourceMetrics(rm.resource, scopes, rm.schema_url)
                    return MetricsData(resource_metrics=resource_metrics)
        own = ScopeMetrics(scope=scope, metrics=ours, schema_url=scope.schema_url or "")
        if resource_metrics:
            rm = resource_metrics[0]
            resource_metrics[0] = ResourceMetrics(rm.resource, [*rm.scope_metrics, own], rm.schema_url)
        else:
            resource_metrics = [ResourceMetrics(resource, [own], resource.schema_url)]
        return MetricsData(resource_metrics=resource_metrics)

    return collect


def call_histograms(calls: m.CallMetrics) -> list[Metric]:
    """The duration, time-to-first-chunk and token histograms as cumulative OTel metrics (read from any thread)."""
    now = time.time_ns()
    out = []
    for name, unit, histogram in (
        (m.DURATION_METRIC, "s", calls.duration),
        (m.TTFC_METRIC, "s", calls.ttfc),
        (m.TOKEN_METRIC, "{token}", calls.tokens),
    ):
        points = [_point(attrs, entry, histogram.bounds, now) for attrs, entry in list(histogram.series.items())]
        if points:
            out.append(
                Metric(
                    name=name,
                    description=m.DESCRIPTIONS[name],
                    unit=unit,
                    data=Histogram(data_points=points, aggregation_temporality=AggregationTemporality.CUMULATIVE),
                )
            )
    return out


def _point(attrs: m.Attrs, entry: list[Any], bounds: tuple[float, ...], now: int) -> HistogramDataPoint:
    counts = list(entry[0])  # one copy under the GIL; the count is taken from it so the two agree
    return HistogramDataPoint(
        attributes=dict(attrs),
        start_time_unix_nano=entry[5],
        time_unix_nano=now,
        count=sum(counts),
        sum=entry[1],
        bucket_counts=counts,
        explicit_bounds=list(bounds),
        min=entry[3],
        max=entry[4],
    )
