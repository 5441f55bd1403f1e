"""A chat completion as a Responses object (and back, for capture on the passthrough path); pure.

Also the pieces the stream writer builds its events from: the response skeleton, output items,
usage and logprobs in Responses form.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from server.capture.tokens import TokenTriple, reasoning_of, token_triple
from server.translate.checks import is_number
from server.translate.custom_tools import decode_input, encode_input
from server.translate.request import wants_output_logprobs
from server.translate.tools import ToolMap

# Chat finish_reason -> Responses incomplete reason; anything else finishes `completed`.
_INCOMPLETE_REASONS = {"length": "max_output_tokens", "content_filter": "content_filter"}

# A logprob vLLM could not represent (-inf) arrives as null; the SDK wants a float.
_MISSING_LOGPROB = -9999.0


# Seals raw reasoning text for `encrypted_content` (the stateful layer holds the key).
Sealer = Callable[[str], str]


def id_base(response_id: str) -> str:
    return response_id[5:] if response_id.startswith("resp_") else response_id


def item_id(prefix: str, base: str, output_index: int) -> str:
    return f"{prefix}_{base}_{output_index}"


# Every key of the Open Responses response object, in its order, with the value it has when the
# request leaves it out (the Responses API defaults: the schema makes these non-nullable).
_BASE: dict[str, Any] = {
    "id": None,
    "object": "response",
    "created_at": None,
    "completed_at": None,
    "status": "in_progress",
    "error": None,
    "incomplete_details": None,
    "instructions": None,
    "max_output_tokens": None,
    "max_tool_calls": None,
    "model": None,
    "output": None,
    "parallel_tool_calls": True,
    "previous_response_id": None,
    "reasoning": None,
    "store": False,
    "temperature": 1.0,
    "text": None,
    "tool_choice": "auto",
    "tools": None,
    "top_p": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "top_logprobs": 0,
    "truncation": "disabled",
    "usage": None,
    "user": None,
    "metadata": None,
    "background": False,
    "service_tier": "default",
    "prompt_cache_key": None,
    "safety_identifier": None,
    "conversation": None,
    "prompt": None,
}
# The request settings echoed as given when not null (`tools`, `metadata`, `model` and `text` are
# filled in apart: their defaults are fresh objects, or not the request's).
_ECHOED = frozenset(
    {
        "instructions",
        "max_output_tokens",
        "max_tool_calls",
        "parallel_tool_calls",
        "reasoning",
        "temperature",
        "tool_choice",
        "top_p",
        "presence_penalty",
        "frequency_penalty",
        "top_logprobs",
        "truncation",
        "user",
        "prompt_cache_key",
        "safety_identifier",
    }
)


def response_base(
    request: dict[str, Any],
    *,
    response_id: str,
    created_at: int,
    model: str | None,
    echo: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """An in-progress response object with every key of the Open Responses response present.

    `echo` overrides the fields the stateful layer decides (`store`, `background`,
    `previous_response_id`, `conversation`).

    Request settings are echoed; those the request left out are reported with the Responses API
    defaults (the Open Responses schema makes them non-nullable), not the upstream's own defaults.
    """
    text = request.get("text")
    text_config = dict(text) if isinstance(text, dict) else {}
    if text_config.get("format") is None:
        text_config["format"] = {"type": "text"}
    # A copy of the defaults with the request's settings over them (a request holds a few keys; the
    # object has every one): the key order stays the schema's.
    response = _BASE.copy()
    for key, value in request.items():
        if value is not None and key in _ECHOED:
            response[key] = value
    tools = request.get("tools")
    metadata = request.get("metadata")
    response["id"] = response_id
    response["created_at"] = created_at
    response["model"] = model if model is not None else request.get("model")
    response["output"] = []
    response["text"] = text_config
    response["tools"] = [] if tools is None else tools
    response["metadata"] = {} if metadata is None else metadata
    if echo:
        response.update(echo)
    return response


def responses_usage(chat_usage: dict[str, Any] | None, triple: TokenTriple | None = None) -> dict[str, Any] | None:
    """Chat usage in Responses form (with `cache_write_tokens`, which the openai SDK requires)."""
    if chat_usage:
        input_tokens = chat_usage.get("prompt_tokens") or 0
        output_tokens = chat_usage.get("completion_tokens") or 0
        total = chat_usage.get("total_tokens") or input_tokens + output_tokens
        cached = (chat_usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        reasoning = (chat_usage.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0
    elif triple is not None:
        input_tokens, output_tokens = len(triple[0]), len(triple[1])
        total, cached, reasoning = input_tokens + output_tokens, 0, 0
    else:
        return None
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": total,
    }


def status_for(finish_reason: str | None) -> tuple[str, dict[str, Any] | None]:
    reason = _INCOMPLETE_REASONS.get(finish_reason or "")
    if reason is None:
        return "completed", None
    return "incomplete", {"reason": reason}


def _logprob_value(value: Any) -> float:
    return float(value) if is_number(value) else _MISSING_LOGPROB


def _token_bytes(entry: dict[str, Any], token: str) -> list[int]:
    raw = entry.get("bytes")
    return raw if isinstance(raw, list) else list(token.encode("utf-8", "surrogatepass"))


def response_logprobs(entries: Any) -> list[dict[str, Any]]:
    """Chat `logprobs.content` entries in the shape of Responses `output_text.logprobs`."""
    out: list[dict[str, Any]] = []
    for entry in entries or ():
        token = entry.get("token") or ""
        out.append(
            {
                "token": token,
                "logprob": _logprob_value(entry.get("logprob")),
                "bytes": _token_bytes(entry, token),
                "top_logprobs": [
                    {
                        "token": top.get("token") or "",
                        "logprob": _logprob_value(top.get("logprob")),
                        "bytes": _token_bytes(top, top.get("token") or ""),
                    }
                    for top in entry.get("top_logprobs") or ()
                ],
            }
        )
    return out


def text_part(text: str, logprobs: list[dict[str, Any]]) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs}


def refusal_part(text: str) -> dict[str, Any]:
    return {"type": "refusal", "refusal": text}


def message_output(item_id: str, parts: list[dict[str, Any]], status: str) -> dict[str, Any]:
    return {"id": item_id, "type": "message", "role": "assistant", "status": status, "content": parts}


def reasoning_output(item_id: str, text: str, status: str, seal: Sealer | None = None) -> dict[str, Any]:
    # Raw chain of thought is `content` (reasoning_text); we write no summary of our own. `seal`
    # (include: reasoning.encrypted_content) also puts it, sealed, in `encrypted_content`.
    return {
        "id": item_id,
        "type": "reasoning",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
        "encrypted_content": seal(text) if seal is not None and status != "in_progress" else None,
        "status": status,
    }


def function_call_output(
    item_id: str, call_id: str, name: str, namespace: str | None, arguments: str, status: str
) -> dict[str, Any]:
    return _call_item("function_call", "arguments", arguments, item_id, call_id, name, namespace, status)


def custom_tool_call_output(
    item_id: str, call_id: str, name: str, namespace: str | None, text: str, status: str
) -> dict[str, Any]:
    """A `custom_tool_call` output item; `text` is its raw input (already decoded from the arguments)."""
    return _call_item("custom_tool_call", "input", text, item_id, call_id, name, namespace, status)


def _call_item(
    kind: str,
    payload_field: str,
    payload: str,
    item_id: str,
    call_id: str,
    name: str,
    namespace: str | None,
    status: str,
) -> dict[str, Any]:
    item = {"id": item_id, "type": kind, "call_id": call_id, "name": name, payload_field: payload, "status": status}
    if namespace is not None:
        item["namespace"] = namespace
    return item


def tool_call_output(
    tool_map: ToolMap, base: str, index: int, call_id: str, chat_name: str, arguments: str, status: str
) -> dict[str, Any]:
    """The output item for a chat tool call: a custom_tool_call if it calls a custom tool, else a function_call."""
    name, namespace = tool_map.response_name(chat_name)
    if tool_map.is_custom(chat_name):
        return custom_tool_call_output(
            item_id("ctc", base, index), call_id, name, namespace, decode_input(arguments), status
        )
    return function_call_output(item_id("fc", base, index), call_id, name, namespace, arguments, status)


def attach_triple(output: list[dict[str, Any]], triple: TokenTriple | None) -> None:
    # Gym's training convention: the ids ride on the last generated item only.
    if triple is not None and output:
        last = output[-1]
        last["prompt_token_ids"], last["generation_token_ids"], last["generation_log_probs"] = triple


def chat_to_response(
    chat: dict[str, Any],
    request: dict[str, Any],
    tool_map: ToolMap | None,
    *,
    response_id: str,
    created_at: int,
    token_ids: bool,
    completed_at: int,
    echo: dict[str, Any] | None = None,
    seal: Sealer | None = None,
) -> dict[str, Any]:
    """A full Responses object for a non-stream chat completion; `completed_at` is the caller's clock.

    Output order: reasoning, message (text and/or refusal), then one function_call per tool call
    (a custom_tool_call when the call is to a custom tool).
    A generation with none of these still gets an empty message, so there is an item to carry
    the token triple. `model` is the upstream's (the routed target).
    """
    tool_map = tool_map or ToolMap()
    base = id_base(response_id)
    choices = chat.get("choices") or []
    choice = choices[0] if choices and isinstance(choices[0], dict) else {}
    message = choice.get("message") or {}
    status, incomplete = status_for(choice.get("finish_reason"))

    output: list[dict[str, Any]] = []
    reasoning = reasoning_of(message)
    if reasoning:
        output.append(reasoning_output(item_id("rs", base, len(output)), reasoning, "completed", seal))
    tool_calls = message.get("tool_calls") or []
    content = message.get("content")
    refusal = message.get("refusal")
    if content or refusal or (not output and not tool_calls):
        parts: list[dict[str, Any]] = []
        if content or not refusal:
            logprobs: list[dict[str, Any]] = []
            # Chat logprobs cover every generated token; they belong to the text only when the
            # text is all that was generated.
            if wants_output_logprobs(request) and not reasoning and not tool_calls:
                logprobs = response_logprobs((choice.get("logprobs") or {}).get("content"))
            parts.append(text_part(content or "", logprobs))
        if refusal:
            parts.append(refusal_part(refusal))
        output.append(message_output(item_id("msg", base, len(output)), parts, "completed"))
    for i, call in enumerate(tool_calls):
        function = call.get("function") or {}
        output.append(
            tool_call_output(
                tool_map,
                base,
                len(output),
                call.get("id") or f"call_{base}_{i}",
                function.get("name") or "",
                function.get("arguments") or "",
                "completed",
            )
        )
    if status == "incomplete":
        output[-1]["status"] = "incomplete"

    usage = chat.get("usage")
    # The triple is read only where it is used: on the output, or as the usage a chat answer lacks.
    triple = token_triple(chat) if token_ids or not usage else None
    if token_ids:
        attach_triple(output, triple)
    response = response_base(
        request, response_id=response_id, created_at=created_at, model=chat.get("model"), echo=echo
    )
    response["status"] = status
    response["incomplete_details"] = incomplete
    response["completed_at"] = completed_at if status == "completed" else None
    response["output"] = output
    response["usage"] = responses_usage(usage, triple)
    return response


def response_to_chat(response: dict[str, Any]) -> dict[str, Any]:
    """A Responses object as the chat.completion it stands for (for capture on the passthrough path).

    Keeps what a Responses upstream may carry for training: top-level `prompt_token_ids` and
    `output_token_ids` (vLLM's native Responses extras) and output_text logprobs.
    """
    content: list[str] = []
    reasoning: list[str] = []
    tool_calls: list[dict[str, Any]] = []
    logprobs: list[dict[str, Any]] = []
    for item in response.get("output") or []:
        if not isinstance(item, dict):
            continue
        kind = item.get("type")
        if kind == "message":
            for part in item.get("content") or []:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    content.append(part["text"])
                    logprobs.extend(part.get("logprobs") or [])
        elif kind == "reasoning":
            for part in (item.get("content") or []) + (item.get("summary") or []):
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    reasoning.append(part["text"])
        elif kind in ("function_call", "custom_tool_call"):
            if kind == "custom_tool_call":
                text = item.get("input")
                arguments = encode_input(text if isinstance(text, str) else "")
            else:
                arguments = item.get("arguments", "")
            tool_calls.append(
                {
                    "id": item.get("call_id"),
                    "type": "function",
                    "function": {"name": item.get("name"), "arguments": arguments},
                }
            )
    message: dict[str, Any] = {"role": "assistant", "content": "".join(content)}
    if reasoning:
        message["reasoning_content"] = "".join(reasoning)
    if tool_calls:
        message["tool_calls"] = tool_calls
    incomplete = (response.get("incomplete_details") or {}).get("reason")
    finish = "length" if incomplete == "max_output_tokens" else "tool_calls" if tool_calls else "stop"
    choice: dict[str, Any] = {
        "index": 0,
        "message": message,
        "finish_reason": finish,
        "logprobs": {"content": logprobs} if logprobs else None,
    }
    chat: dict[str, Any] = {
        "id": response.get("id"),
        "object": "chat.completion",
        "created": response.get("created_at"),
        "model": response.get("model"),
        "choices": [choice],
    }
    if isinstance(response.get("output_token_ids"), list):
        choice["token_ids"] = response["output_token_ids"]
    if isinstance(response.get("prompt_token_ids"), list):
        chat["prompt_token_ids"] = response["prompt_token_ids"]
    usage = response.get("usage")
    if isinstance(usage, dict):
        chat["usage"] = {
            "prompt_tokens": usage.get("input_tokens"),
            "completion_tokens": usage.get("output_tokens"),
            "total_tokens": usage.get("total_tokens"),
        }
    return chat
