"""LocalServer without a child process: settings checked before anything starts; the start semaphore."""

from __future__ import annotations

import os
import tempfile
import threading
import time

import pytest

from server import spawn
from server.config import ConfigError
from server.spawn import LocalServer
from tests.support.procs import dead_and_living_dirs


def test_bad_settings_fail_before_any_process_starts(tmp_path, monkeypatch):
    monkeypatch.setattr(spawn.subprocess, "Popen", lambda *a, **k: pytest.fail("a process was started"))
    with pytest.raises(ConfigError, match="upstream_timeout_s"):
        LocalServer(capture_dir=tmp_path, deployment="demo", upstream_timeout_s=-1)
    with pytest.raises(ConfigError, match="no_such_setting"):
        LocalServer(capture_dir=tmp_path, deployment="demo", no_such_setting=1)


def test_the_environment_does_not_override_explicit_settings(tmp_path, monkeypatch):
    monkeypatch.setenv("SWITCHYARD_MODEL_CAPTURE_DIR", "/somewhere/else")
    server = LocalServer(capture_dir=tmp_path / "mine", deployment="demo")
    assert server.settings.capture_dir == str((tmp_path / "mine").resolve())
    assert (server.settings.host, server.settings.port) == ("127.0.0.1", 0)


def test_a_bare_profile_name_stays_a_name_and_a_relative_path_becomes_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.toml").write_text("schema_version = 1\n")
    assert LocalServer(capture_dir="c", deployment="demo").settings.deployment == "demo"
    assert LocalServer(capture_dir="c", deployment="mine.toml").settings.deployment == str(tmp_path / "mine.toml")


def test_concurrent_starts_are_bounded_per_process(tmp_path, monkeypatch):
    starting = 0
    peak = 0
    lock = threading.Lock()

    def fake_spawn(self):
        nonlocal starting, peak
        with lock:
            starting += 1
            peak = max(peak, starting)

    def fake_wait_ready(self):
        nonlocal starting
        time.sleep(0.05)  # long enough for the other threads to pile up at the semaphore
        with lock:
            starting -= 1
        self.port = 1

    monkeypatch.setattr(LocalServer, "_spawn", fake_spawn)
    monkeypatch.setattr(LocalServer, "_wait_ready", fake_wait_ready)
    servers = [LocalServer(capture_dir=tmp_path / str(i), deployment="demo") for i in range(8)]

    def start_all() -> int:
        nonlocal peak
        peak = 0
        threads = [threading.Thread(target=s.start) for s in servers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return peak

    try:
        spawn.set_max_concurrent_starts(2)
        assert start_all() == 2
        spawn.set_max_concurrent_starts(8)  # negative control: with room for all, they do overlap
        assert start_all() > 2
    finally:
        spawn.set_max_concurrent_starts(spawn.DEFAULT_MAX_CONCURRENT_STARTS)


def test_collect_never_raises(tmp_path):
    never_started = LocalServer(capture_dir=tmp_path / "missing", deployment="demo")
    never_started.errors.append("server did not start: boom")
    assert never_started.collect() == {"rollouts": [], "chains": [], "errors": ["server did not start: boom"]}
    not_a_directory = tmp_path / "file"
    not_a_directory.write_text("x")
    result = LocalServer(capture_dir=not_a_directory, deployment="demo").collect()
    assert result["rollouts"] == []


def test_a_killed_parents_working_folder_is_removed_by_the_next_server_and_a_live_ones_is_kept(tmp_path, monkeypatch):
    """The folder holds the child's settings (keys, perhaps); a parent killed outright never removes it."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    orphan, living = dead_and_living_dirs(tmp_path, spawn.WORKDIR_PREFIX)
    monkeypatch.setattr(spawn.subprocess, "Popen", lambda *a, **k: None)  # the folder is all this test needs
    server = LocalServer(capture_dir=tmp_path / "capture", deployment="demo", switchyard_api_key="sk-test")
    server._spawn()
    try:
        assert not orphan.exists() and living.exists()
        assert server._workdir.name.startswith(f"{spawn.WORKDIR_PREFIX}{os.getpid()}-")
        assert (server._workdir / "settings.json").stat().st_mode & 0o077 == 0
    finally:
        server.stop()
    assert not any(path.name.startswith(f"{spawn.WORKDIR_PREFIX}{os.getpid()}-") for path in tmp_path.iterdir())


def test_collect_carries_every_sessions_chains(tmp_path):
    from server.capture.store import CaptureStore
    from tests.support.scripted_sessions import scripted

    store = CaptureStore(tmp_path / "capture")
    store.start()
    for record in scripted("broken", ["extend", "tool_call_as_text"]) + scripted("whole", ["extend"]):
        assert store.submit(record)
    assert store.flush(10)
    store.close()
    result = LocalServer(capture_dir=tmp_path / "capture", deployment="demo").collect()
    by_id = {body["session_id"]: body for body in result["chains"]}
    assert [len(chain["record_uuids"]) for chain in by_id["broken"]["chains"]] == [2, 1]
    assert by_id["broken"]["trainable_fraction"] == 1.0 and by_id["whole"]["rollout_fraction"] == 1.0
    rollouts = {rollout["session_id"]: rollout for rollout in result["rollouts"]}
    assert rollouts["broken"]["mask_sample"] is True and rollouts["whole"]["mask_sample"] is False
    assert result["errors"] == []
