"""The model-call endpoints: forward to Switchyard's chat API, translate for Responses, hand off capture."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, aclosing, nullcontext
from dataclasses import dataclass
from typing import Any

import orjson

from middleware.correlation import Correlation, current_correlation
from server.errors import OpenAIError
from server.http.asgi import (
    SSE_HEADERS,
    ClientGone,
    parse_json_object,
    read_body,
    run_until_disconnect,
    send_error,
    send_json,
)
from server.ids import uncorrelated_session_id
from server.state import AppState
from server.translate.accumulate import ChatStreamAccumulator, chunks_from_completion
from server.translate.convert import (
    RESPONSES_FIELDS,
    ResponsesStreamWriter,
    chat_to_response,
    response_to_chat,
    responses_to_chat,
)
from server.upstream.client import BufferedStream, relayed_headers

log = logging.getLogger("switchyard_model.calls")

# What we add to a chat request so the upstream (vLLM) returns token ids and logprobs.
_TOKEN_ID_FIELDS = (("return_token_ids", True), ("logprobs", True), ("top_logprobs", 0))


@dataclass(slots=True)
class Call:
    """One model call as it moves through the handler."""

    correlation: Correlation
    request_id: str
    route: str
    request: dict[str, Any]  # the chat body sent upstream
    payload: bytes  # ... serialised once: sent upstream, and handed to capture as is
    stream: bool
    capture: bool
    added_fields: frozenset[str]  # token-id fields the client did not ask for
    started: float


# Ids unique across processes (a random prefix per process) without a uuid4 per call.
_ID_PREFIX = uuid.uuid4().hex[:16]
_id_counter = itertools.count(1)


def _new_id(kind: str) -> str:
    return f"{kind}_{_ID_PREFIX}{next(_id_counter):x}"


def _request_id(corr: Correlation) -> str:
    return corr.request_id or _new_id("req")


class ModelEndpoints:
    """Holds the app state; `chat_completions` and `responses` are raw ASGI apps."""

    def __init__(self, state: AppState) -> None:
        self.state = state
        # `extra_body` goes under the body of the API the client called, as in Gym. On /v1/responses
        # the Responses fields go under the Responses body (before translation); anything else
        # (vLLM knobs such as chat_template_kwargs) goes under the translated chat body.
        extra = state.settings.extra_body
        self._extra_for_responses = {k: v for k, v in extra.items() if k in RESPONSES_FIELDS}
        self._extra_for_translated_chat = {k: v for k, v in extra.items() if k not in RESPONSES_FIELDS}

    # ---- shared plumbing -------------------------------------------------------------------
    async def _read_request(self, receive) -> tuple[dict[str, Any], Correlation]:
        body = parse_json_object(await read_body(receive, self.state.settings.max_body_bytes))
        # Always removed: it is ours, never the upstream's.
        corr = current_correlation().with_body_session_id(body.pop("proxy_x_session_id", None))
        return body, corr

    def _prepare(
        self,
        chat_body: dict[str, Any],
        corr: Correlation,
        stream: bool,
        want_ids: bool,
        requested_model: Any,
        extra_body: dict[str, Any],
    ) -> Call:
        state = self.state
        route = state.route_for(requested_model)
        request = {**extra_body, **chat_body} if extra_body else chat_body
        request["model"] = route
        request["stream"] = stream
        capture = state.store is not None and (corr.session_id is not None or state.settings.capture_uncorrelated)
        added: set[str] = set()
        if (capture and state.settings.request_token_ids) or want_ids:
            for key, value in _TOKEN_ID_FIELDS:
                if key not in request:
                    request[key] = value
                    added.add(key)
        if want_ids:
            added.clear()  # the client asked for them: nothing to strip from its answer
        return Call(
            corr,
            _request_id(corr),
            route,
            request,
            orjson.dumps(request),
            stream,
            capture,
            frozenset(added),
            time.perf_counter(),
        )

    def _upstream_headers(self, call: Call, scope) -> dict[str, str]:
        headers = {"x-request-id": call.request_id}
        if self.state.settings.forward_client_authorization:
            for name, value in scope["headers"]:
                if name == b"authorization":
                    headers["authorization"] = value.decode("latin-1")
                    break
        corr = call.correlation
        if corr.session_id and self.state.settings.forward_session_id:
            for name in self.state.settings.session_id_headers:
                headers[name] = corr.session_id
        return headers

    def _limit(self) -> AbstractAsyncContextManager:
        return self.state.semaphore or nullcontext()

    def _record(self, call: Call, chat_response: dict[str, Any] | bytes, api: str, status: str = "completed") -> None:
        """Hand the call to the capture store; never raises, never blocks.

        Request and answer go as the bytes that crossed the wire where we have them: the writer
        thread parses them again, which keeps large dict trees of queued records away from the
        event loop's garbage collector (measured: 30% of its time with 8k-token captures).
        """
        if not call.capture:
            return
        try:
            corr = call.correlation
            self.state.store.submit_call(
                session_id=corr.session_id or uncorrelated_session_id(call.request_id),
                parent_session_id=corr.parent_session_id,
                rollout_id=corr.rollout_id,
                request_id=call.request_id,
                chat_request=call.payload,
                chat_response=chat_response,
                route=call.route,
                api=api,
                stream=call.stream,
                latency_ms=(time.perf_counter() - call.started) * 1000.0,
                status=status,
            )
        except Exception:  # capture must never fail a call
            log.exception("capture hand-off failed")

    async def _guarded(self, scope, receive, send, handler) -> None:
        """Errors before the response starts become OpenAI-shaped JSON; a gone client cancels upstream."""
        progress = {"started": False, "answered": False}

        async def tracking_send(message) -> None:
            if message["type"] == "http.response.start":
                progress["started"] = True
            elif not message.get("more_body", False):
                progress["answered"] = True
            await send(message)

        try:
            body, corr = await self._read_request(receive)
            await run_until_disconnect(
                receive, lambda: handler(body, corr, tracking_send, scope), answered=lambda: progress["answered"]
            )
        except ClientGone:
            return
        except OpenAIError as error:
            if not progress["started"]:
                await send_error(send, error)
        except Exception:
            log.exception("unhandled error in %s", scope.get("path"))
            error = OpenAIError(500, "internal server error", code="internal_error")
            if not progress["started"]:
                await send_error(send, error)
            elif not progress["answered"]:  # mid-stream: end it with an error event, never a silent cut
                await send({"type": "http.response.body", "body": b"data: " + error.to_json() + b"\n\n"})

    # ---- /v1/chat/completions -----------------------------------------------------------------
    async def chat_completions(self, scope, receive, send) -> None:
        await self._guarded(scope, receive, send, self._chat)

    async def _chat(self, body: dict[str, Any], corr: Correlation, send, scope) -> None:
        _validate_chat(body)
        want_ids = (
            bool(body.pop("return_token_id_information", False)) or self.state.settings.return_token_id_information
        )
        call = self._prepare(
            body,
            corr,
            body.get("stream") is True,
            want_ids=want_ids,
            requested_model=body.get("model"),
            extra_body=self.state.settings.extra_body,
        )
        span = self.state.telemetry.start_call(
            api="chat", route=call.route, request=call.request, correlation=corr, stream=call.stream, scope=scope
        )
        headers = self._upstream_headers(call, scope)
        try:
            async with self._limit():
                span.upstream_headers(headers)  # the CLIENT span starts once the call may go out
                if call.stream:
                    await self._chat_stream(call, headers, send, span)
                else:
                    reply = await self.state.upstream.post("/chat/completions", call.payload, headers)
                    chat = _parse_reply(reply.body)
                    out = reply.body
                    if call.added_fields:
                        out = orjson.dumps(_strip_token_fields(chat, call.added_fields))
                    await send_json(send, 200, out, relayed_headers(reply.headers))
                    span.finish(chat)
                    self._record(call, reply.body, "chat")
        except BaseException as exc:
            span.finish(None, exc)
            raise

    async def _open_chat_stream(self, call: Call, headers: dict[str, str]):
        """The upstream's chat stream; or, with `buffer_upstream_streams`, a non-stream call replayed as one."""
        if self.state.settings.buffer_upstream_streams and call.capture:
            body = orjson.dumps({**call.request, "stream": False})
            reply = await self.state.upstream.post("/chat/completions", body, headers)
            return BufferedStream(reply, chunks_from_completion(_parse_reply(reply.body)))
        return await self.state.upstream.open_stream("/chat/completions", call.payload, headers)

    async def _chat_stream(self, call: Call, headers: dict[str, str], send, span) -> None:
        stream = await self._open_chat_stream(call, headers)
        # Telemetry wants the finish reason and usage even of calls that are not recorded.
        accumulator = ChatStreamAccumulator() if call.capture or self.state.telemetry.enabled else None
        parse = accumulator is not None or bool(call.added_fields)
        try:
            await send(
                {"type": "http.response.start", "status": 200, "headers": SSE_HEADERS + relayed_headers(stream.headers)}
            )
            async for event, data in _chunk_events(stream, span):
                out = event
                if parse:
                    chunk = orjson.loads(data)
                    if accumulator is not None:
                        accumulator.feed(chunk)
                    if call.added_fields:
                        out = b"data: " + orjson.dumps(_strip_token_fields(chunk, call.added_fields))
                await send({"type": "http.response.body", "body": out + b"\n\n", "more_body": True})
            await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})
            result = accumulator.result() if accumulator is not None else None
            span.finish(result)
            if result is not None:
                self._record(call, result, "chat")
        except OpenAIError as error:
            # Mid-stream: the status line is gone, so the error travels in-band, as Switchyard does.
            await send({"type": "http.response.body", "body": b"data: " + error.to_json() + b"\n\n"})
            if accumulator is not None:
                self._record(call, accumulator.result(), "chat", status="failed")
            span.finish(None, error)
        except asyncio.CancelledError:
            if accumulator is not None:
                self._record(call, accumulator.result(), "chat", status="partial")
            raise
        finally:
            await stream.aclose()

    # ---- /v1/responses ------------------------------------------------------------------------
    async def responses(self, scope, receive, send) -> None:
        await self._guarded(scope, receive, send, self._responses)

    async def _responses(self, body: dict[str, Any], corr: Correlation, send, scope) -> None:
        want_triple = (
            bool(body.pop("return_token_id_information", False)) or self.state.settings.return_token_id_information
        )
        stream = body.get("stream") is True
        if self.state.settings.upstream_api == "responses":
            await self._responses_passthrough(body, corr, stream, send, scope)
            return
        if self._extra_for_responses:
            body = {**self._extra_for_responses, **body}
        translated = responses_to_chat(body)
        call = self._prepare(
            translated.body,
            corr,
            stream,
            want_ids=want_triple,
            requested_model=body.get("model"),
            extra_body=self._extra_for_translated_chat,
        )
        span = self.state.telemetry.start_call(
            api="responses", route=call.route, request=call.request, correlation=corr, stream=stream, scope=scope
        )
        headers = self._upstream_headers(call, scope)
        response_id = _new_id("resp")
        created_at = int(time.time())
        try:
            async with self._limit():
                span.upstream_headers(headers)
                if stream:
                    await self._responses_stream(
                        call, body, translated.tool_map, headers, send, span, response_id, created_at, want_triple
                    )
                else:
                    reply = await self.state.upstream.post("/chat/completions", call.payload, headers)
                    chat = _parse_reply(reply.body)
                    response = chat_to_response(
                        chat,
                        body,
                        translated.tool_map,
                        response_id=response_id,
                        created_at=created_at,
                        token_ids=want_triple,
                    )
                    await send_json(send, 200, orjson.dumps(response), relayed_headers(reply.headers))
                    span.finish(chat)
                    self._record(call, reply.body, "responses")
        except BaseException as exc:
            span.finish(None, exc)
            raise

    async def _responses_stream(
        self, call: Call, body, tool_map, headers, send, span, response_id: str, created_at: int, want_triple: bool
    ) -> None:
        stream = await self._open_chat_stream(call, headers)
        model = stream.headers.get("x-model-router-selected-model") or call.route
        writer = ResponsesStreamWriter(
            body, tool_map, response_id=response_id, created_at=created_at, model=model, token_ids=want_triple
        )
        try:
            await send(
                {"type": "http.response.start", "status": 200, "headers": SSE_HEADERS + relayed_headers(stream.headers)}
            )
            await send({"type": "http.response.body", "body": writer.start(), "more_body": True})
            async for _event, data in _chunk_events(stream, span):
                out = writer.feed(orjson.loads(data))
                if out:
                    await send({"type": "http.response.body", "body": out, "more_body": True})
            await send({"type": "http.response.body", "body": writer.finish()})
            result = writer.accumulator.result()
            span.finish(result)
            self._record(call, result, "responses")
        except OpenAIError as error:
            await send({"type": "http.response.body", "body": writer.fail(error.message, error.code)})
            self._record(call, writer.accumulator.result(), "responses", status="failed")
            span.finish(None, error)
        except asyncio.CancelledError:
            self._record(call, writer.accumulator.result(), "responses", status="partial")
            raise
        finally:
            await stream.aclose()

    async def _responses_passthrough(self, body: dict[str, Any], corr: Correlation, stream: bool, send, scope) -> None:
        """`upstream_api: responses`: relay to Switchyard's /v1/responses unchanged.

        Switchyard keeps vLLM's token ids only on a same-format hop, so this path records them only
        when the Responses upstream itself returns them; the call is recorded either way.
        """
        request = {**self.state.settings.extra_body, **body}
        route = self.state.route_for(body.get("model"))
        request["model"] = route
        capture = self.state.store is not None and (
            corr.session_id is not None or self.state.settings.capture_uncorrelated
        )
        call = Call(
            corr,
            _request_id(corr),
            route,
            request,
            orjson.dumps(request),
            stream,
            capture,
            frozenset(),
            time.perf_counter(),
        )
        headers = self._upstream_headers(call, scope)
        span = self.state.telemetry.start_call(
            api="responses", route=route, request=request, correlation=corr, stream=stream, scope=scope
        )
        try:
            async with self._limit():
                span.upstream_headers(headers)
                final = await self._relay_responses(call, headers, send)
            span.finish(final)
        except BaseException as exc:
            span.finish(None, exc)
            raise

    async def _relay_responses(self, call: Call, headers: dict[str, str], send) -> dict[str, Any] | None:
        """Relay one /v1/responses call as is; returns the final Responses object, if there was one."""
        if not call.stream:
            reply = await self.state.upstream.post("/responses", call.payload, headers)
            await send_json(send, 200, reply.body, relayed_headers(reply.headers))
            final = _parse_json(reply.body)
            self._record_responses(call, final)
            return final
        upstream = await self.state.upstream.open_stream("/responses", call.payload, headers)
        final = None
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": SSE_HEADERS + relayed_headers(upstream.headers),
                }
            )
            async for event in upstream.events():
                # Only the terminal event is parsed: it carries the whole response.
                if b"response.completed" in event or b"response.incomplete" in event or b"response.failed" in event:
                    data = _sse_data(event)
                    payload = _parse_json(data) if data and data != b"[DONE]" else None
                    if payload and payload.get("type") in _TERMINAL_RESPONSE_EVENTS:
                        final = payload.get("response")
                await send({"type": "http.response.body", "body": event + b"\n\n", "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        except OpenAIError as error:
            payload = {"type": "error", "code": error.code, "message": error.message, "param": None}
            await send(
                {"type": "http.response.body", "body": b"event: error\ndata: " + orjson.dumps(payload) + b"\n\n"}
            )
        finally:
            await upstream.aclose()
        self._record_responses(call, final, status="completed" if final else "failed")
        return final

    def _record_responses(self, call: Call, response: dict[str, Any] | None, status: str = "completed") -> None:
        if not call.capture:
            return
        try:
            call.payload = orjson.dumps(responses_to_chat(call.request).body)
        except OpenAIError:
            call.payload = b'{"messages": []}'  # a field only the Responses upstream understands
        self._record(call, response_to_chat(response or {}), "responses", status=status)


_TERMINAL_RESPONSE_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed"})


def _parse_json(raw: bytes | None) -> dict[str, Any] | None:
    try:
        doc = orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError:
        return None
    return doc if isinstance(doc, dict) else None


async def _chunk_events(stream, span) -> AsyncIterator[tuple[bytes, bytes]]:
    """Each data event of an upstream chat stream as (raw event, JSON payload), up to `[DONE]`.

    An in-band error (Switchyard's `data: {"error": ...}`) or a stream that ends without `[DONE]`
    raises, so the client gets an error event, never a silent cut.
    """
    first = True
    done = False
    # aclosing: the generators below must be closed here, not whenever they are collected, or the
    # upstream connection under them stays checked out.
    async with aclosing(stream.events()) as events:
        async for event in events:
            if first:
                span.first_chunk()
                first = False
            if done:
                continue  # read to the end, so the connection is released cleanly
            data = _sse_data(event)
            if data is None:
                continue
            if data == b"[DONE]":
                done = True
                continue
            if data.startswith(b'{"error"'):
                raise _in_band_error(orjson.loads(data))
            yield event, data
    if not done:
        raise OpenAIError(502, "the upstream stream ended before it finished", code="upstream_stream_cut")


def _sse_data(event: bytes) -> bytes | None:
    """The payload of an SSE event's `data:` line(s); None for comments and keep-alives."""
    if event.startswith(b"data: "):
        if b"\ndata:" not in event:
            return event[6:]
    lines = [line[5:].lstrip(b" ") for line in event.split(b"\n") if line.startswith(b"data:")]
    return b"\n".join(lines) if lines else None


def _in_band_error(chunk: dict[str, Any]) -> OpenAIError:
    err = chunk.get("error")
    message = err.get("message") if isinstance(err, dict) else str(err)
    return OpenAIError(502, message or "upstream stream failed", code="upstream_stream_error")


def _parse_reply(raw: bytes) -> dict[str, Any]:
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise OpenAIError(502, f"the upstream answered with invalid JSON: {exc}", code="upstream_invalid_json") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("choices"), list):
        raise OpenAIError(502, "the upstream answer is not a chat completion", code="upstream_invalid_response")
    return doc


def _strip_token_fields(chat: dict[str, Any], added: frozenset[str]) -> dict[str, Any]:
    """Remove (in place) what we asked the upstream for but the client did not, so it gets the shape it asked for."""
    if "return_token_ids" in added:
        chat.pop("prompt_token_ids", None)
        for choice in chat.get("choices") or ():
            choice.pop("token_ids", None)
    if "logprobs" in added:
        for choice in chat.get("choices") or ():
            if "logprobs" in choice:
                choice["logprobs"] = None
    return chat


def _validate_chat(body: dict[str, Any]) -> None:
    """The checks that keep a malformed chat body from ever reaching the upstream (400 naming the field)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise OpenAIError(
            400, "`messages` must be a non-empty array of chat messages", param="messages", code="invalid_value"
        )
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise OpenAIError(
                400,
                f"messages[{i}] must be an object with a string `role`",
                param=f"messages[{i}]",
                code="invalid_value",
            )
    _expect(body, "stream", bool, "a boolean")
    _expect(body, "model", str, "a string")
    for key in ("max_tokens", "max_completion_tokens", "n", "top_logprobs"):
        value = body.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            raise OpenAIError(400, f"`{key}` must be a non-negative integer", param=key, code="invalid_type")
    for key in ("temperature", "top_p", "presence_penalty", "frequency_penalty"):
        value = body.get(key)
        if value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool)):
            raise OpenAIError(400, f"`{key}` must be a number", param=key, code="invalid_type")
    tools = body.get("tools")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise OpenAIError(400, "`tools` must be an array of tool objects", param="tools", code="invalid_type")
    _expect(body, "tool_choice", (str, dict), "a string or an object")


def _expect(body: dict[str, Any], key: str, kind, expected: str) -> None:
    value = body.get(key)
    if value is not None and not isinstance(value, kind):
        raise OpenAIError(400, f"`{key}` must be {expected}", param=key, code="invalid_type")
