"""Real loopback processes for tests: start one, wait until it answers, stop it by its pid."""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml

REPO = Path(__file__).resolve().parents[2]


@functools.cache
def scratch_dir() -> Path:
    """One temporary folder for this test run's process logs and state, removed when the run ends."""
    path = Path(tempfile.mkdtemp(prefix="switchyard-tests-"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def dead_and_living_dirs(root: Path, prefix: str) -> tuple[Path, Path]:
    """Two folders named as `server.files.process_temp_dir` names them, each holding a file: one after
    a pid whose process has exited, one after a running process (this test's parent)."""
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    orphan, living = root / f"{prefix}{int(dead.stdout)}-abc", root / f"{prefix}{os.getppid()}-def"
    for directory in (orphan, living):
        directory.mkdir()
        (directory / "left-behind").write_bytes(b"{}")
    return orphan, living


# The variables through which httpx, requests, Node and curl route a request via a proxy. Tests only
# talk to 127.0.0.1, so none of them may apply: the autouse fixture in tests/conftest.py clears them
# for the test process, and `Proc` leaves them out of every child's environment.
PROXY_VARIABLES = tuple(
    case(name) for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY") for case in (str.upper, str.lower)
)


def without_proxies(env: dict[str, str]) -> dict[str, str]:
    """`env` less every proxy variable."""
    return {name: value for name, value in env.items() if name not in PROXY_VARIABLES}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Proc:
    """A child process with its output in a file (so tests can read what it logged)."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> None:
        self.log_path = Path(tempfile.mkstemp(prefix="proc-", suffix=".log", dir=scratch_dir())[1])
        self._log = open(self.log_path, "wb")
        # TMPDIR: what a child killed on purpose cannot remove (its rollout spool, its private
        # deployment copy) goes into this run's scratch folder, not /tmp. No proxy variable, also when
        # this runs outside pytest (where tests/conftest.py has not cleared them).
        full_env = {
            **without_proxies(dict(os.environ)),
            "PYTHONUNBUFFERED": "1",
            "TMPDIR": str(scratch_dir()),
            **(env or {}),
        }
        self.popen = subprocess.Popen(
            argv, stdout=self._log, stderr=subprocess.STDOUT, env=full_env, cwd=str(cwd or REPO), start_new_session=True
        )
        self.pid = self.popen.pid

    def output(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def wait_http(self, url: str, timeout: float = 60.0, expect: int | None = 200) -> None:
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                raise RuntimeError(
                    f"process exited with {self.popen.returncode} before ready:\n{self.output()[-3000:]}"
                )
            try:
                response = httpx.get(url, timeout=1.0)
                if expect is None or response.status_code == expect:
                    return
                last = response.status_code
            except httpx.HTTPError as exc:
                last = exc
            time.sleep(0.05)
        raise TimeoutError(f"{url} not ready after {timeout}s (last: {last}):\n{self.output()[-3000:]}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int | None:
        if self.popen.poll() is None:
            try:
                os.kill(self.pid, sig)
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, signal.SIGKILL)
                self.popen.wait(5)
            except ProcessLookupError:
                pass
        self._log.close()
        return self.popen.returncode


def start_mock_upstream(port: int | None = None, *args: str) -> tuple[Proc, str]:
    """The mock upstream on a free port; `args` are its flags (e.g. `--template drop-reasoning`)."""
    port = port or free_port()
    proc = Proc([sys.executable, "-m", "server.dev.mock_upstream", "--host", "127.0.0.1", "--port", str(port), *args])
    proc.wait_http(f"http://127.0.0.1:{port}/health")
    return proc, f"http://127.0.0.1:{port}"


def start_switchyard_host(upstream_url: str) -> tuple[Proc, str]:
    """Switchyard's native server on the demo deployment, in a process of its own (what attach mode
    attaches to), its route pointed at `upstream_url`; returns the process and its `/v1` URL."""
    port = free_port()
    proc = Proc(
        [sys.executable, "-m", "server.switchyard.host", "--config", "demo", "--port", str(port)],
        env={"MOCK_UPSTREAM_URL": upstream_url + "/v1"},
    )
    try:
        proc.wait_http(f"http://127.0.0.1:{port}/health")
    except BaseException:
        proc.stop()
        raise
    return proc, f"http://127.0.0.1:{port}/v1"


def start_server(
    *args: str, env: dict[str, str] | None = None, port: int | None = None, wait: bool = True
) -> tuple[Proc, str]:
    """`switchyard-model serve ARGS` on a free port; returns the process and its root URL."""
    port = port or free_port()
    if "--no-capture" in args and "--capture-dir" not in args:
        # Capture off still keeps the stored responses' database in the capture directory: not in the checkout.
        args = (*args, "--capture-dir", tempfile.mkdtemp(prefix="state-", dir=scratch_dir()))
    argv = [sys.executable, "-m", "server.cli", "serve", "--port", str(port), *args]
    proc = Proc(argv, env=env)
    url = f"http://127.0.0.1:{port}"
    if wait:
        proc.wait_http(url + "/health")
    return proc, url


def start_attached(tmp_path: Path, mock_upstream: str, **settings: object) -> tuple[Proc, str]:
    """This server attached straight to the mock engine (route "route-a", no Switchyard between, so the
    mock sees what this server sends), capturing into `tmp_path/cap`, with `settings` on top."""
    config = tmp_path / "cfg.yaml"
    values = {
        "switchyard_base_url": mock_upstream + "/v1",
        "switchyard_model": "route-a",
        "capture_dir": str(tmp_path / "cap"),
        **settings,
    }
    config.write_text(yaml.safe_dump(values))
    return start_server("--config", str(config))


def wait_for(predicate, timeout: float = 30.0, interval: float = 0.05):
    """Poll `predicate` until it returns something truthy or `timeout` passes; returns its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    return predicate()


def tokio_workers(pid: int) -> int:
    """Threads of Switchyard's Tokio runtime in a process."""
    tasks = f"/proc/{pid}/task"
    return sum(Path(f"{tasks}/{tid}/comm").read_text().startswith("tokio-rt-worker") for tid in os.listdir(tasks))
