"""The processes a benchmark run needs (mock, servers, stubs, load generator), started and stopped by pid."""

from __future__ import annotations

import os
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import psutil

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _raise_nofile() -> None:
    """preexec_fn: a server holding 1,024 streams needs ~4 fds per stream (client, Switchyard, upstream)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else 65536
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


def _clean_env(extra: dict[str, str] | None) -> dict[str, str]:
    # An inherited OTLP endpoint would turn the exporter on in every server; only one series wants it.
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update({"NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost", "PYTHONUNBUFFERED": "1"})
    env.update(extra or {})
    return env


class Proc:
    """A child process with its output in a log file, stopped by its own pid only."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        log_dir: Path,
        env: dict[str, str] | None = None,
        stdin: int | None = None,
        stdout: int | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self._log = open(self.log_path, "wb")
        self.popen = subprocess.Popen(
            argv,
            cwd=str(cwd or REPO),  # another source tree's server or mock (bench A/B runs): `-m` imports from cwd
            env=_clean_env(env),
            stdin=stdin,
            stdout=stdout if stdout is not None else self._log,
            stderr=self._log,
            preexec_fn=_raise_nofile,
            start_new_session=True,
        )
        self.pid = self.popen.pid
        self.ps = psutil.Process(self.pid)

    def tail(self, n: int = 3000) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-n:]

    def wait_http(self, url: str, timeout: float = 60.0) -> dict[str, Any] | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.popen.returncode}:\n{self.tail()}")
            try:
                response = httpx.get(url, timeout=2.0, trust_env=False)
                if response.status_code == 200:
                    return response.json() if response.content[:1] == b"{" else None
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"{self.name}: {url} not ready after {timeout:.0f}s:\n{self.tail()}")

    def cpu_s(self) -> float:
        times = self.ps.cpu_times()
        return times.user + times.system

    def main_thread_cpu_s(self) -> float:
        """CPU of the thread whose id is the pid: the event loop of a Python server."""
        for thread in self.ps.threads():
            if thread.id == self.pid:
                return thread.user_time + thread.system_time
        return 0.0

    def rss(self) -> int:
        return self.ps.memory_info().rss

    def stop(self, timeout: float = 20.0) -> tuple[int | None, float]:
        """SIGTERM, wait up to `timeout`, then SIGKILL. Returns (exit code, seconds it took)."""
        started = time.monotonic()
        if self.popen.poll() is None:
            try:
                os.kill(self.pid, signal.SIGTERM)
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, signal.SIGKILL)
                self.popen.wait(5)
            except ProcessLookupError:
                pass
        self._log.close()
        return self.popen.returncode, time.monotonic() - started


def thread_cpu_by_role(pid: int) -> dict[int, tuple[str, float]]:
    """tid -> (role, CPU seconds) of every thread of the server process."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            comm = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
            fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended meanwhile
            continue
        if int(tid) == pid:
            role = "event loop"
        elif comm.startswith("tokio"):
            role = "Rust workers"
        else:
            role = "other threads"
        out[int(tid)] = (role, (int(fields[11]) + int(fields[12])) / tick)
    return out


class Mock:
    def __init__(self, log_dir: Path, tree: Path | None = None) -> None:
        self.port = free_port()
        self.proc = Proc(
            "mock",
            [PY, "-m", "server.dev.mock_upstream", "--host", "127.0.0.1", "--port", str(self.port)],
            log_dir,
            cwd=tree,
        )
        self.proc.wait_http(f"http://127.0.0.1:{self.port}/health")
        self.v1 = f"http://127.0.0.1:{self.port}/v1"


class Server:
    """`switchyard-model serve --deployment demo`: this server with its hosted Switchyard (same process)."""

    def __init__(
        self,
        name: str,
        mock: Mock,
        log_dir: Path,
        *,
        capture_dir: Path | None,
        env: dict[str, str] | None = None,
        settings: dict[str, Any] | None = None,
        launcher: list[str] | None = None,
        tree: Path | None = None,
    ) -> None:
        self.name = name
        self.port = free_port()
        # `launcher` replaces `-m server.cli` (bench/otel_side.py wraps the CLI to split the exporters).
        args = [*(launcher or ["-m", "server.cli"]), "serve", "--deployment", "demo", "--port", str(self.port)]
        args += ["--capture-dir", str(capture_dir)] if capture_dir is not None else ["--no-capture"]
        if "session_inference" in ((tree or REPO) / "server" / "config.py").read_text():
            # The bench's uncaptured rows are calls without a session id: keep them unrecorded, as
            # before sessions were inferred (a tree from before then knows no such setting).
            settings = {"session_inference": False, **(settings or {})}
        if settings:
            config = log_dir / f"{name}.yaml"
            config.write_text("".join(f"{key}: {orjson.dumps(value).decode()}\n" for key, value in settings.items()))
            args += ["--config", str(config)]
        self.capture_dir = capture_dir
        self.proc = Proc(name, [PY, *args], log_dir, env={"MOCK_UPSTREAM_URL": mock.v1, **(env or {})}, cwd=tree)
        self.url = f"http://127.0.0.1:{self.port}"
        health = self.proc.wait_http(self.url + "/health", timeout=90.0) or {}
        self.proxy_url = health["proxy"]["url"]
        self.proxy_port = int(self.proxy_url.rsplit(":", 1)[1])

    def health(self) -> dict[str, Any]:
        return httpx.get(self.url + "/health", timeout=10.0, trust_env=False).json()

    def wait_capture_idle(self, timeout: float = 60.0) -> int:
        """Wait until the capture writer has caught up; returns the queue depth found first (-1: no answer)."""
        first = None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                depth = int(self.health().get("capture", {}).get("queue_depth", 0))
            except (httpx.HTTPError, ValueError):
                depth = -1
            first = depth if first is None else first
            if depth == 0:
                break
            time.sleep(0.1)
        return first or 0

    def upstream_connections(self) -> int:
        """Open connections from this server to its Switchyard (pooled idle ones included)."""
        try:
            conns = self.proc.ps.net_connections()
        except psutil.Error:
            return -1
        return sum(1 for c in conns if c.raddr and c.raddr.port == self.proxy_port and c.status == "ESTABLISHED")


class Stub:
    def __init__(self, name: str, reply: str, log_dir: Path) -> None:
        self.port = free_port()
        self.proc = Proc(name, [PY, "-m", "bench.stub", "--port", str(self.port), "--reply", reply], log_dir)
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc.wait_http(self.url + "/stats")

    def stats(self) -> dict[str, int]:
        return httpx.get(self.url + "/stats", timeout=5.0, trust_env=False).json()


class Floor:
    """bench/floor.py in front of a server's Switchyard: the leanest Python hop, for comparison."""

    def __init__(self, upstream_port: int, log_dir: Path) -> None:
        self.port = free_port()
        self.proc = Proc(
            "floor-proxy",
            [PY, "-m", "bench.floor", "--port", str(self.port), "--upstream-port", str(upstream_port)],
            log_dir,
        )
        self.proc.wait_http(f"http://127.0.0.1:{self.port}/health")


class LoadGen:
    """The load generator process: one series at a time, spec in, samples out."""

    def __init__(self, log_dir: Path) -> None:
        self.proc = Proc("loadgen", [PY, "-m", "bench.loadgen"], log_dir, stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def run(self, spec: dict[str, Any]) -> dict[str, Any]:
        pipe_in, pipe_out = self.proc.popen.stdin, self.proc.popen.stdout
        assert pipe_in is not None and pipe_out is not None
        pipe_in.write(orjson.dumps(spec) + b"\n")
        pipe_in.flush()
        line = pipe_out.readline()
        if not line:
            raise RuntimeError(f"load generator died:\n{self.proc.tail()}")
        result = orjson.loads(line)
        if "fatal" in result:
            raise RuntimeError(f"load generator failed: {result['fatal']}")
        return result

    def stop(self) -> None:
        if self.proc.popen.stdin is not None:
            try:
                self.proc.popen.stdin.close()
            except OSError:
                pass
        self.proc.stop()


def make_log_dir() -> Path:
    return Path(tempfile.mkdtemp(prefix="switchyard-bench-"))


def make_ram_dir() -> Path | None:
    """A fresh folder on a RAM filesystem (/dev/shm as tmpfs), or None where there is none.

    Capture folders here show what capture costs when creating a file is cheap: on this project's
    usual disk (ext4 without a journal) the kernel spends 0.2-0.9 ms of CPU per new file (docs/benchmarks.md).
    """
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return None
    if not any(line.split()[1:3] == ["/dev/shm", "tmpfs"] for line in mounts if len(line.split()) > 2):
        return None
    return Path(tempfile.mkdtemp(prefix="switchyard-bench-", dir="/dev/shm"))


def file_create_cost(directory: Path, n: int = 300) -> float:
    """CPU µs to put one 3 KB record file in place as the capture writer does: a new hidden file, then a rename."""
    directory.mkdir(parents=True, exist_ok=True)
    data = b"x" * 3000
    spent = 0.0
    for i in range(n):
        tmp, final = directory / f".probe-{i}.tmp", directory / f"probe-{i}.json"
        c0 = time.process_time()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, data)
        os.close(fd)
        os.replace(tmp, final)
        spent += time.process_time() - c0
    return spent / n * 1e6
