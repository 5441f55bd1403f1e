"""POST /v1/chat/completions: check the body, forward it to Switchyard's chat API, relay the answer, hand off capture."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import orjson
from starlette.types import Scope, Send

from middleware.correlation import Correlation
from server.api.call import Call, ModelEndpoint, chat_event_batches, parse_reply
from server.capture.gym.tokens import chat_with_gym_tokens
from server.capture.tokens import strip_token_fields
from server.errors import OpenAIError
from server.http import sse
from server.http.asgi import SSE_HEADERS, send_json
from server.translate.accumulate import ChatStreamAccumulator
from server.upstream.client import relayed_headers

if TYPE_CHECKING:
    from server.telemetry.spans import CallSpan


class ChatCompletions(ModelEndpoint):
    api = "chat"
    path = "/v1/chat/completions"

    async def handle(self, body: dict[str, Any], corr: Correlation, send: Send, scope: Scope) -> None:
        validate_chat(body)
        sent = dict(body)  # as the client sent it (the call's input on its root span): before we add stream_options
        drop_usage_chunk = _ask_for_usage(body)
        call = self.prepare(
            body,
            corr,
            body.get("stream") is True,
            wants_token_ids=self.wants_token_ids(body),
            requested_model=body.get("model"),
            extra_body=self.state.settings.extra_body,
        )
        corr = call.correlation  # with its session, if one was inferred from the conversation
        await self.admit(call, scope)
        await self.inject(call)
        span = self.state.telemetry.start_call(
            api="chat",
            route=call.route,
            request=call.request,
            correlation=corr,
            stream=call.stream,
            scope=scope,
            client_request=sent,
        )
        headers = self.upstream_headers(call, scope)
        try:
            async with self.limit():
                span.upstream_headers(headers)  # the CLIENT span starts once the call may go out
                if call.stream:
                    await self._stream(call, headers, send, span, drop_usage_chunk)
                else:
                    reply = await self.post_chat(call, headers, span)
                    chat = parse_reply(reply.body)
                    self.injection_done(call, chat, span)
                    await self.save_record(call, chat)  # the record in its file before the answer goes out
                    out = reply.body
                    if call.added_fields:
                        out = orjson.dumps(strip_token_fields(chat, call.added_fields))
                    elif call.wants_token_ids and self.state.settings.gym is not None:
                        out = orjson.dumps(chat_with_gym_tokens(chat))  # where Gym reads them, as its vllm_model
                    await send_json(send, 200, out, relayed_headers(reply.headers))
                    span.finish(chat)
        except BaseException as exc:
            span.finish(None, exc)
            raise

    async def _stream(
        self, call: Call, headers: dict[str, str], send: Send, span: CallSpan, drop_usage_chunk: bool
    ) -> None:
        stream = await self.open_chat_stream(call, headers, span)
        # Telemetry wants the finish reason and usage even of calls that are not recorded.
        accumulator = ChatStreamAccumulator() if call.capture or self.state.telemetry.enabled else None
        parse = accumulator is not None or bool(call.added_fields)
        injection_finished = kept = False
        last = b""  # the events that arrived with [DONE]: they go out with it, after the record
        try:
            await send(
                {"type": "http.response.start", "status": 200, "headers": SSE_HEADERS + relayed_headers(stream.headers)}
            )
            async for batch, finished in chat_event_batches(stream, span):
                parts = []
                for event, data in batch:
                    if parse or (drop_usage_chunk and _USAGE_ONLY_MARK in data):
                        chunk = orjson.loads(data)
                        if accumulator is not None:
                            accumulator.feed(chunk)  # the usage chunk too: capture and spans keep the usage
                        if drop_usage_chunk and chunk.get("choices") == [] and "usage" in chunk:
                            continue  # asked for by us (or by Switchyard), not by the client
                        if call.added_fields:
                            # Edited in place: fed already, the chunk itself is not kept.
                            parts.append(sse.encode_json(strip_token_fields(chunk, call.added_fields, in_place=True)))
                        else:
                            parts.append(event.wire())
                    else:
                        parts.append(event.wire())
                if finished:
                    last = b"".join(parts)
                elif parts:  # what arrived in one read leaves in one write
                    await send({"type": "http.response.body", "body": b"".join(parts), "more_body": True})
            result = accumulator.result() if accumulator is not None else None
            self.injection_done(call, result, span)  # committed before the client sees [DONE]
            injection_finished = True
            if result is not None:
                kept = True  # once queued, the completed record is the call's only one
                await self.save_record(call, result)  # and the record is in its file
            await send({"type": "http.response.body", "body": last + sse.DONE})
            span.finish(result)
        except OpenAIError as error:
            # Mid-stream: the status line is gone, so the error travels in-band, as Switchyard does.
            await send({"type": "http.response.body", "body": last + sse.chat_error(error)})
            self.stream_ended_early(call, span, accumulator, "failed", injection_finished=injection_finished, kept=kept)
            span.finish(None, error)
        except asyncio.CancelledError:
            self.stream_ended_early(
                call, span, accumulator, "partial", injection_finished=injection_finished, kept=kept
            )
            raise
        finally:
            await stream.aclose()


# A usage-only chunk has `"choices": []`; only chunks holding this are parsed to check (compact JSON,
# as vLLM and Switchyard write it; a spaced variant would only be relayed, never lost).
_USAGE_ONLY_MARK = b'"choices":[]'


def _ask_for_usage(body: dict[str, Any]) -> bool:
    """Make a stream ask the model server for usage (for capture and spans); True if the client did not.

    Switchyard sets `stream_options.include_usage: true` upstream itself when the client sent no
    `stream_options`, and the model server then ends the stream with `{"choices": [], "usage": ...}`.
    A client that did not ask for that chunk breaks on it (`chunk.choices[0]`), so it is asked for
    here explicitly, in every case, and dropped on the way back unless the client asked for it.
    """
    options = body.get("stream_options")
    if body.get("stream") is not True or not (options is None or isinstance(options, dict)):
        return False
    if options is not None and options.get("include_usage") is True:
        return False
    body["stream_options"] = {**(options or {}), "include_usage": True}
    return True


def validate_chat(body: dict[str, Any]) -> None:
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


def _expect(body: dict[str, Any], key: str, kind: type | tuple[type, ...], expected: str) -> None:
    value = body.get(key)
    if value is not None and not isinstance(value, kind):
        raise OpenAIError(400, f"`{key}` must be {expected}", param=key, code="invalid_type")
