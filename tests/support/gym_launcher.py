"""NeMo Gym 0.7.0's own launcher, run unchanged from the Python 3.13 venv `make gym-launcher` builds.

`GymRun` starts `gym env start` once (Gym builds each server's venv with uv, starts them, Ray on
loopback), dispatches rollouts with `gym eval run --no-serve` as often as asked, and stops
everything it started by pid. Gym's server venvs and uv's cache are kept under `.cache/gym/` (git-
ignored), so a second run reuses them: the venvs are keyed by what goes into them (this project's
pyproject.toml and setup.py, the server directory's requirements, Gym's version), and other keys are
removed.

Gym declares Python >= 3.13.14; the venv has the newest 3.13 pyenv offers (3.13.0 here), so uv is
told to resolve as 3.13.14 (`[pip] python-version` in a uv.toml of the cache), which is what
`pip --ignore-requires-python` did for the launcher's own venv. uv never downloads a Python.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import httpx

from tests.support.procs import REPO, Proc, free_port, without_proxies

GYM_VERSION = "0.7.0"
GYM_VENV = REPO / ".venv-gym"
GYM_STAMP = GYM_VENV / f".installed-{GYM_VERSION}"
GYM_CACHE = REPO / ".cache" / "gym"
# What Gym's wheel ships and Gym's setup would install as nemo-gym's declared floor.
GYM_REQUIRES_PYTHON = "3.13.14"
# Gym's first start builds four server venvs (~60 s each cold, a few seconds with uv's cache warm).
START_TIMEOUT_S = 900.0
DISPATCH_TIMEOUT_S = 300.0


def not_available() -> str | None:
    """Why the launcher venv cannot be used here, or None."""
    if GYM_STAMP.exists():
        return None
    root = os.path.expanduser("~/.pyenv")
    if shutil.which("pyenv") is not None:
        found = subprocess.run(["pyenv", "root"], capture_output=True, text=True, check=False)
        root = found.stdout.strip() or root
    if not list(Path(root, "versions").glob("3.13.*/bin/python3.13")):
        return "no Python 3.13 here (pyenv has none), so Gym 0.7.0's launcher cannot run"
    return f"the Gym launcher venv is not built ({GYM_VENV.name}): run `make gym-launcher`"


def gym_site_packages() -> Path:
    (site,) = GYM_VENV.glob("lib/python3.*/site-packages")
    return site


def base_python_dir() -> str:
    """The directory of the Python 3.13 the launcher venv was made from (pyvenv.cfg's `home`):
    uv finds the interpreter for Gym's server venvs there."""
    for line in (GYM_VENV / "pyvenv.cfg").read_text().splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "home":
            return value.strip()
    raise RuntimeError(f"{GYM_VENV}/pyvenv.cfg names no home")


def venv_key(server_dir: Path) -> str:
    """What Gym's server venvs depend on: when it changes they are built afresh."""
    digest = hashlib.sha256(GYM_VERSION.encode())
    for path in (
        REPO / "pyproject.toml",
        REPO / "setup.py",
        server_dir / "pyproject.toml",
        server_dir / "requirements.txt",
    ):
        if path.is_file():
            digest.update(str(path.relative_to(path.parent.parent)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def kept_venvs(key: str) -> Path:
    """This key's folder of server venvs; other keys' folders are removed (they are stale)."""
    root = GYM_CACHE / "venvs"
    root.mkdir(parents=True, exist_ok=True)
    for old in root.iterdir():
        if old.name != key:
            shutil.rmtree(old, ignore_errors=True)
    return root / key


class GymRun:
    """One `gym env start` and its dispatches, in `workdir` (Gym writes its outputs there)."""

    def __init__(self, workdir: Path, search_dir: Path, server_dir: Path, env: dict[str, str]) -> None:
        self.workdir = workdir
        self.search_dir = search_dir
        self.head_port = free_port()
        self.model_port = free_port()
        workdir.mkdir(parents=True, exist_ok=True)
        # Ray's sockets live under RAY_TMPDIR, and a socket path may not exceed 107 bytes: a short folder.
        self.ray_dir = Path(tempfile.mkdtemp(prefix="gymray-", dir="/tmp" if os.path.isdir("/tmp") else None))
        GYM_CACHE.mkdir(parents=True, exist_ok=True)
        uv_config = GYM_CACHE / "uv.toml"
        uv_config.write_text(f'[pip]\npython-version = "{GYM_REQUIRES_PYTHON}"\n')
        self.venvs = kept_venvs(venv_key(server_dir))
        self.env = {
            **without_proxies(dict(os.environ)),
            "PATH": os.pathsep.join([str(GYM_VENV / "bin"), base_python_dir(), os.environ.get("PATH", "")]),
            "VIRTUAL_ENV": str(GYM_VENV),
            "PYTHONPATH": "",
            "PYTHONUNBUFFERED": "1",
            "UV_PYTHON_DOWNLOADS": "never",
            "UV_CACHE_DIR": str(GYM_CACHE / "uv"),
            "UV_CONFIG_FILE": str(uv_config),
            # Ray on loopback, its files in this run's folder, no usage report, no token in ~/.ray.
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
            "RAY_TMPDIR": str(self.ray_dir),
            "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_AUTH_MODE": "disabled",
            **env,
        }
        self.common = [
            f"++head_server.port={self.head_port}",
            f"++uv_venv_dir={self.venvs}",
            f"++uv_cache_dir={GYM_CACHE / 'uv'}",
            "++skip_venv_if_present=true",
            f"++results_dir={workdir / 'results'}",  # where Gym keeps a run's outputs (`gym eval run` sets one)
        ]
        self.proc: Proc | None = None

    @property
    def model_url(self) -> str:
        return f"http://127.0.0.1:{self.model_port}"

    def gym(self, *args: str) -> list[str]:
        return [str(GYM_VENV / "bin" / "gym"), *args]

    def start(self, args: Iterable[str], overrides: Iterable[str]) -> None:
        """`gym env start ARGS OVERRIDES`, until Gym says every server is ready."""
        argv = self.gym(
            "env",
            "start",
            *args,
            "--search-dir",
            str(self.search_dir),
            *self.common,
            f"++policy_model.responses_api_models.switchyard_model.port={self.model_port}",
            *overrides,
        )
        self.proc = Proc(argv, env=self.env, cwd=self.workdir)
        deadline = time.monotonic() + START_TIMEOUT_S
        while "servers ready! Polling" not in self.proc.output():
            if self.proc.popen.poll() is not None:
                raise RuntimeError(f"gym env start exited with {self.proc.popen.returncode}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"gym env start not ready after {START_TIMEOUT_S}s:\n{self.log_tail()}")
            time.sleep(0.5)
        httpx.get(self.model_url + "/health", timeout=10).raise_for_status()

    def dispatch(self, name: str, tasks: list[dict[str, Any]], args: Iterable[str], overrides: Iterable[str]) -> Path:
        """One collection (`gym eval run --no-serve`) of `tasks` against the running servers; returns
        the rollouts file Gym wrote (`<name>.jsonl`, failures beside it in `<name>_failures.jsonl`)."""
        inputs = self.workdir / f"{name}-tasks.jsonl"
        inputs.write_text("".join(json.dumps(task) + "\n" for task in tasks))
        output = self.workdir / f"{name}.jsonl"
        argv = self.gym(
            "eval",
            "run",
            "--no-serve",
            *args,
            "--input",
            str(inputs),
            "--output",
            str(output),
            *self.common,
            *overrides,
        )
        done = subprocess.run(
            argv,
            env=self.env,
            cwd=self.workdir,
            capture_output=True,
            text=True,
            timeout=DISPATCH_TIMEOUT_S,
            start_new_session=True,
        )
        (self.workdir / f"{name}.log").write_text(done.stdout + done.stderr)
        if done.returncode != 0:
            raise RuntimeError(
                f"gym eval run {name} exited with {done.returncode}:\n{(done.stdout + done.stderr)[-6000:]}"
            )
        return output

    def log_tail(self, chars: int = 6000) -> str:
        return self.proc.output()[-chars:] if self.proc is not None else ""

    def stop(self) -> None:
        """SIGTERM to `gym env start` (it stops its servers and the Ray it started), then whatever
        it left behind: every process whose environment names this run's Ray folder, by pid."""
        if self.proc is not None:
            self.proc.stop(signal.SIGTERM, timeout=60)
            (self.workdir / "env-start.log").write_text(self.proc.output())  # kept beside Gym's outputs
        stragglers = self.stragglers()
        for pid in stragglers:
            _signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while stragglers and time.monotonic() < deadline:
            time.sleep(0.2)
            stragglers = [pid for pid in stragglers if _alive(pid)]
        for pid in stragglers:
            _signal(pid, signal.SIGKILL)
        shutil.rmtree(self.ray_dir, ignore_errors=True)

    def servers_environment(self, name: str) -> set[str]:
        """The values of `name` in the environments of the processes Gym started (its servers among them)."""
        values = set()
        for pid in self.stragglers():
            try:
                for entry in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                    key, _, value = entry.partition(b"=")
                    if key.decode(errors="replace") == name:
                        values.add(value.decode(errors="replace"))
            except OSError:
                continue
        return values

    def stragglers(self) -> list[int]:
        """Processes Gym started in this run that are still alive (Ray's agents outlive `env start`):
        those in the session `env start` leads (it was started in a session of its own), and any that
        left it but carry this run's Ray folder in their environment."""
        session = self.proc.pid if self.proc is not None else None
        marker = f"RAY_TMPDIR={self.ray_dir}".encode()
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            pid = int(entry.name)
            try:
                in_session = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[3]) == session
                environ = b"" if in_session else (entry / "environ").read_bytes()
            except (OSError, IndexError, ValueError):
                continue
            if (in_session or marker in environ.split(b"\0")) and _alive(pid):
                found.append(pid)
        return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
