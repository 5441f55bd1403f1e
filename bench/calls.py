"""The requests the bench sends: chat and Responses bodies, their prompts, and the load generator's templates."""

from __future__ import annotations

from typing import Any

import orjson

TELEMETRY_CONCURRENCY = 64
CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"
CHAT_TOKEN_MARK = '"delta":{"content":'  # the first chat chunk carrying generated text
RESPONSES_TOKEN_MARK = '"response.output_text.delta"'
TOKEN_FIELDS = {"return_token_ids": True, "logprobs": True, "top_logprobs": 0}
_WORDS = (
    "apple river stone cloud maple tiger orbit lemon piano candle forest harbor velvet rocket "
    "meadow silver thunder garden copper lantern"
).split()


def words(n: int, offset: int = 0) -> str:
    """`n` words, one mock token each."""
    return " ".join(_WORDS[(i + offset) % len(_WORDS)] for i in range(n))


def chat_body(content: str, *, stream: bool = False, token_fields: bool = False) -> str:
    body: dict[str, Any] = {"model": "demo", "messages": [{"role": "user", "content": content}]}
    if stream:
        body["stream"] = True
    if token_fields:
        body.update(TOKEN_FIELDS)
    return orjson.dumps(body).decode()


def responses_body(content: str, *, stream: bool = False) -> str:
    body: dict[str, Any] = {"model": "demo", "input": content}
    if stream:
        body["stream"] = True
    return orjson.dumps(body).decode()


def template(path: str, body: str, headers: list[tuple[str, str]] | None = None) -> dict[str, Any]:
    return {"method": "POST", "path": path, "body": body, "headers": [list(h) for h in headers or []]}


def capture_bodies() -> list[str]:
    """The capture section's calls: 8k-token prompts (four different ones), 200-token answers, token fields asked."""
    return [chat_body(words(8000, offset=k) + " [[mock:tokens 200]]", token_fields=True) for k in range(4)]


SMALL = "Summarize the plan in one line. [[mock:tokens 16]]"
STREAM = "Explain the plan step by step. [[mock:tokens 32]]"
