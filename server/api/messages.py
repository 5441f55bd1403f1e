"""POST /v1/messages and /v1/messages/count_tokens: Anthropic's Messages API, translated to a chat call, errors in its shape."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.types import Scope, Send

from middleware.correlation import Correlation
from server.api.call import Call, Exchange, ModelEndpoint, new_id
from server.capture.gym.messages import responses_request, served_response, with_call_ids
from server.capture.gym.tokens import request_items
from server.errors import OpenAIError, anthropic_error_dict, send_error
from server.http import sse
from server.http.asgi import send_json
from server.state import AppState
from server.stateful.sealing import ReasoningSeal, SealError, load_key
from server.translate.messages_request import MESSAGES_FIELDS, MessagesChatRequest, messages_to_chat
from server.translate.messages_response import chat_to_message
from server.translate.messages_stream import MessagesStreamTranslator, encode_events
from server.upstream.client import SELECTED_MODEL, BufferedStream, UpstreamStream


class _Seals:
    """The reasoning seal key: the stateful API's when it is on, else the same key file, read once."""

    def __init__(self, state: AppState) -> None:
        self._state = state
        self._own: ReasoningSeal | None = None
        self._lock = threading.Lock()

    def get(self) -> ReasoningSeal:
        stateful = self._state.response_store
        if stateful is not None and stateful.seal is not None:
            return stateful.seal
        with self._lock:
            if self._own is None:
                settings = self._state.settings
                self._own = ReasoningSeal(
                    load_key(settings.reasoning_seal_key, settings.capture_dir), self._state.server_run
                )
            return self._own

    def sealer(self, owner: str) -> Callable[[str], str]:
        """Signs reasoning for the key (owner tag) of the call: only that key can send it back."""
        return lambda text: self.get().seal(text, owner)

    def opener(self, owner: str) -> Callable[[Any, str], str]:
        return lambda token, param: self.open(token, param, owner)

    def open(self, token: Any, param: str, owner: str = "") -> str:
        """The reasoning a thinking block's signature seals; a 400 when this server did not seal it
        for this key in this server run."""
        try:
            return self.get().open(token, param, owner)
        except SealError:
            raise OpenAIError(
                400,
                f"`{param}` was not signed by this server, or was altered: send thinking blocks back exactly as "
                "this server returned them",
                param=param,
                code="invalid_signature",
            ) from None


class _AnthropicErrors(ModelEndpoint):
    """A model endpoint whose errors take the Messages API's shape."""

    async def send_error(self, send: Send, error: OpenAIError) -> None:
        await send_error(send, error, anthropic=True)

    def stream_error(self, error: OpenAIError) -> bytes:
        return encode_events([anthropic_error_dict(error)])


class Messages(_AnthropicErrors):
    api = "messages"
    path = "/v1/messages"

    def __init__(self, state: AppState, seals: _Seals) -> None:
        super().__init__(state)
        self._seals = seals
        # extra_body's Messages fields go under the Messages body; anything else under the chat body.
        extra = state.settings.extra_body
        self._extra_for_messages = {k: v for k, v in extra.items() if k in MESSAGES_FIELDS}
        self._extra_for_chat = {k: v for k, v in extra.items() if k not in MESSAGES_FIELDS}
        self._context_windows: dict[str, int] | None = None  # read from the deployment on first use

    def gym_items(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        # Gym's own /v1/messages serves a Messages call as the Responses call it maps it to.
        return request_items(responses_request(body))

    async def handle(self, body: dict[str, Any], corr: Correlation, send: Send, scope: Scope) -> None:
        wants_token_ids = self.wants_token_ids(body)
        stream = body.get("stream") is True
        if self._extra_for_messages:
            body = {**self._extra_for_messages, **body}
        owner = self.state.owners.tag(scope)
        translated = messages_to_chat(body, self._seals.opener(owner))
        call = self.prepare_translated(translated, body, corr, stream, wants_token_ids, self._extra_for_chat)
        self._clamp(call)
        # The Messages request as sent on the root span: the chat request goes on the CLIENT span.
        span = await self.begin(call, scope, body)
        headers = self.upstream_headers(call, scope)
        call.response_id = new_id("msg")
        await self.run(_MessagesExchange(self, call, span, headers, send, body, translated, self._seals.sealer(owner)))

    def _context_length(self, route: str) -> int | None:
        """The route's context length: its deployment `context_window`, else what vLLM said at startup."""
        if self._context_windows is None:
            from server.switchyard.discovery import route_upstreams

            rendered = self.state.proxy.rendered
            upstreams = route_upstreams(rendered.text) if rendered is not None else []
            self._context_windows = {u.route_id: u.context_window for u in upstreams if u.context_window}
        return self._context_windows.get(route) or self.state.max_model_lens.get(route)

    def _clamp(self, call: Call) -> None:
        """A `max_tokens` above the route's context (Claude Code asks for 128000) comes down to it."""
        limit = self._context_length(call.route)
        if limit and call.request.get("max_tokens", 0) > limit:
            call.request["max_tokens"] = limit
            call.payload = orjson.dumps(call.request)


@dataclass(slots=True, eq=False)
class _MessagesExchange(Exchange):
    """A Messages call's answer: the chat answer as a Message, or its stream as Messages events."""

    body: dict[str, Any]  # the Messages request
    translated: MessagesChatRequest
    seal: Callable[[str], str]
    created_at: int = field(default_factory=lambda: int(time.time()), init=False)
    writer: MessagesStreamTranslator = field(init=False)  # a stream's, from `opening`

    def _message(self, chat: dict[str, Any]) -> dict[str, Any]:
        return chat_to_message(
            chat,
            message_id=self.call.response_id or "",
            seal=self.seal,
            show_thinking=self.translated.show_thinking,
            stop_sequences=self.translated.stop_sequences,
            token_ids=self.call.wants_token_ids,
        )

    def _served(self, chat: dict[str, Any], call_ids: Sequence[str | None]) -> Callable[[], dict[str, Any]]:
        """For Gym's token store: the answer as Gym's own /v1/messages captures it (a Responses object)."""
        return lambda: served_response(chat, self.body, self.call.response_id or "", call_ids, self.created_at)

    async def answer(self, chat: dict[str, Any], reply: bytes) -> bytes:
        message = self._message(chat)
        call_ids = [block["id"] for block in message["content"] if block["type"] == "tool_use"]
        # The record in its file before the answer goes out (and Gym's token store, see _served).
        await self.endpoint.save_record(self.call, chat, served=self._served(chat, call_ids), shown=lambda: message)
        return orjson.dumps(message)

    def opening(self, stream: UpstreamStream | BufferedStream) -> bytes:
        self.writer = writer = MessagesStreamTranslator(
            message_id=self.call.response_id or "",
            model=stream.headers.get(SELECTED_MODEL) or self.call.route,
            seal=self.seal,
            show_thinking=self.translated.show_thinking,
            stop_sequences=self.translated.stop_sequences,
            token_ids=self.call.wants_token_ids,
        )
        self.accumulator = writer.accumulator
        return b""

    def feed(self, batch: list[tuple[sse.Event, bytes]]) -> list[dict[str, Any]]:
        feed = self.writer.feed
        return [event for _, data in batch for event in feed(orjson.loads(data))]

    def encode(self, events: list[dict[str, Any]]) -> bytes:
        return encode_events(events)

    async def completed(self, result: dict[str, Any] | None, last: list[dict[str, Any]]) -> bytes:
        assert result is not None  # the writer always accumulates
        writer = self.writer
        call_ids = writer.tool_use_ids()
        # For Gym's evaluation exchange: the message the events make up.
        shown = lambda: self._message(with_call_ids(result, call_ids))  # noqa: E731
        await self.endpoint.save_record(self.call, result, served=self._served(result, call_ids), shown=shown)
        if writer.late_tool_deltas:
            self.endpoint.warn_once(
                "late-tool-delta",
                "upstream interleaved tool-call deltas; a closed call's late arguments were not streamed",
            )
        return encode_events(last + writer.finish())

    async def failed(self, error: OpenAIError, last: list[dict[str, Any]]) -> bytes:
        return encode_events(last + self.writer.fail(error))


class CountTokens(_AnthropicErrors):
    """`POST /v1/messages/count_tokens`: the translated prompt rendered by the engine's own `/tokenize`."""

    api = "messages"
    path = "/v1/messages/count_tokens"

    def __init__(self, state: AppState, seals: _Seals) -> None:
        super().__init__(state)
        self._seals = seals
        self._clients: dict[str, Any] | None = None

    def _client_for(self, route: str) -> Any:
        if self._clients is None:  # built on first use: the deployment is known once Switchyard is up
            from server.injection.setup import tokenize_clients

            rendered = self.state.proxy.rendered
            self._clients = tokenize_clients(self.state.settings, rendered.text if rendered else None)
            self.state.closers.append(self.close)  # their connections go at shutdown, with the rest
        return self._clients.get(route) or self._clients.get("")

    def close(self) -> None:
        for client in (self._clients or {}).values():
            client.close()
        self._clients = None

    async def handle(self, body: dict[str, Any], corr: Correlation, send: Send, scope: Scope) -> None:
        body = {**body, "max_tokens": 1}  # count_tokens takes no max_tokens; the translation wants one
        body.pop("stream", None)
        translated = messages_to_chat(body, self._seals.opener(self.state.owners.tag(scope)))
        route = self.state.route_for(body.get("model"))
        client = self._client_for(route)
        if client is None:
            raise OpenAIError(
                501,
                f"count_tokens needs the engine's /tokenize for route {route!r}: set injection_tokenize_base_url, "
                "or give the route a passthrough target with a base_url in the deployment",
            )
        from server.injection.tokenize import TokenizeError, template_options

        try:
            async with self.limit():  # a round trip to the engine: under the same cap as the model calls
                render = await client.render(
                    translated.body["messages"], translated.body.get("tools"), template_options(translated.body)
                )
        except TokenizeError as exc:
            raise OpenAIError(502, f"the engine could not count the tokens: {exc}") from exc
        await send_json(send, 200, orjson.dumps({"input_tokens": render.prompt_len}))


def messages_handlers(state: AppState) -> dict[str, ModelEndpoint]:
    """The Messages API's model endpoints by path (they share one seal key)."""
    seals = _Seals(state)
    return {"/v1/messages": Messages(state, seals), "/v1/messages/count_tokens": CountTokens(state, seals)}
