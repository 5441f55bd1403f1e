"""`switchyard_threads`: the hosted Switchyard runs the worker threads asked for, and a bad
`TOKIO_WORKER_THREADS` is one clear line at startup instead of a panic inside Switchyard."""

from __future__ import annotations

import httpx
import pytest
import yaml

from tests.support.procs import start_server, tokio_workers


def _serve(tmp_path, mock_upstream, env=None, wait=True, **settings):
    config = tmp_path / "settings.yaml"
    config.write_text(yaml.safe_dump(settings))
    return start_server(
        "--deployment",
        "demo",
        "--no-capture",
        "--config",
        str(config),
        env={"MOCK_UPSTREAM_URL": mock_upstream + "/v1", **(env or {})},
        wait=wait,
    )


@pytest.mark.parametrize("threads", [1, 3])
def test_the_hosted_switchyard_runs_the_threads_asked_for(tmp_path, mock_upstream, threads):
    # Tokio's own default is one per core (2 here), so both values show the setting reached it.
    proc, url = _serve(tmp_path, mock_upstream, switchyard_threads=threads)
    try:
        body = {"model": "x", "messages": [{"role": "user", "content": "hi"}]}
        assert httpx.post(url + "/v1/chat/completions", json=body, timeout=30).status_code == 200
        assert httpx.get(url + "/health", timeout=10).json()["proxy"]["threads"] == threads
        assert tokio_workers(proc.popen.pid) == threads
    finally:
        proc.stop()


def test_a_bad_tokio_worker_threads_fails_startup_with_one_line(tmp_path, mock_upstream):
    proc, _ = _serve(tmp_path, mock_upstream, env={"TOKIO_WORKER_THREADS": ""}, wait=False)
    try:
        assert proc.popen.wait(60) == 2
    finally:
        proc.stop()
    out = proc.output()
    assert "TOKIO_WORKER_THREADS='' is not a positive integer" in out
    assert "Traceback" not in out and "panic" not in out.lower()
