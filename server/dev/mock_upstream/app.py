"""The mock upstream's ASGI app: the chat endpoint (streams, pacing, disconnects), /tokenize, /v1/models and /mock/*."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from server.dev.mock_upstream.replies import ChatJob
from server.dev.mock_upstream.state import MockState
from server.dev.mock_upstream.template import render_prompt
from server.dev.mock_upstream.tokenizer import split_pieces
from server.errors import OpenAIError, error_response, send_error

_JSON_HEADERS = [(b"content-type", b"application/json")]
_SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]
_BAD_JSON = b'{"id": "chatcmpl-mock", "choices": [ this is not JSON'


class StreamCut(Exception):
    """Raised to make the server drop a stream's connection mid-way (the `streamcut` directive)."""


class _HideStreamCut(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], StreamCut))


async def _read_body(receive: Receive) -> bytes | None:
    """The request body, or None if the client went away first."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _wait_for_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _send_whole(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": headers + [(b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


class ChatCompletionsEndpoint:
    """`POST /v1/chat/completions` as a raw ASGI app, so it can watch for disconnects itself."""

    def __init__(self, state: MockState) -> None:
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        state = self.state
        stats = state.stats
        stats.requests += 1
        stats.in_flight += 1
        outcome = "cancelled"
        try:
            raw = await _read_body(receive)
            if raw is None:
                return
            try:
                body = orjson.loads(raw)
            except orjson.JSONDecodeError:
                state.record(scope, raw.decode("utf-8", "replace"))
                outcome = "completed"
                stats.errors += 1
                await send_error(send, OpenAIError(400, "request body must be valid JSON", code="invalid_body"))
                return
            entry = state.record(scope, body)
            try:
                job = state.plan(body)
            except OpenAIError as error:
                outcome = "completed"
                stats.errors += 1
                await send_error(send, error)
                return
            # The ids the engine really used and produced, as an engine's own log would show them.
            entry["prompt_token_ids"] = job.prompt_ids
            entry["generation_token_ids"] = job.gen.ids
            outcome = await self._answer(job, receive, send)
        except StreamCut:
            outcome = "cut"
            raise
        finally:
            stats = state.stats  # may have been replaced by /mock/reset meanwhile
            stats.in_flight -= 1
            if outcome == "completed":
                stats.completed += 1
            elif outcome == "cut":
                stats.cut += 1
            else:
                stats.cancelled += 1

    async def _answer(self, job: ChatJob, receive: Receive, send: Send) -> str:
        d = job.directives
        watcher: asyncio.Task[None] | None = None
        needs_watch = d.hang > 0 or d.sleep_ms > 0 or (job.stream and (d.slow_ms > 0 or d.streamcut is not None))
        if needs_watch:
            watcher = asyncio.ensure_future(_wait_for_disconnect(receive))
        try:
            if d.hang > 0 and await _client_gone(watcher, d.hang):
                return "cancelled"
            if job.error is not None:
                self.state.stats.errors += 1
                if d.sleep_ms > 0 and await _client_gone(watcher, d.sleep_ms / 1000):
                    return "cancelled"
                await send_error(send, job.error)
                return "completed"
            if d.badjson:
                if d.sleep_ms > 0 and await _client_gone(watcher, d.sleep_ms / 1000):
                    return "cancelled"
                if job.stream:
                    await _send_whole(send, 200, b"data: " + _BAD_JSON + b"\n\ndata: [DONE]\n\n", _SSE_HEADERS)
                else:
                    await _send_whole(send, 200, _BAD_JSON, _JSON_HEADERS)
                return "completed"
            if not job.stream:
                if d.sleep_ms > 0 and await _client_gone(watcher, d.sleep_ms / 1000):
                    return "cancelled"
                await _send_whole(send, 200, job.body(self.state.entries), _JSON_HEADERS)
                return "completed"
            return await self._stream(job, watcher, send)
        finally:
            if watcher is not None:
                watcher.cancel()

    async def _stream(self, job: ChatJob, watcher: asyncio.Task[None] | None, send: Send) -> str:
        d = job.directives
        events = job.events(self.state.entries, self.state.choice_cache)
        await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
        if d.sleep_ms > 0 and await _client_gone(watcher, d.sleep_ms / 1000):
            return "cancelled"
        if d.streamcut is not None:
            # Never the [DONE]: the point is a stream that ends without its terminator.
            events = events[: min(d.streamcut, len(events) - 1)]
        if d.slow_ms <= 0:
            # No pacing asked for: the first chunk alone (a real first byte), then the rest in one write.
            await send({"type": "http.response.body", "body": events[0], "more_body": True})
            if len(events) > 1:
                await send({"type": "http.response.body", "body": b"".join(events[1:]), "more_body": True})
        else:
            for index, event in enumerate(events):
                if index and await _client_gone(watcher, d.slow_ms / 1000):
                    return "cancelled"
                await send({"type": "http.response.body", "body": event, "more_body": True})
        if watcher is not None and watcher.done():
            return "cancelled"
        if d.streamcut is not None:
            raise StreamCut(f"stream cut after {len(events)} chunks (scripted)")
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return "completed"


class TokenizeEndpoint:
    """`POST /tokenize` (vLLM's, chat form or prompt form) as a raw ASGI app: the hot path of token injection.

    Raw, like the chat endpoint, so that the request/response objects of the framework are not in
    what the injection benchmark measures; the answers and the validation are the same.
    """

    def __init__(self, state: MockState) -> None:
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        state = self.state
        state.stats.tokenize += 1
        raw = await _read_body(receive)
        if raw is None:
            return
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            body = None
        state.record(scope, body if body is not None else raw.decode("utf-8", "replace"))
        try:
            answer = self._answer(body)
        except OpenAIError as error:
            await send_error(send, error)
            return
        await _send_whole(send, 200, orjson.dumps(answer), _JSON_HEADERS)

    def _answer(self, body: Any) -> dict[str, Any]:
        state = self.state
        if not isinstance(body, dict):
            raise OpenAIError(400, "request body must be a JSON object", code="invalid_body")
        strs = bool(body.get("return_token_strs"))
        if isinstance(body.get("messages"), list):
            messages = body["messages"]
            if not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
                raise OpenAIError(400, "messages must be a list of objects with a string role", param="messages")
            tools = body.get("tools") if isinstance(body.get("tools"), list) else None
            add_prompt = body.get("add_generation_prompt", True) is not False
            tokens = state.prompt_ids(messages, tools, add_prompt)
            text = render_prompt(messages, tools, add_prompt, state.template == "drop-reasoning") if strs else ""
        elif isinstance(body.get("prompt"), str):
            text = body["prompt"]
            tokens = state.tokenizer.encode(text)
        else:
            raise OpenAIError(400, "give either messages or prompt", param="messages")
        return {
            "count": len(tokens),
            "max_model_len": state.max_model_len,
            "tokens": tokens,
            "token_strs": split_pieces(text) if strs else None,
        }


async def _client_gone(watcher: asyncio.Task[None] | None, seconds: float) -> bool:
    """Wait `seconds`; True as soon as the client disconnects."""
    if watcher is None:
        await asyncio.sleep(seconds)
        return False
    done, _ = await asyncio.wait({watcher}, timeout=seconds)
    return bool(done)


def create_app(
    *,
    model_name: str = "mock-model",
    max_model_len: int = 32768,
    template: str = "keep-reasoning",
    token_in: str = "honor",
) -> Starlette:
    """The mock upstream as a Starlette app (see docs/mock-upstream.md for the directives and modes)."""
    state = MockState(model_name, max_model_len, template=template, token_in=token_in)
    models_body = orjson.dumps(
        {
            "object": "list",
            "data": [
                {
                    "id": model_name,
                    "object": "model",
                    "created": int(time.time()),
                    "owned_by": "vllm",
                    "root": model_name,
                    "parent": None,
                    "max_model_len": max_model_len,
                    "permission": [],
                }
            ],
        }
    )

    async def models(request: Request) -> Response:
        return Response(models_body, media_type="application/json")

    async def health(request: Request) -> Response:
        return Response(b"", status_code=200)

    async def mock_requests(request: Request) -> Response:
        entries = list(state.log)
        last = request.query_params.get("last")
        if last and last.isdigit():
            entries = entries[-int(last) :] if int(last) else []
        return Response(orjson.dumps({"requests": entries}), media_type="application/json")

    async def mock_stats(request: Request) -> Response:
        return Response(orjson.dumps(state.stats.as_dict()), media_type="application/json")

    async def mock_config(request: Request) -> Response:
        """GET: the template and token-in modes; POST {"template"?, "token_in"?}: change them."""
        if request.method == "POST":
            try:
                body = orjson.loads(await request.body())
                state.configure(template=body.get("template"), token_in=body.get("token_in"))
            except (orjson.JSONDecodeError, AttributeError, ValueError) as exc:
                error = OpenAIError(400, f"bad mock config: {exc}", code="invalid_value")
                return error_response(error)
        return Response(
            orjson.dumps({"template": state.template, "token_in": state.token_in}), media_type="application/json"
        )

    async def mock_reset(request: Request) -> Response:
        state.reset()
        return Response(orjson.dumps({"ok": True}), media_type="application/json")

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # Installed here, after the server has configured logging, so a scripted stream cut
        # does not print a traceback for every request.
        hide = _HideStreamCut()
        logger = logging.getLogger("uvicorn.error")
        logger.addFilter(hide)
        try:
            yield
        finally:
            logger.removeFilter(hide)

    app = Starlette(
        routes=[
            Route("/v1/chat/completions", ChatCompletionsEndpoint(state), methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/tokenize", TokenizeEndpoint(state), methods=["POST"]),
            Route("/health", health, methods=["GET"]),
            Route("/mock/requests", mock_requests, methods=["GET"]),
            Route("/mock/stats", mock_stats, methods=["GET"]),
            Route("/mock/reset", mock_reset, methods=["POST"]),
            Route("/mock/config", mock_config, methods=["GET", "POST"]),
        ],
        lifespan=lifespan,
    )
    app.state.mock = state
    return app


def run(host: str = "127.0.0.1", port: int = 8000, **kw: Any) -> None:
    """Serve the mock upstream with uvicorn until interrupted (`model_name`/`max_model_len` go to the app)."""
    import uvicorn

    app_kw = {name: kw.pop(name) for name in ("model_name", "max_model_len", "template", "token_in") if name in kw}
    settings: dict[str, Any] = {"log_level": "warning", "access_log": False}
    try:
        import uvloop  # noqa: F401

        settings["loop"] = "uvloop"
    except ImportError:
        pass
    try:
        import httptools  # noqa: F401

        settings["http"] = "httptools"
    except ImportError:
        pass
    settings.update(kw)

    class AnnouncingServer(uvicorn.Server):
        """Says where it listens once it does (with `--port 0` that is the only way to know)."""

        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets=sockets)
            if self.started and self.servers and self.servers[0].sockets:
                bound_host, bound_port = self.servers[0].sockets[0].getsockname()[:2]
                print(f"mock upstream listening on http://{bound_host}:{bound_port}", flush=True)

    server = AnnouncingServer(uvicorn.Config(create_app(**app_kw), host=host, port=port, **settings))
    try:
        server.run()
    except KeyboardInterrupt:
        pass  # uvicorn re-raises Ctrl-C after its clean shutdown: a requested stop, not an error
