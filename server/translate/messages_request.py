"""An Anthropic Messages request body as a Chat Completions request body (pure; a 400 naming the field when it cannot be)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from server.translate.checks import invalid, is_int, is_number, text_of, unsupported, wrong_type

# Opens a thinking block's `signature` (or a redacted block's `data`) into the reasoning it seals;
# raises a 400 naming `param` when it was not sealed by this server's key.
Unsealer = Callable[[Any, str], str]

# Accepted and deliberately ignored: caching hints, client bookkeeping, and server-side features a
# single chat call has no notion of (see docs/http-api.md for what each would have done).
IGNORED_FIELDS = frozenset(
    {
        "model",  # the route decides (as for the other APIs)
        "stream",
        "metadata",
        "cache_control",
        "context_management",  # Claude Code's thinking-clearing edits: the history is sent as given
        "service_tier",
        "inference_geo",
        "speed",
    }
)
_HANDLED_FIELDS = frozenset(
    {
        "messages",
        "system",
        "max_tokens",
        "stop_sequences",
        "temperature",
        "top_p",
        "top_k",
        "tools",
        "tool_choice",
        "thinking",
        "output_config",
    }
)
# Every top-level Messages field this module accepts; anything else is a 400 naming it.
MESSAGES_FIELDS = IGNORED_FIELDS | _HANDLED_FIELDS

# Tool types that are Anthropic's own server or client tools: a chat upstream cannot run them.
_CUSTOM_TOOL_TYPES = (None, "custom")
_EFFORTS = {"low": "low", "medium": "medium", "high": "high", "xhigh": "high", "max": "high"}
_THINKING_TYPES = ("enabled", "disabled", "adaptive")


@dataclass
class MessagesChatRequest:
    """A translated Messages request: the chat body (no `model`/`stream`) and how to shape the answer."""

    body: dict[str, Any]
    show_thinking: bool = True  # false with `thinking.display: "omitted"`: the block's text stays empty
    stop_sequences: list[str] = field(default_factory=list)
    dropped_tool_types: list[str] = field(default_factory=list)


def _image(block: dict[str, Any], param: str) -> dict[str, Any]:
    source = block.get("source")
    if not isinstance(source, dict):
        raise wrong_type(f"{param}.source", "an object")
    kind = source.get("type")
    if kind == "base64":
        media, data = source.get("media_type"), source.get("data")
        if not isinstance(media, str) or not isinstance(data, str):
            raise invalid(f"`{param}.source` needs string `media_type` and `data`", f"{param}.source")
        return {"type": "image_url", "image_url": {"url": f"data:{media};base64,{data}"}}
    if kind == "url" and isinstance(source.get("url"), str):
        return {"type": "image_url", "image_url": {"url": source["url"]}}
    raise unsupported(f"image sources of type {kind!r} cannot be sent to a chat completions upstream", param)


def _content_blocks(content: Any, param: str) -> Iterator[tuple[dict[str, Any], str, Any]]:
    """Each block of a content array with its param name and its `type` (400s for what is not one)."""
    if not isinstance(content, list):
        raise wrong_type(param, "a string or an array of content blocks")
    for k, block in enumerate(content):
        block_param = f"{param}[{k}]"
        if not isinstance(block, dict):
            raise wrong_type(block_param, "a content block object")
        yield block, block_param, block.get("type")


def _parts(content: Any, param: str) -> str | list[dict[str, Any]]:
    """User-side content (a string, or text and image blocks) as chat content."""
    if isinstance(content, str):
        return content
    parts: list[dict[str, Any]] = []
    for block, part_param, kind in _content_blocks(content, param):
        if kind == "text":
            parts.append({"type": "text", "text": text_of(block, part_param)})
        elif kind == "image":
            parts.append(_image(block, part_param))
        else:
            raise unsupported(f"content blocks of type {kind!r} cannot be sent here", f"{part_param}.type")
    # One text block is exactly a string to a chat template; anything richer stays a list.
    if len(parts) == 1 and parts[0]["type"] == "text":
        text: str = parts[0]["text"]
        return text
    return parts


def _tool_result(block: dict[str, Any], param: str) -> dict[str, Any]:
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str):
        raise wrong_type(f"{param}.tool_use_id", "a string")
    raw = block.get("content")
    content: Any = "" if raw is None else _parts(raw, f"{param}.content")
    is_error = block.get("is_error")
    if is_error is not None and not isinstance(is_error, bool):
        raise wrong_type(f"{param}.is_error", "a boolean")
    if is_error:
        # A chat tool message has no error flag: the model is told in the text, as a tool would say it.
        content = "Error: " + content if isinstance(content, str) else [{"type": "text", "text": "Error:"}, *content]
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def _user(content: Any, param: str, messages: list[dict[str, Any]]) -> None:
    """A user turn: its tool results become tool messages, the rest user messages, in order."""
    if isinstance(content, str):
        messages.append({"role": "user", "content": content})
        return
    if not isinstance(content, list):
        raise wrong_type(param, "a string or an array of content blocks")
    pending: list[Any] = []

    def flush() -> None:
        if pending:
            messages.append({"role": "user", "content": _parts(list(pending), param)})
            pending.clear()

    for k, block in enumerate(content):
        if isinstance(block, dict) and block.get("type") == "tool_result":
            flush()
            messages.append(_tool_result(block, f"{param}[{k}]"))
        else:
            pending.append(block)
    flush()


def _assistant(content: Any, param: str, messages: list[dict[str, Any]], unseal: Unsealer) -> None:
    """An assistant turn: text, tool_use and (sealed) thinking blocks as one chat assistant message."""
    if isinstance(content, str):
        messages.append({"role": "assistant", "content": content})
        return
    texts: list[str] = []
    reasoning: list[str] = []
    calls: list[dict[str, Any]] = []
    for block, block_param, kind in _content_blocks(content, param):
        if kind == "text":
            texts.append(text_of(block, block_param))
        elif kind == "tool_use":
            call_id, name, arguments = block.get("id"), block.get("name"), block.get("input", {})
            if not isinstance(call_id, str) or not isinstance(name, str):
                raise invalid(f"`{block_param}` needs string `id` and `name`", block_param)
            if not isinstance(arguments, dict):
                raise wrong_type(f"{block_param}.input", "an object")
            encoded = json.dumps(arguments, ensure_ascii=False)
            calls.append({"id": call_id, "type": "function", "function": {"name": name, "arguments": encoded}})
        elif kind == "thinking":
            sealed = unseal(block.get("signature"), f"{block_param}.signature")
            shown = block.get("thinking")
            # The signature is what counts; the text must be what it seals, or empty (display: omitted).
            if shown not in ("", None, sealed):
                raise invalid(
                    f"`{block_param}.thinking` differs from what its signature seals; send thinking blocks back "
                    "exactly as this server returned them",
                    f"{block_param}.thinking",
                )
            reasoning.append(sealed)
        elif kind == "redacted_thinking":
            reasoning.append(unseal(block.get("data"), f"{block_param}.data"))
        else:
            raise unsupported(f"assistant content blocks of type {kind!r} cannot be sent here", f"{block_param}.type")
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if reasoning:
        message["reasoning_content"] = "".join(reasoning)
    if calls:
        message["tool_calls"] = calls
    messages.append(message)


def _system_text(value: Any, param: str) -> str:
    """`system` (top level, or a `role: "system"` message's content): a string or text blocks, joined."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise wrong_type(param, "a string or an array of text blocks")
    texts = []
    for k, block in enumerate(value):
        if not isinstance(block, dict) or block.get("type") != "text":
            raise invalid(f"`{param}[{k}]` must be a text block", f"{param}[{k}]")
        texts.append(text_of(block, f"{param}[{k}]"))
    return "\n\n".join(texts)


def _messages(value: Any, unseal: Unsealer) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not value:
        raise invalid("`messages` must be a non-empty array of messages", "messages")
    messages: list[dict[str, Any]] = []
    for i, message in enumerate(value):
        param = f"messages[{i}]"
        if not isinstance(message, dict):
            raise wrong_type(param, "a message object")
        role = message.get("role")
        content = message.get("content")
        if role == "user":
            _user(content, f"{param}.content", messages)
        elif role == "assistant":
            _assistant(content, f"{param}.content", messages, unseal)
        elif role == "system":  # Claude Code sends its environment block this way, mid-conversation
            messages.append({"role": "system", "content": _system_text(content, f"{param}.content")})
        else:
            raise invalid(f"`{param}.role` must be user, assistant or system (got {role!r})", f"{param}.role")
    return messages


def _tools(value: Any) -> tuple[list[dict[str, Any]], list[str]]:
    if value is None:
        return [], []
    if not isinstance(value, list):
        raise wrong_type("tools", "an array of tools")
    tools: list[dict[str, Any]] = []
    dropped: list[str] = []
    for i, tool in enumerate(value):
        if not isinstance(tool, dict):
            raise wrong_type(f"tools[{i}]", "a tool object")
        if tool.get("type") not in _CUSTOM_TOOL_TYPES:
            dropped.append(str(tool.get("type")))
            continue
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise wrong_type(f"tools[{i}].name", "a non-empty string")
        schema = tool.get("input_schema", {"type": "object"})
        if not isinstance(schema, dict):
            raise wrong_type(f"tools[{i}].input_schema", "a JSON Schema object")
        function: dict[str, Any] = {"name": name, "parameters": schema}
        if isinstance(tool.get("description"), str):
            function["description"] = tool["description"]
        if tool.get("strict") is True:
            function["strict"] = True
        tools.append({"type": "function", "function": function})
    return tools, dropped


def _tool_choice(value: Any, chat: dict[str, Any]) -> None:
    if value is None:
        return
    if not isinstance(value, dict):
        raise wrong_type("tool_choice", "an object")
    kind = value.get("type")
    if kind == "auto":
        choice: Any = "auto"
    elif kind == "any":
        choice = "required"
    elif kind == "none":
        choice = "none"
    elif kind == "tool":
        if not isinstance(value.get("name"), str):
            raise wrong_type("tool_choice.name", "a string")
        choice = {"type": "function", "function": {"name": value["name"]}}
    else:
        raise invalid(f"`tool_choice.type` must be auto, any, tool or none (got {kind!r})", "tool_choice.type")
    if "tools" in chat:
        chat["tool_choice"] = choice
    disable = value.get("disable_parallel_tool_use")
    if disable is not None:
        if not isinstance(disable, bool):
            raise wrong_type("tool_choice.disable_parallel_tool_use", "a boolean")
        if "tools" in chat:
            chat["parallel_tool_calls"] = not disable


def _thinking(value: Any) -> bool:
    """Check `thinking`; returns whether the reasoning text is shown (false with `display: "omitted"`).

    The engine reasons or not as its model and chat template do: `enabled`, `adaptive` and their
    budget cannot switch that, so the reasoning it generates is always returned, as thinking blocks.
    """
    if value is None:
        return True
    if not isinstance(value, dict):
        raise wrong_type("thinking", "an object")
    if value.get("type") not in _THINKING_TYPES:
        raise invalid(f"`thinking.type` must be one of {', '.join(_THINKING_TYPES)}", "thinking.type")
    budget = value.get("budget_tokens")
    if budget is not None and (not is_int(budget) or budget < 0):
        raise wrong_type("thinking.budget_tokens", "a non-negative integer")
    display = value.get("display")
    if display is not None and display not in ("summarized", "omitted"):
        raise invalid("`thinking.display` must be summarized or omitted", "thinking.display")
    return display != "omitted"


def _output_config(value: Any, chat: dict[str, Any]) -> None:
    if value is None:
        return
    if not isinstance(value, dict):
        raise wrong_type("output_config", "an object")
    effort = value.get("effort")
    if effort is not None:
        if not isinstance(effort, str) or effort not in _EFFORTS:
            raise invalid(f"`output_config.effort` must be one of {', '.join(_EFFORTS)}", "output_config.effort")
        chat["reasoning_effort"] = _EFFORTS[effort]
    fmt = value.get("format")
    if fmt is not None:
        if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
            raise invalid("`output_config.format` must be {type: json_schema, schema: {...}}", "output_config.format")
        chat["response_format"] = {"type": "json_schema", "json_schema": {"name": "response", "schema": fmt["schema"]}}


def messages_to_chat(body: dict[str, Any], unseal: Unsealer) -> MessagesChatRequest:
    """Translate a Messages request body to a chat completions body; 400 (OpenAIError) when it cannot.

    `unseal` opens the signatures of thinking blocks sent back, so the model sees its own reasoning
    again exactly; one not sealed by this server is refused.
    """
    for key in body:
        if key not in MESSAGES_FIELDS:
            raise unsupported(f"unsupported parameter: {key}", key)
    if body.get("stream") is not None and not isinstance(body["stream"], bool):
        raise wrong_type("stream", "a boolean")
    if body.get("model") is not None and not isinstance(body["model"], str):
        raise wrong_type("model", "a string")
    if body.get("metadata") is not None and not isinstance(body["metadata"], dict):
        raise wrong_type("metadata", "an object")
    max_tokens = body.get("max_tokens")
    if max_tokens is None:
        raise invalid("`max_tokens` is required", "max_tokens", code="missing_required_parameter")
    if not is_int(max_tokens) or max_tokens < 1:
        raise wrong_type("max_tokens", "a positive integer")

    messages = _messages(body.get("messages"), unseal)
    if body.get("system") is not None:
        messages.insert(0, {"role": "system", "content": _system_text(body["system"], "system")})
    chat: dict[str, Any] = {"messages": messages, "max_tokens": max_tokens}
    tools, dropped = _tools(body.get("tools"))
    if tools:
        chat["tools"] = tools
    _tool_choice(body.get("tool_choice"), chat)

    stop = body.get("stop_sequences")
    if stop is not None:
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise wrong_type("stop_sequences", "an array of strings")
        if stop:
            chat["stop"] = stop
    for key in ("temperature", "top_p"):
        if body.get(key) is not None:
            if not is_number(body[key]):
                raise wrong_type(key, "a number")
            chat[key] = body[key]
    if body.get("top_k") is not None:
        if not is_int(body["top_k"]):
            raise wrong_type("top_k", "an integer")
        chat["top_k"] = body["top_k"]
    show_thinking = _thinking(body.get("thinking"))
    _output_config(body.get("output_config"), chat)
    return MessagesChatRequest(chat, show_thinking, list(stop or ()), dropped)
