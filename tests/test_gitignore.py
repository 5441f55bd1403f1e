"""What the quickstart makes in a checkout (the default capture folder, the export file) is git-ignored."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from server.config import Settings

REPO = Path(__file__).resolve().parent.parent


def ignored(path: str) -> bool:
    # --no-index: the answer depends on .gitignore alone, not on what happens to be tracked.
    result = subprocess.run(["git", "check-ignore", "-q", "--no-index", path], cwd=REPO, check=False)
    assert result.returncode in (0, 1), result
    return result.returncode == 0


pytestmark = pytest.mark.skipif(
    shutil.which("git") is None or not (REPO / ".git").exists(), reason="not a git checkout"
)


def test_the_default_capture_folder_is_ignored():
    assert ignored(Settings.model_fields["capture_dir"].default + "/sessions/0123abcd/record.json")


def test_every_export_file_the_docs_write_is_ignored():
    outs = set()
    for doc in [REPO / "README.md", *(REPO / "docs").glob("*.md")]:
        outs.update(re.findall(r"sessions export\b[^\n]*?--out\s+([\w./-]+\.\w+)", doc.read_text()))
    assert "rollouts.jsonl" in outs  # the quickstart's
    for out in outs:
        assert ignored(out), out


def test_the_check_can_fail():
    assert not ignored("server/app.py")


def test_the_gym_launcher_venv_and_its_cache_are_ignored():
    """`make gym-launcher`'s venv and the uv cache and server venvs tests/support/gym_launcher.py keeps."""
    assert ignored(".venv-gym/.installed-0.7.0")
    assert ignored(".cache/gym/venvs/0123abcd/responses_api_models/switchyard_model/.venv/bin/python")
    assert ignored(".cache/gym/uv/wheels-v5/index")
