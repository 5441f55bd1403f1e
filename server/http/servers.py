"""Serve the ASGI app on an already bound socket under the chosen HTTP server (uvicorn or granian).

Both run the lifespan and every request on one event loop in the main thread: the hosted
Switchyard is thread-affine (created and closed on the lifespan's thread), and the app's
signal handling (graceful shutdown on SIGTERM/SIGINT, a second signal forces it) needs the main
thread. The app itself stays pure ASGI; only this module knows which server carries it.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

ServerImpl = Literal["uvicorn", "granian"]

# How long a graceful shutdown waits for in-flight calls (streams included) before cutting them.
GRACEFUL_SHUTDOWN_S = 30.0
# Connections waiting to be accepted; Linux caps it at net.core.somaxconn (4,096 by default).
_BACKLOG = 4096


@dataclass(frozen=True)
class ConnectionLimits:
    """What the HTTP server itself bounds per worker (server/http/admission.py sizes them)."""

    connections: int = 4096  # held open at once; further ones wait in the listen backlog
    header_timeout_s: float = 30.0  # to deliver a request head, after opening or after the previous answer


def serve(
    app: Any,
    sock: socket.socket,
    impl: ServerImpl,
    *,
    quiet: Callable[[], bool],
    limits: ConnectionLimits | None = None,
) -> None:
    """Serve until SIGTERM/SIGINT (graceful: in-flight calls finish) or until the lifespan fails.

    `quiet()` is true once the server's own error logs should be dropped (a failed startup, which
    the caller reports in one line)."""
    limits = limits or ConnectionLimits()
    if impl == "granian":
        _serve_granian(app, sock, quiet, limits)
    else:
        _serve_uvicorn(app, sock, quiet, limits)


def _serve_uvicorn(app: Any, sock: socket.socket, quiet: Callable[[], bool], limits: ConnectionLimits) -> None:
    import uvicorn

    logging.getLogger("uvicorn.error").addFilter(lambda record: not quiet())
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=int(GRACEFUL_SHUTDOWN_S),
        backlog=_BACKLOG,
        # uvicorn accepts every connection; beyond this many (connections or requests) it answers a
        # plain 503 itself. It has no deadline for a request head: only idle keep-alive is bounded.
        limit_concurrency=limits.connections,
        timeout_keep_alive=max(1, round(limits.header_timeout_s)),
    )
    try:
        uvicorn.Server(config).run(sockets=[sock])
    except SystemExit:  # uvicorn exits 3 when the lifespan fails; the caller reports that
        if not quiet():
            raise


def _event_loop_runner() -> Callable[[Any], Any]:
    """uvloop's `run` where it is installed, else asyncio's, with one line saying so (it is slower)."""
    try:
        import uvloop
    except ImportError:
        logging.getLogger("switchyard_model.http").warning(
            "uvloop cannot be imported; serving on asyncio's event loop (slower; pip install uvloop)"
        )
        return asyncio.run
    return uvloop.run


def _serve_granian(app: Any, sock: socket.socket, quiet: Callable[[], bool], limits: ConnectionLimits) -> None:
    run = _event_loop_runner()
    # granian says its embedded mode is experimental on every start; the rest of its logs stay.
    logging.getLogger("_granian").addFilter(lambda record: not quiet() and "experimental" not in record.getMessage())
    logging.getLogger("granian").addFilter(lambda record: not quiet())
    from granian.errors import FatalError

    try:
        run(_granian_main(app, sock, limits))
    except FatalError:  # the lifespan failed; the caller reports that
        if not quiet():
            raise


async def _granian_main(app: Any, sock: socket.socket, limits: ConnectionLimits) -> None:
    """granian's embedded server: its Rust I/O threads hand each request to this loop's thread."""
    from granian._granian import SocketHolder
    from granian.constants import HTTPModes, Interfaces, TaskImpl
    from granian.http import HTTP1Settings
    from granian.log import LogLevels
    from granian.server.embed import Server

    host, port = sock.getsockname()[:2]
    # granian leaves Nagle's algorithm on for the connections it accepts: a stream's later writes
    # then wait for the client's delayed ACK (~40 ms per streamed answer to a keep-alive client).
    # Linux hands a listening socket's TCP_NODELAY down to every connection accepted from it.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.listen(_BACKLOG)

    class _OnOurSocket(Server):
        # granian binds its own socket from (address, port); ours is already bound (port 0 read
        # back, one clear error if the port is taken), so hand it ours. Private API: granian is pinned.
        def _init_shared_socket(self) -> None:
            self._ssp = None
            self._shd = SocketHolder(sock.fileno(), False, _BACKLOG)  # type: ignore[call-arg,assignment]
            self._sfd = sock.fileno()  # type: ignore[assignment]

    server = _OnOurSocket(
        app,
        address=host,
        port=port,
        interface=Interfaces.ASGI,
        http=HTTPModes.http1,
        websockets=False,
        task_impl=TaskImpl.asyncio,  # real asyncio tasks: disconnect handling cancels the call's task
        runtime_threads=1,
        backlog=_BACKLOG,
        # granian's "backpressure" is connections per worker: each holds a permit from accept to
        # close (idle keep-alive included); the next connection waits in the listen backlog.
        backpressure=limits.connections,
        # hyper's header read timeout runs from a connection's opening and again after each answer,
        # so it bounds a trickled request head and an idle keep-alive connection alike.
        http1_settings=HTTP1Settings(header_read_timeout=max(1, round(limits.header_timeout_s * 1000))),
        log_level=LogLevels.warning,
    )
    server.workers_kill_timeout = int(GRACEFUL_SHUTDOWN_S)
    loop = asyncio.get_running_loop()
    stopping = False

    def on_signal() -> None:
        nonlocal stopping
        if stopping:  # a second Ctrl-C: do not wait for in-flight calls
            server.workers_kill_timeout = 0
            for worker in server.wrks:
                worker.kill()  # type: ignore[no-untyped-call]  # granian's workers are not annotated
        stopping = True
        server.stop()  # type: ignore[no-untyped-call]

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    try:
        await server.serve()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
