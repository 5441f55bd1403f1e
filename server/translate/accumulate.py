"""Folds a stream of chat.completion.chunk dicts into the equivalent non-stream chat.completion dict."""

from __future__ import annotations

from typing import Any

from server.capture.tokens import logprob_entries, reasoning_of


class _ToolCallParts:
    """One streamed tool call, keyed by its delta `index`; strings are joined once, at the end."""

    __slots__ = ("id", "type", "name_parts", "argument_parts")

    def __init__(self) -> None:
        self.id: str | None = None
        self.type: str = "function"
        self.name_parts: list[str] = []
        self.argument_parts: list[str] = []


def first_choice_delta(choice: dict[str, Any]) -> dict[str, Any] | None:
    """A chunk choice's delta if it is choice 0 (this server never asks for n > 1) and not empty."""
    if choice.get("index", 0) != 0:
        return None
    return choice.get("delta") or None


def chunk_delta(chunk: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """A stream chunk's choice 0 and its delta, if it has a delta that is not empty."""
    for choice in chunk.get("choices") or ():
        delta = first_choice_delta(choice)
        if delta is not None:
            return choice, delta
    return None


class ChatStreamAccumulator:
    """Feed each parsed upstream chunk with `feed`; `result()` gives the non-stream equivalent.

    Only choice 0 is accumulated (this server never asks for n > 1); `n_choices` tells how many
    distinct choice indices were seen, so a caller can flag a record as not token-exact.
    Strings arrive in pieces and are kept as lists, joined once in `result()`, so a long stream
    costs linear time. vLLM extras are kept: top-level `prompt_token_ids`, per-choice `token_ids`
    and `logprobs.content`. The reasoning delta is read under either of vLLM's names
    (server.capture.tokens.reasoning_of) and lands in `reasoning_content`.
    """

    def __init__(self) -> None:
        self.id: str | None = None
        self.created: int | None = None
        self.model: str | None = None
        self.system_fingerprint: str | None = None
        self.prompt_token_ids: list[int] | None = None
        self.role: str | None = None
        self.finish_reason: str | None = None
        self.stop_reason: Any = None
        self.usage: dict[str, Any] | None = None
        self.chunks = 0
        self._choice_indices: set[int] = set()
        self._content: list[str] | None = None  # None until a `content` key is seen at all
        self._reasoning: list[str] = []
        self._refusal: list[str] = []
        self._tool_calls: dict[int, _ToolCallParts] = {}
        self._token_ids: list[int] | None = None
        self._logprobs: list[dict[str, Any]] | None = None

    @property
    def n_choices(self) -> int:
        return len(self._choice_indices)

    def feed(self, chunk: dict[str, Any]) -> None:
        self.chunks += 1
        if self.id is None:
            self.id = chunk.get("id")
            self.created = chunk.get("created")
        if self.model is None:
            self.model = chunk.get("model")
        if self.system_fingerprint is None:
            self.system_fingerprint = chunk.get("system_fingerprint")
        if self.prompt_token_ids is None:
            ids = chunk.get("prompt_token_ids")
            if ids is not None:
                self.prompt_token_ids = ids
        usage = chunk.get("usage")
        if usage is not None:
            self.usage = usage
        for choice in chunk.get("choices") or ():
            index = choice.get("index", 0)
            self._choice_indices.add(index)
            if index == 0:
                self._feed_choice(choice)

    def _feed_choice(self, choice: dict[str, Any]) -> None:
        delta = choice.get("delta")
        if delta:
            role = delta.get("role")
            if role is not None and self.role is None:
                self.role = role
            content = delta.get("content")
            if content is not None:
                if self._content is None:
                    self._content = []
                if content:
                    self._content.append(content)
            reasoning = reasoning_of(delta)
            if reasoning:
                self._reasoning.append(reasoning)
            refusal = delta.get("refusal")
            if refusal:
                self._refusal.append(refusal)
            tool_calls = delta.get("tool_calls")
            if tool_calls:
                self._feed_tool_calls(tool_calls)
        finish_reason = choice.get("finish_reason")
        if finish_reason is not None:
            self.finish_reason = finish_reason
            self.stop_reason = choice.get("stop_reason")
        token_ids = choice.get("token_ids")
        if token_ids is not None:
            if self._token_ids is None:
                self._token_ids = []
            self._token_ids.extend(token_ids)
        entries = logprob_entries(choice)
        if entries is not None:
            if self._logprobs is None:
                self._logprobs = []
            self._logprobs.extend(entries)

    def _feed_tool_calls(self, tool_calls: list[dict[str, Any]]) -> None:
        for position, delta in enumerate(tool_calls):
            # `index` is required by the spec; fall back to the list position for lax upstreams.
            index = delta.get("index", position)
            call = self._tool_calls.get(index)
            if call is None:
                call = self._tool_calls[index] = _ToolCallParts()
            if delta.get("id"):
                call.id = delta["id"]
            if delta.get("type"):
                call.type = delta["type"]
            function = delta.get("function")
            if function:
                name = function.get("name")
                if name:
                    call.name_parts.append(name)
                arguments = function.get("arguments")
                if arguments:
                    call.argument_parts.append(arguments)

    @property
    def content(self) -> str | None:
        return None if self._content is None else "".join(self._content)

    @property
    def reasoning_content(self) -> str | None:
        return "".join(self._reasoning) if self._reasoning else None

    @property
    def token_ids(self) -> list[int] | None:
        return self._token_ids

    def tool_calls(self) -> list[dict[str, Any]]:
        """The merged tool calls in index order, arguments exactly as the model generated them."""
        return [
            {
                "id": call.id,
                "type": call.type,
                "function": {"name": "".join(call.name_parts), "arguments": "".join(call.argument_parts)},
            }
            for _, call in sorted(self._tool_calls.items())
        ]

    def result(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": self.role or "assistant", "content": self.content}
        reasoning = self.reasoning_content
        if reasoning is not None:
            message["reasoning_content"] = reasoning
        if self._refusal:
            message["refusal"] = "".join(self._refusal)
        if self._tool_calls:
            message["tool_calls"] = self.tool_calls()
        choice: dict[str, Any] = {
            "index": 0,
            "message": message,
            "logprobs": None if self._logprobs is None else {"content": list(self._logprobs)},
            "finish_reason": self.finish_reason,
        }
        if self.stop_reason is not None:
            choice["stop_reason"] = self.stop_reason
        if self._token_ids is not None:
            choice["token_ids"] = list(self._token_ids)
        # Lists are copied so a caller may edit the result while the stream goes on.
        result: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": self.usage,
        }
        if self.system_fingerprint is not None:
            result["system_fingerprint"] = self.system_fingerprint
        if self.prompt_token_ids is not None:
            result["prompt_token_ids"] = self.prompt_token_ids
        return result


def chunks_from_completion(chat: dict[str, Any]) -> list[dict[str, Any]]:
    """The inverse of the accumulator: a non-stream chat.completion as the chunks a stream would carry.

    Used when an upstream is called non-stream (it does not stream token ids) but the client asked
    for a stream. Feeding the result to a ChatStreamAccumulator gives back `chat`'s message, ids and
    logprobs.
    """
    base = {
        "id": chat.get("id"),
        "object": "chat.completion.chunk",
        "created": chat.get("created"),
        "model": chat.get("model"),
    }
    choices = chat.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], dict) else {}
    message = choice.get("message") or {}
    first = {
        **base,
        "choices": [
            {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        ],
    }
    if "prompt_token_ids" in chat:
        first["prompt_token_ids"] = chat["prompt_token_ids"]
    delta: dict[str, Any] = {}
    for key in ("reasoning_content", "content", "refusal"):
        if message.get(key):
            delta[key] = message[key]
    if message.get("tool_calls"):
        delta["tool_calls"] = [{**call, "index": i} for i, call in enumerate(message["tool_calls"])]
    body_choice: dict[str, Any] = {
        "index": 0,
        "delta": delta,
        "logprobs": choice.get("logprobs"),
        "finish_reason": choice.get("finish_reason"),
    }
    if "token_ids" in choice:
        body_choice["token_ids"] = choice["token_ids"]
    chunks = [first, {**base, "choices": [body_choice]}]
    if chat.get("usage") is not None:
        chunks.append({**base, "choices": [], "usage": chat["usage"]})
    return chunks
