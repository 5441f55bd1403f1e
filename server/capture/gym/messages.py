"""A Messages call on Gym's training path as Gym 0.7's own /v1/messages handler captures it: as a Responses call.

Gym's model servers answer `/v1/messages` by mapping the Anthropic request to a Responses request,
serving that, and mapping the Responses answer back. Its token capture sees only the Responses side:
lineage reads the Responses request's items (and its `instructions` / `tools` envelope), and the
`TokenEntry` holds the Responses answer's output items. Gym's mapping lives in a module that needs
Gym's whole server stack, so the request direction is re-implemented here after Gym 0.7's rules; the
answer direction is this server's own chat-to-Responses translation, with the tool-call ids the
client was served, so the next request's `tool_use` blocks find their parent.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import orjson

from server.translate.response import chat_to_response


def responses_request(body: dict[str, Any]) -> dict[str, Any]:
    """The Responses request Gym builds from an Anthropic Messages body (`input`, `instructions`,
    `tools`, sampling settings). Never raises: a malformed body gives whatever could be read, so the
    call's lineage is still deterministic (the handler refuses such a body before dispatch anyway)."""
    request: dict[str, Any] = {"input": _input_items(body.get("messages"))}
    instructions = _instructions(body.get("system"))
    if instructions:
        request["instructions"] = instructions
    for ours, theirs in (
        ("model", "model"),
        ("max_tokens", "max_output_tokens"),
        ("temperature", "temperature"),
        ("top_p", "top_p"),
    ):
        if body.get(ours) is not None:
            request[theirs] = body[ours]
    tools = _tools(body.get("tools"))
    if tools:
        request["tools"] = tools
    choice = _tool_choice(body.get("tool_choice"))
    if choice is not None:
        request["tool_choice"] = choice
    return request


def served_response(
    chat: dict[str, Any], body: dict[str, Any], message_id: str, call_ids: Sequence[str | None], created_at: int
) -> dict[str, Any]:
    """The answer as Gym's token capture holds it: a Responses object with the token triple, its id the
    Messages answer's (Gym reuses one id for both), its function calls under the `tool_use` ids served."""
    return chat_to_response(
        with_call_ids(chat, call_ids),
        responses_request(body),
        None,
        response_id=message_id,
        created_at=created_at,
        token_ids=True,
        completed_at=int(time.time()),
    )


def with_call_ids(chat: dict[str, Any], call_ids: Sequence[str | None]) -> dict[str, Any]:
    """The chat answer with its tool calls under the ids the client got (they differ only where the
    upstream gave a call no id and the Messages translation named it); None keeps a call's own id."""
    choices = chat.get("choices")
    if not call_ids or not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return chat
    message = choices[0].get("message") or {}
    calls = message.get("tool_calls") or []
    renamed = [{**call, "id": call_id} if call_id else call for call, call_id in zip(calls, call_ids, strict=False)]
    renamed += calls[len(renamed) :]
    first = {**choices[0], "message": {**message, "tool_calls": renamed}}
    return {**chat, "choices": [first, *choices[1:]]}


def _instructions(system: Any) -> str:
    if isinstance(system, str):
        return system
    if isinstance(system, list):
        texts = [block.get("text") for block in system if isinstance(block, dict) and block.get("type") == "text"]
        return "\n".join(text for text in texts if isinstance(text, str) and text)
    return ""


def _input_items(messages: Any) -> list[dict[str, Any]]:
    """Gym's ordering: a message's text (and other content) blocks group into one message item;
    each tool_use, tool_result and thinking block becomes an item of its own, in place."""
    items: list[dict[str, Any]] = []
    for message in messages if isinstance(messages, list) else []:
        if not isinstance(message, dict):
            continue
        role, content = message.get("role"), message.get("content", "")
        if isinstance(content, str):
            items.append({"role": role, "content": content, "type": "message"})
            continue
        parts: list[Any] = []

        def flush(role: Any = role, parts: list[Any] = parts) -> None:
            if len(parts) == 1 and isinstance(parts[0], dict) and parts[0].get("type") == "input_text":
                items.append({"role": role, "content": parts[0]["text"], "type": "message"})
            elif parts:
                items.append({"role": role, "content": list(parts), "type": "message"})
            parts.clear()

        for block in content if isinstance(content, list) else []:
            kind = block.get("type") if isinstance(block, dict) else None
            if kind == "text":
                parts.append({"type": "input_text", "text": block.get("text", "")})
                continue
            if kind not in ("tool_use", "tool_result", "thinking"):
                parts.append(block)  # Gym refuses these; kept as they are, so lineage still sees them
                continue
            flush()
            if kind == "tool_use":
                arguments = orjson.dumps(block.get("input", {})).decode()  # compared canonically by Gym
                call_id = block.get("id")
                items.append(
                    {
                        "type": "function_call",
                        "id": call_id,
                        "call_id": call_id,
                        "name": block.get("name"),
                        "arguments": arguments,
                        "status": "completed",
                    }
                )
            elif kind == "tool_result":
                items.append(
                    {
                        "type": "function_call_output",
                        "call_id": block.get("tool_use_id"),
                        "output": _tool_result(block.get("content", "")),
                    }
                )
            else:
                items.append(
                    {
                        "type": "reasoning",
                        "summary": [{"type": "summary_text", "text": block.get("thinking", "")}],
                        "encrypted_content": block.get("signature"),
                    }
                )
        flush()
    return items


def _tool_result(content: Any) -> Any:
    if not isinstance(content, list):
        return content
    if all(isinstance(block, dict) and block.get("type") == "text" for block in content):
        return "\n".join(block.get("text", "") for block in content)
    return [
        {"type": "input_text", "text": block.get("text", "")}
        if isinstance(block, dict) and block.get("type") == "text"
        else block
        for block in content
    ]


def _tools(tools: Any) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "name": tool.get("name"),
            "description": tool.get("description"),
            "parameters": tool.get("input_schema") or {"type": "object", "properties": {}},
            "strict": False,
        }
        for tool in (tools if isinstance(tools, list) else [])
        if isinstance(tool, dict)
    ]


def _tool_choice(choice: Any) -> Any:
    if not isinstance(choice, dict):
        return None
    kind = choice.get("type")
    if kind in ("auto", "none"):
        return kind
    if kind == "any":
        return "required"
    if kind == "tool":
        return {"type": "function", "name": choice.get("name")}
    return None
