"""`switchyard-model demo`: what it prints, and that every process it starts ends with it, however it ends."""

from __future__ import annotations

import os
import re
import shlex
import signal
import sys

import httpx
import psutil
import pytest

from tests.support.procs import REPO, Proc, free_port, wait_for

READY_LINE = "Press Ctrl-C to stop."


def _start_demo(tmp_path, *, ignore_sigint: bool = False) -> Proc:
    argv = [sys.executable, "-m", "server.cli", "demo", "--serve", "--port", str(free_port())]
    if ignore_sigint:
        # As a non-interactive shell starts a background job (`switchyard-model demo --serve &`):
        # SIGINT ignored, and the ignoring inherited through exec.
        argv = ["sh", "-c", 'trap "" INT; exec "$0" "$@"', *argv]
    proc = Proc(argv, env={"TMPDIR": str(tmp_path)})
    wait_for(lambda: READY_LINE in proc.output() or proc.popen.poll() is not None, timeout=180, interval=0.1)
    assert READY_LINE in proc.output() and proc.popen.poll() is None, proc.output()[-3000:]
    return proc


def _alive(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE  # an exited orphan not yet reaped is gone
    except psutil.NoSuchProcess:
        return False


def _left_behind(processes: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    wait_for(lambda: not any(_alive(p) for p in processes), timeout, interval=0.1)
    return [p for p in processes if _alive(p)]


@pytest.mark.parametrize(
    ("sig", "ignore_sigint"),
    [
        (signal.SIGTERM, False),
        (signal.SIGHUP, False),
        (signal.SIGINT, True),  # started in the background from a shell: SIGINT ignored on entry
        (signal.SIGKILL, False),  # the demo itself killed: its children must not outlive it
    ],
    ids=["sigterm", "sighup", "sigint-in-background", "sigkill"],
)
def test_every_process_the_demo_starts_ends_with_it(tmp_path, sig, ignore_sigint):
    proc = _start_demo(tmp_path, ignore_sigint=ignore_sigint)
    try:
        children = psutil.Process(proc.pid).children(recursive=True)
        names = [" ".join(child.cmdline()) for child in children]
        # At least the mock upstream and `serve` (which hosts Switchyard, and may run rollout rebuilds).
        assert any("mock_upstream" in n for n in names) and any(" serve " in n for n in names), names
        os.kill(proc.pid, sig)
        code = proc.popen.wait(60)
        left = _left_behind(children, timeout=60)
        assert not left, [(p.pid, " ".join(p.cmdline())) for p in left]
        if sig != signal.SIGKILL:
            assert code == 0, proc.output()[-3000:]
            assert "Traceback" not in proc.output(), proc.output()[-3000:]
    finally:
        proc.stop(signal.SIGKILL)
        for child in children if "children" in locals() else []:
            if _alive(child):
                child.kill()


def test_the_demo_prints_the_mock_upstreams_address_once(tmp_path):
    proc = Proc([sys.executable, "-m", "server.cli", "demo"], env={"TMPDIR": str(tmp_path)})
    code = proc.popen.wait(180)
    output = proc.output()
    assert code == 0, output[-3000:]
    header = output.split("1. root agent", 1)[0]
    addresses = re.findall(r"http://127\.0\.0\.1:(\d+)", header)
    mock_port = re.search(r"mock upstream\s+http://127\.0\.0\.1:(\d+)", header)
    assert mock_port, header
    assert addresses.count(mock_port.group(1)) == 1, header


def _recipe_lines() -> list[str]:
    """The shell lines of docs/harnesses.md's "your own server in front of the demo's mock model"."""
    text = (REPO / "docs" / "harnesses.md").read_text()
    section = text.split("**Your own server in front of the demo's mock model.**", 1)[1]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line.strip()]


def test_the_harnesses_recipe_for_a_server_of_ones_own_runs_and_any_model_name_reaches_the_route(tmp_path):
    mock_line, serve_line = _recipe_lines()
    mock_port, port = free_port(), free_port()
    mock_argv = shlex.split(mock_line.replace("8001", str(mock_port)))
    assert mock_argv[0] == "switchyard-model"
    env_assignment, *serve_argv = shlex.split(serve_line.replace("8001", str(mock_port)).replace("8080", str(port)))
    name, _, value = env_assignment.partition("=")
    assert serve_argv[0] == "switchyard-model" and name == "MOCK_UPSTREAM_URL"
    mock = Proc([sys.executable, "-m", "server.cli", *mock_argv[1:]])
    server = Proc(
        [sys.executable, "-m", "server.cli", *serve_argv[1:], "--capture-dir", str(tmp_path / "captures")],
        env={name: value},
    )
    try:
        mock.wait_http(f"http://127.0.0.1:{mock_port}/health")
        server.wait_http(f"http://127.0.0.1:{port}/health")
        reply = httpx.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            json={"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]},
            headers={"x-session-id": "own-server"},
            timeout=30,
        )
        assert reply.status_code == 200, reply.text
        assert reply.json()["model"] == "mock-model"  # the name sent was replaced by the route
        record = httpx.get(f"http://127.0.0.1:{port}/v1/sessions/own-server/completions", timeout=30).json()[
            "completions"
        ][0]
        assert record["route"] == "demo" and record.get("injection") is not None  # --token-injection took effect
    finally:
        server.stop()
        mock.stop()
