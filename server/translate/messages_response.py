"""A chat completion as an Anthropic Messages `message` object; the stop reason, usage and blocks the stream writer shares (pure)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from server.capture.tokens import TokenTriple, reasoning_of, token_triple

# Seals raw reasoning text into a thinking block's `signature` (server.stateful.sealing).
Sealer = Callable[[str], str]


def stop_reason(finish_reason: str | None, matched: Any, stop_sequences: list[str], has_calls: bool) -> tuple[str, Any]:
    """Chat `finish_reason` (and vLLM's `stop_reason`, the matched stop string) as `stop_reason`, `stop_sequence`."""
    if finish_reason == "length":
        return "max_tokens", None
    if has_calls or finish_reason == "tool_calls":
        return "tool_use", None
    if isinstance(matched, str) and matched in stop_sequences:
        return "stop_sequence", matched
    if finish_reason == "content_filter":
        return "refusal", None
    return "end_turn", None


def messages_usage(chat_usage: dict[str, Any] | None, triple: TokenTriple | None = None) -> dict[str, Any]:
    """Chat usage in Messages form: `input_tokens` does not count the prompt tokens read from cache."""
    if chat_usage:
        prompt = chat_usage.get("prompt_tokens") or 0
        output = chat_usage.get("completion_tokens") or 0
        cached = (chat_usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    elif triple is not None:
        prompt, output, cached = len(triple[0]), len(triple[1]), 0
    else:
        prompt = output = cached = 0
    return {
        "input_tokens": prompt - cached,
        "output_tokens": output,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
    }


def tool_input(arguments: str) -> dict[str, Any]:
    """A tool call's generated arguments as the `input` object; arguments that are no JSON object give `{}`."""
    try:
        value = orjson.loads(arguments) if arguments else {}
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def thinking_block(text: str, seal: Sealer, shown: bool) -> dict[str, Any]:
    # The signature seals the whole text even when it is not shown (display: omitted), so a client
    # that sends the block back gives the model its exact reasoning again.
    return {"type": "thinking", "thinking": text if shown else "", "signature": seal(text)}


def message_base(message_id: str, model: str | None) -> dict[str, Any]:
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model or "",
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": messages_usage(None),
    }


def attach_triple(message: dict[str, Any], triple: TokenTriple | None) -> None:
    """Gym's training names for the call's token ids, on the message (asked for with `return_token_id_information`)."""
    if triple is not None:
        message["prompt_token_ids"], message["generation_token_ids"], message["generation_log_probs"] = triple


def chat_to_message(
    chat: dict[str, Any],
    *,
    message_id: str,
    seal: Sealer,
    show_thinking: bool,
    stop_sequences: list[str],
    token_ids: bool,
) -> dict[str, Any]:
    """A full Messages `message` for a non-stream chat completion: thinking, text, then tool_use blocks."""
    choices = chat.get("choices") or []
    choice = choices[0] if choices and isinstance(choices[0], dict) else {}
    message = choice.get("message") or {}
    content: list[dict[str, Any]] = []
    reasoning = reasoning_of(message)
    if reasoning:
        content.append(thinking_block(reasoning, seal, show_thinking))
    text = message.get("content") or message.get("refusal")
    if text:
        content.append({"type": "text", "text": text})
    calls = message.get("tool_calls") or []
    for i, call in enumerate(calls):
        function = call.get("function") or {}
        content.append(
            {
                "type": "tool_use",
                "id": call.get("id") or f"toolu_{message_id}_{i}",
                "name": function.get("name") or "",
                "input": tool_input(function.get("arguments") or ""),
            }
        )
    out = message_base(message_id, chat.get("model"))
    out["content"] = content
    out["stop_reason"], out["stop_sequence"] = stop_reason(
        choice.get("finish_reason"), choice.get("stop_reason"), stop_sequences, bool(calls)
    )
    triple = token_triple(chat)
    out["usage"] = messages_usage(chat.get("usage"), triple)
    if token_ids:
        attach_triple(out, triple)
    return out
