"""Chat stream chunks as Responses stream events, as they arrive (events are dicts; framing is server.http.sse)."""

from __future__ import annotations

from typing import Any

from server.capture.tokens import reasoning_of, token_triple
from server.http.sse import responses_error_event
from server.translate.accumulate import ChatStreamAccumulator, chunk_delta
from server.translate.custom_tools import InputDecoder, decode_input
from server.translate.request import wants_output_logprobs
from server.translate.response import (
    Sealer,
    attach_triple,
    custom_tool_call_output,
    function_call_output,
    id_base,
    item_id,
    message_output,
    reasoning_output,
    refusal_part,
    response_base,
    response_logprobs,
    responses_usage,
    status_for,
    text_part,
)
from server.translate.tool_calls import ToolCallDeltas
from server.translate.tools import ToolMap

# `Response.error.code` is a closed set in the openai SDK; other codes are reported as server_error
# (the in-stream `error` event keeps the original code).
_RESPONSE_ERROR_CODES = frozenset(
    {
        "server_error",
        "rate_limit_exceeded",
        "invalid_prompt",
        "vector_store_timeout",
        "invalid_image",
        "invalid_image_format",
        "invalid_base64_image",
        "invalid_image_url",
        "image_too_large",
        "image_too_small",
        "image_parse_error",
        "image_content_policy_violation",
        "invalid_image_mode",
        "image_file_too_large",
        "unsupported_image_media_type",
        "empty_image_file",
        "failed_to_download_image",
        "image_file_not_found",
    }
)


class _StreamItem:
    """One output item while it streams; text arrives as parts and is joined when it closes."""

    __slots__ = (
        "kind",
        "output_index",
        "item_id",
        "parts",
        "logprobs",
        "call_id",
        "name",
        "namespace",
        "status",
        "decoder",
    )

    def __init__(self, kind: str) -> None:
        self.kind = kind  # reasoning | text | refusal | call | custom (a call to a custom tool)
        self.output_index: int | None = None  # None: a tool call whose name has not arrived yet
        self.item_id = ""
        self.parts: list[str] = []
        self.logprobs: list[dict[str, Any]] = []
        self.call_id: str | None = None
        self.name = ""
        self.namespace: str | None = None
        self.status: str | None = None  # set when output_item.done has been sent
        self.decoder: InputDecoder | None = None  # a custom call's input, decoded as the arguments stream

    @property
    def started(self) -> bool:
        return self.output_index is not None

    def snapshot(self, status: str, seal: Sealer | None = None) -> dict[str, Any]:
        """The item as `output_item.added` shows it (nothing generated yet) or, closed, in full."""
        closing = status != "in_progress"
        text = "".join(self.parts) if closing else ""
        if self.kind == "text":
            return message_output(self.item_id, [text_part(text, self.logprobs)] if closing else [], status)
        if self.kind == "refusal":
            return message_output(self.item_id, [refusal_part(text)] if closing else [], status)
        if self.kind == "reasoning":
            item = reasoning_output(self.item_id, text, status, seal)
            if not closing:
                item["content"] = []
            return item
        if self.kind == "custom":
            # `parts` are the function arguments the model wrote; the item carries their decoded text.
            decoded = decode_input(text) if closing else ""
            return custom_tool_call_output(self.item_id, self.call_id or "", self.name, self.namespace, decoded, status)
        return function_call_output(self.item_id, self.call_id or "", self.name, self.namespace, text, status)


_ITEM_PREFIX = {"text": "msg", "refusal": "msg", "reasoning": "rs", "call": "fc", "custom": "ctc"}


class ResponsesStreamTranslator(ToolCallDeltas[_StreamItem]):
    """Turns upstream chat chunks into Responses stream events (dicts, numbered) as they arrive.

    start() -> created + in_progress; feed(chunk) -> the events that chunk causes (maybe none);
    finish(completed_at) -> closes the open item, then response.completed / response.incomplete;
    fail(message, code) -> an `error` event and response.failed. Any of them starts the stream
    first if start() was not called, and all return [] once the stream has ended. The caller
    frames the events and ends the wire stream with `[DONE]` (server.http.sse).

    One item is open at a time, in the order the upstream starts them; a new kind of content (or a
    new tool call) closes the open item first. A tool-call delta for a call already closed (an
    upstream interleaving calls) cannot be streamed any more: it is kept in the final response and
    counted in `late_tool_deltas`, for the caller to log. `accumulator` holds the chat-form result
    for capture; `response` is the final Responses object once the stream has ended (the same
    shape chat_to_response gives).
    """

    def __init__(
        self,
        request: dict[str, Any],
        tool_map: ToolMap | None,
        *,
        response_id: str,
        created_at: int,
        model: str | None,
        token_ids: bool,
        echo: dict[str, Any] | None = None,
        seal: Sealer | None = None,
    ) -> None:
        self.accumulator = ChatStreamAccumulator()
        self._seal = seal
        self.response: dict[str, Any] | None = None
        self._tool_map = tool_map or ToolMap()
        self._base = response_base(request, response_id=response_id, created_at=created_at, model=model, echo=echo)
        self._id_base = id_base(response_id)
        self._token_ids = token_ids
        self._want_logprobs = wants_output_logprobs(request)
        self._sequence = 0
        self._started = False
        self._ended = False
        self._items: list[_StreamItem] = []
        self._open: _StreamItem | None = None
        self._calls: dict[int, _StreamItem] = {}
        self.late_tool_deltas = 0

    # -- numbering --

    def _emit(self, out: list[dict[str, Any]], event: dict[str, Any]) -> None:
        event["sequence_number"] = self._sequence
        self._sequence += 1
        out.append(event)

    def _lifecycle(self, out: list[dict[str, Any]], kind: str, response: dict[str, Any]) -> None:
        self._emit(out, {"type": kind, "response": response})

    # -- public API --

    def start(self) -> list[dict[str, Any]]:
        if self._started:
            return []
        self._started = True
        out: list[dict[str, Any]] = []
        self._lifecycle(out, "response.created", dict(self._base))
        self._lifecycle(out, "response.in_progress", dict(self._base))
        return out

    def feed(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        if self._ended:
            return []
        out: list[dict[str, Any]] = []
        if not self._started:
            out.extend(self.start())
        self.accumulator.feed(chunk)
        found = chunk_delta(chunk)
        if found is None:
            return out
        choice, delta = found
        reasoning = reasoning_of(delta)
        if reasoning:
            self._append(out, "reasoning", reasoning, None)
        content = delta.get("content")
        if content:
            self._append(out, "text", content, choice.get("logprobs"))
        refusal = delta.get("refusal")
        if refusal:
            self._append(out, "refusal", refusal, None)
        tool_calls = delta.get("tool_calls")
        if tool_calls:
            for position, call in enumerate(tool_calls):
                self._tool_call_delta(out, position, call)
        return out

    def finish(self, completed_at: int) -> list[dict[str, Any]]:
        """The closing events; `completed_at` is the caller's clock (Unix seconds)."""
        if self._ended:
            return []
        out = self.start()  # [] once started
        self._ended = True
        for item in self._calls.values():
            if item.output_index is None:  # a call whose name never came: still the model's output
                self._open_call(out, item)
        if not self._items:
            self._open_item(out, _StreamItem("text"))
        status, incomplete = status_for(self.accumulator.finish_reason)
        self._close_open(out, "incomplete" if incomplete else "completed")

        output = [item.snapshot(item.status or "completed", self._seal) for item in self._items]
        triple = token_triple(self.accumulator.result()) if self._token_ids or not self.accumulator.usage else None
        if self._token_ids:
            attach_triple(output, triple)
        response = dict(self._base)
        response["status"] = status
        response["incomplete_details"] = incomplete
        response["completed_at"] = completed_at if status == "completed" else None
        response["output"] = output
        response["usage"] = responses_usage(self.accumulator.usage, triple)
        if self.accumulator.model:
            response["model"] = self.accumulator.model
        self.response = response
        self._lifecycle(out, "response.completed" if status == "completed" else "response.incomplete", response)
        return out

    def fail(self, message: str, code: str | None = None) -> list[dict[str, Any]]:
        if self._ended:
            return []
        out = self.start()  # [] once started
        self._ended = True
        self._emit(out, responses_error_event(message, code))
        # Items still open are left unfinished: a client (Codex) keeps every item it saw
        # completed, and a half-generated tool call must not look like one.
        response = dict(self._base)
        response["status"] = "failed"
        response["error"] = {"code": code if code in _RESPONSE_ERROR_CODES else "server_error", "message": message}
        response["output"] = [item.snapshot(item.status, self._seal) for item in self._items if item.status is not None]
        response["usage"] = responses_usage(self.accumulator.usage)
        if self.accumulator.model:
            response["model"] = self.accumulator.model
        self.response = response
        self._lifecycle(out, "response.failed", response)
        return out

    # -- items --

    def _open_item(self, out: list[dict[str, Any]], item: _StreamItem) -> None:
        self._close_open(out, "completed")
        index = len(self._items)
        item.output_index = index
        item.item_id = item_id(_ITEM_PREFIX[item.kind], self._id_base, index)
        self._items.append(item)
        self._open = item
        self._emit(
            out, {"type": "response.output_item.added", "output_index": index, "item": item.snapshot("in_progress")}
        )
        if item.kind == "text":
            part: dict[str, Any] | None = text_part("", [])
        elif item.kind == "refusal":
            part = refusal_part("")
        elif item.kind == "reasoning":
            part = {"type": "reasoning_text", "text": ""}
        else:
            part = None
        if part is not None:
            self._emit(
                out,
                {
                    "type": "response.content_part.added",
                    "item_id": item.item_id,
                    "output_index": index,
                    "content_index": 0,
                    "part": part,
                },
            )

    def _close_open(self, out: list[dict[str, Any]], status: str) -> None:
        item = self._open
        if item is None:
            return
        self._open = None
        item.status = status
        final = item.snapshot(status, self._seal)
        ids = {"item_id": item.item_id, "output_index": item.output_index}
        if item.kind == "call":
            self._emit(out, {"type": "response.function_call_arguments.done", **ids, "arguments": final["arguments"]})
        elif item.kind == "custom":
            # The whole arguments may decode to more than the stream could (lenient decoding of
            # arguments that are not `{"input": "..."}`): send the rest when it extends the deltas.
            # The done event's `input` is what counts either way.
            streamed = item.decoder.text if item.decoder is not None else ""
            if len(final["input"]) > len(streamed) and final["input"].startswith(streamed):
                self._custom_delta(out, item, final["input"][len(streamed) :])
            self._emit(out, {"type": "response.custom_tool_call_input.done", **ids, "input": final["input"]})
        else:
            part = final["content"][0]
            if item.kind == "text":
                self._emit(
                    out,
                    {
                        "type": "response.output_text.done",
                        **ids,
                        "content_index": 0,
                        "text": part["text"],
                        "logprobs": item.logprobs,
                    },
                )
            elif item.kind == "refusal":
                self._emit(
                    out, {"type": "response.refusal.done", **ids, "content_index": 0, "refusal": part["refusal"]}
                )
            else:
                self._emit(
                    out, {"type": "response.reasoning_text.done", **ids, "content_index": 0, "text": part["text"]}
                )
            self._emit(out, {"type": "response.content_part.done", **ids, "content_index": 0, "part": part})
        self._emit(out, {"type": "response.output_item.done", "output_index": item.output_index, "item": final})

    def _append(self, out: list[dict[str, Any]], kind: str, delta: str, chat_logprobs: dict[str, Any] | None) -> None:
        item = self._open
        if item is None or item.kind != kind:
            item = _StreamItem(kind)
            self._open_item(out, item)
        item.parts.append(delta)
        ids = {"item_id": item.item_id, "output_index": item.output_index, "content_index": 0}
        if kind == "text":
            logprobs: list[dict[str, Any]] = []
            if self._want_logprobs and chat_logprobs:
                logprobs = response_logprobs(chat_logprobs.get("content"))
                item.logprobs.extend(logprobs)
            self._emit(out, {"type": "response.output_text.delta", **ids, "delta": delta, "logprobs": logprobs})
        elif kind == "refusal":
            self._emit(out, {"type": "response.refusal.delta", **ids, "delta": delta})
        else:
            self._emit(out, {"type": "response.reasoning_text.delta", **ids, "delta": delta})

    def _name_arrived(self, out: list[dict[str, Any]], item: _StreamItem, name: str) -> None:
        item.name, item.namespace = self._tool_map.response_name(name)
        if self._tool_map.is_custom(name):
            item.kind = "custom"
        self._open_call(out, item)

    def _open_call(self, out: list[dict[str, Any]], item: _StreamItem) -> None:
        if item.kind == "custom":
            item.decoder = InputDecoder()
        self._open_item(out, item)
        if item.call_id is None:
            item.call_id = f"call_{self._id_base}_{item.output_index}"
        buffered = "".join(item.parts)
        if buffered:
            item.parts = [buffered]
            self._arguments_delta(out, item, buffered)

    def _arguments_delta(self, out: list[dict[str, Any]], item: _StreamItem, arguments: str) -> None:
        """Stream a piece of the open call's arguments: as they are, or as decoded custom-tool input."""
        if item.decoder is None:
            self._emit(
                out,
                {
                    "type": "response.function_call_arguments.delta",
                    "item_id": item.item_id,
                    "output_index": item.output_index,
                    "delta": arguments,
                },
            )
            return
        decoded = item.decoder.feed(arguments)
        if decoded:
            self._custom_delta(out, item, decoded)

    def _custom_delta(self, out: list[dict[str, Any]], item: _StreamItem, text: str) -> None:
        self._emit(
            out,
            {
                "type": "response.custom_tool_call_input.delta",
                "item_id": item.item_id,
                "output_index": item.output_index,
                "delta": text,
            },
        )

    def _new_call(self) -> _StreamItem:
        return _StreamItem("call")
