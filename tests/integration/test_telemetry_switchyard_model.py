"""Telemetry through the real stack against a traces-only OTLP endpoint (as Phoenix and Langfuse are):
every LLM span names the model Switchyard says answered, and the hosted Switchyard exports no metrics."""

from __future__ import annotations

import httpx
import pytest

from tests.support.otlp_receiver import OtlpReceiver
from tests.support.stack import launch_stack

ROUTE = "demo"
# (path, body) of a call on each API this server translates or relays; each is sent stream and not.
CALLS = [
    ("/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
    ("/responses", {"input": "hi"}),
    ("/messages", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}),
]


def is_switchyards(request) -> bool:
    """Switchyard's own exporter (Rust) posted it; this server's probes and exporter are Python's."""
    return "Rust" in request.user_agent


def run_stack(mock_upstream, tmp_path, receiver: OtlpReceiver, **extra_env: str) -> tuple[list[str], str]:
    """Every call, stream and not, through a stack exporting to `receiver`: (selected-model headers, server log)."""
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "OTEL_METRIC_EXPORT_INTERVAL": "200",  # Switchyard's and ours: an export every 200 ms, were it on
        "RUST_LOG": "info",
        **extra_env,
    }
    stack = launch_stack(mock_upstream, tmp_path / "cap", env=env)
    selected = []
    try:
        for path, body in CALLS:
            for stream in (False, True):
                reply = httpx.post(
                    stack.v1 + path,
                    json={"model": ROUTE, **body, "stream": stream},
                    headers={"x-session-id": f"otel-model-{path.strip('/').replace('/', '-')}-{stream}"},
                    timeout=60,
                )
                assert reply.status_code == 200, reply.text
                selected.append(reply.headers["x-model-router-selected-model"])
    finally:
        stack.proc.stop()  # flushes our exporter; closing Switchyard flushes (and, were it on, exports) its own
    return selected, stack.proc.output()


def test_spans_name_the_answering_model_and_switchyard_exports_no_metrics(mock_upstream, tmp_path):
    with OtlpReceiver(traces_only=True) as receiver:
        selected, log = run_stack(mock_upstream, tmp_path, receiver)
        llm = receiver.wait_for(
            lambda: (
                (
                    s := [
                        x
                        for x in receiver.spans()
                        if x.attributes.get("openinference.span.kind") == "LLM" and x.service_name == "switchyard-model"
                    ]
                )
                and len(s) >= len(selected)
                and s
            )
        )
        requests = list(receiver.requests)
    assert set(selected) == {"mock-model"}  # Switchyard's word on which target answered
    assert [s.attributes["llm.model_name"] for s in llm] == ["mock-model"] * len(selected)  # one per call
    assert all(s.attributes["gen_ai.response.model"] == "mock-model" for s in llm)
    assert all(s.attributes["gen_ai.request.model"] == ROUTE for s in llm)
    # Switchyard's spans still go; its metrics do not, and it never complains about flushing them.
    assert any(is_switchyards(r) for r in requests if r.path == "/v1/traces")
    assert not [r for r in requests if r.path == "/v1/metrics" and is_switchyards(r)]
    assert "failed to flush OpenTelemetry metrics" not in log, log[-3000:]
    assert "Switchyard's metric export is off" in log


def test_negative_control_switchyard_exports_metrics_where_the_environment_says_so(mock_upstream, tmp_path):
    """With `OTEL_METRICS_EXPORTER=otlp` chosen outright, this server leaves Switchyard's exporter on:
    the receiver sees its metric exports (and Switchyard logs its flush failures), which the test above
    would catch."""
    with OtlpReceiver(traces_only=True) as receiver:
        _, log = run_stack(mock_upstream, tmp_path, receiver, OTEL_METRICS_EXPORTER="otlp")
        requests = list(receiver.requests)
    assert [r for r in requests if r.path == "/v1/metrics" and is_switchyards(r)]
    assert "failed to flush OpenTelemetry metrics" in log


@pytest.fixture(autouse=True)
def clean_otel_env(monkeypatch):
    """The stack gets this test's OTEL_* configuration only, not the runner's."""
    from tests.support.telemetry import OTEL_VARS

    for name in OTEL_VARS:
        monkeypatch.delenv(name, raising=False)
