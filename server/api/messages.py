"""POST /v1/messages and /v1/messages/count_tokens: Anthropic's Messages API, translated to a chat call, errors in its shape."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import orjson
from starlette.types import Scope, Send

from middleware.correlation import Correlation
from server.api.call import Call, ModelEndpoint, chat_event_batches, new_id, parse_reply
from server.capture.gym.messages import responses_request, served_response, with_call_ids
from server.capture.gym.tokens import request_items
from server.errors import OpenAIError, anthropic_error_dict, send_error
from server.http.asgi import SSE_HEADERS, send_json
from server.state import AppState
from server.stateful.sealing import ReasoningSeal, SealError, load_key
from server.translate.messages_request import MESSAGES_FIELDS, MessagesChatRequest, messages_to_chat
from server.translate.messages_response import chat_to_message
from server.translate.messages_stream import MessagesStreamTranslator, encode_events
from server.upstream.client import SELECTED_MODEL, relayed_headers

if TYPE_CHECKING:
    from server.telemetry.spans import CallSpan

log = logging.getLogger("switchyard_model.translate")


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
        self._warned: set[str] = set()
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
        for kind in translated.dropped_tool_types:
            if kind not in self._warned:
                self._warned.add(kind)
                log.warning("dropping tools of type %r: a chat completions upstream cannot serve them", kind)
        call = self.prepare(
            translated.body,
            corr,
            stream,
            wants_token_ids=wants_token_ids,
            requested_model=body.get("model"),
            extra_body=self._extra_for_chat,
        )
        self._clamp(call)
        corr = call.correlation  # with its session, if one was inferred from the conversation
        await self.admit(call, scope)
        await self.inject(call)
        span = self.state.telemetry.start_call(
            api="messages",
            route=call.route,
            request=call.request,
            correlation=corr,
            stream=stream,
            scope=scope,
            client_request=body,  # the Messages request as sent: the chat request goes on the CLIENT span
        )
        headers = self.upstream_headers(call, scope)
        call.response_id = new_id("msg")
        try:
            async with self.limit():
                span.upstream_headers(headers)
                seal = self._seals.sealer(owner)
                if stream:
                    await self._stream(call, body, translated, headers, send, span, seal)
                else:
                    await self._answer(call, body, translated, headers, send, span, seal)
        except BaseException as exc:
            span.finish(None, exc)
            raise

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

    async def _answer(
        self,
        call: Call,
        body: dict[str, Any],
        translated: MessagesChatRequest,
        headers: dict[str, str],
        send: Send,
        span: CallSpan,
        seal: Callable[[str], str],
    ) -> None:
        created_at = int(time.time())
        reply = await self.post_chat(call, headers, span)
        chat = parse_reply(reply.body)
        self.injection_done(call, chat, span)
        message = chat_to_message(
            chat,
            message_id=call.response_id or "",
            seal=seal,
            show_thinking=translated.show_thinking,
            stop_sequences=translated.stop_sequences,
            token_ids=call.wants_token_ids,
        )
        call_ids = [block["id"] for block in message["content"] if block["type"] == "tool_use"]
        # The record in its file before the answer goes out; on Gym's training path, the answer as
        # Gym's own /v1/messages captures it (a Responses object) into Gym's token store.
        await self.save_record(
            call,
            chat,
            served=lambda: served_response(chat, body, message["id"], call_ids, created_at),
            shown=lambda: message,
        )
        await send_json(send, 200, orjson.dumps(message), relayed_headers(reply.headers))
        span.finish(chat)

    async def _stream(
        self,
        call: Call,
        body: dict[str, Any],
        translated: MessagesChatRequest,
        headers: dict[str, str],
        send: Send,
        span: CallSpan,
        seal: Callable[[str], str],
    ) -> None:
        created_at = int(time.time())
        stream = await self.open_chat_stream(call, headers, span)
        writer = MessagesStreamTranslator(
            message_id=call.response_id or "",
            model=stream.headers.get(SELECTED_MODEL) or call.route,
            seal=seal,
            show_thinking=translated.show_thinking,
            stop_sequences=translated.stop_sequences,
            token_ids=call.wants_token_ids,
        )
        injection_finished = kept = False
        last: list[dict[str, Any]] = []
        try:
            await send(
                {"type": "http.response.start", "status": 200, "headers": SSE_HEADERS + relayed_headers(stream.headers)}
            )
            async for batch, finished in chat_event_batches(stream, span):
                events = [event for _, data in batch for event in writer.feed(orjson.loads(data))]
                if finished:
                    last = events  # they arrived with [DONE]: they go out with the closing events
                elif events:  # what arrived in one read leaves in one write
                    await send({"type": "http.response.body", "body": encode_events(events), "more_body": True})
            result = writer.accumulator.result()
            self.injection_done(call, result, span)  # committed before the client sees the end
            injection_finished = kept = True  # once queued, the completed record is the call's only one
            call_ids = writer.tool_use_ids()
            message_id = call.response_id or ""

            def shown() -> dict[str, Any]:  # for Gym's evaluation exchange: the message the events make up
                return chat_to_message(
                    with_call_ids(result, call_ids),
                    message_id=message_id,
                    seal=seal,
                    show_thinking=translated.show_thinking,
                    stop_sequences=translated.stop_sequences,
                    token_ids=call.wants_token_ids,
                )

            await self.save_record(  # and the record is in its file (see _answer)
                call,
                result,
                served=lambda: served_response(result, body, message_id, call_ids, created_at),
                shown=shown,
            )
            await send({"type": "http.response.body", "body": encode_events(last + writer.finish())})
            if writer.late_tool_deltas and "late-tool-delta" not in self._warned:
                self._warned.add("late-tool-delta")
                log.warning("upstream interleaved tool-call deltas; a closed call's late arguments were not streamed")
            span.finish(result)
        except OpenAIError as error:
            await send({"type": "http.response.body", "body": encode_events(last + writer.fail(error))})
            self.stream_ended_early(
                call, span, writer.accumulator, "failed", injection_finished=injection_finished, kept=kept
            )
            span.finish(None, error)
        except asyncio.CancelledError:
            self.stream_ended_early(
                call, span, writer.accumulator, "partial", injection_finished=injection_finished, kept=kept
            )
            raise
        finally:
            await stream.aclose()


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
