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


@pytest.mark.parametrize(
    "requirement, dependency",
    [
        ("-e /abs/checkout", "switchyard-model @ file:///abs/checkout"),
        ("/abs/checkout", "switchyard-model @ file:///abs/checkout"),
        ("switchyard-model @ file:///w/switchyard_model-0.1.0-py3-none-any.whl", None),
        ("switchyard-model==0.1.0", None),
    ],
)
def test_the_dependency_names_its_own_source(requirement, dependency):
    assert gym_dir.dependency(requirement) == (dependency or requirement)


@pytest.mark.parametrize("requirement", ["-e ../../checkout", "-e .", "./checkout", "-r other.txt"])
def test_a_requirement_gym_cannot_install_from_its_venv_is_refused(requirement):
    with pytest.raises(ValueError):
        gym_dir.dependency(requirement)


def test_the_directory_replaces_gyms_files_and_an_earlier_requirements_txt(tmp_path, capsys):
    import argparse
    import tomllib

    target = tmp_path / "responses_api_models" / "switchyard_model"
    (target / "configs").mkdir(parents=True)
    (target / "pyproject.toml").write_text('[project]\nname = "switchyard-model"\n')  # Gym's own
    (target / "requirements.txt").write_text("-e /abs/old\n")  # an earlier gym-dir's
    (target / "README.md").write_text("Gym's")
    assert gym_dir.run_gym_dir(argparse.Namespace(directory=str(target), requirement="-e /abs/checkout")) == 0
    assert sorted(p.name for p in target.iterdir()) == ["README.md", "app.py", "configs", "pyproject.toml"]
    written = tomllib.loads((target / "pyproject.toml").read_text())
    assert written["project"]["name"] != "switchyard-model"  # its dependency, not itself
    assert written["project"]["dependencies"] == ["nemo-gym[dev]", "switchyard-model @ file:///abs/checkout"]
    assert written["tool"]["setuptools"]["packages"] == [] and "uv" not in written["tool"]
    assert (target / "app.py").read_text() == (gym_dir.DROP_IN / "app.py").read_text()
    assert (target / "configs" / "switchyard_model.yaml").exists()
    out = capsys.readouterr().out
    assert "replaced or removed: pyproject.toml, requirements.txt" in out
    bad = argparse.Namespace(directory=str(tmp_path / "x"), requirement="-e ../../checkout")
    assert gym_dir.run_gym_dir(bad) == 2
    assert "give an absolute path" in capsys.readouterr().err
