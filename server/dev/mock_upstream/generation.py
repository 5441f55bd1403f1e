"""Decide the mock's reply to a conversation (text, reasoning, tool calls) and its token ids."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import orjson

from server.dev.mock_upstream.directives import Directives
from server.dev.mock_upstream.template import AssistantLayout, content_text, render_assistant
from server.dev.mock_upstream.tokenizer import IM_END, IM_END_ID, SPECIAL_TOKENS, Tokenizer, split_pieces

_FILLER_WORDS = (
    "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar "
    "papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu"
).split()
# Top-logprob alternatives: real pieces, so their ids and texts agree with the tokenizer.
ALTERNATIVES = [
    " the",
    " a",
    " and",
    " of",
    " to",
    " in",
    " is",
    " it",
    " that",
    " for",
    " on",
    " with",
    " as",
    " was",
    " at",
    " by",
    " this",
    " be",
    " or",
    " an",
    " not",
]


def filler_text(tokens: int) -> str:
    """Deterministic text of exactly `tokens` pieces (each word is one piece)."""
    words = [_FILLER_WORDS[i % len(_FILLER_WORDS)] for i in range(tokens)]
    return " ".join(words)


def token_logprob(token_id: int) -> float:
    """A deterministic, finite, negative log probability for a token id."""
    return -((token_id * 2654435761) % 997 + 1) / 1000.0


def _excerpt(text: str, words: int) -> str:
    parts = text.split()
    excerpt = " ".join(parts[:words])
    return excerpt + (" ..." if len(parts) > words else "")


@dataclass(slots=True)
class Generation:
    """The assistant turn the mock produces: its token ids and how they map to message parts."""

    text: str
    pieces: list[str]
    ids: list[int]
    starts: list[int]
    layout: AssistantLayout
    calls: list[dict[str, str]]  # {"id", "name", "arguments"}
    finish_reason: str
    content: str | None
    reasoning: str | None
    kept_calls: list[dict[str, str]]


def _to_js_numbers(value: Any) -> Any:
    """Turn integral floats into ints, as a JavaScript client would when it re-serialises them."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, dict):
        return {k: _to_js_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_to_js_numbers(v) for v in value]
    return value


def _tool_names(tools: list[Any] | None) -> set[str]:
    names: set[str] = set()
    for tool in tools or ():
        if not isinstance(tool, dict):
            continue
        function = tool.get("function")
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            names.add(function["name"])
        elif isinstance(tool.get("name"), str):
            names.add(tool["name"])
        if isinstance(tool.get("tools"), list):  # a Codex-style namespace of tools
            names |= _tool_names(tool["tools"])
    return names


def last_user_text(messages: list[dict[str, Any]]) -> tuple[str, int]:
    """(text of the last user message, how many assistant messages follow it)."""
    assistants = 0
    for message in reversed(messages):
        role = message.get("role")
        if role == "user":
            content = message.get("content")
            if isinstance(content, list):
                # Parts are joined with newlines here so two parts never glue into one directive.
                text = "\n".join(content_text([part]) for part in content)
            else:
                text = content_text(content)
            return text, assistants
        if role == "assistant":
            assistants += 1
    return "", assistants


def _tool_call_id(seed: str, index: int) -> str:
    digest = hashlib.blake2b(f"{seed}\x00{index}".encode(), digest_size=12).hexdigest()
    return f"chatcmpl-tool-{digest}"


def plan_reply(
    tokenizer: Tokenizer,
    messages: list[dict[str, Any]],
    tools: list[Any] | None,
    directives: Directives,
    *,
    allow_tools: bool = True,
    max_tokens: int | None = None,
    seed: str = "",
) -> Generation:
    """Decide the reply (content / reasoning / tool calls) and its token ids."""
    _, step_index = last_user_text(messages)
    step = directives.steps[step_index] if step_index < len(directives.steps) else None
    last_role = messages[-1].get("role") if messages else None

    calls: list[tuple[str, str]] = []
    content = ""
    cap = max_tokens
    if step is not None:
        available = _tool_names(tools) if allow_tools else set()
        for name, arguments in step.tools:
            if name in available:
                calls.append((name, orjson.dumps(_to_js_numbers(arguments)).decode()))
        if step.length is not None:
            cap = step.length if cap is None else min(cap, step.length)
    if calls:
        content = ""
    elif step is not None and step.say is not None:
        content = step.say
    elif step is not None and step.tokens is not None:
        content = filler_text(step.tokens)
    elif step is not None and step.length is not None:
        content = filler_text(step.length + 1)
    elif last_role == "tool":
        outputs = 0
        for message in reversed(messages):
            if message.get("role") != "tool":
                break
            outputs += 1
        preview = _excerpt(content_text(messages[-1].get("content")), 12)
        if outputs == 1:
            content = f"Done. The tool said: {preview}" if preview else "Done."
        else:
            content = (
                f"Done. {outputs} tool results; the last said: {preview}"
                if preview
                else f"Done. {outputs} tool results."
            )
    else:
        excerpt = _excerpt(directives.stripped_text, 16)
        content = f"OK. You said: {excerpt}" if excerpt else "OK."

    reasoning = None
    if directives.reasoning:
        if calls:
            reasoning = "The user wants tools. I will call " + ", ".join(name for name, _ in calls) + "."
        else:
            reasoning = f"The conversation has {len(messages)} messages. I will answer in text."

    layout = render_assistant(content, reasoning, calls)
    pieces = split_pieces(layout.text)
    ids = tokenizer.ids_of(pieces)
    starts = []
    offset = 0
    for piece in pieces:
        starts.append(offset)
        offset += len(piece)

    if directives.drift:
        _drift(tokenizer, pieces, ids, starts)

    pieces.append(IM_END)
    ids.append(IM_END_ID)
    starts.append(len(layout.text))

    truncated = cap is not None and len(ids) > cap
    if truncated:
        del pieces[cap:], ids[cap:], starts[cap:]
    call_dicts = [
        {"id": _tool_call_id(seed, index), "name": name, "arguments": arguments}
        for index, (name, arguments) in enumerate(calls)
    ]
    if truncated:
        kept_end = starts[-1] + len(pieces[-1]) if pieces else 0
        finish = "length"
        kept_calls = [c for c, span in zip(call_dicts, layout.tool_calls) if span[3] <= kept_end]
        cs, ce = layout.content
        content_out = layout.text[cs : min(ce, kept_end)] if kept_end > cs else ""
        reasoning_out = None
        if layout.reasoning and kept_end > layout.reasoning[0]:
            rs, re_ = layout.reasoning
            reasoning_out = layout.text[rs : min(re_, kept_end)]
    else:
        finish = "tool_calls" if calls else "stop"
        kept_calls = call_dicts
        content_out = content
        reasoning_out = reasoning
    return Generation(
        text=layout.text,
        pieces=pieces,
        ids=ids,
        starts=starts,
        layout=layout,
        calls=call_dicts,
        finish_reason=finish,
        content=content_out if (content_out or not kept_calls) else None,
        reasoning=reasoning_out,
        kept_calls=kept_calls,
    )


def _drift(tokenizer: Tokenizer, pieces: list[str], ids: list[int], starts: list[int]) -> None:
    """Tokenise the reply non-canonically: split its first multi-character piece in two.

    The text is unchanged, so the next turn's template re-tokenises it the canonical way and the
    prompt no longer starts with this turn's prompt + generated ids.
    """
    for index, piece in enumerate(pieces):
        if len(piece) >= 2 and piece not in SPECIAL_TOKENS:
            head, tail = piece[:1], piece[1:]
            pieces[index : index + 1] = [head, tail]
            ids[index : index + 1] = tokenizer.ids_of([head, tail])
            starts[index : index + 1] = [starts[index], starts[index] + 1]
            return
    if ids:
        ids[0] += 1
