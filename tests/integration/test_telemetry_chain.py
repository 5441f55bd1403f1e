"""The whole chain exporting to a loopback OTLP receiver: our spans and Switchyard's in one trace."""

from __future__ import annotations

import httpx

from tests.support.otlp_receiver import OtlpReceiver
from tests.support.stack import launch_stack

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


def test_one_trace_per_call_across_this_server_and_switchyard(mock_upstream, tmp_path):
    with OtlpReceiver() as receiver:
        # The hosted Switchyard reads OTEL_SERVICE_NAME too; otel_service_name names only this server.
        env = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
            "OTEL_SERVICE_NAME": "switchyard-hosted",
            "OTEL_BSP_SCHEDULE_DELAY": "100",
            "RUST_LOG": "info",
        }
        config = tmp_path / "cfg.yaml"
        config.write_text("otel_service_name: switchyard-model-test\n")
        stack = launch_stack(mock_upstream, tmp_path / "cap", "--config", str(config), env=env)
        try:
            response = httpx.post(
                stack.v1 + "/responses",
                timeout=30,
                headers={
                    "x-session-id": "otel-chain-1",
                    "x-parent-session-id": "otel-root",
                    "traceparent": f"00-{CALLER_TRACE}-00f067aa0ba902b7-01",
                },
                json={"model": "x", "input": "hello", "stream": True},
            )
            assert response.status_code == 200
        finally:
            stack.proc.stop()  # flushes our exporter and closes Switchyard (which flushes its own)
        spans = receiver.wait_for(
            lambda: (
                (s := receiver.spans(CALLER_TRACE))
                and {x.service_name for x in s} >= {"switchyard-model-test", "switchyard-hosted"}
                and s
            )
        )
    assert spans, [(s.service_name, s.name) for s in receiver.spans()]
    ours = [s for s in spans if s.service_name == "switchyard-model-test"]
    theirs = [s for s in spans if s.service_name != "switchyard-model-test"]
    server = next(s for s in ours if s.kind == "SERVER")
    client = next(s for s in ours if s.kind == "CLIENT")
    assert server.parent_span_id == "00f067aa0ba902b7"  # the caller's span is the parent
    assert client.parent_span_id == server.span_id
    assert server.name == "POST /v1/responses" and client.name == "chat demo"
    assert client.attributes["gen_ai.response.model"] == "mock-model"
    # Switchyard exports into the same trace, so its model-call span alone carries the usage.
    with_usage = [s for s in spans if "gen_ai.usage.output_tokens" in s.attributes]
    assert [s.service_name for s in with_usage] == ["switchyard-hosted"], [(s.name, s.service_name) for s in spans]
    for span in (server, client):
        assert span.attributes["gen_ai.conversation.id"] == span.attributes["session.id"] == "otel-chain-1"
        assert span.attributes["switchyard_model.parent_session.id"] == "otel-root"
    switchyard_root = next(s for s in theirs if s.parent_span_id == client.span_id)
    assert any(
        s.attributes.get("session.id") == "otel-chain-1" or s.attributes.get("gen_ai.conversation.id") == "otel-chain-1"
        for s in theirs
    ), [(s.name, s.attributes) for s in theirs]
    assert switchyard_root.trace_id == CALLER_TRACE
