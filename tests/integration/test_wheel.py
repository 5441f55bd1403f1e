"""The wheel works when installed: built from this checkout, installed non-editable into a fresh venv,
and run from a directory outside the checkout (so nothing can come from the source tree)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.procs import REPO


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A fresh venv with the wheel (and its `demo` extra) installed; returns its bin/ folder."""
    root = tmp_path_factory.mktemp("wheel")
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(root / "dist"), str(REPO)],
        check=True,
        cwd=root,
        capture_output=True,
        text=True,
    )
    # Every folder the wheel ships is declared, data folders too: setuptools warns of none it would drop.
    assert "would be ignored" not in build.stdout + build.stderr, build.stderr[-3000:]
    (wheel,) = (root / "dist").glob("switchyard_model-*.whl")
    subprocess.run([sys.executable, "-m", "venv", str(root / "venv")], check=True)
    bin_dir = root / "venv" / "bin"
    subprocess.run([str(bin_dir / "pip"), "install", "--quiet", f"{wheel}[demo]"], check=True, cwd=root)
    return bin_dir


def _run(bin_dir: Path, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    outside = bin_dir.parent.parent  # the temp folder: not the checkout, not on any path to it
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(
        [str(bin_dir / "switchyard-model"), *args],
        cwd=outside,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_installed_server_lists_the_shipped_profiles(installed):
    result = _run(installed, "profiles", "list", timeout=60)
    assert result.returncode == 0, result.stderr
    for name in ("demo", "vllm", "router", "gym"):
        assert name in result.stdout, result.stdout
    # The code really came from the venv, not from this checkout.
    where = subprocess.run(
        [str(installed / "python"), "-c", "import server.config as c; print(c.__file__); print(c.PROFILES_DIR)"],
        cwd=installed.parent.parent,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert all(str(REPO) not in line and "site-packages" in line for line in where), where


def test_the_demo_extra_installs_no_test_tooling(installed):
    # `make demo` installs the demo extra alone: a first run does not wait for Ray, a browser driver,
    # the harness frameworks or the type checker.
    listed = subprocess.run(
        [str(installed / "python"), "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True, check=True
    ).stdout.lower()
    names = {line.split("==")[0] for line in listed.split()}
    assert "openai" in names and "switchyard-model" in names, names
    assert not names & {"ray", "playwright", "inspect-ai", "inspect_ai", "mypy", "pytest"}, names


def test_make_demo_installs_only_the_demo_extra(tmp_path):
    planned = subprocess.run(
        ["make", "-n", "demo", f"VENV={tmp_path / 'venv'}"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    installs = [line for line in planned.splitlines() if "pip install" in line and "-e" in line]
    assert installs == [f"{tmp_path / 'venv'}/bin/python -m pip install --quiet -e '.[demo]'"], planned


def test_installed_demo_runs_the_whole_chain(installed):
    # Its captures beside the wheel's venv, not in /tmp, where the demo keeps them for the user to read.
    result = _run(installed, "demo", "--capture-dir", str(installed.parent.parent / "demo-captures"), timeout=240)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "rollout" in result.stdout.lower(), result.stdout[-3000:]
