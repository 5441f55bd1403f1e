"""Gym-scale concurrency: 4,096 streamed calls held open at once through the real stack, 0 errors, every one captured.

The stack is the mock engine, Switchyard in a process of its own (as `--workers` and
`switchyard_command` run it) and this server attached to it, with its limits derived from the
open-file limit. The load is the bench's own generator (`bench/loadgen.py`, one process, raw
sockets): 4,096 connections, each one streamed call paced at 3 s a token, opened over 3 s, so every
call is in flight at once for several seconds. Marked `scale`: `pytest -m scale` runs it alone.
"""

from __future__ import annotations

import resource
import subprocess
import sys

import httpx
import orjson
import pytest
import yaml

from tests.support.procs import REPO, start_mock_upstream, start_server, start_switchyard_host, wait_for

STREAMS = 4096
# Per process: this server (a client and an upstream connection per call, and room besides),
# Switchyard (two per call), the mock and the generator (one each).
NEEDED_OPEN_FILES = 4 * STREAMS


def _raise_open_file_limit() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else 1 << 20
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))  # the processes started below inherit it
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


@pytest.mark.scale
def test_4096_streams_at_once_through_the_real_stack(tmp_path):
    if _raise_open_file_limit() < NEEDED_OPEN_FILES:
        pytest.skip(f"this host's open-file limit is below the {NEEDED_OPEN_FILES} the stack needs")
    mock, mock_url = start_mock_upstream()
    switchyard, switchyard_v1 = start_switchyard_host(mock_url)
    config = tmp_path / "cfg.yaml"
    config.write_text(yaml.safe_dump({"switchyard_base_url": switchyard_v1, "capture_dir": str(tmp_path / "cap")}))
    server, url = start_server("--config", str(config))
    try:
        admission = httpx.get(url + "/health", timeout=30).json()["admission"]
        assert admission["max_calls_in_flight"] >= STREAMS, admission
        body = {
            "model": "demo",
            "messages": [{"role": "user", "content": "hold on [[mock:tokens 4]] [[mock:slow 3000]]"}],
            "stream": True,
        }
        spec = {
            "port": int(url.rsplit(":", 1)[1]),
            "templates": [
                {
                    "method": "POST",
                    "path": "/v1/chat/completions",
                    "body": orjson.dumps(body).decode(),
                    "headers": [["x-session-id", "many-{seq}"]],
                }
            ],
            "concurrency": STREAMS,
            "count": STREAMS,
            "stream": True,
            "fresh": True,
            "ramp": 3.0,
            "timeout": 120,
        }
        generator = subprocess.run(
            [sys.executable, "-m", "bench.loadgen"],
            input=orjson.dumps(spec) + b"\n",
            capture_output=True,
            cwd=REPO,
            timeout=300,
        )
        result = orjson.loads(generator.stdout.splitlines()[0])
        assert result.get("errors") == 0, {k: result.get(k) for k in ("fatal", "error_kinds", "error_details")}
        assert result["ok"] == STREAMS
        assert result["peak_in_flight"] == STREAMS  # every call was open at one moment
        health = httpx.get(url + "/health", timeout=30).json()
        assert health["admission"]["refused_calls"] == 0
        assert health["admission"]["peak_calls_in_flight"] == STREAMS
        written = wait_for(
            lambda: (c := httpx.get(url + "/health", timeout=30).json()["capture"])["queue_depth"] == 0 and c,
            timeout=120,
        )
        assert written["written"] == STREAMS and written["failed"] == 0 and written["dropped"] == 0
    finally:
        server.stop(timeout=60)
        switchyard.stop()
        mock.stop()
