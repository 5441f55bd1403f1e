"""The mock's chat template: messages and tools rendered to prompt text, assistant turns with their spans."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

GENERATION_PROMPT = "<|im_start|>assistant\n"
_TOOLS_PREAMBLE = (
    "# Tools\n\n"
    "Functions you can call are listed below, one JSON object per line. To call one, write "
    '<tool_call>\n{"name": <name>, "arguments": <object>}\n</tool_call>.\n\n'
)


def content_text(content: Any) -> str:
    """A chat message's content as the template sees it: text parts joined, other parts as a tag."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for part in content:
            if isinstance(part, str):
                out.append(part)
            elif isinstance(part, dict):
                text = part.get("text")
                out.append(text if isinstance(text, str) else f"[{part.get('type', 'part')}]")
        return "".join(out)
    return orjson.dumps(content).decode()


def canonical_arguments(arguments: Any) -> str:
    """Tool-call arguments as the template renders them: parsed and re-dumped compactly.

    Clients re-serialise arguments before sending them back (opencode drops the spaces), so the
    template must not depend on the exact string it receives, only on the JSON value.
    """
    if isinstance(arguments, str):
        try:
            value = orjson.loads(arguments)
        except orjson.JSONDecodeError:
            return orjson.dumps(arguments).decode()
    else:
        value = arguments
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return orjson.dumps(str(value)).decode()


@dataclass(slots=True)
class AssistantLayout:
    """An assistant message rendered as the template does, with where each part sits in the text."""

    text: str
    reasoning: tuple[int, int] | None
    content: tuple[int, int]
    # (start of "<tool_call>", start of the arguments, end of the arguments, end of "</tool_call>")
    tool_calls: list[tuple[int, int, int, int]]


def render_assistant(content: str, reasoning: str | None, tool_calls: list[tuple[str, str]]) -> AssistantLayout:
    """Render an assistant turn (`tool_calls` = (name, canonical arguments) pairs)."""
    text = ""
    reasoning_span = None
    if reasoning:
        text = "<think>\n"
        reasoning_span = (len(text), len(text) + len(reasoning))
        text += reasoning + "\n</think>\n\n"
    content_span = (len(text), len(text) + len(content))
    text += content
    spans: list[tuple[int, int, int, int]] = []
    for name, arguments in tool_calls:
        if content or spans:
            text += "\n"
        start = len(text)
        text += '<tool_call>\n{"name":' + orjson.dumps(name).decode() + ',"arguments":'
        args_start = len(text)
        text += arguments
        args_end = len(text)
        text += "}\n</tool_call>"
        spans.append((start, args_start, args_end, len(text)))
    return AssistantLayout(text, reasoning_span, content_span, spans)


def _history_assistant_text(message: dict[str, Any], drop_reasoning: bool = False) -> str:
    reasoning = None if drop_reasoning else message.get("reasoning_content") or message.get("reasoning")
    calls = []
    for call in message.get("tool_calls") or ():
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            calls.append((str(function.get("name") or ""), canonical_arguments(function.get("arguments", "{}"))))
    return render_assistant(
        content_text(message.get("content")), reasoning if isinstance(reasoning, str) else None, calls
    ).text


def _tools_text(tools: list[Any]) -> str:
    return _TOOLS_PREAMBLE + "".join(orjson.dumps(tool).decode() + "\n" for tool in tools)


def render_blocks(messages: list[dict[str, Any]], tools: list[Any] | None, drop_reasoning: bool = False) -> list[str]:
    """The prompt as one string per message block (each ends with `<|im_end|>\\n`), tools in the first system block.

    `drop_reasoning`: past assistant turns render without their reasoning, as Qwen3-class templates
    do, so a reasoning reply's generated ids do not reappear in the next prompt.
    """
    blocks = []
    rest = messages
    if tools:
        if messages and messages[0].get("role") == "system":
            system = content_text(messages[0].get("content"))
            blocks.append("<|im_start|>system\n" + system + "\n\n" + _tools_text(tools) + "<|im_end|>\n")
            rest = messages[1:]
        else:
            blocks.append("<|im_start|>system\n" + _tools_text(tools) + "<|im_end|>\n")
    for message in rest:
        role = message.get("role")
        if role == "assistant":
            body = _history_assistant_text(message, drop_reasoning)
        else:
            body = content_text(message.get("content"))
        blocks.append(f"<|im_start|>{role}\n{body}<|im_end|>\n")
    return blocks


def render_prompt(
    messages: list[dict[str, Any]],
    tools: list[Any] | None,
    add_generation_prompt: bool = True,
    drop_reasoning: bool = False,
) -> str:
    """The whole prompt as one string (tokenising it gives the same ids as `prompt_token_ids`)."""
    text = "".join(render_blocks(messages, tools, drop_reasoning))
    return text + (GENERATION_PROMPT if add_generation_prompt else "")
