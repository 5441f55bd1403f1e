"""Shared data and helpers for the translation tests: Responses bodies, chat answers, an offline openai client."""

from __future__ import annotations

import httpx
import openai
import pytest

from server.errors import OpenAIError
from server.translate.request import responses_to_chat
from server.translate.response import chat_to_response
from server.translate.tools import ToolMap

# The keys the Open Responses ResponseResource schema requires to be present.
OPEN_RESPONSES_KEYS = {
    "id",
    "object",
    "created_at",
    "completed_at",
    "status",
    "incomplete_details",
    "model",
    "previous_response_id",
    "instructions",
    "output",
    "error",
    "tools",
    "tool_choice",
    "truncation",
    "parallel_tool_calls",
    "text",
    "top_p",
    "presence_penalty",
    "frequency_penalty",
    "top_logprobs",
    "temperature",
    "reasoning",
    "user",
    "usage",
    "max_output_tokens",
    "max_tool_calls",
    "store",
    "background",
    "service_tier",
    "metadata",
    "safety_identifier",
    "prompt_cache_key",
}

FN_EXEC = {
    "type": "function",
    "name": "exec_command",
    "description": "Run a command",
    "strict": False,
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
}
NS_AGENTS = {
    "type": "namespace",
    "name": "multi_agent_v1",
    "description": "Sub-agents",
    "tools": [
        {
            "type": "function",
            "name": "spawn_agent",
            "description": "Spawn",
            "strict": True,
            "parameters": {
                "type": "object",
                "properties": {"task": {"type": "string"}},
                "required": ["task"],
                "additionalProperties": False,
            },
        },
        {"type": "function", "name": "wait_agent", "parameters": {"type": "object", "properties": {}}},
    ],
}
WEB_SEARCH = {"type": "web_search", "external_web_access": True}

# A Codex request body, as measured (clients.md), minus the long texts.
CODEX_BODY = {
    "model": "sy/route",
    "stream": True,
    "input": [
        {"type": "message", "id": "msg_1", "role": "developer", "content": [{"type": "input_text", "text": "base"}]},
        {"type": "message", "id": "msg_2", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
    ],
    "tools": [FN_EXEC, NS_AGENTS, WEB_SEARCH],
    "tool_choice": "auto",
    "parallel_tool_calls": True,
    "reasoning": {"summary": "auto"},
    "store": False,
    "include": ["reasoning.encrypted_content"],
    "prompt_cache_key": "0199-root",
    "client_metadata": {"session_id": "s", "thread_id": "t"},
}


def chat(body: dict, **kw) -> dict:
    return responses_to_chat({"model": "m", **body}, **kw).body


def error_of(body: dict) -> OpenAIError:
    with pytest.raises(OpenAIError) as info:
        responses_to_chat(body)
    assert info.value.status == 400
    return info.value


PROMPT_IDS = [151644, 872, 198, 9707, 151645]
COMPLETED_AT = 1795956001  # the caller's clock, passed in: translation reads none


def lp(token_id: int, value: float) -> dict:
    return {
        "token": f"token_id:{token_id}",
        "logprob": value,
        "bytes": [104],
        "top_logprobs": [{"token": f"token_id:{token_id}", "logprob": value, "bytes": [104]}],
    }


def chat_completion(message: dict, *, finish="stop", token_ids=None, logprobs=None, usage=True, prompt_ids=True):
    choice = {
        "index": 0,
        "message": {"role": "assistant", **message},
        "finish_reason": finish,
        "logprobs": {"content": logprobs} if logprobs is not None else None,
    }
    if token_ids is not None:
        choice["token_ids"] = token_ids
    doc = {
        "id": "chatcmpl-fake-123",
        "object": "chat.completion",
        "created": 1795956045,
        "model": "fake/ok",
        "choices": [choice],
    }
    if usage:
        doc["usage"] = {
            "prompt_tokens": 5,
            "completion_tokens": 4,
            "total_tokens": 9,
            "prompt_tokens_details": {"cached_tokens": 2},
        }
    if prompt_ids:
        doc["prompt_token_ids"] = PROMPT_IDS
    return doc


def to_response(chat_doc: dict, request: dict | None = None, tool_map: ToolMap | None = None, token_ids=False):
    request = request or {"model": "sy/route", "input": "x"}
    return chat_to_response(
        chat_doc,
        request,
        tool_map,
        response_id="resp_abc",
        created_at=1795956000,
        token_ids=token_ids,
        completed_at=COMPLETED_AT,
    )


def sdk_client(body: bytes, content_type: str) -> openai.OpenAI:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": content_type}, content=body)

    return openai.OpenAI(
        api_key="sk-test",
        base_url="http://model.invalid/v1",
        max_retries=0,
        http_client=httpx.Client(transport=httpx.MockTransport(handler)),
    )
