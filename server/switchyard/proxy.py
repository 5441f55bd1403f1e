"""Switchyard's lifecycle in each mode: attached, hosted in-process, or launched as a child process."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shlex
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from server.config import Settings, resolve_deployment
from server.process import die_with_parent
from server.switchyard import profiles
from server.switchyard.runtime import (
    TOKIO_THREADS_ENV,
    ensure_no_proxy_for_loopback,
    environment_set,
    switchyard_threads,
)
from server.urls import root_url

log = logging.getLogger("switchyard_model.proxy")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class SwitchyardProxy:
    """The common face of the three modes: a root URL, start/close, and whether it is up."""

    mode = "attach"

    def __init__(self) -> None:
        self.root_url = ""  # set once the proxy is up (or known, when attaching)
        self.deployment_path: Path | None = None  # the deployment as the user named it
        self._rendered_path: Path | None = None  # the private, interpolated copy Switchyard reads
        self.rendered: profiles.RenderedDeployment | None = None
        self.threads: int | None = None  # the worker threads asked of a Switchyard we run (None: its default)
        self.environment: dict[str, str] = {}  # added to the environment of a Switchyard we run

    def _render_deployment(self) -> Path:
        """Interpolate `${VAR}` in the deployment and write it privately (0600) for Switchyard."""
        assert self.deployment_path is not None, "only the launch modes render a deployment"
        self.rendered = profiles.render(self.deployment_path)
        self._rendered_path = profiles.write_private(self.rendered)
        return self._rendered_path

    def _forget_rendered(self) -> None:
        if self._rendered_path is not None:
            profiles.remove_private(self._rendered_path)
            self._rendered_path = None

    async def start(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    async def _settle_environment(self) -> None:
        """What the Switchyard we run gets added to its environment (its OpenTelemetry exporters')."""
        from server.telemetry.otlp_export import switchyard_environment

        self.environment = await asyncio.to_thread(switchyard_environment)

    async def close(self) -> None:
        """Idempotent."""

    def is_known_down(self) -> bool:
        """True when we know the proxy is gone (closed, exited); False while it runs, or when only a probe can tell."""
        return False


class AttachedProxy(SwitchyardProxy):
    mode = "attach"

    def __init__(self, base_url: str) -> None:
        super().__init__()
        self.root_url = root_url(base_url)

    async def start(self) -> None:
        return None


class HostedProxy(SwitchyardProxy):
    """Hosts `switchyard_rust.server.Server` in this process.

    The native server is thread-affine: create and close it on one thread (the event loop's, from
    the lifespan). A call from another thread raises a PanicException that `except Exception` misses.
    """

    mode = "launch-hosted"

    def __init__(self, deployment: Path, port: int | None, threads: int | None = None, keyed: bool = False) -> None:
        super().__init__()
        self.deployment_path = deployment
        self.port = port or 0
        self.threads = threads
        self.keyed = keyed  # this server takes API keys, which the Switchyard it hosts cannot
        self._server: Any = None  # switchyard_rust.server.Server, imported only when hosting

    async def start(self) -> None:
        try:
            from switchyard_rust.server import Server, ServerConfigError  # noqa: F401
        except ImportError as exc:
            raise RuntimeError(
                "cannot import switchyard_rust: install nemo-switchyard==0.3.0 "
                "(pip install nemo-switchyard==0.3.0) or set switchyard_base_url to attach"
            ) from exc
        ensure_no_proxy_for_loopback()
        await self._settle_environment()
        config_path = self._render_deployment()
        try:
            threads = None if self.threads is None else str(self.threads)
            # Switchyard reads its environment at its first Server() in a process: set only around it.
            with contextlib.ExitStack() as environment:
                for name, value in {**self.environment, TOKIO_THREADS_ENV: threads}.items():
                    environment.enter_context(environment_set(name, value))
                with _keep_python_signal_handlers():
                    self._server = Server(str(config_path), port=self.port)
        except RuntimeError as exc:  # ServerConfigError is a RuntimeError too
            # Switchyard quotes TOML lines (which may hold secrets) and names the private copy.
            assert self.rendered is not None
            message = profiles.switchyard_error(str(exc), self.rendered, config_path, str(self.deployment_path))
            self._forget_rendered()
            if "Address already in use" in message:
                raise RuntimeError(f"Switchyard cannot bind port {self.port}: {message}") from exc
            raise RuntimeError(f"Switchyard rejected the deployment {self.deployment_path}: {message}") from exc
        self.root_url = self._server.base_url
        log.info("hosted Switchyard on %s (deployment %s)", self.root_url, self.deployment_path)
        if self.keyed:
            # Switchyard 0.3.0 has no inbound auth (no deployment key, no Server() argument) and
            # always binds 127.0.0.1: all that guards it is that loopback, and that no answer of
            # this server names its port while keys are set (/health, /metrics).
            log.warning(
                "the hosted Switchyard takes no API key (Switchyard 0.3.0 cannot): its loopback port "
                "answers chat calls from any process on this host, unrecorded; see docs/operations.md"
            )

    async def close(self) -> None:
        server, self._server = self._server, None
        self._forget_rendered()
        if server is None:
            return
        try:
            server.close(timeout_secs=5.0)
        except RuntimeError as exc:
            log.warning("closing the hosted Switchyard: %s", exc)

    def is_known_down(self) -> bool:
        return self._server is None


@contextlib.contextmanager
def _keep_python_signal_handlers() -> Iterator[None]:
    """The native server installs its own SIGTERM/SIGINT handlers, which would shut Switchyard down
    (and end the process) behind the lifespan's back. Put the Python-level handlers (uvicorn's)
    back, so a signal goes through the graceful shutdown, which closes Switchyard last."""
    signals = (signal.SIGTERM, signal.SIGINT)
    saved = {sig: signal.getsignal(sig) for sig in signals}
    try:
        yield
    finally:
        if threading.current_thread() is threading.main_thread():
            for sig, handler in saved.items():
                if handler is not None:
                    signal.signal(sig, handler)


class LaunchedProxy(SwitchyardProxy):
    """Runs a command (e.g. a separately installed `switchyard-server`) as a supervised child process.

    If the child dies while serving, it is restarted on the same port with exponential back-off;
    meanwhile `is_known_down()` is True, so calls get a prompt 503 instead of hanging.
    """

    mode = "launch-process"

    def __init__(
        self,
        command: str,
        deployment: Path,
        port: int | None,
        startup_timeout_s: float,
        restart_backoff_s: tuple[float, ...] = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0),
        threads: int | None = None,
    ) -> None:
        super().__init__()
        self.restart_backoff_s = tuple(restart_backoff_s)
        self.threads = threads
        self.command = command
        self.deployment_path = deployment
        self.port = port or free_port()
        self.startup_timeout_s = startup_timeout_s
        self.process: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        self._stderr_file: IO[bytes] | None = None
        self._supervisor: asyncio.Task[None] | None = None
        self._closing = False

    def _argv(self, config_path: Path) -> list[str]:
        return [part.format(deployment=str(config_path), port=self.port) for part in shlex.split(self.command)]

    def stderr_tail(self, limit: int = 2000) -> str:
        if self._stderr_file is None:
            return ""
        try:
            self._stderr_file.flush()
            with open(self._stderr_file.name, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                size = fh.tell()
                fh.seek(max(0, size - limit))
                text = fh.read().decode("utf-8", "replace").strip()
        except OSError:
            return ""
        return text.replace(str(self._rendered_path), str(self.deployment_path))

    async def start(self) -> None:
        ensure_no_proxy_for_loopback()
        await self._settle_environment()
        rendered = self._render_deployment()
        # Beside the private deployment copy: removed with it, or by the next server if this one is killed.
        self._stderr_file = open(rendered.parent / "switchyard-stderr.log", "w+b")  # noqa: SIM115 - closed in close()
        self.root_url = f"http://127.0.0.1:{self.port}"
        try:
            await self._spawn_until_ready()
        except BaseException:
            await self.close()
            raise
        self._supervisor = asyncio.ensure_future(self._supervise())

    async def _spawn_until_ready(self) -> None:
        assert self._rendered_path is not None, "start() renders the deployment first"
        argv = self._argv(self._rendered_path)
        try:
            env = {**os.environ, **self.environment}
            if self.threads is not None:
                env[TOKIO_THREADS_ENV] = str(self.threads)
            self.process = subprocess.Popen(
                argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=self._stderr_file,
                preexec_fn=die_with_parent,  # in the child: SIGTERM when this server dies
            )
        except OSError as exc:
            raise RuntimeError(f"cannot launch Switchyard ({argv[0]}): {exc.strerror or exc}") from exc
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            code = self.process.poll()
            if code is not None:
                tail = self.stderr_tail()
                raise RuntimeError(
                    f"Switchyard exited with code {code} before it was ready" + (f": {tail}" if tail else "")
                )
            if await _port_open("127.0.0.1", self.port):
                log.info("launched Switchyard (pid %s) on %s", self.process.pid, self.root_url)
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"Switchyard not ready after {self.startup_timeout_s:g}s on port {self.port}")
            await asyncio.sleep(0.1)

    async def _supervise(self) -> None:
        attempt = 0
        while not self._closing:
            await asyncio.sleep(0.2)
            process = self.process
            if process is None or process.poll() is None:
                continue
            delay = self.restart_backoff_s[min(attempt, len(self.restart_backoff_s) - 1)]
            log.error(
                "Switchyard (pid %s) exited with code %s; restarting in %gs: %s",
                process.pid,
                process.returncode,
                delay,
                self.stderr_tail(500),
            )
            await asyncio.sleep(delay)
            if self._closing:
                return
            try:
                await self._spawn_until_ready()
                self.restarts += 1
                attempt = 0
            except RuntimeError as exc:
                attempt += 1
                log.error("restarting Switchyard failed: %s", exc)
                await _terminate(self.process)

    async def close(self) -> None:
        self._closing = True
        supervisor, self._supervisor = self._supervisor, None
        if supervisor is not None:
            supervisor.cancel()
            try:
                await supervisor
            except asyncio.CancelledError:
                pass
        process, self.process = self.process, None
        await _terminate(process)
        if self._stderr_file is not None:
            self._stderr_file.close()
            self._stderr_file = None
        self._forget_rendered()

    def is_known_down(self) -> bool:
        return self.process is None or self.process.poll() is not None


async def _terminate(process: subprocess.Popen[bytes] | None) -> None:
    """SIGTERM, then SIGKILL if it has not exited within 10 s."""
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        await asyncio.to_thread(process.wait, 10)
    except subprocess.TimeoutExpired:
        process.kill()
        await asyncio.to_thread(process.wait)


async def _port_open(host: str, port: int) -> bool:
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout=1.0)
    except (TimeoutError, OSError):
        return False
    writer.close()
    try:
        await writer.wait_closed()
    except OSError:
        pass
    return True


def build_proxy(settings: Settings) -> SwitchyardProxy:
    """Pick the mode from the settings. Has no side effects: nothing starts until `start()`."""
    if settings.switchyard_base_url:
        return AttachedProxy(settings.switchyard_base_url)
    deployment = resolve_deployment(settings.deployment or "")
    if settings.switchyard_command:
        return LaunchedProxy(
            settings.switchyard_command,
            deployment,
            settings.proxy_port,
            settings.proxy_startup_timeout_s,
            tuple(settings.proxy_restart_backoff_s),
            switchyard_threads(settings.switchyard_threads, hosted=False),
        )
    threads = switchyard_threads(settings.switchyard_threads, hosted=True)
    return HostedProxy(deployment, settings.proxy_port, threads, keyed=bool(settings.api_keys))


__all__ = ["AttachedProxy", "HostedProxy", "LaunchedProxy", "SwitchyardProxy", "build_proxy"]
