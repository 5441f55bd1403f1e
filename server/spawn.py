"""A server per rollout, as a library: start `serve` as a child process, use it, stop it, collect its rollouts.

```python
from server.spawn import LocalServer
with LocalServer(deployment="vllm", capture_dir=attempt_dir, **settings) as srv:
    run_my_agent(base_url=srv.base_url)        # http://127.0.0.1:<port>/v1
result = srv.collect()                         # after teardown: the record set is complete
```

The child is `python -m server.cli serve` under the running interpreter (no PATH lookup), bound to
port 0 on 127.0.0.1; it writes the port it got to a file once ready, so there is no free-port race.
It is stopped with SIGTERM (then SIGKILL) when the block ends, and the kernel sends it SIGTERM if
the thread that started it dies first. Settings are checked here before anything starts, and
passed to the child in a private file, never through inherited environment variables.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import orjson

from server.config import ENV_VARS, load_settings
from server.files import process_temp_dir
from server.process import PARENT_PID_ENV

if TYPE_CHECKING:
    from server.capture.rollout.chains import ChainsEnvelope
    from server.capture.rollout.items import Rollout

# The child's settings (which may hold keys), port file and log: a `process_temp_dir`, so a parent
# killed outright (its block never ends) leaves a folder the next LocalServer of any process removes.
WORKDIR_PREFIX = "switchyard-local-"
DEFAULT_STARTUP_TIMEOUT_S = 240.0  # imports alone took 60 s on a loaded shared filesystem
DEFAULT_STOP_TIMEOUT_S = 40.0  # the child's own graceful shutdown waits up to 30 s for open calls
DEFAULT_MAX_CONCURRENT_STARTS = 64
_STDERR_TAIL_BYTES = 4000

_starts = threading.BoundedSemaphore(DEFAULT_MAX_CONCURRENT_STARTS)


def set_max_concurrent_starts(limit: int) -> None:
    """How many LocalServers of this process may be starting at once (default 64); the rest wait.

    Starting a thousand at once on one node exhausted ports and connections; running ones are not limited.
    """
    global _starts
    if limit < 1:
        raise ValueError("limit must be at least 1")
    _starts = threading.BoundedSemaphore(limit)


class ServerStartError(RuntimeError):
    """The child exited, or was not ready in time, before it could take calls; the message has its stderr tail."""


class LocalServer:
    """One `switchyard-model serve` child process for one rollout (see the module docstring).

    `**settings` are `Settings` fields (`switchyard_base_url`, `switchyard_model`, `extra_body`, ...);
    `host` and `port` are chosen here. Entering the block starts the server and waits until it is
    ready; leaving it stops the server. `collect()` is meant for after the block.
    """

    def __init__(
        self,
        *,
        capture_dir: str | os.PathLike[str],
        deployment: str | os.PathLike[str] | None = None,
        startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S,
        stop_timeout_s: float = DEFAULT_STOP_TIMEOUT_S,
        env: dict[str, str] | None = None,
        **settings: Any,
    ) -> None:
        self.capture_dir = Path(capture_dir).resolve()
        self.startup_timeout_s = startup_timeout_s
        self.stop_timeout_s = stop_timeout_s
        fields: dict[str, Any] = {**settings, "capture_dir": str(self.capture_dir)}
        if deployment is not None:
            path = Path(deployment)
            # A path is made absolute (the child runs elsewhere); a bare profile name stays a name.
            fields["deployment"] = str(path.resolve()) if path.exists() else str(deployment)
        fields.update(host="127.0.0.1", port=0)
        # Checked here, so a typo fails before anything starts (ConfigError); the environment is not read.
        self.settings = load_settings(None, fields, environ={})
        self._env = env
        self.port: int | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self.errors: list[str] = []
        self._workdir: Path | None = None
        self._log: IO[bytes] | None = None

    @property
    def base_url(self) -> str:
        """The `/v1` base URL an OpenAI client needs."""
        if self.port is None:
            raise RuntimeError("the server is not running")
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def pid(self) -> int | None:
        """The child's pid while it runs."""
        return self.process.pid if self.process is not None else None

    # ---- lifecycle -------------------------------------------------------------------------

    def __enter__(self) -> LocalServer:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> None:
        """Start the child and wait until it serves; raises ServerStartError (with its stderr tail)."""
        with _starts:
            try:
                self._spawn()
                self._wait_ready()
            except BaseException as exc:
                self.errors.append(f"server did not start: {exc}")
                self.stop()
                raise

    def _spawn(self) -> None:
        self._workdir = Path(process_temp_dir(WORKDIR_PREFIX))
        config = self._workdir / "settings.json"
        config.write_bytes(orjson.dumps(self.settings.model_dump(mode="json", exclude_unset=True)))
        os.chmod(config, 0o600)
        env = {k: v for k, v in os.environ.items() if k not in ENV_VARS.values()}  # explicit settings only
        env.update(self._env or {})
        env[PARENT_PID_ENV] = str(os.getpid())
        env.setdefault("PYTHONUNBUFFERED", "1")
        self._log = open(self._workdir / "server.log", "wb")  # noqa: SIM115 - closed in stop()
        argv = [
            sys.executable,
            "-m",
            "server.cli",
            "serve",
            "--config",
            str(config),
            "--capture-dir",  # also on the command line, so `ps` shows which rollout a server is for
            str(self.capture_dir),
            "--port-file",
            str(self._workdir / "port"),
        ]
        self.process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT, env=env, close_fds=True
        )

    def _wait_ready(self) -> None:
        assert self.process is not None and self._workdir is not None
        port_file = self._workdir / "port"
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            code = self.process.poll()
            if code is not None:
                raise ServerStartError(f"the server exited with code {code} while starting: {self.output_tail()}")
            with contextlib.suppress(FileNotFoundError, ValueError):
                self.port = int(port_file.read_text())
                return
            if time.monotonic() > deadline:
                raise ServerStartError(
                    f"the server was not ready after {self.startup_timeout_s:g}s: {self.output_tail()}"
                )
            time.sleep(0.05)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after `stop_timeout_s`. Idempotent; problems go to `errors`."""
        process, self.process = self.process, None
        if process is not None:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(self.stop_timeout_s)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
                    self.errors.append(
                        f"the server did not stop within {self.stop_timeout_s:g}s and was killed; "
                        "records of calls still open may be missing"
                    )
            elif self.port is not None:  # it died while serving
                self.errors.append(f"the server exited with code {process.returncode}: {self.output_tail()}")
        self.port = None
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None

    def output_tail(self, limit: int = _STDERR_TAIL_BYTES) -> str:
        """The end of what the child printed (stdout and stderr), for error messages."""
        if self._workdir is None:
            return ""
        if self._log is not None:
            self._log.flush()
        try:
            with open(self._workdir / "server.log", "rb") as handle:
                handle.seek(0, os.SEEK_END)
                handle.seek(max(0, handle.tell() - limit))
                return handle.read().decode("utf-8", "replace").strip()
        except OSError:
            return ""

    # ---- after the block -------------------------------------------------------------------

    def collect(self) -> dict[str, Any]:
        """Every session's rollout and chains, and the errors met on the way. Never raises.

        `rollouts` holds one entry per top session (no parent, or a parent nobody captured), each
        with its sub-agents under `subagents`. A rollout that could only be partly rebuilt is
        partial with `mask_sample: true` and its `partial_reason`; one that could not be rebuilt at
        all is an empty masked sample with the reason. `chains` holds, per top session, its
        `GET /chains` answer: every completed call in a whole token-contiguous chain, so a broken
        session's tokens still train. `errors` also says if the server failed to start, crashed or
        had to be killed, or if record files were unreadable.
        """
        errors = list(self.errors)
        rollouts: list[Rollout] = []
        chains: list[ChainsEnvelope] = []
        try:
            rollouts = collect_rollouts(self.capture_dir, errors, chains)
        except Exception as exc:  # the promise is "never raises": a broken directory is an error entry
            errors.append(f"reading {self.capture_dir}: {type(exc).__name__}: {exc}")
        return {"rollouts": rollouts, "chains": chains, "errors": errors}


def collect_rollouts(
    capture_dir: str | os.PathLike[str], errors: list[str], chains: list[ChainsEnvelope] | None = None
) -> list[Rollout]:
    """Rebuild every top session's rollout from a capture directory, read-only; problems go to
    `errors`, and each top session's chains to `chains` when given."""
    from server.capture.catalog.sessions import build_rollout
    from server.capture.rollout import RolloutError
    from server.capture.rollout.items import failed_rollout
    from server.capture.store import CaptureStore, UnknownSession

    store = CaptureStore.open_read_only(Path(capture_dir))
    view = store.index_view()
    sessions = view.list_sessions(limit=sys.maxsize)
    known = {s["session_id"] for s in sessions}
    rollouts = []
    for session in sessions:
        parent = session["parent_session_id"]
        if parent is not None and parent in known:
            continue  # it comes back inside its parent's rollout
        session_id = session["session_id"]
        try:
            rollouts.append(build_rollout(store, session_id, allow_partial=True))
        except (RolloutError, UnknownSession) as exc:
            errors.append(f"session {session_id!r}: {exc}")
            rollouts.append(failed_rollout(session_id, parent, str(exc)))
        if chains is not None:
            try:
                chains.append(build_rollout(store, session_id, view="chains"))
            except (RolloutError, UnknownSession) as exc:
                errors.append(f"session {session_id!r} chains: {exc}")
    skipped = store.stats()["skipped"]
    if skipped:
        errors.append(f"{skipped} record files under {capture_dir} were unreadable and left out")
    return rollouts
