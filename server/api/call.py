"""The model-call template: one flow for every model endpoint, the per-call context, and what they share.

`ModelEndpoint` is a raw ASGI app, one per POST path of the three APIs: chat (server.api.chat),
Responses (server.api.responses) and Messages (server.api.messages: `/v1/messages` and
`/v1/messages/count_tokens`). It owns the flow once: read the body and its correlation, prepare the
chat call (`Call`), admit it, inject token ids, post or stream it (`answer`, `relay_stream`), commit
injection, save the record before the answer's end, finish the span, map errors. An API's `handle`
translates its request and hands the template an `Exchange`, the per-call context, which supplies
only its answer and its stream events; its error shape is `send_error`/`stream_error`.

Longer than 500 lines because the flow is kept whole in one place: a reader follows a call from the
body to its record here, and what each API adds stays in its own module.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import orjson
from starlette.types import Message, Receive, Scope, Send

from middleware.correlation import Correlation, current_correlation, id_rule
from server.api import gym_hooks, inference
from server.api.session_writes import admit_writes
from server.api.upstream_chat import chat_event_batches, parse_reply
from server.capture.gym.tokens import request_items
from server.capture.tokens import TOKEN_REQUEST_FIELDS
from server.capture.write.record import RecordInput
from server.errors import OpenAIError, send_error
from server.http import sse
from server.http.asgi import SSE_HEADERS, ClientGone, parse_json_object, read_body, run_until_disconnect, send_json
from server.ids import uncorrelated_session_id
from server.state import AppState
from server.translate.accumulate import ChatStreamAccumulator, chunks_from_completion
from server.translate.checks import check_counts
from server.upstream.client import SELECTED_MODEL, BufferedStream, UpstreamReply, UpstreamStream, relayed_headers

if TYPE_CHECKING:
    from server.injection.injector import Plan
    from server.telemetry.spans import CallSpan

log = logging.getLogger("switchyard_model.calls")
translate_log = logging.getLogger("switchyard_model.translate")  # what translation reports (`warn_once`)

_Sent = TypeVar("_Sent")  # what sending a call upstream gives back: a reply or an open stream


@dataclass(slots=True)
class Call:
    """One model call as it moves through the handler."""

    correlation: Correlation
    request_id: str
    route: str
    request: dict[str, Any]  # the chat body sent upstream
    payload: bytes  # ... serialised once and sent upstream; emptied once sent (`_SENT`)
    stream: bool
    capture: bool
    added_fields: frozenset[str]  # token-id fields the client did not ask for
    started: float
    wants_token_ids: bool = False  # the client asked for the token triple in its answer
    injection: Plan | None = None  # token injection's decision for this call (docs/injection.md)
    response_id: str | None = None  # a Responses call's id, which its record carries too
    developer_messages: list[int] | None = None  # `request` messages the client sent as `developer`
    inference: inference.Inference | None = None  # set when the session was inferred from the conversation


class Translated(Protocol):
    """A request of another API translated to chat (`server.translate`): the chat body, what was dropped."""

    body: dict[str, Any]
    dropped_tool_types: list[str]


@dataclass(slots=True, eq=False)
class Exchange:
    """One model call in flight, as the template (`ModelEndpoint.run`) drives it: the per-call context.

    It holds the call, its span, its upstream headers and the client's `send`; an API subclasses it with
    what it alone knows: its answer (`answer`) and its stream events (`opening` .. `failed`), built from
    the chat answer. The template owns everything else (post or stream, injection, the record's
    timing, the span, errors), so the three APIs differ only where their wire formats do.
    """

    endpoint: ModelEndpoint
    call: Call
    span: CallSpan
    headers: dict[str, str]  # sent upstream with the call
    send: Send  # the client's (a background run's: its event log's)
    # What the stream's chat chunks add up to (set by `opening`; chat keeps none when nothing reads it).
    accumulator: ChatStreamAccumulator | None = field(default=None, init=False)

    async def answer(self, chat: dict[str, Any], reply: bytes) -> bytes:
        """The non-stream answer's body in this API's shape; saves the record (`save_record`) first."""
        raise NotImplementedError

    def opening(self, stream: UpstreamStream | BufferedStream) -> bytes:
        """Sets up the stream's translation; the events that open the stream (b"" for none)."""
        raise NotImplementedError

    def feed(self, batch: list[tuple[sse.Event, bytes]]) -> list[Any]:
        """The events (or wire parts) that one upstream read's chat chunks become."""
        raise NotImplementedError

    def encode(self, events: list[Any]) -> bytes:
        raise NotImplementedError

    async def completed(self, result: dict[str, Any] | None, last: list[Any]) -> bytes:
        """A whole stream: saves its record; the stream's end (`last`: events that came with [DONE])."""
        raise NotImplementedError

    async def failed(self, error: OpenAIError, last: list[Any]) -> bytes:
        """The end of a stream that broke off: `last` and the in-band error, in this API's shape."""
        raise NotImplementedError


# What a Call's payload becomes once it went upstream (a large body is not kept for the whole call).
_SENT = b""

# Ids unique across processes (a random prefix per process) without a uuid4 per call.
_ID_PREFIX = uuid.uuid4().hex[:16]
_id_counter = itertools.count(1)


def new_id(kind: str) -> str:
    return f"{kind}_{_ID_PREFIX}{next(_id_counter):x}"


def _request_id(corr: Correlation) -> str:
    return corr.request_id or new_id("req")


def refused_id_error(source: str) -> OpenAIError:
    """`refused_session_ids: reject`: the 400 for an id the correlation rules refused, naming where it was."""
    kind, _, name = source.partition(":")
    where = {"header": f"header {name}", "path": "the /ng-rollout/<id>/ path prefix", "body": f"body field {name}"}
    return OpenAIError(
        400,
        f"the id in {where.get(kind, source)} was refused: {id_rule(source)} "
        "(this server answers such calls with this error: refused_session_ids is reject)",
        param=name or source,
        code="invalid_session_id",
    )


class ModelEndpoint:
    """Holds the app state; an instance is the raw ASGI app of one model endpoint."""

    api = ""  # the API name in records and telemetry: "chat", "responses" or "messages"
    path = ""  # the endpoint's path, for warnings

    def __init__(self, state: AppState) -> None:
        self.state = state
        self._warned: set[str] = set()  # see warn_once

    async def handle(self, body: dict[str, Any], corr: Correlation, send: Send, scope: Scope) -> None:
        raise NotImplementedError

    async def send_error(self, send: Send, error: OpenAIError) -> None:
        """An error before the answer started, in this API's shape (OpenAI's unless overridden)."""
        await send_error(send, error)

    def stream_error(self, error: OpenAIError) -> bytes:
        """The in-band error that ends a stream already under way, in this API's shape."""
        return sse.chat_error(error)

    async def _read_request(self, receive: Receive) -> tuple[dict[str, Any], Correlation]:
        body = parse_json_object(await read_body(receive, self.state.settings.max_body_bytes))
        check_counts(body)  # before any copy or translation multiplies what a huge list costs
        # Always removed: it is ours, never the upstream's.
        before = current_correlation()
        corr = before.with_body_session_id(body.pop("proxy_x_session_id", None))
        if len(corr.refused) > len(before.refused):  # a refused body field: counted and warned about too
            self.state.refused_ids.note(corr.refused[len(before.refused) :], self.path)
        if corr.refused and self.state.settings.refused_session_ids == "reject":
            raise refused_id_error(corr.refused[0])
        return body, corr

    def wants_token_ids(self, body: dict[str, Any]) -> bool:
        """The client asked for the token triple in its answer (the field is ours: always removed)."""
        return bool(body.pop("return_token_id_information", False)) or self.state.settings.return_token_id_information

    def captures(self, corr: Correlation) -> bool:
        state = self.state
        return state.capture_store is not None and (corr.session_id is not None or state.settings.capture_uncorrelated)

    def check_capture_open(self, corr: Correlation) -> None:
        """`capture_on_failure: refuse`: a captured call gets a 503 before anything goes upstream."""
        if self.state.capture_handoff is not None and self.captures(corr):
            self.state.capture_handoff.check_open()

    def new_call(
        self,
        corr: Correlation,
        route: str,
        request: dict[str, Any],
        stream: bool,
        added: frozenset[str] = frozenset(),
        wants_token_ids: bool = False,
    ) -> Call:
        corr, inferred = inference.infer_session(self.state, corr, request)  # (prepare's already, if it did)
        inference.decided(self.state, corr, self.captures(corr))
        self.check_capture_open(corr)  # refused: the claim goes back when the request ends
        return Call(
            corr,
            _request_id(corr),
            route,
            request,
            orjson.dumps(request),
            stream,
            self.captures(corr),
            added,
            time.perf_counter(),
            wants_token_ids,
            inference=inferred,
        )

    def prepare(
        self,
        chat_body: dict[str, Any],
        corr: Correlation,
        stream: bool,
        wants_token_ids: bool,
        requested_model: Any,
        extra_body: dict[str, Any],
    ) -> Call:
        """The chat request to send upstream: routed, with the token-id fields capture needs."""
        state = self.state
        route = state.route_for(requested_model)
        corr, _ = inference.infer_session(self.state, corr, chat_body)  # before the token fields: now captured
        request = {**extra_body, **chat_body} if extra_body else chat_body
        request["model"] = route
        request["stream"] = stream
        added: set[str] = set()
        if (
            (self.captures(corr) and state.settings.request_token_ids)
            or wants_token_ids
            or gym_hooks.on_training_path()
        ):
            for key, value in TOKEN_REQUEST_FIELDS:
                if key not in request:
                    request[key] = value
                    added.add(key)
        if wants_token_ids:
            added.clear()  # the client asked for them: nothing to strip from its answer
        return self.new_call(corr, route, request, stream, frozenset(added), wants_token_ids)

    def prepare_translated(
        self,
        translated: Translated,
        body: dict[str, Any],
        corr: Correlation,
        stream: bool,
        wants_token_ids: bool,
        extra_body: dict[str, Any],
    ) -> Call:
        """`prepare` for a request translated to chat from the API's `body` (Responses, Messages); the
        tools the translation had to drop are warned about once per server."""
        for kind in translated.dropped_tool_types:
            self.warn_once(
                f"tool:{kind}", "dropping tools of type %r: a chat completions upstream cannot serve them", kind
            )
        return self.prepare(translated.body, corr, stream, wants_token_ids, body.get("model"), extra_body)

    def gym_items(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        """The items of a request as received that Gym's lineage reads on its training path."""
        return request_items(body)

    async def admit(self, call: Call, scope: Scope) -> None:
        """The one gate between a valid call and everything it creates or sends: may its key write into
        the sessions it names (a 403 if not; new ones are claimed for it, `server.api.session_writes`),
        then Gym's training capture begins (`server.api.gym_hooks`). Every API calls it once, after
        every check of the request and just before dispatch, so a refused call leaves nothing behind."""
        await admit_writes(self.state.owners, self.state.capture_store, call.correlation, scope)
        gym_hooks.admitted()
        await gym_hooks.begin_training_capture(self.state)

    # ---- token injection (docs/injection.md) ---------------------------------------------------
    async def inject(self, call: Call) -> None:
        """With token_injection on, attach the session's token history to a correlated call (called by
        every API just after `admit`)."""
        injector = self.state.injector
        session = call.correlation.session_id
        if injector is None or not call.capture or session is None:
            return
        plan = await injector.prepare(session, call.route, call.request)
        call.injection = plan
        if plan.body is not call.request:
            if plan.adds_field_only and plan.sent_json is not None:  # the messages are not serialised again
                call.payload = injector.id_field.splice(call.payload, plan.sent_json)
            else:
                call.payload = orjson.dumps(plan.body)
            call.request = plan.body

    def _reissue_plain(self, call: Call, error: OpenAIError) -> bool:
        """The engine refused an injected call (a 400/422): send the same call again without the ids."""
        plan = call.injection
        if plan is None or not plan.injected or error.status not in (400, 422) or self.state.injector is None:
            return False
        log.info("the upstream refused the injected ids (%s); sending the call plainly", error.message)
        call.request = self.state.injector.reissue(plan)
        call.payload = orjson.dumps(call.request)
        return True

    async def _plainly_if_refused(self, call: Call, send: Callable[[], Awaitable[_Sent]]) -> _Sent:
        """`send()` the call upstream; if the engine refused its injected ids, once more without them.

        `send` reads `call.payload` (or `call.request`) when called, so the second try sends the plain call."""
        try:
            return await send()
        except OpenAIError as error:
            if not self._reissue_plain(call, error):
                raise
            return await send()

    async def post_chat(self, call: Call, headers: dict[str, str], span: CallSpan) -> UpstreamReply:
        """POST the chat call upstream (once more, plainly, if the engine refused injected ids)."""
        upstream = self.state.require_upstream()
        reply = await self._plainly_if_refused(call, lambda: upstream.post("/chat/completions", call.payload, headers))
        call.payload = _SENT  # nothing sends it again: not kept alive beside the record being built
        span.answered_by(reply.headers.get(SELECTED_MODEL))
        return reply

    def injection_done(self, call: Call, chat: dict[str, Any] | None, span: CallSpan, completed: bool = True) -> None:
        """Verify the echo and commit the chain: before the client sees the answer's end. Never raises."""
        plan = call.injection
        if plan is None or self.state.injector is None:
            return
        try:
            info = self.state.injector.finish(plan, chat, completed)
            span.injection(info)
        except Exception:
            log.exception("token injection bookkeeping failed")

    def upstream_headers(self, call: Call, scope: Scope) -> dict[str, str]:
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

    def limit(self) -> AbstractAsyncContextManager[object]:
        """The concurrency limit on upstream calls (none when unset)."""
        return self.state.semaphore or nullcontext()

    def record_input(
        self, call: Call, chat_response: dict[str, Any], status: str, chat_request: dict[str, Any] | None = None
    ) -> RecordInput:
        """What capture needs to build the call's record (on its writer thread, not here)."""
        corr = call.correlation
        return RecordInput(
            session_id=corr.session_id or uncorrelated_session_id(call.request_id),
            parent_session_id=corr.parent_session_id,
            rollout_id=corr.rollout_id,
            request_id=call.request_id,
            # Handed over as dicts, not copied or re-serialised: nothing mutates them from here on,
            # and an awaited hand-off keeps at most one record per call in flight.
            chat_request=call.request if chat_request is None else chat_request,
            chat_response=chat_response,
            route=call.route,
            api=self.api,
            stream=call.stream,
            latency_ms=(time.perf_counter() - call.started) * 1000.0,
            status=status,
            injection=call.injection.record if call.injection is not None else None,
            response_id=call.response_id,
            developer_messages=call.developer_messages,
            session_source=corr.source if corr.session_id is not None else None,
        )

    async def save_record(
        self,
        call: Call,
        chat_response: dict[str, Any],
        chat_request: dict[str, Any] | None = None,
        served: Callable[[], dict[str, Any]] | None = None,
        shown: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        """A whole answer, before its last byte goes out: its record into its file first.

        The store's writer thread does the work; this only waits. Never raises, except the 503 of
        `capture_on_failure: refuse` when the record could not be saved. On Gym's training path the
        answer also goes into Gym's token store: `served()` gives it as Gym holds it (a Responses
        object), by default the chat answer with Gym's token fields; `shown()`, as the client got it
        (for Gym's evaluation exchange), by default `served()` (see server.api.gym_hooks.answered).
        """
        await gym_hooks.answered(self.state, self.api, chat_response, served, shown)
        inference.answered(self.state, call.inference, call.correlation.session_id, chat_response)  # before it ends
        if call.capture and self.state.capture_handoff is not None:
            await self.state.capture_handoff.save(self.record_input(call, chat_response, "completed", chat_request))

    def save_record_later(
        self, call: Call, chat_response: dict[str, Any], status: str, chat_request: dict[str, Any] | None = None
    ) -> None:
        """A call that failed or was cut: its record is queued, not waited for (its answer is already over)."""
        if call.capture and self.state.capture_handoff is not None:
            self.state.capture_handoff.save_later(self.record_input(call, chat_response, status, chat_request))

    def stream_ended_early(
        self,
        call: Call,
        span: CallSpan,
        accumulator: ChatStreamAccumulator | None,
        status: str,
        *,
        injection_finished: bool,
        kept: bool,
    ) -> None:
        """A stream that failed or was cut: injection learns it did not complete, and what arrived is
        queued as the call's record (`status` "failed" or "partial") unless it was saved already."""
        if not injection_finished:
            self.injection_done(call, None, span, completed=False)
        if accumulator is not None and not kept:
            self.save_record_later(call, accumulator.result(), status)

    # ---- the template: one flow for every API's model call ---------------------------------------
    async def begin(
        self, call: Call, scope: Scope, client_request: dict[str, Any], stream: bool | None = None
    ) -> CallSpan:
        """Admit the call (nothing is created for a refused one), inject its token history, start its span."""
        await self.admit(call, scope)
        await self.inject(call)
        return self.start_span(call, scope, client_request, stream)

    def start_span(
        self, call: Call, scope: Scope, client_request: dict[str, Any], stream: bool | None = None
    ) -> CallSpan:
        """The call's root span (`client_request`: the request as the client sent it; `stream`: as it
        asked, where that is not the call's)."""
        return self.state.telemetry.start_call(
            api=self.api,
            route=call.route,
            request=call.request,
            correlation=call.correlation,
            stream=call.stream if stream is None else stream,
            scope=scope,
            client_request=client_request,
        )

    async def run(self, exchange: Exchange) -> None:
        """Under the concurrency limit: the answer or the stream; the span ends however the call does."""
        span = exchange.span
        try:
            async with self.limit():
                span.upstream_headers(exchange.headers)  # the CLIENT span starts once the call may go out
                if exchange.call.stream:
                    await self.relay_stream(exchange)
                else:
                    await self.answer(exchange)
        except BaseException as exc:
            span.finish(None, exc)
            raise

    async def answer(self, exchange: Exchange) -> None:
        """A non-stream call: post, commit injection, the API's answer (its record saved first), send."""
        call, span = exchange.call, exchange.span
        reply = await self.post_chat(call, exchange.headers, span)
        chat = parse_reply(reply.body)
        self.injection_done(call, chat, span)
        await send_json(exchange.send, 200, await exchange.answer(chat, reply.body), relayed_headers(reply.headers))
        span.finish(chat)

    async def relay_stream(self, exchange: Exchange) -> None:
        """A stream call: the upstream's chat stream relayed as the API's events (also a background run's,
        whose `send` keeps the events). What arrived in one upstream read leaves in one write; the events
        that came with [DONE] leave with the stream's end, after injection is committed and the record
        saved. A stream that breaks off ends with the API's in-band error and a "failed" record; a client
        that goes leaves a "partial" one."""
        call, span, send = exchange.call, exchange.span, exchange.send
        stream = await self.open_chat_stream(call, exchange.headers, span)
        injection_finished = kept = False
        last: list[Any] = []
        try:
            await send(
                {"type": "http.response.start", "status": 200, "headers": SSE_HEADERS + relayed_headers(stream.headers)}
            )
            opening = exchange.opening(stream)
            if opening:
                await send({"type": "http.response.body", "body": opening, "more_body": True})
            async for batch, finished in chat_event_batches(stream, span):
                events = exchange.feed(batch)
                if finished:
                    last = events  # they arrived with [DONE]: they go out with the stream's end
                elif events:
                    await send({"type": "http.response.body", "body": exchange.encode(events), "more_body": True})
            accumulator = exchange.accumulator
            result = accumulator.result() if accumulator is not None else None
            self.injection_done(call, result, span)  # committed before the client sees the end
            injection_finished = kept = True  # once queued, the completed record is the call's only one
            await send({"type": "http.response.body", "body": await exchange.completed(result, last)})
            span.finish(result)
        except OpenAIError as error:
            # Mid-stream: the status line is gone, so the error travels in-band, as Switchyard does.
            await send({"type": "http.response.body", "body": await exchange.failed(error, last)})
            self.stream_ended_early(
                call, span, exchange.accumulator, "failed", injection_finished=injection_finished, kept=kept
            )
            span.finish(None, error)
        except asyncio.CancelledError:
            self.stream_ended_early(
                call, span, exchange.accumulator, "partial", injection_finished=injection_finished, kept=kept
            )
            raise
        finally:
            await stream.aclose()

    def warn_once(self, key: str, message: str, *args: Any) -> None:
        """Log what translation reported once per server, not once per call."""
        if key not in self._warned:
            self._warned.add(key)
            translate_log.warning(message, *args)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The raw ASGI app: 503 until the lifespan has brought Switchyard up (and after it went down);
        errors before the response starts become OpenAI-shaped JSON; a gone client cancels upstream."""
        if not self.state.ready or self.state.proxy.is_known_down():
            await self.send_error(send, OpenAIError(503, "Switchyard is not running", code="proxy_unavailable"))
            return
        progress = {"started": False, "answered": False}
        answering, answering_token, send = inference.begin(self.state.owners.tag(scope), send)

        async def tracking_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                progress["started"] = True
            elif not message.get("more_body", False):
                progress["answered"] = True
            await send(message)

        gym_token = None
        failure: tuple[int | None, str | None] = (None, None)  # for Gym's evaluation exchange
        try:
            body, corr = await self._read_request(receive)
            inference.named(corr.session_id)
            gym_token = gym_hooks.open_gym_call(self.state, body, corr, self.gym_items)
            await run_until_disconnect(
                receive, lambda: self.handle(body, corr, tracking_send, scope), answered=lambda: progress["answered"]
            )
        except ClientGone:
            failure = (None, "cancelled")
        except OpenAIError as error:
            failure = (error.status, None)
            if not progress["started"]:
                await self.send_error(send, error)
        except Exception:
            log.exception("unhandled error in %s", scope.get("path"))
            failure = (500, None)
            internal = OpenAIError(500, "internal server error", code="internal_error")
            if not progress["started"]:
                await self.send_error(send, internal)
            elif not progress["answered"]:  # mid-stream: end it with an error event, never a silent cut
                await send({"type": "http.response.body", "body": self.stream_error(internal)})
        finally:
            inference.end(self.state, answering, answering_token)
            if gym_token is not None:
                await gym_hooks.close_gym_call(self.state, gym_token, self.api, failure, progress["started"])

    async def open_chat_stream(
        self, call: Call, headers: dict[str, str], span: CallSpan
    ) -> UpstreamStream | BufferedStream:
        """The upstream's chat stream; or, with `buffer_upstream_streams`, a non-stream call replayed as one."""
        stream = await self._open_chat_stream(call, headers)
        span.answered_by(stream.headers.get(SELECTED_MODEL))
        return stream

    async def _open_chat_stream(self, call: Call, headers: dict[str, str]) -> UpstreamStream | BufferedStream:
        upstream = self.state.require_upstream()
        if self.state.settings.buffer_upstream_streams and call.capture:
            reply = await self._plainly_if_refused(
                call,
                lambda: upstream.post("/chat/completions", orjson.dumps({**call.request, "stream": False}), headers),
            )
            return BufferedStream(reply, chunks_from_completion(parse_reply(reply.body)))
        stream = await self._plainly_if_refused(
            call, lambda: upstream.open_stream("/chat/completions", call.payload, headers)
        )
        call.payload = _SENT  # as in post_chat: sent, and not needed while the stream runs
        return stream
