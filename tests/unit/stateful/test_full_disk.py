"""A response store that cannot set its state file up (a full disk) says which file, and what it needed."""

from __future__ import annotations

import os
import sqlite3
import subprocess

import pytest

from server.stateful import db as state_db
from server.stateful.service import Stateful
from tests.support.stateful_settings import stateful_settings


def assert_names_the_file_and_the_space(message: str, path) -> None:
    assert str(path / state_db.DB_NAME) in message
    assert "database or disk is full" in message
    assert "KiB free" in message and f"about {state_db.SETUP_BYTES // 1024} KiB" in message


def test_sqlites_full_disk_error_names_the_file_and_the_space_it_needed(tmp_path, monkeypatch):
    def full(*args, **kwargs):
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(state_db.sqlite3, "connect", full)
    service = Stateful(stateful_settings(tmp_path))
    with pytest.raises(RuntimeError) as caught:
        service.open()
    assert_names_the_file_and_the_space(str(caught.value), tmp_path)


def test_another_failure_names_the_file_without_talking_of_space(tmp_path, monkeypatch):
    def locked(*args, **kwargs):
        raise sqlite3.OperationalError("database is locked")

    monkeypatch.setattr(state_db.sqlite3, "connect", locked)
    with pytest.raises(RuntimeError) as caught:
        Stateful(stateful_settings(tmp_path)).open()
    message = str(caught.value)
    assert str(tmp_path / state_db.DB_NAME) in message and "database is locked" in message
    assert "KiB" not in message


@pytest.fixture
def tiny_filesystem(tmp_path):
    """A 64 KiB tmpfs, full but for what it holds (root only; skipped where mounting is not allowed)."""
    mount = tmp_path / "tiny"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode(errors='replace').strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def test_a_real_full_filesystem(tiny_filesystem):
    capture_dir = tiny_filesystem / "captures"
    service = Stateful(stateful_settings(capture_dir))
    with pytest.raises(RuntimeError) as caught:
        service.open()
    assert_names_the_file_and_the_space(str(caught.value), capture_dir)
