"""POST /v1/responses: translate to a chat call (or relay as is, with `upstream_api: responses`), answer, hand off capture."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import aclosing
from dataclasses import dataclass, field, replace
from typing import Any

import orjson
from starlette.types import Scope, Send

from middleware.correlation import Correlation
from server.api.call import Call, Exchange, ModelEndpoint, new_id
from server.api.upstream_chat import parse_json
from server.errors import OpenAIError
from server.http import sse
from server.http.asgi import SSE_HEADERS, send_json
from server.state import AppState
from server.stateful.context import expand
from server.stateful.runner import start_background
from server.stateful.turns import Turn
from server.translate.request import RESPONSES_FIELDS, responses_to_chat
from server.translate.response import chat_to_response, response_to_chat
from server.translate.stream import ResponsesStreamTranslator
from server.translate.tools import ToolMap
from server.upstream.client import SELECTED_MODEL, BufferedStream, UpstreamStream, relayed_headers

_TERMINAL_RESPONSE_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed"})
_TERMINAL_MARKERS = tuple(kind.encode() for kind in _TERMINAL_RESPONSE_EVENTS)


class Responses(ModelEndpoint):
    api = "responses"
    path = "/v1/responses"

    def __init__(self, state: AppState) -> None:
        super().__init__(state)
        # `extra_body` goes under the body of the API the client called, as in Gym. On /v1/responses
        # the Responses fields go under the Responses body (before translation); anything else
        # (vLLM knobs such as chat_template_kwargs) goes under the translated chat body.
        extra = state.settings.extra_body
        self._extra_for_responses = {k: v for k, v in extra.items() if k in RESPONSES_FIELDS}
        self._extra_for_translated_chat = {k: v for k, v in extra.items() if k not in RESPONSES_FIELDS}

    async def handle(self, body: dict[str, Any], corr: Correlation, send: Send, scope: Scope) -> None:
        wants_token_ids = self.wants_token_ids(body)
        stream = body.get("stream") is True
        if self.state.settings.upstream_api == "responses":
            await self._passthrough(body, corr, stream, send, scope)
            return
        sent = body  # as the client sent it: the call's input on its root span
        if self._extra_for_responses:
            body = {**self._extra_for_responses, **body}
        stateful = self.state.response_store
        owner = stateful.owner(scope) if stateful is not None else ""
        response_id = new_id("resp")  # before expanding: the input's items are named after it
        expanded = await expand(body, stateful, owner, has_session=corr.session_id is not None, response_id=response_id)
        if expanded.session_id is not None:  # the previous response's, or the conversation's
            corr = replace(corr, session_id=expanded.session_id, source="stored:" + expanded.session_source)
        body = expanded.body
        translated = responses_to_chat(body)
        call = self.prepare_translated(
            translated,
            body,
            corr,
            stream or expanded.background,  # a background run always streams: its events are kept
            wants_token_ids,
            self._extra_for_translated_chat,
        )
        call.developer_messages = translated.developer_messages or None
        corr = call.correlation  # with its session, if one was inferred from the conversation
        if expanded.background:  # its place first (the 429 beyond the bounds): a refused run leaves nothing
            assert stateful is not None  # expand() refuses background without the store
            stateful.runs.reserve(expanded.owner)
            try:
                span = await self.begin(call, scope, sent, stream)
                turn = Turn(stateful, expanded, response_id, corr.session_id)
            except BaseException:
                stateful.runs.release(expanded.owner)
                raise
            call.response_id = turn.response_id
            headers = self.upstream_headers(call, scope)
            # From here start_background gives the place back.
            if call.inference is not None:
                call.inference.detached = True  # the run registers its answer when it completes
            exchange = _ResponsesExchange(
                self, call, span, headers, send, body, translated.tool_map, turn, int(time.time())
            )
            await start_background(self, exchange)
            return
        span = await self.begin(call, scope, sent)
        headers = self.upstream_headers(call, scope)
        call.response_id = response_id
        turn = Turn(stateful, expanded, response_id, corr.session_id)
        await self.run(
            _ResponsesExchange(self, call, span, headers, send, body, translated.tool_map, turn, int(time.time()))
        )

    # ---- upstream_api: responses --------------------------------------------------------------

    async def _passthrough(
        self, body: dict[str, Any], corr: Correlation, stream: bool, send: Send, scope: Scope
    ) -> None:
        """`upstream_api: responses`: relay to Switchyard's /v1/responses unchanged.

        Switchyard keeps vLLM's token ids only on a same-format hop, so this path records them only
        when the Responses upstream itself returns them; the call is recorded either way.
        """
        request = {**self.state.settings.extra_body, **body}
        route = self.state.route_for(body.get("model"))
        request["model"] = route
        call = self.new_call(corr, route, request, stream)
        await self.admit(call, scope)
        headers = self.upstream_headers(call, scope)
        span = self.start_span(call, scope, body)
        try:
            async with self.limit():
                span.upstream_headers(headers)
                final = await self._relay(call, headers, send)
            span.finish(final)
        except BaseException as exc:
            span.finish(None, exc)
            raise

    async def _relay(self, call: Call, headers: dict[str, str], send: Send) -> dict[str, Any] | None:
        """Relay one /v1/responses call as is; returns the final Responses object, if there was one."""
        if not call.stream:
            reply = await self.state.require_upstream().post("/responses", call.payload, headers)
            final = parse_json(reply.body)
            await self.save_record(
                call, response_to_chat(final or {}), _relayed_chat_request(call), _served(final or {})
            )
            await send_json(send, 200, reply.body, relayed_headers(reply.headers))
            return final
        upstream = await self.state.require_upstream().open_stream("/responses", call.payload, headers)
        final = None
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": SSE_HEADERS + relayed_headers(upstream.headers),
                }
            )
            async with aclosing(upstream.event_batches()) as batches:
                async for batch in batches:
                    for event in batch:
                        # Only the terminal event is parsed: it carries the whole response.
                        data = event.data
                        if data and any(marker in data for marker in _TERMINAL_MARKERS):
                            payload = parse_json(data) if data != sse.DONE_DATA else None
                            if final is None and payload and payload.get("type") in _TERMINAL_RESPONSE_EVENTS:
                                final = payload.get("response")
                                if final is not None:  # kept before the client sees the end
                                    await self.save_record(
                                        call, response_to_chat(final), _relayed_chat_request(call), _served(final)
                                    )
                    # What arrived in one read leaves in one write.
                    body = b"".join(event.wire() for event in batch)
                    await send({"type": "http.response.body", "body": body, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        except OpenAIError as error:
            await send({"type": "http.response.body", "body": sse.responses_error(error)})
        finally:
            await upstream.aclose()
        if final is None and call.capture:
            self.save_record_later(call, response_to_chat({}), "failed", _relayed_chat_request(call))
        return final


@dataclass(slots=True, eq=False)
class _ResponsesExchange(Exchange):
    """A Responses call's answer: the chat answer as a Responses object, or its stream as Responses
    events; stored (`Turn.keep`) before the client sees its end."""

    body: dict[str, Any]  # the Responses request, expanded
    tool_map: ToolMap
    turn: Turn
    created_at: int
    writer: ResponsesStreamTranslator = field(init=False)  # a stream's, from `opening`

    def redirect(self, send: Send) -> None:
        """A background run's: its events go to its event log (`server.stateful.runner`)."""
        self.send = send

    def _served(self, chat: dict[str, Any]) -> Callable[[], dict[str, Any]]:
        """For Gym's token store: the answer as a Responses object with its token triple."""
        return lambda: chat_to_response(
            chat,
            self.body,
            self.tool_map,
            response_id=self.turn.response_id,
            created_at=self.created_at,
            token_ids=True,
            completed_at=int(time.time()),
        )

    async def answer(self, chat: dict[str, Any], reply: bytes) -> bytes:
        call, turn = self.call, self.turn
        response = chat_to_response(
            chat,
            self.body,
            self.tool_map,
            response_id=turn.response_id,
            created_at=self.created_at,
            token_ids=call.wants_token_ids,
            completed_at=int(time.time()),
            echo=turn.echo,
            seal=turn.seal,
        )
        encoded = orjson.dumps(response)  # serialised once: stored, and (most often) the answer as is
        echoed_store = response["store"]
        await turn.keep(response, encoded)  # before the answer: a follow-up sent at once finds it
        served = (lambda: response) if call.wants_token_ids else self._served(chat)
        await self.endpoint.save_record(call, chat, served=served)  # the record in its file before the answer
        # Encoded again only if it changed since: keep reports a failed store on it, and the object
        # itself went to Gym's token store when the client asked for its triple.
        if response["store"] != echoed_store or call.wants_token_ids:
            encoded = orjson.dumps(response)
        return encoded

    def opening(self, stream: UpstreamStream | BufferedStream) -> bytes:
        turn = self.turn
        self.writer = writer = ResponsesStreamTranslator(
            self.body,
            self.tool_map,
            response_id=turn.response_id,
            created_at=self.created_at,
            model=stream.headers.get(SELECTED_MODEL) or self.call.route,
            token_ids=self.call.wants_token_ids,
            echo=turn.echo,
            seal=turn.seal,
        )
        self.accumulator = writer.accumulator
        return sse.encode_responses_events(writer.start())

    def feed(self, batch: list[tuple[sse.Event, bytes]]) -> list[dict[str, Any]]:
        feed = self.writer.feed
        return [event for _, data in batch for event in feed(orjson.loads(data))]

    def encode(self, events: list[dict[str, Any]]) -> bytes:
        return sse.encode_responses_events(events)

    async def completed(self, result: dict[str, Any] | None, last: list[dict[str, Any]]) -> bytes:
        assert result is not None  # the writer always accumulates
        writer = self.writer
        await self.endpoint.save_record(self.call, result, served=self._served(result))  # the record in its file
        closing = writer.finish(completed_at=int(time.time()))
        # Stored before response.completed goes out (its `store` is set here, before encoding).
        await self.turn.keep(writer.response)
        if writer.late_tool_deltas:
            self.endpoint.warn_once(
                "late-tool-delta",
                "upstream interleaved tool-call deltas; a closed call's late arguments only reach the final response",
            )
        return sse.encode_responses_events(last + closing) + sse.DONE

    async def failed(self, error: OpenAIError, last: list[dict[str, Any]]) -> bytes:
        failing = self.writer.fail(error.message, error.code)
        await self.turn.keep(self.writer.response)
        return sse.encode_responses_events(last + failing) + sse.DONE


def _served(response: dict[str, Any]) -> Callable[[], dict[str, Any]]:
    """A relayed answer as it was served, for Gym's token store."""
    return lambda: response


def _relayed_chat_request(call: Call) -> dict[str, Any]:
    """The chat form of a relayed Responses request, for its record."""
    try:
        return responses_to_chat(call.request).body
    except OpenAIError:
        return {"messages": []}  # a field only the Responses upstream understands
