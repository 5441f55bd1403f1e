"""`switchyard-model gym-dir`: the requirement written is one Gym's setup keeps, for each way of installing."""

from __future__ import annotations

import json

import pytest

from server.cli import gym_dir


class FakeDistribution:
    def __init__(self, direct_url: dict | None, version: str = "0.1.0") -> None:
        self._direct_url = direct_url
        self.version = version

    def read_text(self, name: str) -> str | None:
        return json.dumps(self._direct_url) if name == "direct_url.json" and self._direct_url else None


@pytest.mark.parametrize(
    "origins, expected",
    [
        # A checkout installed editable; its build's egg-info (no origin) found first on the path.
        ([None, {"url": "file:///src/switchyard-model", "dir_info": {"editable": True}}], "-e /src/switchyard-model"),
        ([{"url": "file:///src/switchyard-model", "dir_info": {}}], "switchyard-model @ file:///src/switchyard-model"),
        (
            [{"url": "file:///wheels/switchyard_model-0.1.0-py3-none-any.whl", "archive_info": {}}],
            "switchyard-model @ file:///wheels/switchyard_model-0.1.0-py3-none-any.whl",
        ),
        ([None], "switchyard-model==0.1.0"),  # from an index: its version
    ],
)
def test_own_requirement(monkeypatch, origins, expected):
    found = [FakeDistribution(origin) for origin in origins]
    monkeypatch.setattr(gym_dir.importlib.metadata, "distributions", lambda name: iter(found))
    assert gym_dir.own_requirement() == expected


def test_the_directory_and_a_requirement_gym_would_drop(tmp_path, capsys):
    import argparse

    target = tmp_path / "responses_api_models" / "switchyard_model"
    assert gym_dir.run_gym_dir(argparse.Namespace(directory=str(target), requirement="-e /abs/checkout")) == 0
    lines = (target / "requirements.txt").read_text().splitlines()
    assert lines[1:] == ["-e nemo-gym[dev] @ ../../", "-e /abs/checkout"]
    assert (target / "app.py").read_text() == (gym_dir.DROP_IN / "app.py").read_text()
    assert (target / "configs" / "switchyard_model.yaml").exists()
    bad = argparse.Namespace(directory=str(tmp_path / "x"), requirement="-e ../../checkout")
    assert gym_dir.run_gym_dir(bad) == 2
    assert "drops requirement lines holding '../..'" in capsys.readouterr().err
