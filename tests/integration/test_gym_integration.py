"""NeMo Gym drop-in use: the Gym-shaped YAML in both modes, run provenance, max_model_len discovery."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import httpx

from tests.support.procs import REPO, Proc, free_port, start_mock_upstream, start_server, start_switchyard_host

GYM_YAML = str(REPO / "profiles" / "gym.yaml")


def gym_call(url: str, rollout_id: str) -> dict:
    response = httpx.post(
        f"{url}/ng-rollout/{rollout_id}/v1/responses",
        timeout=30,
        json={"model": "caller-supplied", "input": [{"role": "user", "content": "hi"}]},
    )
    assert response.status_code == 200, response.text
    return response.json()


def test_gym_yaml_launch_mode_with_provenance(mock_upstream, tmp_path):
    condition = tmp_path / "condition"
    env = {
        "SWITCHYARD_DEPLOYMENT": "demo",
        "SWITCHYARD_CONDITION_DIR": str(condition),
        "MOCK_UPSTREAM_URL": mock_upstream + "/v1",
        "SWITCHYARD_MODEL_CAPTURE_DIR": str(tmp_path / "cap"),
    }
    proc, url = start_server("--config", GYM_YAML, env=env)
    try:
        assert httpx.get(url + "/health").json()["mode"] == "launch-hosted"
        body = gym_call(url, "task0-r1-a0")
        assert body["model"] == "mock-model" and body["usage"]["input_tokens_details"]["cached_tokens"] == 0
        manifest = json.loads((condition / "switchyard-condition.json").read_text())
        assert manifest["route"] == "demo" and manifest["mode"] == "hosted"
        assert manifest["nemo_switchyard_version"] == "0.3.0"
        assert manifest["deployment_path"].endswith("profiles/demo.toml")
        # Gym's hash: the deployment file's bytes on disk, so `sha256sum` on the file agrees.
        assert (
            manifest["deployment_sha256"] == hashlib.sha256(Path(manifest["deployment_path"]).read_bytes()).hexdigest()
        )
        sessions = httpx.get(url + "/v1/sessions").json()["sessions"]
        assert [s["session_id"] for s in sessions] == ["task0-r1-a0"]
    finally:
        proc.stop()
    stats = json.loads((condition / "switchyard-stats.json").read_text())
    assert stats["mode"] == "hosted" and stats["scope"].startswith("this run")  # Gym's shape
    assert stats["stats"]["models"]["mock-model"]["calls"] == 1  # snapshot taken at shutdown, before the proxy closed


def test_gym_yaml_attach_mode(mock_upstream, tmp_path):
    host, switchyard_v1 = start_switchyard_host(mock_upstream)
    try:
        env = {
            "SWITCHYARD_BASE_URL": switchyard_v1,
            "SWITCHYARD_MODEL": "demo",
            "SWITCHYARD_MODEL_CAPTURE_DIR": str(tmp_path / "cap"),
        }
        proc, url = start_server("--config", GYM_YAML, env=env)
        try:
            assert httpx.get(url + "/health").json()["mode"] == "attach"
            assert gym_call(url, "task1-r0")["model"] == "mock-model"
        finally:
            proc.stop()
    finally:
        host.stop()


def test_max_model_len_discovered_from_a_vllm_upstream(tmp_path):
    mock, mock_url = start_mock_upstream()
    mock.stop()
    mock = Proc(
        [
            sys.executable,
            "-m",
            "server.dev.mock_upstream",
            "--port",
            mock_url.rsplit(":", 1)[1],
            "--max-model-len",
            "12345",
        ]
    )
    deployment = tmp_path / "nocontext.toml"
    deployment.write_text(f"""schema_version = 1
[llm_clients.vllm]
format = "openai_chat"
base_url = "{mock_url}/v1"
[targets.policy]
id = "mock-model"
llm_client = "vllm"
[routes.policy]
id = "policy"
type = "passthrough"
target = "policy"
""")
    try:
        mock.wait_http(mock_url + "/health")
        proc, url = start_server("--deployment", str(deployment), "--no-capture")
        try:
            models = httpx.get(url + "/v1/models").json()["data"]
            assert models == [
                {"id": "policy", "object": "model", "created": 0, "owned_by": "switchyard", "max_model_len": 12345}
            ]
        finally:
            proc.stop()
    finally:
        mock.stop()


def test_started_the_way_gym_starts_a_model_server(mock_upstream, tmp_path):
    """`NEMO_GYM_CONFIG_DICT=<merged yaml> NEMO_GYM_CONFIG_PATH=<instance> python app.py` in the drop-in dir."""
    import yaml

    port = free_port()
    merged = {
        "policy_model_name": "demo",
        "policy_model": {
            "responses_api_models": {
                "switchyard_model": {
                    "entrypoint": "app.py",
                    "host": "127.0.0.1",
                    "port": port,
                    "name": "policy_model",
                    "switchyard_model": "${policy_model_name}",
                    "deployment": "demo",
                    "capture_dir": str(tmp_path / "cap"),
                }
            }
        },
        "other_server": {"resources_servers": {"x": {"api_key": "not-ours"}}},
    }
    drop_in = REPO / "profiles" / "gym" / "responses_api_models" / "switchyard_model"
    proc = Proc(
        [sys.executable, "app.py"],
        cwd=drop_in,
        env={
            "NEMO_GYM_CONFIG_DICT": yaml.safe_dump(merged),
            "NEMO_GYM_CONFIG_PATH": "policy_model",
            "MOCK_UPSTREAM_URL": mock_upstream + "/v1",
            "PYTHONPATH": str(REPO),
        },
    )
    try:
        url = f"http://127.0.0.1:{port}"
        proc.wait_http(url + "/")
        assert httpx.get(url + "/").json() == {"status": "ok"}  # Gym's liveness probe
        assert httpx.get(url + "/health").json()["route"] == "demo"
        assert gym_call(url, "task7-r0")["model"] == "mock-model"
        assert (tmp_path / "cap" / "sessions").is_dir()
    finally:
        proc.stop()
