"""The call metrics in the Prometheus text exposition format (0.0.4), and the `GET /metrics` route (`routes`)."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from server.telemetry.metrics import (
    ACTIVE_METRIC,
    CAPTURE_OUTCOMES,
    CAPTURE_QUEUE_METRIC,
    CAPTURE_RECORDS_METRIC,
    DESCRIPTIONS,
    DURATION_METRIC,
    INJECTION_METRIC,
    REFUSED_IDS_METRIC,
    TOKEN_METRIC,
    TTFC_METRIC,
    Attrs,
    CallMetrics,
    Histogram,
)

PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class MetricsSource(Protocol):
    """What `/metrics` reads: the app's Telemetry (named by its method, so this module needs not import it)."""

    def prometheus_text(self) -> str: ...


class MetricsApp(Protocol):
    """What `/metrics` finds at its app's `state.switchyard`: the AppState, or anything with a `telemetry`."""

    @property
    def telemetry(self) -> MetricsSource: ...


async def metrics(request: Request) -> Response:
    """`GET /metrics` for Prometheus scrapers."""
    state: MetricsApp = request.app.state.switchyard
    return Response(state.telemetry.prometheus_text(), media_type=PROMETHEUS_CONTENT_TYPE)


routes = [Route("/metrics", metrics, methods=["GET"])]


def prometheus_text(metrics: CallMetrics) -> str:
    """Everything in the Prometheus text exposition format (0.0.4)."""
    out: list[str] = []
    _value_family(out, ACTIVE_METRIC, "{call}", "gauge", list(metrics.active.items()))
    for name, unit, histogram in (
        (DURATION_METRIC, "s", metrics.duration),
        (TTFC_METRIC, "s", metrics.ttfc),
        (TOKEN_METRIC, "{token}", metrics.tokens),
    ):
        _histogram_family(out, name, unit, histogram)
    if metrics.injection:
        _value_family(out, INJECTION_METRIC, "{call}", "counter", sorted(metrics.injection.items()))
    if refused := metrics.read_refused_ids():
        _value_family(out, REFUSED_IDS_METRIC, "{id}", "counter", refused)
    stats = metrics.read_capture_stats()
    if stats:
        _value_family(
            out,
            CAPTURE_RECORDS_METRIC,
            "{record}",
            "counter",
            [((("outcome", o),), int(stats.get(o, 0))) for o in CAPTURE_OUTCOMES],
        )
        _value_family(out, CAPTURE_QUEUE_METRIC, "{record}", "gauge", [((), int(stats.get("queue_depth", 0)))])
    return "\n".join(out) + "\n" if out else ""


_UNIT_SUFFIXES = {"s": "seconds", "ms": "milliseconds", "By": "bytes", "1": ""}


def prometheus_name(name: str, unit: str, counter: bool = False) -> str:
    """The OTel → Prometheus name mapping: dots become underscores, the unit is a suffix (annotation
    units such as `{token}` are dropped), counters end in `_total`."""
    base = _sanitize(name)
    suffix = _UNIT_SUFFIXES.get(unit)
    if suffix is None:
        suffix = _sanitize(re.sub(r"\{[^}]*\}", "", unit or "")).strip("_")
    if suffix and not base.endswith("_" + suffix):
        base += "_" + suffix
    if counter and not base.endswith("_total"):
        base += "_total"
    return base


def _sanitize(name: str) -> str:
    cleaned = re.sub(r"[^a-zA-Z0-9_:]", "_", name)
    return "_" + cleaned if cleaned[:1].isdigit() else cleaned


def _number(value: float | int) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    value = float(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


def _label_value(value: Any) -> str:
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, (list, tuple)):
        text = ",".join(str(v) for v in value)
    else:
        text = str(value)
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(attrs: Iterable[tuple[str, Any]], extra: tuple[str, str] | None = None) -> str:
    pairs = [f'{_sanitize(k)}="{_label_value(v)}"' for k, v in attrs]
    if extra is not None:
        pairs.append(f'{extra[0]}="{extra[1]}"')
    return "{" + ",".join(pairs) + "}" if pairs else ""


def _header(out: list[str], name: str, otel_name: str, kind: str) -> None:
    help_text = DESCRIPTIONS.get(otel_name, "").replace("\\", "\\\\").replace("\n", "\\n")
    if help_text:
        out.append(f"# HELP {name} {help_text}")
    out.append(f"# TYPE {name} {kind}")


def _value_family(out: list[str], otel_name: str, unit: str, kind: str, series: list[tuple[Attrs, int]]) -> None:
    if not series:
        return
    name = prometheus_name(otel_name, unit, counter=kind == "counter")
    _header(out, name, otel_name, kind)
    out.extend(f"{name}{_labels(attrs)} {_number(value)}" for attrs, value in series)


def _histogram_family(out: list[str], otel_name: str, unit: str, histogram: Histogram) -> None:
    series = list(histogram.series.items())
    if not series:
        return
    name = prometheus_name(otel_name, unit)
    _header(out, name, otel_name, "histogram")
    bounds = [_number(float(b)) for b in histogram.bounds] + ["+Inf"]
    for attrs, (counts, total, count, *_) in series:
        cumulative = 0
        for le, bucket in zip(bounds, counts):
            cumulative += bucket
            out.append(f"{name}_bucket{_labels(attrs, ('le', le))} {cumulative}")
        out.append(f"{name}_sum{_labels(attrs)} {_number(total)}")
        out.append(f"{name}_count{_labels(attrs)} {count}")
