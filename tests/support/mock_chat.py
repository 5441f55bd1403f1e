"""Shared pieces for the mock upstream's tests: tool specs, message builders, an in-process app client."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from server.dev.mock_upstream.app import create_app
from server.dev.mock_upstream.tokenizer import Tokenizer

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "read",
            "description": "Read a file",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "task",
            "description": "Start a sub-agent",
            "parameters": {"type": "object", "properties": {"prompt": {"type": "string"}}},
        },
    },
]
SYSTEM = {"role": "system", "content": "You are a coding agent. Be brief."}
TOKEN_EXTRAS = {"return_token_ids": True, "logprobs": True, "top_logprobs": 0, "return_tokens_as_token_ids": True}

tokenizer = Tokenizer()


class AppClient:
    """Synchronous calls into the app through httpx.ASGITransport (non-stream answers only)."""

    def __init__(self, **kw: Any) -> None:
        self.app = create_app(**kw)

    async def _request(self, method: str, path: str, body: Any = None, content: bytes | None = None) -> httpx.Response:
        transport = httpx.ASGITransport(app=self.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://mock") as client:
            if content is not None:
                return await client.request(method, path, content=content, headers={"content-type": "application/json"})
            return await client.request(method, path, json=body)

    def post(self, path: str, body: Any = None, content: bytes | None = None) -> httpx.Response:
        return asyncio.run(self._request("POST", path, body, content))

    def get(self, path: str) -> httpx.Response:
        return asyncio.run(self._request("GET", path))

    def chat(self, messages: list[dict[str, Any]], tools: list[Any] | None = None, **extra: Any) -> dict[str, Any]:
        body: dict[str, Any] = {"model": "mock-model", "messages": messages, **extra}
        if tools is not None:
            body["tools"] = tools
        response = self.post("/v1/chat/completions", body)
        assert response.status_code == 200, response.text
        return response.json()


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant_from(answer: dict[str, Any], reserialise=lambda args: args) -> dict[str, Any]:
    """The assistant message a client would send back next turn (arguments re-serialised its way)."""
    message = answer["choices"][0]["message"]
    out: dict[str, Any] = {"role": "assistant", "content": message["content"] or ""}
    if message["tool_calls"]:
        out["tool_calls"] = [
            {
                "id": c["id"],
                "type": "function",
                "function": {"name": c["function"]["name"], "arguments": reserialise(c["function"]["arguments"])},
            }
            for c in message["tool_calls"]
        ]
    return out


def ids_of(answer: dict[str, Any]) -> tuple[list[int], list[int]]:
    return answer["prompt_token_ids"], answer["choices"][0]["token_ids"]
