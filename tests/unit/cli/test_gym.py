"""The Gym entrypoint's reading of Gym's merged config: Gym's global settings, and where captures go under Gym."""

from __future__ import annotations

import pytest
import yaml

from server.cli.gym import capture_dir_under_gym, instance_block


def block_of(doc: dict) -> dict:
    return instance_block(yaml.safe_dump(doc), "policy_model")["policy_model"]["responses_api_models"][
        "switchyard_model"
    ]


def merged(**top) -> dict:
    return {"policy_model": {"responses_api_models": {"switchyard_model": {"entrypoint": "app.py"}}}, **top}


def test_gyms_unresolved_references_to_its_top_level_are_resolved():
    block = block_of(
        merged(results_dir="/runs/r1", observability_enabled=True, model_call_capture_dir="${results_dir}/model-calls")
    )
    assert block["gym"]["model_call_capture_dir"] == "/runs/r1/model-calls"
    assert block["capture_dir"] == "/runs/r1/model-calls/switchyard-captures"


@pytest.mark.parametrize(
    "capture_dir, gym, expected",
    [
        (None, {"model_call_capture_dir": "/c", "results_dir": "/r"}, "/c/switchyard-captures"),
        (None, {"results_dir": "/r"}, "/r/switchyard-captures"),
        ("mine", {"results_dir": "/r"}, "/r/mine"),  # never the server's own directory
        ("/abs", {"results_dir": "/r"}, "/abs"),
        (None, {}, None),  # not Gym's launcher: the server's default
        ("mine", {}, "mine"),
    ],
)
def test_the_capture_folder_follows_gyms_settings(capture_dir, gym, expected):
    assert capture_dir_under_gym(capture_dir, gym) == expected


def test_the_written_config_turns_observability_on_with_gyms_results(monkeypatch):
    from tests.support.procs import REPO

    drop_in = REPO / "profiles" / "gym" / "responses_api_models" / "switchyard_model"
    monkeypatch.delenv("SWITCHYARD_MODEL_CAPTURE_DIR", raising=False)
    shipped = yaml.safe_load((drop_in / "configs" / "switchyard_model.yaml").read_text())
    block = block_of({**shipped, "results_dir": "/runs/r2", "policy_model_name": "policy"})
    assert block["gym"]["observability_enabled"] is True
    assert block["capture_dir"] == "/runs/r2/model-calls/switchyard-captures"
    monkeypatch.setenv("SWITCHYARD_MODEL_CAPTURE_DIR", "/elsewhere")
    assert block_of({**shipped, "results_dir": "/runs/r2"})["capture_dir"] == "/elsewhere"
