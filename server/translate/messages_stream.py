"""Chat stream chunks as Anthropic Messages stream events (dicts; the caller frames them), as they arrive."""

from __future__ import annotations

from typing import Any

import orjson

from server.capture.tokens import reasoning_of, token_triple
from server.errors import OpenAIError, anthropic_error_dict
from server.translate.accumulate import ChatStreamAccumulator, chunk_delta
from server.translate.messages_response import (
    Sealer,
    attach_triple,
    message_base,
    messages_usage,
    stop_reason,
    thinking_block,
)
from server.translate.tool_calls import ToolCallDeltas


class _Block:
    """One content block as it streams: thinking, text or tool_use."""

    __slots__ = ("call_id", "index", "kind", "name", "parts", "text")

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.index: int | None = None  # set when content_block_start has been sent
        self.text: list[str] = []
        self.call_id: str | None = None
        self.name = ""
        self.parts: list[str] = []  # a call's arguments (those that arrived before its name go out when it opens)

    @property
    def started(self) -> bool:
        return self.index is not None


class MessagesStreamTranslator(ToolCallDeltas[_Block]):
    """Turns upstream chat chunks into Messages stream events as they arrive.

    start() -> message_start and a ping; feed(chunk) -> the events that chunk causes (maybe none);
    finish() -> closes the open block, then message_delta (stop reason, usage) and message_stop;
    fail(error) -> an `error` event. All return [] once the stream has ended. One block is open at a
    time, in the order the upstream starts them; a new kind (or a new tool call) closes the open one.
    A tool-call delta for a call already closed cannot be streamed any more: it is counted in
    `late_tool_deltas`. `accumulator` holds the chat-form result for capture.
    """

    def __init__(
        self,
        *,
        message_id: str,
        model: str | None,
        seal: Sealer,
        show_thinking: bool,
        stop_sequences: list[str],
        token_ids: bool,
    ) -> None:
        self.accumulator = ChatStreamAccumulator()
        self._message_id = message_id
        self._model = model
        self._seal = seal
        self._show_thinking = show_thinking
        self._stop_sequences = stop_sequences
        self._token_ids = token_ids
        self._started = False
        self._ended = False
        self._blocks = 0
        self._open: _Block | None = None
        self._calls: dict[int, _Block] = {}
        self.late_tool_deltas = 0

    def start(self, prompt_tokens: int = 0) -> list[dict[str, Any]]:
        if self._started:
            return []
        self._started = True
        message = message_base(self._message_id, self._model)
        message["usage"]["input_tokens"] = prompt_tokens
        return [{"type": "message_start", "message": message}, {"type": "ping"}]

    def feed(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        if self._ended:
            return []
        self.accumulator.feed(chunk)
        out: list[dict[str, Any]] = []
        if not self._started:
            ids = chunk.get("prompt_token_ids")
            out.extend(self.start(len(ids) if isinstance(ids, list) else 0))
        found = chunk_delta(chunk)
        if found is None:
            return out
        delta = found[1]
        reasoning = reasoning_of(delta)
        if reasoning:
            self._append(out, "thinking", reasoning)
        text = delta.get("content") or delta.get("refusal")
        if text:
            self._append(out, "text", text)
        for position, call in enumerate(delta.get("tool_calls") or ()):
            self._tool_call_delta(out, position, call)
        return out

    def finish(self) -> list[dict[str, Any]]:
        if self._ended:
            return []
        out = self.start()
        self._ended = True
        for call in self._calls.values():
            if call.index is None:  # a call whose name never came: still the model's output
                self._open_block(out, call)
        self._close_open(out)
        result = self.accumulator.result()
        choice = result["choices"][0]
        reason, sequence = stop_reason(
            choice.get("finish_reason"), choice.get("stop_reason"), self._stop_sequences, bool(self._calls)
        )
        triple = token_triple(result)
        delta: dict[str, Any] = {"stop_reason": reason, "stop_sequence": sequence}
        if self._token_ids:
            attach_triple(delta, triple)
        out.append({"type": "message_delta", "delta": delta, "usage": messages_usage(self.accumulator.usage, triple)})
        out.append({"type": "message_stop"})
        return out

    def tool_use_ids(self) -> list[str | None]:
        """The ids the tool_use blocks went out under, in the order of the upstream's tool calls
        (None for a call not sent yet that has no id of its own)."""
        return [block.call_id for _, block in sorted(self._calls.items())]

    def fail(self, error: OpenAIError) -> list[dict[str, Any]]:
        """The in-band `error` event; blocks still open are left unfinished (never a half call that looks whole)."""
        if self._ended:
            return []
        out = self.start()
        self._ended = True
        out.append(anthropic_error_dict(error))
        return out

    # -- blocks --

    def _open_block(self, out: list[dict[str, Any]], block: _Block) -> None:
        self._close_open(out)
        block.index = self._blocks
        self._blocks += 1
        self._open = block
        if block.kind == "thinking":
            start: dict[str, Any] = {"type": "thinking", "thinking": "", "signature": ""}
        elif block.kind == "text":
            start = {"type": "text", "text": ""}
        else:
            if block.call_id is None:
                block.call_id = f"toolu_{self._message_id}_{block.index}"
            start = {"type": "tool_use", "id": block.call_id, "name": block.name, "input": {}}
        out.append({"type": "content_block_start", "index": block.index, "content_block": start})
        if block.parts:
            self._arguments_delta(out, block, "".join(block.parts))

    def _close_open(self, out: list[dict[str, Any]]) -> None:
        block = self._open
        if block is None:
            return
        self._open = None
        if block.kind == "thinking":
            sealed = thinking_block("".join(block.text), self._seal, True)["signature"]
            out.append(
                {
                    "type": "content_block_delta",
                    "index": block.index,
                    "delta": {"type": "signature_delta", "signature": sealed},
                }
            )
        out.append({"type": "content_block_stop", "index": block.index})

    def _append(self, out: list[dict[str, Any]], kind: str, text: str) -> None:
        block = self._open
        if block is None or block.kind != kind:
            block = _Block(kind)
            self._open_block(out, block)
        block.text.append(text)
        if kind == "text":
            delta = {"type": "text_delta", "text": text}
        elif self._show_thinking:
            delta = {"type": "thinking_delta", "thinking": text}
        else:
            return  # display: omitted: only the signature goes out
        out.append({"type": "content_block_delta", "index": block.index, "delta": delta})

    def _arguments_delta(self, out: list[dict[str, Any]], block: _Block, arguments: str) -> None:
        out.append(
            {
                "type": "content_block_delta",
                "index": block.index,
                "delta": {"type": "input_json_delta", "partial_json": arguments},
            }
        )

    def _new_call(self) -> _Block:
        return _Block("tool_use")

    def _name_arrived(self, out: list[dict[str, Any]], block: _Block, name: str) -> None:
        block.name = name
        self._open_block(out, block)


def encode_events(events: list[dict[str, Any]]) -> bytes:
    """Messages stream events on the wire: `event: <type>` and one `data:` line each."""
    return b"".join(
        b"event: " + event["type"].encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n" for event in events
    )
