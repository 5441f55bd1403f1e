"""The in-process harness: this server's app behind httpx.ASGITransport with its lifespan run, and a
scripted upstream in place of Switchyard, so a route test runs in milliseconds without processes.

The app is the production one (`create_app(settings)`), attached (`switchyard_base_url`) to the
scripted upstream: an ASGI app served on a loopback port by uvicorn inside this process. So a model
call takes the whole production path, the pooled HTTP/1.1 client to "Switchyard" included; only the
processes are gone (no mock engine process, no Switchyard, no `serve`). Unscripted calls go to the
mock engine's own app (`server.dev.mock_upstream`, the same engine the integration stack runs), so its
`[[mock:...]]` directives work here too.

Both run on one event loop in a background thread; `client` is a synchronous `httpx.Client` whose
transport hands each request to `httpx.ASGITransport` on that loop. httpx's ASGI transport buffers
the answer: a stream is read whole, which is enough to check its shape (the real-stack integration
tests keep what needs real streaming, real Switchyard or a real socket).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
from collections import deque
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import httpx
import orjson
import uvicorn
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.app import ServerApp, create_app
from server.config import Settings
from server.dev.mock_upstream.app import create_app as create_mock_engine

T = TypeVar("T")

# A Host this server accepts (its default bind address); the ASGI transport sends it as `Host`.
BASE_URL = "http://127.0.0.1:8000"


@dataclass
class UpstreamRequest:
    """One request the scripted upstream received, as this server sent it."""

    method: str
    path: str
    headers: dict[str, str]  # lower-case names
    body: bytes

    def json(self) -> Any:
        return orjson.loads(self.body)


@dataclass
class Reply:
    """A scripted answer: a whole body, or (with `events`) an SSE stream and how it ends."""

    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    events: list[Any] | None = None  # each JSON-encoded into one `data:` event; then `data: [DONE]`
    # After the events: "done" sends `data: [DONE]`; "early" ends the HTTP body without it (as if the
    # engine stopped short); "drop" closes the connection mid-body (no chunked terminator).
    end: Literal["done", "early", "drop"] = "done"


class _StreamCut(Exception):
    """Raised inside the upstream app so that uvicorn drops the connection (a stream's `end="drop"`)."""


class _HideStreamCut(logging.Filter):
    """uvicorn logs an app's exception with its traceback; a drop asked for by a test is no error."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], _StreamCut))


logging.getLogger("uvicorn.error").addFilter(_HideStreamCut())


class ScriptedUpstream:
    """Stands in for Switchyard: records every request, answers model calls from a script first, then
    from the mock engine's app."""

    def __init__(self, fallback: ASGIApp | None = None) -> None:
        self.requests: list[UpstreamRequest] = []
        self._script: deque[Reply] = deque()
        self.fallback = fallback if fallback is not None else create_mock_engine()

    # ---- scripting, from the test -------------------------------------------------------------
    def reply(
        self, status: int = 200, json: Any = None, *, body: bytes = b"", headers: dict[str, str] | None = None
    ) -> None:
        """The next model call (POST) gets this whole answer."""
        content = orjson.dumps(json) if json is not None else body
        all_headers = {"content-type": "application/json", **(headers or {})}
        self._script.append(Reply(status, content, all_headers))

    def stream(
        self,
        events: list[Any],
        *,
        end: Literal["done", "early", "drop"] = "done",
        headers: dict[str, str] | None = None,
    ) -> None:
        """The next model call (POST) gets these events as an SSE stream, ended as `end` says (see Reply)."""
        self._script.append(Reply(200, b"", {"content-type": "text/event-stream", **(headers or {})}, events, end))

    @property
    def model_calls(self) -> list[UpstreamRequest]:
        """The POSTs received (model calls), oldest first: what "nothing was forwarded" is counted by."""
        return [request for request in self.requests if request.method == "POST"]

    # ---- ASGI ------------------------------------------------------------------------------------
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        assert scope["type"] == "http", scope["type"]  # uvicorn runs it with lifespan="off"
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope["headers"]}
        self.requests.append(UpstreamRequest(scope["method"], scope["path"], headers, body))
        if scope["method"] == "POST" and self._script:
            await self._answer(self._script.popleft(), send)
            return
        replayed = False

        async def replay() -> Message:  # the body once more, for the fallback app
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.fallback(scope, replay, send)

    async def _answer(self, reply: Reply, send: Send) -> None:
        headers = [(name.encode(), value.encode()) for name, value in reply.headers.items()]
        if reply.events is None:
            headers.append((b"content-length", str(len(reply.body)).encode()))
            await send({"type": "http.response.start", "status": reply.status, "headers": headers})
            await send({"type": "http.response.body", "body": reply.body})
            return
        await send({"type": "http.response.start", "status": reply.status, "headers": headers})
        for event in reply.events:
            data = event if isinstance(event, bytes) else orjson.dumps(event)
            await send({"type": "http.response.body", "body": b"data: " + data + b"\n\n", "more_body": True})
        if reply.end == "drop":
            raise _StreamCut  # uvicorn closes the connection without the chunked terminator
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n" if reply.end == "done" else b""})


class _Lifespan:
    """The ASGI lifespan protocol, driven by hand (httpx.ASGITransport sends only HTTP requests)."""

    def __init__(self, app: ASGIApp) -> None:
        self._to_app: asyncio.Queue[Message] = asyncio.Queue()
        self._from_app: asyncio.Queue[Message] = asyncio.Queue()
        scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"}, "state": {}}
        self._task: asyncio.Future[None] = asyncio.ensure_future(app(scope, self._to_app.get, self._from_app.put))

    async def _step(self, message: str) -> None:
        await self._to_app.put({"type": message})
        reply = asyncio.ensure_future(self._from_app.get())
        waited: set[asyncio.Future[Any]] = {reply, self._task}
        await asyncio.wait(waited, return_when=asyncio.FIRST_COMPLETED)
        if not reply.done():
            reply.cancel()
            self._task.result()  # the app ended without answering: its exception, if any
            raise RuntimeError(f"the app ended its lifespan without answering {message}")
        if reply.result()["type"].endswith(".failed"):
            with contextlib.suppress(BaseException):
                await self._task  # Starlette re-raises after reporting; the message says it all
            raise RuntimeError(f"{message} failed: {reply.result().get('message', '')}")

    async def startup(self) -> None:
        await self._step("lifespan.startup")

    async def shutdown(self) -> None:
        await self._step("lifespan.shutdown")
        await self._task


class _LoopTransport(httpx.BaseTransport):
    """A synchronous httpx transport that runs each request through httpx.ASGITransport on the harness's loop."""

    def __init__(self, harness: InProcessServer) -> None:
        self._harness = harness
        self._asgi = httpx.ASGITransport(app=harness.app)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        request.read()  # the body, whole (also a generator's): ASGITransport then streams it in one piece

        async def exchange() -> tuple[int, httpx.Headers, bytes]:
            response = await self._asgi.handle_async_request(request)
            return response.status_code, response.headers, await response.aread()

        status, headers, content = self._harness.run(exchange())
        return httpx.Response(status, headers=headers, stream=httpx.ByteStream(content), request=request)


class InProcessServer:
    """This server's app (its lifespan run) attached to a `ScriptedUpstream`, on a loop in a thread."""

    def __init__(self, settings: Settings, upstream: ScriptedUpstream, upstream_socket: socket.socket) -> None:
        self.settings = settings  # attached to the upstream's socket: switchyard_base_url names its port
        self.upstream = upstream
        self._upstream_socket = upstream_socket
        self.url = BASE_URL
        self.v1 = BASE_URL + "/v1"
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="in-process-server", daemon=True)
        self._upstream_server: uvicorn.Server | None = None
        self._upstream_task: asyncio.Task[None] | None = None
        self._lifespan: _Lifespan | None = None
        self.app: ServerApp
        self.transport: httpx.BaseTransport
        self.client: httpx.Client

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine on the harness's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout=60)

    def start(self) -> None:
        self._thread.start()
        try:
            self.run(self._start())
        except BaseException:
            self.stop()
            raise
        # For any synchronous httpx client, e.g. the one an SDK is given (`http_client=httpx.Client(transport=...)`).
        self.transport = _LoopTransport(self)
        self.client = httpx.Client(transport=self.transport, base_url=self.url, timeout=60)

    async def _start(self) -> None:
        config = uvicorn.Config(self.upstream, lifespan="off", log_level="warning", access_log=False)
        self._upstream_server = uvicorn.Server(config)
        self._upstream_task = asyncio.create_task(self._upstream_server.serve(sockets=[self._upstream_socket]))
        while not self._upstream_server.started:
            if self._upstream_task.done():
                self._upstream_task.result()
            await asyncio.sleep(0.001)
        self.app = create_app(self.settings)
        self._lifespan = _Lifespan(self.app)
        await self._lifespan.startup()

    async def _stop(self) -> None:
        if self._lifespan is not None:
            await self._lifespan.shutdown()
        if self._upstream_server is not None and self._upstream_task is not None:
            self._upstream_server.should_exit = True
            await self._upstream_task

    def stop(self) -> None:
        if hasattr(self, "client"):
            self.client.close()
        if self._thread.is_alive():
            try:
                self.run(self._stop())
            finally:
                self._loop.call_soon_threadsafe(self._loop.stop)
                self._thread.join(timeout=10)
        self._loop.close()
        self._upstream_socket.close()

    @property
    def state(self) -> Any:
        """The app's AppState (`server.state`), e.g. to read what capture holds."""
        return self.app.state.switchyard

    def post(self, path: str, json: Any = None, **kw: Any) -> httpx.Response:
        return self.client.post(path, json=json, **kw)

    def get(self, path: str, **kw: Any) -> httpx.Response:
        return self.client.get(path, **kw)


@contextlib.contextmanager
def in_process_server(
    capture_dir: Path, upstream: ScriptedUpstream | None = None, **settings: Any
) -> Iterator[InProcessServer]:
    """The app with `settings` (capture into `capture_dir`), attached to `upstream` (a fresh
    ScriptedUpstream by default), started and, on leaving the block, shut down."""
    # IPPROTO_TCP named, so that asyncio sets TCP_NODELAY on the connections it accepts (it checks the
    # protocol number): else the upstream's answer head and body, two writes, meet the client's
    # delayed ACK and each reused-connection call waits 40 ms.
    upstream_socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    upstream_socket.bind(("127.0.0.1", 0))
    base_url = f"http://127.0.0.1:{upstream_socket.getsockname()[1]}/v1"
    settings.setdefault("rollout_workers", 0)  # rollouts rebuilt in a thread: no process pool
    server = InProcessServer(
        Settings(switchyard_base_url=base_url, capture_dir=str(capture_dir), **settings),
        upstream if upstream is not None else ScriptedUpstream(),
        upstream_socket,
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()
