"""What the mock keeps between requests (caches, counters, the request log), and request validation into a ChatJob."""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from server.dev.mock_upstream import token_in as token_in_module
from server.dev.mock_upstream.directives import DIRECTIVE_OPEN, Directives, parse_directives
from server.dev.mock_upstream.generation import last_user_text, plan_reply
from server.dev.mock_upstream.replies import ChatJob, ChoiceCache, LogprobEntries, Options
from server.dev.mock_upstream.template import GENERATION_PROMPT, render_blocks
from server.dev.mock_upstream.tokenizer import Tokenizer
from server.errors import OpenAIError

TEMPLATES = ("keep-reasoning", "drop-reasoning")


@dataclass(slots=True)
class Stats:
    requests: int = 0
    completed: int = 0
    cancelled: int = 0
    cut: int = 0
    errors: int = 0
    in_flight: int = 0
    tokenize: int = 0

    def as_dict(self) -> dict[str, int]:
        return {
            "requests": self.requests,
            "completed": self.completed,
            "cancelled": self.cancelled,
            "in_flight": self.in_flight,
            "cut": self.cut,
            "errors": self.errors,
            "tokenize": self.tokenize,
        }


def _bool(value: Any) -> bool:
    return value is True


def _int_field(body: dict[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise OpenAIError(400, f"{name} must be a non-negative integer", param=name)
    return value


class MockState:
    """Everything the mock keeps between requests: tokenizer caches, counters, the request log."""

    def __init__(
        self, model_name: str, max_model_len: int, template: str = "keep-reasoning", token_in: str = "honor"
    ) -> None:
        self.model_name = model_name
        self.max_model_len = max_model_len
        self.configure(template=template, token_in=token_in)
        self.tokenizer = Tokenizer()
        self.entries = LogprobEntries()
        self.choice_cache = ChoiceCache()
        self.stats = Stats()
        self.log: deque[dict[str, Any]] = deque(maxlen=200)
        self.error_hits: dict[str, int] = {}
        self._seq = 0
        self._responses = 0
        self._id_prefix = os.urandom(4).hex()
        self._generation_prompt = tuple(self.tokenizer.encode(GENERATION_PROMPT))

    def configure(self, template: str | None = None, token_in: str | None = None) -> None:
        """`template`: keep-reasoning | drop-reasoning (Qwen3-like); `token_in`: honor | ignore the token-in fields."""
        if template is not None:
            if template not in TEMPLATES:
                raise ValueError(f"template must be one of {TEMPLATES}")
            self.template = template
        if token_in is not None:
            if token_in not in token_in_module.MODES:
                raise ValueError(f"token_in must be one of {token_in_module.MODES}")
            self.token_in = token_in

    def reset(self) -> None:
        in_flight = self.stats.in_flight
        self.stats = Stats(in_flight=in_flight)
        self.log.clear()
        self.error_hits.clear()

    def record(self, scope: Mapping[str, Any], body: Any) -> dict[str, Any]:
        self._seq += 1
        headers: dict[str, str] = {}
        for name, value in scope.get("headers", ()):
            key = name.decode("latin-1")
            text = value.decode("latin-1")
            headers[key] = headers[key] + ", " + text if key in headers else text
        entry = {
            "seq": self._seq,
            "time": time.time(),
            "method": scope.get("method"),
            "path": scope.get("path"),
            "query": scope.get("query_string", b"").decode("latin-1"),
            "headers": headers,
            "body": body,
        }
        self.log.append(entry)
        return entry

    def prompt_ids(
        self, messages: list[dict[str, Any]], tools: list[Any] | None, add_generation_prompt: bool = True
    ) -> list[int]:
        ids: list[int] = []
        encode_block = self.tokenizer.encode_block
        for block in render_blocks(messages, tools, self.template == "drop-reasoning"):
            ids += encode_block(block)
        if add_generation_prompt:
            ids += self._generation_prompt
        return ids

    def new_response_id(self) -> str:
        self._responses += 1
        return f"chatcmpl-{self._id_prefix}{self._responses:010x}"

    def error_fires(self, d: Directives, seed: str) -> bool:
        """`error ... times=K` fails only the first K requests carrying it; otherwise every one."""
        assert d.error is not None
        times = d.error[2]
        if times is None:
            return True
        key = seed + "\x00" + d.error_key
        hits = self.error_hits.get(key, 0)
        self.error_hits[key] = hits + 1
        return hits < times

    def plan(self, body: Any) -> ChatJob:
        if not isinstance(body, dict):
            raise OpenAIError(400, "request body must be a JSON object", code="invalid_body")
        messages = body.get("messages")
        if not isinstance(messages, list) or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages
        ):
            raise OpenAIError(400, "messages must be a list of objects with a string role", param="messages")
        tools = body.get("tools")
        if tools is not None and not isinstance(tools, list):
            raise OpenAIError(400, "tools must be a list", param="tools")
        n = body.get("n")
        if n not in (None, 1):
            raise OpenAIError(400, "the mock upstream only supports n=1", param="n")
        max_tokens = _int_field(body, "max_completion_tokens")
        if max_tokens is None:
            max_tokens = _int_field(body, "max_tokens")
        top_logprobs = _int_field(body, "top_logprobs") or 0
        if top_logprobs > 20:
            raise OpenAIError(400, "top_logprobs must be at most 20", param="top_logprobs")
        stream_options = body.get("stream_options")
        options = Options(
            return_token_ids=_bool(body.get("return_token_ids")),
            logprobs=_bool(body.get("logprobs")),
            top_logprobs=top_logprobs,
            tokens_as_ids=_bool(body.get("return_tokens_as_token_ids")),
            include_usage=isinstance(stream_options, dict) and _bool(stream_options.get("include_usage")),
        )
        user_text, _ = last_user_text(messages)
        directives = parse_directives(user_text) if DIRECTIVE_OPEN in user_text else Directives(stripped_text=user_text)
        seed = f"{len(messages)}\x00{user_text}"
        error = None
        if directives.error is not None and self.error_fires(directives, seed):
            status, retry_after, _ = directives.error
            headers = {}
            if retry_after is not None or status == 429:
                headers["retry-after"] = format_seconds(1.0 if retry_after is None else retry_after)
            error = OpenAIError(status, f"mock upstream error {status} (scripted)", code="mock_error", headers=headers)
        # An engine without the fields (token_in "ignore") neither checks nor uses them.
        sent = token_in_module.requested_prompt(body) if self.token_in == "honor" else None
        if sent is None:
            prompt_ids = self.prompt_ids(messages, tools)
        elif sent[2]:  # NeMo-RL's splice: the template renders, the caller's history replaces its head
            prompt_ids = token_in_module.splice(sent[1], self.prompt_ids(messages, tools))
        else:  # the ids are the whole prompt: like vLLM, the template is not rendered at all
            prompt_ids = list(sent[1])
        if len(prompt_ids) >= self.max_model_len:
            raise OpenAIError(
                400,
                f"This model's maximum context length is {self.max_model_len} tokens. However, your request has "
                f"{len(prompt_ids)} input tokens. Please reduce the length of the input messages.",
                param="messages",
                code="context_length_exceeded",
            )
        # Unlike vLLM, a max_tokens that overshoots the context is clamped, not rejected: opencode
        # asks for 32000 output tokens when its config has no limit, and the demo should still run.
        room = self.max_model_len - len(prompt_ids)
        max_tokens = room if max_tokens is None else min(max_tokens, room)
        gen = plan_reply(
            self.tokenizer,
            messages,
            tools,
            directives,
            allow_tools=body.get("tool_choice") != "none",
            max_tokens=max_tokens,
            seed=seed,
        )
        model = body.get("model")
        return ChatJob(
            response_id=self.new_response_id(),
            created=int(time.time()),
            model=model if isinstance(model, str) and model else self.model_name,
            prompt_ids=prompt_ids,
            gen=gen,
            options=options,
            stream=_bool(body.get("stream")),
            directives=directives,
            error=error,
        )


def format_seconds(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)
