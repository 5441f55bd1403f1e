"""`serve --workers N`: N uvicorn worker processes on one socket, one capture directory and one Switchyard.

The parent binds the socket, runs Switchyard once (launch mode: in a dedicated process it supervises,
`python -m server.switchyard.host` or the configured `switchyard_command`; attach mode: the given
one), and hands both to uvicorn's multi-process supervisor, which starts the workers, restarts one
that dies, and stops them all on SIGTERM/SIGINT. Each worker is an ordinary server attached to that
Switchyard. They agree on sessions because the capture store's index is read from the disk.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shlex
import shutil
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.capture.catalog.runs import new_run_id
from server.cli.exits import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from server.config import ConfigError, Settings, resolve_deployment
from server.files import process_temp_dir
from server.http.admission import limits
from server.process import calm_the_collector, die_with_parent

if TYPE_CHECKING:
    from server.state import AppState

log = logging.getLogger("switchyard_model.workers")

SETTINGS_ENV = "SWITCHYARD_MODEL_WORKER_SETTINGS"  # the server's settings as given, as JSON
SWITCHYARD_ENV = "SWITCHYARD_MODEL_WORKER_SWITCHYARD"  # the root URL of the Switchyard the parent runs
READY_DIR_ENV = "SWITCHYARD_MODEL_WORKER_READY_DIR"  # each ready worker writes <pid> here
READY_DIR_PREFIX = "switchyard-model-workers-"  # a `process_temp_dir`: a killed supervisor's is swept
RUN_ENV = "SWITCHYARD_MODEL_WORKER_SERVER_RUN"  # the one server run id all workers' records carry
# Which worker answered: on every response, so a client or a test can see how calls were spread.
WORKER_HEADER = b"x-switchyard-model-worker"


# ---- in each worker --------------------------------------------------------------------------


class _NameTheWorker:
    """Pure ASGI: adds the worker's pid to every response's headers."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.header = (WORKER_HEADER, str(os.getpid()).encode())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def named_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), self.header]}
            await send(message)

        await self.app(scope, receive, named_send)


def worker_app() -> Any:
    """uvicorn's app factory in a worker process: settings from the parent, then the ordinary app."""
    from server.app import create_app
    from server.switchyard import profiles

    die_with_parent(os.getppid())  # a killed supervisor takes its workers with it
    given = Settings.model_validate_json(os.environ[SETTINGS_ENV])  # checked here, as the user gave them
    settings = settings_for_workers(given, os.environ.get(SWITCHYARD_ENV) or None)
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    ready_dir = os.environ.get(READY_DIR_ENV)
    # Taken out of this worker's environment: a server it might start is a run of its own.
    server_run = os.environ.pop(RUN_ENV, None) or None

    def ready(state: AppState) -> None:
        calm_the_collector()
        if ready_dir:
            note = {"pid": os.getpid(), "switchyard": state.proxy.root_url, "route": state.route}
            path = Path(ready_dir) / str(os.getpid())
            path.with_suffix(".tmp").write_bytes(orjson.dumps(note))
            os.replace(path.with_suffix(".tmp"), path)

    app = create_app(settings, on_ready=ready, server_run=server_run)
    if given.launches_proxy:
        # The shared Switchyard runs this deployment: the worker reads it as a hosting server would
        # (max_model_len of routes without a context_window, each route's /tokenize for injection,
        # the provenance manifest), though it only attaches.
        proxy = app.state.switchyard.proxy
        proxy.deployment_path = resolve_deployment(given.deployment or "")
        proxy.rendered = profiles.render(proxy.deployment_path)
    return _NameTheWorker(app)


def settings_for_workers(settings: Settings, switchyard_root_url: str | None) -> Settings:
    """What every worker runs with: attached to the one Switchyard the parent runs (if it runs one),
    and no condition_dir: the run's condition files are the parent's to write, once (`_Condition`).

    Not validated again: the settings were checked as given (launch mode), and attaching to the
    parent's Switchyard does not make them any less valid.
    """
    update: dict[str, Any] = {"condition_dir": None}
    if switchyard_root_url is not None:
        update.update(switchyard_base_url=switchyard_root_url + "/v1", switchyard_command=None, proxy_port=None)
    return settings.model_copy(update=update)


# ---- in the parent ---------------------------------------------------------------------------


class _SwitchyardThread:
    """Runs a launched Switchyard's start, supervision (restarts) and close on an event loop of its own."""

    def __init__(self, settings: Settings) -> None:
        from server.switchyard.proxy import LaunchedProxy
        from server.switchyard.runtime import switchyard_threads

        command = settings.switchyard_command or (
            f"{shlex.quote(sys.executable)} -m server.switchyard.host --config {{deployment}} --port {{port}}"
        )
        self.proxy = LaunchedProxy(
            command,
            resolve_deployment(settings.deployment or ""),
            settings.proxy_port,
            settings.proxy_startup_timeout_s,
            tuple(settings.proxy_restart_backoff_s),
            # One Switchyard for every worker: its own default (a thread per core) unless told.
            switchyard_threads(settings.switchyard_threads, hosted=False),
        )
        self._loop = asyncio.new_event_loop()
        # Its child is tied to this thread's life (PR_SET_PDEATHSIG): it runs until close().
        self._thread = threading.Thread(target=self._loop.run_forever, name="switchyard", daemon=True)

    def start(self) -> str:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.proxy.start(), self._loop).result()
        assert self.proxy.root_url is not None
        return self.proxy.root_url

    def close(self) -> None:
        try:
            asyncio.run_coroutine_threadsafe(self.proxy.close(), self._loop).result(60)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)


class _Condition:
    """The run's condition files in `condition_dir`, written by the parent: the manifest once every
    worker is ready (the route is theirs to discover), the stats snapshot once they have stopped,
    while the Switchyard still runs. Workers write neither, so N workers leave one of each."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.proxy_root_url: str | None = None

    def write_manifest(self, note: dict[str, Any]) -> None:
        from server.switchyard import profiles, provenance

        settings = self.settings
        self.proxy_root_url = note.get("switchyard")
        deployment_path = rendered = None
        if settings.launches_proxy:
            try:
                deployment_path = resolve_deployment(settings.deployment or "")
                rendered = profiles.render(deployment_path).redacted_text
            except (ConfigError, OSError) as exc:  # it served already: the manifest is best-effort
                log.warning("cannot read the deployment for the condition manifest: %s", exc)
        provenance.write_manifest(
            settings.condition_dir,
            route=note.get("route"),
            mode=settings.mode,
            proxy_root_url=self.proxy_root_url,
            deployment_path=str(deployment_path) if deployment_path else None,
            rendered_text=rendered,
            session_id_headers=settings.session_id_headers,
            proxy_provenance=settings.proxy_provenance,
        )

    def snapshot_stats(self) -> None:
        from server.switchyard import provenance

        if self.proxy_root_url is None:  # the workers never all came up: no manifest, no stats
            return
        settings = self.settings
        asyncio.run(
            provenance.snapshot_stats(
                settings.condition_dir,
                self.proxy_root_url,
                mode=settings.mode,
                api_key=settings.switchyard_api_key,
                default_headers=settings.default_headers,
            )
        )


def _await_workers(
    ready_dir: str,
    workers: int,
    stop: threading.Event,
    on_ready: Callable[[dict[str, Any]], None],
    seen: list[dict[str, Any]],
) -> None:
    """Calls `on_ready(note)` once every worker has reported ready (never if the supervisor stops first)."""
    while not stop.wait(0.05):
        notes = []
        for name in os.listdir(ready_dir):
            if name.isdigit():
                try:
                    notes.append(orjson.loads(Path(ready_dir, name).read_bytes()))
                except (OSError, orjson.JSONDecodeError):
                    pass
        if len(notes) >= workers:
            seen.extend(notes)
            on_ready(notes[0])
            return


def run_workers(
    settings: Settings, sock: socket.socket, workers: int, on_ready: Callable[[dict[str, Any]], None]
) -> int:
    """Serve with `workers` processes on the bound `sock` until SIGTERM/SIGINT; the exit code."""
    import uvicorn
    from uvicorn.supervisors import Multiprocess

    if settings.http_server != "uvicorn":
        log.warning(
            "workers > 1 run under uvicorn's worker supervisor; http_server %r applies to one process",
            settings.http_server,
        )
    switchyard = None
    try:
        switchyard = _SwitchyardThread(settings) if settings.launches_proxy else None
        root_url = switchyard.start() if switchyard is not None else None
    except (ConfigError, RuntimeError, OSError) as exc:
        print(f"switchyard-model: startup failed: {exc}", file=sys.stderr)
        if switchyard is not None:
            switchyard.close()
        return EXIT_USAGE
    ready_dir = process_temp_dir(READY_DIR_PREFIX)
    os.environ[SETTINGS_ENV] = settings.model_dump_json()
    os.environ[SWITCHYARD_ENV] = root_url or ""
    os.environ[READY_DIR_ENV] = ready_dir
    os.environ[RUN_ENV] = new_run_id()  # one run for every worker, restarted ones included
    stop = threading.Event()
    ready: list[dict[str, Any]] = []
    condition = _Condition(settings) if settings.condition_dir else None
    if condition is not None:
        announce = on_ready

        def on_ready(note: dict[str, Any]) -> None:
            condition.write_manifest(note)
            announce(note)

    try:
        config = uvicorn.Config(
            "server.cli.workers:worker_app",
            factory=True,
            workers=workers,
            log_level="warning",
            access_log=False,
            lifespan="on",
            timeout_graceful_shutdown=30,
            backlog=4096,
            # Each worker's connections and idle keep-alive (server/http/admission.py, docs/operations.md).
            limit_concurrency=limits(settings_for_workers(settings, root_url)).connections,
            timeout_keep_alive=max(1, round(settings.http_header_timeout_s)),
        )
        supervisor = Multiprocess(config, sockets=[sock])
        watcher = threading.Thread(
            target=_await_workers, args=(ready_dir, workers, stop, on_ready, ready), name="ready", daemon=True
        )
        watcher.start()
        started = time.monotonic()
        supervisor.run()
    finally:
        stop.set()
        try:
            if condition is not None:
                condition.snapshot_stats()
        finally:
            if switchyard is not None:
                switchyard.close()
            shutil.rmtree(ready_dir, ignore_errors=True)
    if not ready:
        print(
            f"switchyard-model: startup failed: the workers did not all start "
            f"(stopped after {time.monotonic() - started:.1f}s; see their errors above)",
            file=sys.stderr,
        )
        return EXIT_FAILED
    return EXIT_OK
