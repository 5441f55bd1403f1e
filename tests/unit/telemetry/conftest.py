"""Fixtures for the telemetry tests: a clean OTEL_* environment, an exact clock, a traced Telemetry."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from server.telemetry import spans as spans_module
from server.telemetry.service import Telemetry
from tests.support.telemetry import OTEL_VARS, Clock, settings


@pytest.fixture(autouse=True)
def clean_otel_env(monkeypatch):
    """Each test decides its own OTEL_* configuration; the runner's environment must not leak in."""
    for name in OTEL_VARS:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def clock(monkeypatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(spans_module, "_clock", fake)
    return fake


@pytest.fixture
def traced():
    exporter = InMemorySpanExporter()
    reader = InMemoryMetricReader()
    tel = Telemetry(settings(), span_exporter=exporter, metric_reader=reader)
    yield tel, exporter, reader
    tel.shutdown()
