"""Gym's own setup installs the directory `switchyard-model gym-dir` writes, in Gym's own tree, and the server starts.

Gym 0.7.0's wheel ships `responses_api_models/switchyard_model/` with a `pyproject.toml` of its own;
the tests copy that shipped directory into a Gym tree of their own and run gym-dir over it. Gym's
`setup_env_command` (nemo_gym/cli/setup_command.py, 0.7.0) then builds the install, as Gym would:
it refuses a directory with both a `pyproject.toml` and a `requirements.txt` (the negative control:
what gym-dir wrote before, seen only in the real tree), and the part of its install that concerns
this project (`uv pip install --no-sources -e .` and the dependencies the written pyproject names)
is executed into a fresh venv with pip. Gym's module imports Hydra/OmegaConf configuration types
only for annotations and constants, so those two imports are stood in for.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import types
from pathlib import Path

import httpx
import pytest
import yaml

from tests.support.procs import REPO, Proc, free_port


def gyms_setup_command():
    """Gym 0.7.0's `setup_env_command`, loaded from the installed wheel."""
    nemo_gym = pytest.importorskip("nemo_gym", reason="NeMo Gym 0.7.0 is installed by `make venv`")
    package = Path(nemo_gym.__file__).parent
    constants = dict(re.findall(r'^([A-Z_]+_KEY_NAME) = "([^"]+)"', (package / "global_config.py").read_text(), re.M))
    stand_ins = {
        "omegaconf": types.SimpleNamespace(DictConfig=dict),
        "nemo_gym.global_config": types.SimpleNamespace(**constants, get_global_config_dict=dict),
    }
    saved = {name: sys.modules.get(name) for name in stand_ins}
    sys.modules.update(stand_ins)  # type: ignore[arg-type]
    try:
        spec = importlib.util.spec_from_file_location("gym_setup_command", package / "cli" / "setup_command.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        for name, previous in saved.items():
            if previous is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = previous
    return module, nemo_gym.PARENT_DIR


def install_command(server_dir: Path) -> str:
    """The shell command Gym's setup runs in the server directory to install it."""
    setup, parent_dir = gyms_setup_command()
    config = {
        "head_server_deps": [],
        "uv_venv_dir": str(parent_dir),  # the default: the venv goes into the server directory
        "python_version": "3.11",
        "skip_venv_if_present": False,
    }
    command = setup.setup_env_command(server_dir, config, "policy_model")
    argv = shlex.split(command.split(" && ", 1)[1].rsplit(" && source", 1)[0])
    return argv[argv.index("--command") + 1]


def shipped_switchyard_dir() -> Path:
    """Gym 0.7.0's own `responses_api_models/switchyard_model/`, as its wheel installs it."""
    spec = importlib.util.find_spec("responses_api_models")
    assert spec is not None and spec.submodule_search_locations, "Gym's responses_api_models is not installed"
    shipped = Path(next(iter(spec.submodule_search_locations))) / "switchyard_model"
    assert (shipped / "pyproject.toml").exists() and (shipped / "app.py").exists()
    return shipped


def gym_tree(root: Path) -> Path:
    """A Gym tree holding Gym's shipped switchyard_model directory; returns that directory."""
    server_dir = root / "responses_api_models" / "switchyard_model"
    shutil.copytree(shipped_switchyard_dir(), server_dir, ignore=shutil.ignore_patterns("__pycache__"))
    return server_dir


def gym_dir(server_dir: Path, *extra: str) -> None:
    subprocess.run(
        [sys.executable, "-m", "server.cli", "gym-dir", str(server_dir), *extra],
        cwd=REPO,
        check=True,
        capture_output=True,
    )


def test_gyms_setup_refuses_the_former_layout_in_its_own_tree_and_an_empty_fake_hides_it(tmp_path):
    """The negative control: gym-dir used to add requirements.txt beside Gym's shipped pyproject.toml."""
    gyms_setup_command()  # skips without Gym
    server_dir = gym_tree(tmp_path / "gym")
    (server_dir / "requirements.txt").write_text("-e nemo-gym[dev] @ ../../\n-e /abs/checkout\n")
    with pytest.raises(RuntimeError, match="Found both pyproject.toml and requirements.txt"):
        install_command(server_dir)
    fake = tmp_path / "fake" / "responses_api_models" / "switchyard_model"
    fake.mkdir(parents=True)
    (fake / "requirements.txt").write_text("-e nemo-gym[dev] @ ../../\n-e /abs/checkout\n")
    assert "requirements.txt" in install_command(fake)  # an empty tree never shows the failure


def test_gyms_setup_installs_gym_dir_over_gyms_own_tree_and_the_server_starts(tmp_path, mock_upstream):
    gym_root = tmp_path / "gym"
    server_dir = gym_tree(gym_root)
    (server_dir / "requirements.txt").write_text("-e /left/by/an/earlier/gym-dir\n")
    gym_dir(server_dir, "--requirement", f"-e {REPO}")
    assert not (server_dir / "requirements.txt").exists()
    written = tomllib.loads((server_dir / "pyproject.toml").read_text())
    assert written["project"]["dependencies"] == ["nemo-gym[dev]", f"switchyard-model @ {REPO.as_uri()}"]

    # Gym installed from its wheel: nemo-gym from the index, then this directory without its sources.
    command = install_command(server_dir)
    assert re.search(r"uv pip install .*nemo-gym==[0-9.]+ && uv pip install .*--no-sources '-e \.'", command), command

    # What that command installs, into a fresh venv whose other dependencies are borrowed from the
    # test venv: the directory itself, built as Gym builds it (`-e .`, setuptools from the index in
    # an isolated build), and the dependencies it names other than Gym.
    venv = tmp_path / "server-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    site = Path(
        subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    (site / "borrowed.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    others = [dep for dep in written["project"]["dependencies"] if not dep.startswith("nemo-gym")]
    for target in (["-e", "."], *[[dep] for dep in others]):
        subprocess.run(
            [sys.executable, "-m", "pip", "--python", python, "install", "--quiet", "--no-deps", *target],
            cwd=server_dir,
            check=True,
            capture_output=True,
        )

    # Gym's launcher: the merged config as Gym hands it over (interpolations unresolved), holding the
    # written config file's top level (observability on) and the launcher's absolute results_dir.
    port = free_port()
    config = yaml.safe_load((server_dir / "configs" / "switchyard_model.yaml").read_text())
    block = config.pop("policy_model")["responses_api_models"]["switchyard_model"]
    results = tmp_path / "results"
    merged = {
        **config,
        "results_dir": str(results),
        "policy_model_name": "demo",
        "policy_model": {
            "responses_api_models": {
                "switchyard_model": {**block, "host": "127.0.0.1", "port": port, "name": "policy_model"}
            }
        },
    }
    assert merged["observability_enabled"] is True
    proc = Proc(
        [python, "app.py"],
        cwd=server_dir,
        env={
            "NEMO_GYM_CONFIG_DICT": yaml.safe_dump(merged),
            "NEMO_GYM_CONFIG_PATH": "policy_model",
            "SWITCHYARD_DEPLOYMENT": "demo",
            "MOCK_UPSTREAM_URL": mock_upstream + "/v1",
            "PYTHONPATH": "",
        },
    )
    try:
        url = f"http://127.0.0.1:{port}"
        proc.wait_http(url + "/health")
        reply = httpx.post(url + "/ng-rollout/0-0/v1/responses", json={"model": "m", "input": "hi"}, timeout=30)
        assert reply.status_code == 200 and reply.json()["model"] == "mock-model"
        session = httpx.get(url + "/v1/sessions/0-0/completions", timeout=30)
        assert session.status_code == 200 and len(session.json()["completions"]) == 1
    finally:
        proc.stop()
    assert "is not installed in this server's venv" not in proc.output()
    # Captured with the run's outputs: Gym's model-call capture and this server's folder beside it.
    assert (results / "model-calls" / "0-0.capture.jsonl").exists()
    assert (results / "model-calls" / "switchyard-captures" / "sessions").is_dir()
    assert not (server_dir / "switchyard-captures").exists()


def test_inside_an_editable_gym_checkout_gym_installs_it_with_nemo_gym_from_the_checkout(tmp_path):
    gym_root = tmp_path / "gym"
    server_dir = gym_tree(gym_root)
    (gym_root / "pyproject.toml").write_text('[project]\nname = "nemo-gym"\n')
    gym_dir(server_dir, "--requirement", "-e /abs/checkout")
    command = install_command(server_dir)
    assert "'-e .'" in command and "--no-sources" not in command
    sources = tomllib.loads((server_dir / "pyproject.toml").read_text())["tool"]["uv"]["sources"]
    assert (server_dir / sources["nemo-gym"]["path"] / "pyproject.toml").resolve() == gym_root / "pyproject.toml"


def test_a_root_of_its_own_installs_the_same_way_without_gyms_sources(tmp_path):
    server_dir = tmp_path / "extra-root" / "responses_api_models" / "switchyard_model"
    gym_dir(server_dir, "--requirement", "switchyard-model==0.1.0")
    assert sorted(p.name for p in server_dir.iterdir()) == ["app.py", "configs", "pyproject.toml"]
    assert "--no-sources '-e .'" in install_command(server_dir)
    written = tomllib.loads((server_dir / "pyproject.toml").read_text())
    assert "tool" not in written or "uv" not in written["tool"]
    assert written["project"]["dependencies"][1] == "switchyard-model==0.1.0"
