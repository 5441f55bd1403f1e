"""Ctrl-C (SIGINT to the whole process group, as a terminal sends it) stops the commands cleanly."""

from __future__ import annotations

import os
import signal
import sys
import time

import httpx

from tests.support.captures import records_in
from tests.support.procs import Proc, free_port, start_server, wait_for

# Interrupted: our status 130, or death by SIGINT, which a shell reports as the same 130. CPython
# chooses the second by itself when the interrupt landed inside code compiled from a string (e.g.
# the methods `dataclasses` writes with exec() while the modules load): it marks that
# KeyboardInterrupt as unhandled even though main() caught it, and re-raises SIGINT at exit.
INTERRUPTED = (130, -signal.SIGINT)


def ctrl_c(proc: Proc, timeout: float = 60.0) -> int:
    """SIGINT to the process group, then wait for the exit; returns the exit code."""
    os.killpg(proc.pid, signal.SIGINT)
    code = proc.popen.wait(timeout)
    proc.stop()
    return code


def wait_for_line(proc: Proc, text: str, timeout: float = 120.0) -> None:
    wait_for(lambda: text in proc.output() or proc.popen.poll() is not None, timeout, interval=0.1)
    assert text in proc.output(), f"{text!r} never printed:\n{proc.output()[-3000:]}"


def test_ctrl_c_on_serve_exits_cleanly_and_keeps_the_records(mock_upstream, tmp_path):
    capture_dir = tmp_path / "captures"
    proc, url = start_server(
        "--deployment", "demo", "--capture-dir", str(capture_dir), env={"MOCK_UPSTREAM_URL": mock_upstream + "/v1"}
    )
    reply = httpx.post(
        url + "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}]},
        headers={"x-session-id": "before-ctrl-c"},
        timeout=30,
    )
    assert reply.status_code == 200
    code = ctrl_c(proc)
    output = proc.output()
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output[-3000:]
    assert code == 0, output[-3000:]
    # Records were flushed on the way out, as on SIGTERM.
    assert len(records_in(capture_dir)[0]) == 1


def _in_interpreter_startup(output: str) -> bool:
    """The interrupt landed in Python's own startup (site-packages' .pth files), before any of our code ran."""
    return "<frozen site>" in output and f"{os.sep}server{os.sep}" not in output


def test_ctrl_c_while_serve_is_still_starting_exits_without_a_traceback(mock_upstream, tmp_path):
    for _attempt in range(3):
        proc, _ = start_server(
            "--deployment",
            "demo",
            "--capture-dir",
            str(tmp_path / "captures"),
            env={"MOCK_UPSTREAM_URL": mock_upstream + "/v1"},
            wait=False,
        )
        time.sleep(0.2)  # somewhere in the imports or the startup: wherever it lands, the exit must be clean
        code = ctrl_c(proc)
        output = proc.output()
        # On a loaded machine 0.2 s can still be inside the interpreter's startup, where Python
        # itself prints the KeyboardInterrupt: not this program's to handle; try again.
        if not _in_interpreter_startup(output):
            break
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output[-3000:]
    assert code == 0 or code in INTERRUPTED, output[-3000:]


def test_ctrl_c_on_demo_serve_exits_cleanly(tmp_path):
    proc = Proc(
        [sys.executable, "-m", "server.cli", "demo", "--serve", "--port", str(free_port())],
        env={"TMPDIR": str(tmp_path)},
    )
    wait_for_line(proc, "Press Ctrl-C to stop.")
    code = ctrl_c(proc)
    output = proc.output()
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output[-3000:]
    assert code == 0, output[-3000:]


def test_mock_upstream_says_where_it_listens(tmp_path):
    proc = Proc([sys.executable, "-m", "server.cli", "mock-upstream", "--port", "0"])
    try:
        wait_for_line(proc, "listening on http://127.0.0.1:", timeout=60)
        url = proc.output().split("listening on ", 1)[1].split()[0]
        assert httpx.get(url + "/health", timeout=10).status_code == 200
        code = ctrl_c(proc)
        assert "Traceback" not in proc.output()
        assert code == 0
    finally:
        proc.stop()
