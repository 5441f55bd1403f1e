"""What the reconstruction reads off single records: their order, session signature, title calls, equal prompts, injection fallbacks."""

from __future__ import annotations

from typing import Any

from server.capture.write.record import INJECTION_BREAKING_FALLBACKS, CaptureRecord


def split_items(items: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Gym's input/output split: output starts at the first generated item."""
    split = next(
        (
            k
            for k, item in enumerate(items)
            if item.get("role") == "assistant" or item["type"] in ("reasoning", "reasoning_item", "function_call")
        ),
        len(items),
    )
    return {"input": items[:split], "output": items[split:]}


def order_key(record: object) -> tuple[int, str, str]:
    # A record without a capture time cannot be placed in the conversation: it goes last, so a
    # damaged entry ends the rollout there instead of failing the whole session up front.
    if not isinstance(record, dict):
        return (1, "", "")
    captured_at, uuid = record.get("captured_at"), record.get("uuid")
    uuid = uuid if isinstance(uuid, str) else ""
    return (0, captured_at, uuid) if isinstance(captured_at, str) else (1, "", uuid)


def uuid_or_index(record: object, i: int) -> str:
    uuid = record.get("uuid") if isinstance(record, dict) else None
    return uuid if isinstance(uuid, str) and uuid else f"record {i}"


def signature(record: object) -> tuple[Any, Any, Any]:
    if not isinstance(record, dict):
        return (None, None, None)
    return (record.get("model"), record.get("tools"), record.get("tool_choice"))


def is_title_call(record: object) -> bool:
    """opencode's title request: no tools, and a system prompt that calls itself a title generator."""
    if not isinstance(record, dict) or record.get("tools"):
        return False
    messages = record.get("messages")
    if not isinstance(messages, list):
        return False
    for message in messages:
        if isinstance(message, dict) and message.get("role") == "system":
            content = message.get("content")
            if isinstance(content, list):
                content = "".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
            if isinstance(content, str) and "title generator" in content.lower():
                return True
    return False


def prompt_of(record: object) -> list[Any] | None:
    prompt = record.get("prompt_token_ids") if isinstance(record, dict) else None
    return prompt if isinstance(prompt, list) else None


def same_prompt(record: CaptureRecord, other: CaptureRecord) -> bool:
    """Both records ask the same thing: equal prompt tokens, or, lacking tokens, equal prompt messages."""
    prompt, other_prompt = record.get("prompt_token_ids"), other.get("prompt_token_ids")
    if isinstance(prompt, list) and prompt and isinstance(other_prompt, list) and other_prompt:
        return len(prompt) == len(other_prompt) and prompt == other_prompt
    messages, other_messages = record.get("messages"), other.get("messages")
    return (
        isinstance(messages, list)
        and isinstance(other_messages, list)
        and len(messages) > 1
        and messages[:-1] == other_messages[:-1]
    )


def injection_break(record: CaptureRecord) -> str | None:
    """The record's injection fallback reason when it broke a chain that was there to extend."""
    info = record.get("injection")
    reason = info.get("fallback_reason") if isinstance(info, dict) else None
    return reason if reason in INJECTION_BREAKING_FALLBACKS else None


# A piece of generated text shorter than this is too common ("ok", "4") to say a prompt quotes it.
QUOTED_MIN_CHARS = 5
# A line of a longer answer this long is quoted on its own (a client may rework a summary around it).
QUOTED_LINE_CHARS = 32


def generated_texts(messages: list[Any]) -> list[str]:
    """What the model wrote in `messages`: each assistant turn's text (whole, and each of its long
    lines) and tool-call arguments."""
    out = []
    for message in messages:
        if not isinstance(message, dict) or message.get("role") != "assistant":
            continue
        content = message.get("content")
        if isinstance(content, list):
            content = "".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
        if isinstance(content, str) and len(content.strip()) >= QUOTED_MIN_CHARS:
            out.append(content.strip())
            if "\n" in content.strip():
                out += [line.strip() for line in content.splitlines() if len(line.strip()) >= QUOTED_LINE_CHARS]
        for call in message.get("tool_calls") or []:
            function = call.get("function") if isinstance(call, dict) else None
            arguments = function.get("arguments") if isinstance(function, dict) else None
            if isinstance(arguments, str) and len(arguments.strip()) >= QUOTED_MIN_CHARS:
                out.append(arguments.strip())
    return out


def quotes_any(prompt: list[Any], texts: list[str]) -> bool:
    """Whether a non-system message of `prompt` holds one of `texts`: a compaction's summary carries
    what the conversation before it produced; a new task's first call carries none of it."""
    said = []
    for message in prompt:
        if isinstance(message, dict) and message.get("role") not in ("system", "developer"):
            content = message.get("content")
            if isinstance(content, list):
                content = "".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
            if isinstance(content, str):
                said.append(content)
    whole = "\n".join(said)
    return any(text in whole for text in texts)
