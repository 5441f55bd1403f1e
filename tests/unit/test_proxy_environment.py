"""The tests run without proxy variables, whatever the shell has: tests/conftest.py clears them."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from tests.support.procs import PROXY_VARIABLES, REPO, free_port, without_proxies

PROBE = "SWITCHYARD_PROXY_PROBE"


class _Ok(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.skipif(PROBE not in os.environ, reason="run by the tests below, in a pytest of its own")
def test_probe_a_default_httpx_client_and_a_child_process_see_no_proxy():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        # A default client: it reads the proxy variables (trust_env is on).
        assert httpx.get(f"http://127.0.0.1:{server.server_address[1]}/", timeout=10).text == "ok"
    finally:
        server.shutdown()
    child = subprocess.run(
        [sys.executable, "-c", "import os; print(sorted(n for n in os.environ if n.lower().endswith('_proxy')))"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert child.stdout.strip() == "[]"


def _probe(*pytest_args: str) -> subprocess.CompletedProcess[str]:
    """The probe above in a fresh pytest whose environment routes every request through a dead proxy."""
    dead_proxy = f"http://127.0.0.1:{free_port()}"
    # Without this run's own NO_PROXY (the hosted Switchyard's setup adds one to os.environ), which
    # would exempt 127.0.0.1 from the dead proxy.
    env = {**without_proxies(dict(os.environ)), PROBE: "1"}
    env.update({"HTTP_PROXY": dead_proxy, "https_proxy": dead_proxy, "ALL_PROXY": dead_proxy})
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *pytest_args]
        + [f"{__file__}::test_probe_a_default_httpx_client_and_a_child_process_see_no_proxy"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=120,
    )


def test_a_proxy_set_in_the_shell_reaches_neither_the_tests_nor_their_children():
    run = _probe()
    assert run.returncode == 0 and "1 passed" in run.stdout, run.stdout + run.stderr


def test_without_the_conftest_the_same_proxy_breaks_the_probe():
    # Negative control: the dead proxy is really in the probe's environment and a default client uses it.
    run = _probe("--noconftest")
    assert run.returncode == 1 and "1 failed" in run.stdout, run.stdout + run.stderr
    assert "ConnectError" in run.stdout or "ProxyError" in run.stdout, run.stdout


def test_the_cleared_names_cover_both_cases_of_every_proxy_variable():
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        assert name in PROXY_VARIABLES and name.lower() in PROXY_VARIABLES
    # NO_PROXY may be back: hosting Switchyard in this process adds loopback to it (harmless here).
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        assert name not in os.environ and name.lower() not in os.environ
