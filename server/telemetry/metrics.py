"""The call metrics (duration, time to first chunk, tokens, calls in flight, capture and injection counters), kept in plain Python and mirrored to OTel."""

from __future__ import annotations

import logging
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from opentelemetry.metrics import CallbackOptions, Meter, Observation
from opentelemetry.metrics import Histogram as SdkHistogram

from server.logs import RateLimitedLog
from server.telemetry.attributes import error_type, is_int

log = logging.getLogger("switchyard_model.telemetry")
_limited = RateLimitedLog(log)  # a broken stats source would complain on every scrape

# Advisory bucket boundaries from the conventions' metric definitions.
DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)
TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864)

DURATION_METRIC = "gen_ai.client.operation.duration"
TOKEN_METRIC = "gen_ai.client.token.usage"
TTFC_METRIC = "gen_ai.client.operation.time_to_first_chunk"
ACTIVE_METRIC = "switchyard_model.calls.active"
CAPTURE_RECORDS_METRIC = "switchyard_model.capture.records"
CAPTURE_QUEUE_METRIC = "switchyard_model.capture.queue.depth"
INJECTION_METRIC = "switchyard_model.injection.calls"
REFUSED_IDS_METRIC = "switchyard_model.correlation.refused_ids"

Attrs = tuple[tuple[str, Any], ...]  # metric attributes, hashable and in a fixed order

DESCRIPTIONS = {
    DURATION_METRIC: "Duration of model calls through Switchyard",
    TTFC_METRIC: "Time from the start of a streamed call to its first chunk",
    TOKEN_METRIC: "Input and output tokens per model call",
    ACTIVE_METRIC: "Model calls in flight",
    CAPTURE_RECORDS_METRIC: "Capture records by outcome: written, failed (write error), dropped (queue full)",
    CAPTURE_QUEUE_METRIC: "Capture records waiting to be written",
    INJECTION_METRIC: "Correlated calls under token injection by outcome: injected, or the fallback reason",
    REFUSED_IDS_METRIC: "Session ids the correlation rules refused, by source (those calls went uncorrelated)",
}
CAPTURE_OUTCOMES = ("written", "failed", "dropped")


class Histogram:
    """Explicit-bucket histogram series keyed by attribute tuples; a bound is inclusive, as in OTel."""

    __slots__ = ("bounds", "series")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        # attrs -> [bucket counts, sum, count, min, max, start time (ns since the epoch)]
        self.series: dict[Attrs, list[Any]] = {}

    def record(self, value: float, attrs: Attrs) -> None:
        entry = self.series.get(attrs)
        if entry is None:
            entry = self.series[attrs] = [[0] * (len(self.bounds) + 1), 0, 0, value, value, time.time_ns()]
        entry[0][bisect_left(self.bounds, value)] += 1
        entry[1] += value
        entry[2] += 1
        if value < entry[3]:
            entry[3] = value
        elif value > entry[4]:
            entry[4] = value


class CallMetrics:
    """The call metrics, kept in plain Python: recording costs a few microseconds (the OTel SDK's
    measurement path costs tens per measurement). They are what GET /metrics shows, and what OTel
    metric readers get: the histograms are handed over at collection time (otel_metrics.py), the
    rest through observable instruments. Only a reader that wants delta histograms makes each
    measurement go into SDK histograms as well (`mirror_histograms_to`)."""

    def __init__(self) -> None:
        self.duration = Histogram(DURATION_BUCKETS)
        self.ttfc = Histogram(DURATION_BUCKETS)
        self.tokens = Histogram(TOKEN_BUCKETS)
        self.active: dict[Attrs, int] = {}
        self.injection: dict[Attrs, int] = {}  # (route, outcome) -> calls
        self.capture_stats: Callable[[], Mapping[str, int]] | None = None
        self.refused_ids: Callable[[], Mapping[str, int]] | None = None  # source -> count
        self._sdk: tuple[SdkHistogram, SdkHistogram, SdkHistogram] | None = None  # duration, ttfc, tokens

    def mirror_histograms_to(self, meter: Meter) -> None:
        """Record every measurement into SDK histograms too (for readers that want deltas)."""

        def histogram(name: str, unit: str) -> SdkHistogram:
            return meter.create_histogram(name, unit=unit, description=DESCRIPTIONS[name])

        self._sdk = (histogram(DURATION_METRIC, "s"), histogram(TTFC_METRIC, "s"), histogram(TOKEN_METRIC, "{token}"))

    def observe_from(self, meter: Meter) -> None:
        """Calls in flight and the capture counters, read by the SDK when it collects."""
        meter.create_observable_up_down_counter(
            ACTIVE_METRIC, callbacks=[self._observe_active], unit="{call}", description=DESCRIPTIONS[ACTIVE_METRIC]
        )
        meter.create_observable_counter(
            CAPTURE_RECORDS_METRIC,
            callbacks=[self._observe_capture_records],
            unit="{record}",
            description=DESCRIPTIONS[CAPTURE_RECORDS_METRIC],
        )
        meter.create_observable_counter(
            INJECTION_METRIC,
            callbacks=[self._observe_injection],
            unit="{call}",
            description=DESCRIPTIONS[INJECTION_METRIC],
        )
        meter.create_observable_counter(
            REFUSED_IDS_METRIC,
            callbacks=[self._observe_refused_ids],
            unit="{id}",
            description=DESCRIPTIONS[REFUSED_IDS_METRIC],
        )
        meter.create_observable_gauge(
            CAPTURE_QUEUE_METRIC,
            callbacks=[self._observe_capture_queue],
            unit="{record}",
            description=DESCRIPTIONS[CAPTURE_QUEUE_METRIC],
        )

    # ---- recording (event-loop thread) --------------------------------------------------------
    def call_started(self, attrs: Attrs) -> None:
        self.active[attrs] = self.active.get(attrs, 0) + 1

    def first_chunk(self, attrs: Attrs, seconds: float) -> None:
        self.ttfc.record(seconds, attrs)
        if self._sdk is not None:
            self._sdk[1].record(seconds, dict(attrs))

    def call_finished(
        self, attrs: Attrs, seconds: float, response: dict[str, Any] | None, error: BaseException | None
    ) -> None:
        self.active[attrs] = self.active.get(attrs, 0) - 1
        model = response.get("model") if response else None
        if isinstance(model, str):
            attrs += (("gen_ai.response.model", model),)
        if error is not None:
            attrs += (("error.type", error_type(error)),)
        self.duration.record(seconds, attrs)
        sdk = self._sdk
        if sdk is not None:
            sdk[0].record(seconds, dict(attrs))
        usage = response.get("usage") if response else None
        if not isinstance(usage, dict):
            return
        for chat_key, responses_key, token_type in (
            ("prompt_tokens", "input_tokens", "input"),
            ("completion_tokens", "output_tokens", "output"),
        ):
            count = usage.get(chat_key, usage.get(responses_key))
            if is_int(count) and count >= 0:
                token_attrs = attrs + (("gen_ai.token.type", token_type),)
                self.tokens.record(count, token_attrs)
                if sdk is not None:
                    sdk[2].record(count, dict(token_attrs))

    def injection_outcome(self, route: str, outcome: str) -> None:
        key = (("gen_ai.request.model", route), ("outcome", outcome))
        self.injection[key] = self.injection.get(key, 0) + 1

    # ---- reading --------------------------------------------------------------------------------
    def read_capture_stats(self) -> Mapping[str, int] | None:
        if self.capture_stats is None:
            return None
        try:
            return self.capture_stats()
        except Exception:
            _limited.warning("reading the capture store's counters failed", exc_info=True)
            return None

    def read_refused_ids(self) -> list[tuple[Attrs, int]]:
        counts = self.refused_ids() if self.refused_ids is not None else {}
        return [((("source", source),), count) for source, count in sorted(counts.items())]

    # The SDK calls these from its export thread: copy the dict before walking it.
    def _observe_active(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(count, dict(attrs)) for attrs, count in list(self.active.items())]

    def _observe_capture_records(self, options: CallbackOptions) -> Iterable[Observation]:
        stats = self.read_capture_stats()
        return [Observation(int(stats.get(o, 0)), {"outcome": o}) for o in CAPTURE_OUTCOMES] if stats else []

    def _observe_injection(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(count, dict(attrs)) for attrs, count in list(self.injection.items())]

    def _observe_refused_ids(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(count, dict(attrs)) for attrs, count in self.read_refused_ids()]

    def _observe_capture_queue(self, options: CallbackOptions) -> Iterable[Observation]:
        stats = self.read_capture_stats()
        return [Observation(int(stats.get("queue_depth", 0)))] if stats else []
