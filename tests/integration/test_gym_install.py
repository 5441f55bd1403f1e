"""Gym's own setup installs the directory `switchyard-model gym-dir` writes, and the server starts from that venv.

Gym's `setup_env_command` (nemo_gym/cli/setup_command.py, 0.7.0) builds the install; it is run here
on the written directory, as Gym would, and the part of the install that concerns this project (the
requirement lines Gym keeps) is executed into a fresh venv. Gym's module imports Hydra/OmegaConf
configuration types only for annotations and constants, so those two imports are stood in for.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import subprocess
import sys
import sysconfig
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


def kept_requirements(server_dir: Path, command: str) -> list[str]:
    """Run the part of Gym's install that reads this directory: the requirement lines it keeps."""
    match = re.search(r"\(echo '([^']+)' && (grep [^)]*requirements\.txt)\)", command)
    assert match, command
    assert match.group(1).startswith("nemo-gym")  # Gym installs itself beside them
    kept = subprocess.run(["bash", "-c", match.group(2)], cwd=server_dir, capture_output=True, text=True)
    assert kept.returncode in (0, 1), kept.stderr  # grep: 1 is "no line kept"
    return [line for line in kept.stdout.splitlines() if line.strip() and not line.startswith("#")]


def test_gyms_setup_installs_the_written_directory_and_the_server_starts(tmp_path, mock_upstream):
    root = tmp_path / "extra-root"  # as found through NEMO_GYM_EXTRA_ROOTS / --search-dir
    server_dir = root / "responses_api_models" / "switchyard_model"
    subprocess.run([sys.executable, "-m", "server.cli", "gym-dir", str(server_dir)], cwd=REPO, check=True)
    assert sorted(p.name for p in server_dir.iterdir()) == ["app.py", "configs", "requirements.txt"]

    command = install_command(server_dir)
    kept = kept_requirements(server_dir, command)
    assert kept and not any("../.." in line for line in kept)
    # The control: the drop-in's former requirement, a relative path to the checkout, is dropped by Gym.
    former = tmp_path / "former"
    former.mkdir()
    (former / "requirements.txt").write_text("-e ../../../..\n")
    assert kept_requirements(former, command) == []

    # A fresh venv, its dependencies borrowed from the test venv, installed from exactly the lines Gym
    # keeps (pip's isolated build takes setuptools from the package index).
    venv = tmp_path / "server-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = Path(
        subprocess.run(
            [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    (site / "borrowed.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    (tmp_path / "kept.txt").write_text("\n".join(kept) + "\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "--quiet", "--no-deps"]
        + ["-r", str(tmp_path / "kept.txt")],
        cwd=server_dir,
        check=True,
        capture_output=True,
    )

    port = free_port()
    merged = {
        "policy_model_name": "demo",
        "policy_model": {
            "responses_api_models": {
                "switchyard_model": {
                    **yaml.safe_load((server_dir / "configs" / "switchyard_model.yaml").read_text())["policy_model"][
                        "responses_api_models"
                    ]["switchyard_model"],
                    "host": "127.0.0.1",
                    "port": port,
                    "name": "policy_model",
                }
            }
        },
    }
    proc = Proc(
        [str(venv / "bin" / "python"), "app.py"],
        cwd=server_dir,
        env={
            "NEMO_GYM_CONFIG_DICT": yaml.safe_dump(merged),
            "NEMO_GYM_CONFIG_PATH": "policy_model",
            "SWITCHYARD_DEPLOYMENT": "demo",
            "MOCK_UPSTREAM_URL": mock_upstream + "/v1",
            "SWITCHYARD_MODEL_CAPTURE_DIR": str(tmp_path / "captures"),
            "PYTHONPATH": "",
        },
    )
    try:
        url = f"http://127.0.0.1:{port}"
        proc.wait_http(url + "/health")
        reply = httpx.post(url + "/v1/responses", json={"model": "m", "input": "hi"}, timeout=30)
        assert reply.status_code == 200 and reply.json()["model"] == "mock-model"
    finally:
        proc.stop()


def test_a_directory_inside_an_editable_gym_checkout_installs_every_line(tmp_path):
    """Inside an editable Gym tree Gym keeps every line, its own checkout's nemo-gym among them."""
    gym_root = tmp_path / "gym"
    (gym_root / "responses_api_models").mkdir(parents=True)
    (gym_root / "pyproject.toml").write_text('[project]\nname = "nemo-gym"\n')
    server_dir = gym_root / "responses_api_models" / "switchyard_model"
    subprocess.run([sys.executable, "-m", "server.cli", "gym-dir", str(server_dir)], cwd=REPO, check=True)
    command = install_command(server_dir)
    assert "-r requirements.txt" in command and "grep -v" not in command
    lines = [line for line in (server_dir / "requirements.txt").read_text().splitlines() if not line.startswith("#")]
    assert (
        lines[0] == "-e nemo-gym[dev] @ ../../" and (server_dir / lines[0].split("@ ")[1] / "pyproject.toml").exists()
    )
