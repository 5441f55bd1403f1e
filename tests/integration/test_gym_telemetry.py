"""Gym's telemetry on the calling side, this server started as Gym starts it: one call, one trace, the right parent edge.

The model is nemo-lens's `test_propagation.py`: two apps, one request, one trace id, and the callee's
span a child of the caller's. Here the caller is Gym 0.7.0's own code, in the Gym launcher venv
(tests/support/gym_caller.py): the server environment comes from Gym's `configure_telemetry_env` (what
`gym env start` puts into every server's), and the call goes through Gym's traced request, which opens a
CLIENT span and injects its `traceparent`. This server runs from its Gym entrypoint (the drop-in
`app.py`, Gym's merged config in `NEMO_GYM_CONFIG_DICT`) with that environment. Both export over OTLP
gRPC (Gym's default: no protocol is set) to the test's receiver.

The negative control is built in: a server that does not follow Gym's environment exports over HTTP
(or not at all) and the gRPC receiver gets none of its spans; Gym's switch off is checked in
tests/unit/telemetry/test_gym_environment.py.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from server.cli.gym_dir import DROP_IN
from tests.support import gym_launcher
from tests.support.procs import REPO, Proc, free_port, wait_for

GYM_PYTHON = str(gym_launcher.GYM_VENV / "bin" / "python")

pytestmark = [
    pytest.mark.skipif(gym_launcher.not_available() is not None, reason=str(gym_launcher.not_available())),
    pytest.mark.skipif(
        importlib.util.find_spec("opentelemetry.exporter.otlp.proto.grpc") is None,
        reason="opentelemetry-exporter-otlp-proto-grpc (a dependency of this package) is not installed in this venv",
    ),
]


def gym_started_server(port: int, capture_dir: Path, environment: dict[str, str], upstream: str) -> Proc:
    """This server as Gym starts it: `python app.py` in its directory, Gym's config in the environment."""
    block = yaml.safe_load((DROP_IN / "configs" / "switchyard_model.yaml").read_text())["policy_model"]
    block = block["responses_api_models"]["switchyard_model"]
    merged = {
        "policy_model_name": "demo",
        "observability_enabled": True,
        "model_call_capture_dir": str(capture_dir / "gym-calls"),
        "policy_model": {
            "responses_api_models": {
                "switchyard_model": {**block, "host": "127.0.0.1", "port": port, "name": "policy_model"}
            }
        },
    }
    return Proc(
        [sys.executable, "app.py"],
        cwd=DROP_IN,
        env={
            **environment,
            "NEMO_GYM_CONFIG_DICT": yaml.safe_dump(merged),
            "NEMO_GYM_CONFIG_PATH": "policy_model",
            "SWITCHYARD_DEPLOYMENT": "demo",
            "MOCK_UPSTREAM_URL": upstream + "/v1",
            "SWITCHYARD_MODEL_CAPTURE_DIR": str(capture_dir),
            "PYTHONPATH": str(REPO),
            "OTEL_BSP_SCHEDULE_DELAY": "100",
        },
    )


def test_this_servers_spans_are_children_of_gyms_client_span_in_one_trace(tmp_path, mock_upstream):
    spans_file, port_file = tmp_path / "spans.jsonl", tmp_path / "otlp-port"
    receiver = Proc(
        [GYM_PYTHON, str(REPO / "tests/support/otlp_grpc_receiver.py"), "--out", str(spans_file)]
        + ["--port-file", str(port_file)],
        env={"PYTHONPATH": ""},
    )
    server = None
    try:
        assert wait_for(port_file.exists, timeout=60), receiver.output()
        endpoint = f"http://127.0.0.1:{port_file.read_text()}"
        made = subprocess.run(
            [GYM_PYTHON, str(REPO / "tests/support/gym_caller.py"), "env", "--endpoint", endpoint],
            capture_output=True,
            text=True,
            check=True,
            env={"PATH": "/usr/bin:/bin"},
        )
        environment = json.loads(made.stdout)  # what Gym's launcher puts into each server's environment
        assert environment["OTEL_EXPORTER_OTLP_ENDPOINT"] == endpoint
        assert "OTEL_EXPORTER_OTLP_PROTOCOL" not in environment  # gRPC, Gym's default
        run_id = environment["NEMO_GYM_OTEL_RUN_ID"]

        port = free_port()
        server = gym_started_server(port, tmp_path / "captures", environment, mock_upstream)
        url = f"http://127.0.0.1:{port}"
        server.wait_http(url + "/health")
        out = tmp_path / "call.json"
        subprocess.run(
            [GYM_PYTHON, str(REPO / "tests/support/gym_caller.py"), "call", "--url", url]
            + ["--rollout-id", "task3-r0", "--out", str(out)],
            env={**environment, "PATH": "/usr/bin:/bin", "OTEL_BSP_SCHEDULE_DELAY": "100"},
            cwd=tmp_path,
            check=True,
            timeout=120,
            capture_output=True,
        )
        assert json.loads(out.read_text())["status"] == 200

        def received() -> list[dict]:
            return [json.loads(line) for line in spans_file.read_text().splitlines()] if spans_file.exists() else []

        def both() -> tuple[list[dict], list[dict]] | None:
            spans = received()
            callers = [s for s in spans if s["service_name"] == "nemo-gym/caller_agent" and s["kind"] == "CLIENT"]
            ours = [s for s in spans if s["service_name"] == "nemo-gym/policy_model"]
            return (callers, ours) if callers and len(ours) >= 2 else None

        found = wait_for(both, timeout=30)
        assert found, [(s["service_name"], s["name"]) for s in received()]
        (caller,), ours = found
        (server_span,) = [s for s in ours if s["kind"] == "SERVER"]
        assert server_span["trace_id"] == caller["trace_id"]  # one trace
        assert server_span["parent_span_id"] == caller["span_id"]  # the right edge
        assert server_span["attributes"]["session.id"] == "task3-r0"
        for span in ours:
            assert span["trace_id"] == caller["trace_id"]
            assert span["resource"]["nemo.run.id"] == run_id == caller["resource"]["nemo.run.id"]
            assert span["resource"]["nemo.gym.server.name"] == "policy_model"
    finally:
        if server is not None:
            server.stop()
        receiver.stop()
