"""Serialise a planned reply as vLLM does: the non-stream body and the SSE chunks, with token ids and log probs."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import orjson

from server.dev.mock_upstream.directives import Directives
from server.dev.mock_upstream.generation import ALTERNATIVES, Generation, token_logprob
from server.dev.mock_upstream.tokenizer import piece_id
from server.errors import OpenAIError


@dataclass(slots=True)
class Options:
    """The vLLM extras a request asked for."""

    return_token_ids: bool = False
    logprobs: bool = False
    top_logprobs: int = 0
    tokens_as_ids: bool = False
    include_usage: bool = False


class LogprobEntries:
    """Build (and cache) `logprobs.content[]` entries; the same tokens recur in every reply."""

    def __init__(self, max_entries: int = 100_000) -> None:
        self._cache: dict[tuple[int, str, int, bool], dict[str, Any]] = {}
        self._max_entries = max_entries
        self._alternatives = [(piece_id(p), p) for p in ALTERNATIVES]

    @staticmethod
    def _token(token_id: int, text: str, as_ids: bool) -> tuple[str, list[int]]:
        token = f"token_id:{token_id}" if as_ids else text
        return token, list(token.encode("utf-8"))

    def entry(self, token_id: int, text: str, top: int, as_ids: bool) -> dict[str, Any]:
        key = (token_id, text, top, as_ids)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        logprob = token_logprob(token_id)
        token, token_bytes = self._token(token_id, text, as_ids)
        top_list = []
        if top > 0:
            top_list.append({"token": token, "logprob": logprob, "bytes": token_bytes})
            rank = 1
            for alt_id, alt_text in self._alternatives:
                if rank >= top:
                    break
                if alt_id == token_id:
                    continue
                alt_token, alt_bytes = self._token(alt_id, alt_text, as_ids)
                top_list.append({"token": alt_token, "logprob": round(logprob - rank, 6), "bytes": alt_bytes})
                rank += 1
        value = {"token": token, "logprob": logprob, "bytes": token_bytes, "top_logprobs": top_list}
        if len(self._cache) >= self._max_entries:
            self._cache.clear()
        self._cache[key] = value
        return value


def _classify(gen: Generation, index: int) -> tuple[str, int, str] | None:
    """What a generated token shows in a stream: (kind, tool index, text), or None if nothing."""
    start = gen.starts[index]
    end = start + len(gen.pieces[index])
    text = gen.text
    layout = gen.layout
    if layout.reasoning:
        rs, re_ = layout.reasoning
        if start < re_ and end > rs:
            return ("reasoning", -1, text[max(start, rs) : min(end, re_)])
    cs, ce = layout.content
    if cs < ce and start < ce and end > cs:
        return ("content", -1, text[max(start, cs) : min(end, ce)])
    for tool_index, (ts, args_start, args_end, _te) in enumerate(layout.tool_calls):
        if start == ts:
            return ("header", tool_index, "")
        if start < args_end and end > args_start:
            return ("arguments", tool_index, text[max(start, args_start) : min(end, args_end)])
    return None


def stream_groups(gen: Generation, per_chunk: int) -> tuple[list[tuple[str, int, str, list[int]]], list[int]]:
    """Group generated tokens into stream chunks: ([(kind, tool index, text, token indexes)], trailing).

    Tokens that show nothing (`<tool_call>` scaffolding, `</think>`, `<|im_end|>`) ride with the
    next visible chunk, or with the final chunk when nothing visible follows, so the chunks'
    token ids always concatenate to exactly the non-stream `token_ids`.
    """
    groups: list[tuple[str, int, str, list[int]]] = []
    pending: list[int] = []
    current: list[Any] | None = None  # [kind, tool index, [texts], [token indexes], visible count]
    for index in range(len(gen.ids)):
        shown = _classify(gen, index)
        if shown is None:
            pending.append(index)
            continue
        kind, tool_index, text = shown
        if (
            current is not None
            and current[0] == kind
            and current[1] == tool_index
            and kind != "header"
            and current[4] < per_chunk
        ):
            current[2].append(text)
            current[3].extend(pending)
            current[3].append(index)
            current[4] += 1
        else:
            if current is not None:
                groups.append((current[0], current[1], "".join(current[2]), current[3]))
            current = [kind, tool_index, [text], pending + [index], 1]
        pending = []
    if current is not None:
        groups.append((current[0], current[1], "".join(current[2]), current[3]))
    return groups, pending


@dataclass(slots=True)
class ChatJob:
    """One accepted chat request: everything needed to answer it, stream or not."""

    response_id: str
    created: int
    model: str
    prompt_ids: list[int]
    gen: Generation
    options: Options
    stream: bool
    directives: Directives
    error: OpenAIError | None = None

    def usage(self) -> dict[str, int]:
        prompt, completion = len(self.prompt_ids), len(self.gen.ids)
        return {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion}

    def _logprobs(self, indexes: range | list[int], entries: LogprobEntries) -> dict[str, Any] | None:
        if not self.options.logprobs:
            return None
        gen, top, as_ids = self.gen, self.options.top_logprobs, self.options.tokens_as_ids
        return {"content": [entries.entry(gen.ids[i], gen.pieces[i], top, as_ids) for i in indexes]}

    def _tool_calls(self) -> list[dict[str, Any]]:
        return [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for c in self.gen.kept_calls
        ]

    def body(self, entries: LogprobEntries) -> bytes:
        gen = self.gen
        choice: dict[str, Any] = {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": gen.content,
                "reasoning_content": gen.reasoning,
                "tool_calls": self._tool_calls(),
            },
            "logprobs": self._logprobs(range(len(gen.ids)), entries),
            "finish_reason": gen.finish_reason,
            "stop_reason": None,
        }
        if self.options.return_token_ids:
            choice["token_ids"] = gen.ids
        body: dict[str, Any] = {
            "id": self.response_id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": self.usage(),
            "prompt_logprobs": None,
        }
        if self.options.return_token_ids:
            body["prompt_token_ids"] = self.prompt_ids
        body["kv_transfer_params"] = None
        return orjson.dumps(body)

    def events(self, entries: LogprobEntries, cache: ChoiceCache | None = None) -> list[bytes]:
        """Every SSE event of the stream, `[DONE]` last."""
        gen, options = self.gen, self.options
        head = (
            b'data: {"id":'
            + orjson.dumps(self.response_id)
            + b',"object":"chat.completion.chunk","created":'
            + str(self.created).encode()
            + b',"model":'
            + orjson.dumps(self.model)
            + b',"choices":['
        )
        first = head + _FIRST_CHOICE + b"]"
        if options.return_token_ids:
            first += b',"prompt_token_ids":' + orjson.dumps(self.prompt_ids)
        events = [first + b"}\n\n"]
        # The chunk bodies depend only on the reply and the options, and benchmarks repeat replies.
        key = (
            gen.text,
            tuple(gen.ids),
            gen.finish_reason,
            tuple(c["id"] for c in gen.calls),
            options.return_token_ids,
            options.logprobs,
            options.top_logprobs,
            options.tokens_as_ids,
            self.directives.chunk,
        )
        choices = cache.get(key) if cache is not None else None
        if choices is None:
            choices = self._choices(entries)
            if cache is not None:
                cache.put(key, choices)
        events += [head + choice + b"]}\n\n" for choice in choices]
        if options.include_usage:
            events.append(head + b'],"usage":' + orjson.dumps(self.usage()) + b"}\n\n")
        events.append(b"data: [DONE]\n\n")
        return events

    def _choices(self, entries: LogprobEntries) -> list[bytes]:
        """The serialized `choices[0]` of every chunk after the first, the finish chunk last."""
        gen, options = self.gen, self.options
        out = []
        groups, trailing = stream_groups(gen, self.directives.chunk)
        for kind, tool_index, text, indexes in groups:
            if kind == "content":
                delta: dict[str, Any] = {"content": text}
            elif kind == "reasoning":
                delta = {"reasoning_content": text}
            elif kind == "header":
                call = gen.calls[tool_index]
                delta = {
                    "tool_calls": [
                        {
                            "index": tool_index,
                            "id": call["id"],
                            "type": "function",
                            "function": {"name": call["name"], "arguments": ""},
                        }
                    ]
                }
            else:
                delta = {"tool_calls": [{"index": tool_index, "function": {"arguments": text}}]}
            choice = {"index": 0, "delta": delta, "logprobs": self._logprobs(indexes, entries), "finish_reason": None}
            if options.return_token_ids:
                choice["token_ids"] = [gen.ids[i] for i in indexes]
            out.append(orjson.dumps(choice))
        final = {
            "index": 0,
            "delta": {},
            "logprobs": self._logprobs(trailing, entries),
            "finish_reason": gen.finish_reason,
            "stop_reason": None,
        }
        if options.return_token_ids:
            final["token_ids"] = [gen.ids[i] for i in trailing]
        out.append(orjson.dumps(final))
        return out


_FIRST_CHOICE = orjson.dumps(
    {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
)


class ChoiceCache:
    """A small LRU of serialized stream chunk bodies, keyed by reply and options."""

    def __init__(self, entries: int = 1024) -> None:
        self._data: OrderedDict[Any, list[bytes]] = OrderedDict()
        self._entries = entries

    def get(self, key: Any) -> list[bytes] | None:
        value = self._data.get(key)
        if value is not None:
            self._data.move_to_end(key)
        return value

    def put(self, key: Any, value: list[bytes]) -> None:
        self._data[key] = value
        if len(self._data) > self._entries:
            self._data.popitem(last=False)
