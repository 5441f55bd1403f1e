"""POST /v1/chat/completions: check the body, forward it to Switchyard's chat API, relay the answer, hand off capture."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.types import Scope, Send

from middleware.correlation import Correlation
from server.api.call import Exchange, ModelEndpoint
from server.capture.gym.tokens import chat_with_gym_tokens
from server.capture.tokens import strip_token_fields
from server.errors import OpenAIError
from server.http import sse
from server.translate.accumulate import ChatStreamAccumulator
from server.upstream.client import BufferedStream, UpstreamStream


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
        span = await self.begin(call, scope, sent)
        await self.run(_ChatExchange(self, call, span, self.upstream_headers(call, scope), send, drop_usage_chunk))


@dataclass(slots=True, eq=False)
class _ChatExchange(Exchange):
    """A chat call's answer: the upstream's, relayed as is but for the token fields we added (and, on a
    stream, the usage chunk we asked for)."""

    drop_usage_chunk: bool  # the usage chunk was asked for by us, not by the client
    parse: bool = field(default=False, init=False)  # the chunks must be read, not only relayed

    async def answer(self, chat: dict[str, Any], reply: bytes) -> bytes:
        call = self.call
        await self.endpoint.save_record(call, chat)  # the record in its file before the answer goes out
        if call.added_fields:
            return orjson.dumps(strip_token_fields(chat, call.added_fields))
        if call.wants_token_ids and self.endpoint.state.settings.gym is not None:
            return orjson.dumps(chat_with_gym_tokens(chat))  # where Gym reads them, as its vllm_model
        return reply

    def opening(self, stream: UpstreamStream | BufferedStream) -> bytes:
        # Telemetry wants the finish reason and usage even of calls that are not recorded.
        if self.call.capture or self.endpoint.state.telemetry.enabled:
            self.accumulator = ChatStreamAccumulator()
        self.parse = self.accumulator is not None or bool(self.call.added_fields)
        return b""

    def feed(self, batch: list[tuple[sse.Event, bytes]]) -> list[bytes]:
        accumulator, added, drop_usage_chunk = self.accumulator, self.call.added_fields, self.drop_usage_chunk
        parts = []
        for event, data in batch:
            if self.parse or (drop_usage_chunk and _USAGE_ONLY_MARK in data):
                chunk = orjson.loads(data)
                if accumulator is not None:
                    accumulator.feed(chunk)  # the usage chunk too: capture and spans keep the usage
                if drop_usage_chunk and chunk.get("choices") == [] and "usage" in chunk:
                    continue  # asked for by us (or by Switchyard), not by the client
                if added:
                    # Edited in place: fed already, the chunk itself is not kept.
                    parts.append(sse.encode_json(strip_token_fields(chunk, added, in_place=True)))
                else:
                    parts.append(event.wire())
            else:
                parts.append(event.wire())
        return parts

    def encode(self, events: list[bytes]) -> bytes:
        return b"".join(events)

    async def completed(self, result: dict[str, Any] | None, last: list[bytes]) -> bytes:
        if result is not None:
            await self.endpoint.save_record(self.call, result)  # the record in its file before [DONE]
        return b"".join(last) + sse.DONE

    async def failed(self, error: OpenAIError, last: list[bytes]) -> bytes:
        return b"".join(last) + sse.chat_error(error)


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
