"""Switchyard's own spans join the trace under this server's CLIENT span (a hosted Switchyard in a child process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support.otlp_receiver import OtlpReceiver
from tests.support.procs import REPO
from tests.support.telemetry import (
    CALLER_SPAN_ID,
    CALLER_TRACE_ID,
    CALLER_TRACEPARENT,
    OTEL_VARS,
)


@pytest.fixture(autouse=True)
def clean_otel_env(monkeypatch):
    """The child gets this test's OTEL_* configuration only, not the runner's."""
    for name in OTEL_VARS:
        monkeypatch.delenv(name, raising=False)


# ---- joined with a real Switchyard ----------------------------------------------------------------------
_CHILD = r"""
import json, sys
import httpx
from middleware.correlation import Correlation
from server.telemetry.service import Telemetry
from switchyard_rust.server import Server

deployment, caller_traceparent = sys.argv[1], sys.argv[2]
tel = Telemetry()
assert tel.enabled, "OTLP endpoint not picked up"
body = {"model": "otel-route", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}
corr = Correlation(session_id="otel-session-1", parent_session_id="otel-parent-1")
span = tel.start_call(api="chat", route="otel-route", request=body, correlation=corr, stream=False,
                      scope={"headers": [(b"traceparent", caller_traceparent.encode())]})
server = Server(deployment, port=0)
tel.set_upstream(server.base_url)
headers = {"x-switchyard-session-id": "otel-session-1"}
span.upstream_headers(headers)
reply = httpx.post(server.base_url + "/v1/chat/completions", json=body, headers=headers, timeout=30)
span.finish(reply.json() if reply.status_code == 200 else None)
server.close(timeout_secs=2.0)  # Switchyard flushes its spans on close
tel.shutdown()
print(json.dumps({"traceparent": headers["traceparent"], "status": reply.status_code}))
"""


def test_switchyard_spans_join_the_trace_under_our_client_span(mock_upstream, tmp_path):
    deployment = tmp_path / "deploy.toml"
    deployment.write_text(
        "schema_version = 1\n"
        '[llm_clients.mock]\nformat = "openai_chat"\n'
        f'base_url = "{mock_upstream}/v1"\nmax_retries = 0\ntimeout_ms = 30000\n'
        '[targets.mock]\nid = "mock-model"\nllm_client = "mock"\n'
        '[routes.otel]\nid = "otel-route"\ntype = "passthrough"\ntarget = "mock"\n'
    )
    with OtlpReceiver() as receiver:
        # Switchyard reads OTEL_* once per process, at its first Server(): a fresh process it is.
        env = {**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint}
        # RUST_LOG filters Switchyard's spans as well as its log lines.
        for name in (
            "OTEL_SDK_DISABLED",
            "OTEL_TRACES_EXPORTER",
            "OTEL_TRACES_SAMPLER",
            "OTEL_SERVICE_NAME",
            "RUST_LOG",
        ):
            env.pop(name, None)
        done = subprocess.run(
            [sys.executable, "-c", _CHILD, str(deployment), CALLER_TRACEPARENT],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        result = json.loads(done.stdout.strip().splitlines()[-1])
        assert result["status"] == 200
        client_span_id = result["traceparent"].split("-")[2]

        def both_services():
            spans = receiver.spans(CALLER_TRACE_ID)
            services = {s.service_name for s in spans}
            return spans if {"switchyard-model", "switchyard-server"} <= services else None

        spans = receiver.wait_for(both_services, timeout=15)

    ours = {s.kind: s for s in spans if s.service_name == "switchyard-model"}
    theirs = [s for s in spans if s.service_name == "switchyard-server"]
    assert ours["SERVER"].parent_span_id == CALLER_SPAN_ID
    assert ours["CLIENT"].span_id == client_span_id
    assert ours["CLIENT"].parent_span_id == ours["SERVER"].span_id
    assert ours["CLIENT"].attributes["gen_ai.response.model"] == "mock-model"
    assert ours["CLIENT"].attributes["gen_ai.usage.output_tokens"] > 0
    # Switchyard's request span is the child of our CLIENT span; the rest hang below it.
    theirs_by_id = {s.span_id: s for s in theirs}
    roots = [s for s in theirs if s.parent_span_id not in theirs_by_id]
    assert [(s.name, s.parent_span_id) for s in roots] == [("switchyard.request", client_span_id)]
    session_values = {s.attributes.get(key) for s in theirs for key in ("session.id", "gen_ai.conversation.id")}
    assert "otel-session-1" in session_values
