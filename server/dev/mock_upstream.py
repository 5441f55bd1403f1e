"""Deterministic vLLM-compatible chat model server, scripted by directives, for the demo, tests and benchmarks."""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import logging
import os
import re
import time
import zlib
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from server.errors import OpenAIError

Scope = dict[str, Any]
ASGIMessage = dict[str, Any]
Receive = Callable[[], Awaitable[ASGIMessage]]
Send = Callable[[ASGIMessage], Awaitable[None]]

# ---------------------------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------------------------

SPECIAL_TOKENS: dict[str, int] = {
    "<|endoftext|>": 0,
    "<|im_start|>": 1,
    "<|im_end|>": 2,
    "<tool_call>": 3,
    "</tool_call>": 4,
    "<think>": 5,
    "</think>": 6,
}
IM_START_ID = SPECIAL_TOKENS["<|im_start|>"]
IM_END_ID = SPECIAL_TOKENS["<|im_end|>"]
IM_END = "<|im_end|>"

_SPECIAL_RE = re.compile("(" + "|".join(re.escape(s) for s in SPECIAL_TOKENS) + ")")
# Every character is either \w, \s or neither, so the pieces always concatenate back to the text.
_PIECE_RE = re.compile(r" ?\w+| ?[^\w\s]+|\s+")
_PIECE_ID_BASE = 1000
_PIECE_ID_SPAN = 100_000


def piece_id(piece: str) -> int:
    """The id of an ordinary (non-special) piece: stable across processes and runs."""
    return _PIECE_ID_BASE + zlib.crc32(piece.encode("utf-8")) % _PIECE_ID_SPAN


class _PieceIds(dict):
    """piece -> id, computing unknown pieces on first use so lookups stay in C (`map(d.__getitem__, ...)`)."""

    def __missing__(self, piece: str) -> int:
        value = self[piece] = piece_id(piece)
        return value


def split_pieces(text: str) -> list[str]:
    """The token pieces of `text`: special tokens whole, the rest split by `_PIECE_RE`.

    The text right after `<|im_start|>` is cut after its first newline, so the role header
    (`assistant\\n`) never merges with the message body. That is what makes a rendered
    conversation tokenise to the concatenation of its per-message tokenisations, and a reply's
    generated ids reappear unchanged in the next turn's prompt.
    """
    parts = _SPECIAL_RE.split(text)
    if len(parts) == 1:
        return _PIECE_RE.findall(text)
    out: list[str] = []
    after_im_start = False
    for index, part in enumerate(parts):
        if index % 2:
            out.append(part)
            after_im_start = part == "<|im_start|>"
            continue
        if not part:
            continue
        if after_im_start:
            newline = part.find("\n")
            if newline >= 0:
                out += _PIECE_RE.findall(part[: newline + 1])
                part = part[newline + 1 :]
        out += _PIECE_RE.findall(part)
    return out


class Tokenizer:
    """Deterministic tokenizer with a per-block cache (prompts repeat their system block on every call)."""

    def __init__(self, *, block_cache_entries: int = 4096, max_pieces: int = 500_000) -> None:
        self._ids = _PieceIds(SPECIAL_TOKENS)
        self._blocks: OrderedDict[str, tuple[int, ...]] = OrderedDict()
        self._block_cache_entries = block_cache_entries
        self._max_pieces = max_pieces

    def ids_of(self, pieces: list[str]) -> list[int]:
        if len(self._ids) > self._max_pieces:
            # Random text could grow the table forever; dropping it only costs recomputation.
            self._ids = _PieceIds(SPECIAL_TOKENS)
        return list(map(self._ids.__getitem__, pieces))

    def encode(self, text: str) -> list[int]:
        return self.ids_of(split_pieces(text))

    def encode_block(self, block: str) -> tuple[int, ...]:
        """`encode`, cached: meant for whole rendered messages, which recur turn after turn."""
        cached = self._blocks.get(block)
        if cached is not None:
            self._blocks.move_to_end(block)
            return cached
        ids = tuple(self.encode(block))
        self._blocks[block] = ids
        if len(self._blocks) > self._block_cache_entries:
            self._blocks.popitem(last=False)
        return ids


# ---------------------------------------------------------------------------------------------
# Chat template
# ---------------------------------------------------------------------------------------------

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
    spans = []
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


def _history_assistant_text(message: dict[str, Any]) -> str:
    reasoning = message.get("reasoning_content") or message.get("reasoning")
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


def render_blocks(messages: list[dict[str, Any]], tools: list[Any] | None) -> list[str]:
    """The prompt as one string per message block (each ends with `<|im_end|>\\n`), tools in the first system block."""
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
            body = _history_assistant_text(message)
        else:
            body = content_text(message.get("content"))
        blocks.append(f"<|im_start|>{role}\n{body}<|im_end|>\n")
    return blocks


def render_prompt(messages: list[dict[str, Any]], tools: list[Any] | None, add_generation_prompt: bool = True) -> str:
    """The whole prompt as one string (tokenising it gives the same ids as `prompt_token_ids`)."""
    return "".join(render_blocks(messages, tools)) + (GENERATION_PROMPT if add_generation_prompt else "")


# ---------------------------------------------------------------------------------------------
# Directives
# ---------------------------------------------------------------------------------------------

DIRECTIVE_OPEN = "[[mock:"
DIRECTIVE_CLOSE = "]]"
_VERB_RE = re.compile(r"[a-z_]+")
_JSON = json.JSONDecoder()


@dataclass(slots=True)
class Step:
    """What one reply in a user turn's agent loop should contain."""

    tools: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    say: str | None = None
    tokens: int | None = None
    length: int | None = None


@dataclass(slots=True)
class Directives:
    steps: list[Step] = field(default_factory=lambda: [Step()])
    reasoning: bool = False
    drift: bool = False
    chunk: int = 1
    error: tuple[int, float | None, int | None] | None = None  # status, retry_after, times
    error_key: str = ""
    badjson: bool = False
    hang: float = 0.0
    sleep_ms: float = 0.0
    slow_ms: float = 0.0
    streamcut: int | None = None
    stripped_text: str = ""


def _number(text: str, kind: type = float) -> Any:
    value = kind(text)
    if value < 0 or value != value:
        raise ValueError(text)
    return value


def _apply_simple(d: Directives, verb: str, args: list[str], raw: str) -> bool:
    """Apply a directive that takes plain words; False if the words do not fit the verb."""
    step = d.steps[-1]
    try:
        if verb == "reasoning" and not args:
            d.reasoning = True
        elif verb == "drift" and not args:
            d.drift = True
        elif verb == "badjson" and not args:
            d.badjson = True
        elif verb == "next" and not args:
            d.steps.append(Step())
        elif verb == "length" and len(args) == 1:
            step.length = _number(args[0], int)
        elif verb == "tokens" and len(args) == 1:
            step.tokens = _number(args[0], int)
        elif verb == "chunk" and len(args) == 1:
            d.chunk = max(1, _number(args[0], int))
        elif verb == "hang" and len(args) == 1:
            d.hang = _number(args[0])
        elif verb == "sleep" and len(args) == 1:
            d.sleep_ms = _number(args[0])
        elif verb == "slow" and len(args) == 1:
            d.slow_ms = _number(args[0])
        elif verb == "streamcut" and len(args) == 1:
            d.streamcut = _number(args[0], int)
        elif verb == "error" and 1 <= len(args) <= 3:
            times = None
            positional = []
            for arg in args:
                if arg.startswith("times="):
                    times = _number(arg[6:], int)
                else:
                    positional.append(arg)
            status = int(positional[0])
            if not 400 <= status <= 599 or len(positional) > 2:
                return False
            retry_after = _number(positional[1]) if len(positional) == 2 else None
            d.error = (status, retry_after, times)
            d.error_key = raw
        else:
            return False
    except ValueError:
        return False
    return True


def parse_directives(text: str) -> Directives:
    """Find the outermost `[[mock:...]]` directives in `text` (see docs/mock-upstream.md).

    Scanning resumes after each directive's end, so a directive quoted inside a tool directive's
    JSON arguments (a sub-agent's task prompt) never fires here: it fires where that prompt
    becomes the sub-agent's own user message.
    """
    d = Directives()
    kept: list[str] = []
    position = 0
    while True:
        start = text.find(DIRECTIVE_OPEN, position)
        if start < 0:
            break
        end = _parse_one(d, text, start + len(DIRECTIVE_OPEN))
        if end is None:
            kept.append(text[position : start + len(DIRECTIVE_OPEN)])
            position = start + len(DIRECTIVE_OPEN)
            continue
        kept.append(text[position:start])
        position = end
    kept.append(text[position:])
    d.stripped_text = "".join(kept)
    return d


def _skip_spaces(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


def _parse_one(d: Directives, text: str, i: int) -> int | None:
    """Parse the directive whose verb starts at `i`; return the index after its `]]`, or None."""
    verb_match = _VERB_RE.match(text, i)
    if not verb_match:
        return None
    verb = verb_match.group()
    i = verb_match.end()
    if verb == "tool":
        i = _skip_spaces(text, i)
        name_start = i
        while i < len(text) and not text[i].isspace() and not text.startswith(DIRECTIVE_CLOSE, i) and text[i] != "{":
            i += 1
        name = text[name_start:i]
        if not name:
            return None
        i = _skip_spaces(text, i)
        arguments: Any = {}
        if i < len(text) and text[i] == "{":
            try:
                arguments, i = _JSON.raw_decode(text, i)
            except ValueError:
                return None
            i = _skip_spaces(text, i)
        if not text.startswith(DIRECTIVE_CLOSE, i):
            return None
        d.steps[-1].tools.append((name, arguments))
        return i + len(DIRECTIVE_CLOSE)
    close = text.find(DIRECTIVE_CLOSE, i)
    if close < 0:
        return None
    if verb == "say":
        d.steps[-1].say = text[i:close].strip()
        return close + len(DIRECTIVE_CLOSE)
    if i < close and not text[i].isspace():
        return None  # e.g. "[[mock:toolx ...]]": the verb must end at a space or "]]"
    if not _apply_simple(d, verb, text[i:close].split(), text[i - len(verb) : close]):
        return None
    return close + len(DIRECTIVE_CLOSE)


# ---------------------------------------------------------------------------------------------
# Generation
# ---------------------------------------------------------------------------------------------

_FILLER_WORDS = (
    "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar "
    "papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu"
).split()
# Top-logprob alternatives: real pieces, so their ids and texts agree with the tokenizer.
_ALTERNATIVES = [
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


# ---------------------------------------------------------------------------------------------
# Response bodies
# ---------------------------------------------------------------------------------------------


@dataclass(slots=True)
class Options:
    """The vLLM extras a request asked for."""

    return_token_ids: bool = False
    logprobs: bool = False
    top_logprobs: int = 0
    tokens_as_ids: bool = False
    include_usage: bool = False


class _LogprobEntries:
    """Build (and cache) `logprobs.content[]` entries; the same tokens recur in every reply."""

    def __init__(self, max_entries: int = 100_000) -> None:
        self._cache: dict[tuple[int, str, int, bool], dict[str, Any]] = {}
        self._max_entries = max_entries
        self._alternatives = [(piece_id(p), p) for p in _ALTERNATIVES]

    @staticmethod
    def _token(token_id: int, text: str, as_ids: bool) -> tuple[str, list[int]]:
        token = f"token_id:{token_id}" if as_ids else text
        return token, list(token.encode("utf-8"))

    def entry(self, token_id: int, text: str, top: int, as_ids: bool) -> dict[str, Any]:
        key = (token_id, text, top, as_ids)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        logprob = token_logprob(token_id)
        token, token_bytes = self._token(token_id, text, as_ids)
        top_list = []
        if top > 0:
            top_list.append({"token": token, "logprob": logprob, "bytes": token_bytes})
            rank = 1
            for alt_id, alt_text in self._alternatives:
                if rank >= top:
                    break
                if alt_id == token_id:
                    continue
                alt_token, alt_bytes = self._token(alt_id, alt_text, as_ids)
                top_list.append({"token": alt_token, "logprob": round(logprob - rank, 6), "bytes": alt_bytes})
                rank += 1
        value = {"token": token, "logprob": logprob, "bytes": token_bytes, "top_logprobs": top_list}
        if len(self._cache) >= self._max_entries:
            self._cache.clear()
        self._cache[key] = value
        return value


def _classify(gen: Generation, index: int) -> tuple[str, int, str] | None:
    """What a generated token shows in a stream: (kind, tool index, text), or None if nothing."""
    start = gen.starts[index]
    end = start + len(gen.pieces[index])
    text = gen.text
    layout = gen.layout
    if layout.reasoning:
        rs, re_ = layout.reasoning
        if start < re_ and end > rs:
            return ("reasoning", -1, text[max(start, rs) : min(end, re_)])
    cs, ce = layout.content
    if cs < ce and start < ce and end > cs:
        return ("content", -1, text[max(start, cs) : min(end, ce)])
    for tool_index, (ts, args_start, args_end, _te) in enumerate(layout.tool_calls):
        if start == ts:
            return ("header", tool_index, "")
        if start < args_end and end > args_start:
            return ("arguments", tool_index, text[max(start, args_start) : min(end, args_end)])
    return None


def stream_groups(gen: Generation, per_chunk: int) -> tuple[list[tuple[str, int, str, list[int]]], list[int]]:
    """Group generated tokens into stream chunks: ([(kind, tool index, text, token indexes)], trailing).

    Tokens that show nothing (`<tool_call>` scaffolding, `</think>`, `<|im_end|>`) ride with the
    next visible chunk, or with the final chunk when nothing visible follows, so the chunks'
    token ids always concatenate to exactly the non-stream `token_ids`.
    """
    groups: list[tuple[str, int, str, list[int]]] = []
    pending: list[int] = []
    current: list[Any] | None = None  # [kind, tool index, [texts], [token indexes], visible count]
    for index in range(len(gen.ids)):
        shown = _classify(gen, index)
        if shown is None:
            pending.append(index)
            continue
        kind, tool_index, text = shown
        if (
            current is not None
            and current[0] == kind
            and current[1] == tool_index
            and kind != "header"
            and current[4] < per_chunk
        ):
            current[2].append(text)
            current[3].extend(pending)
            current[3].append(index)
            current[4] += 1
        else:
            if current is not None:
                groups.append((current[0], current[1], "".join(current[2]), current[3]))
            current = [kind, tool_index, [text], pending + [index], 1]
        pending = []
    if current is not None:
        groups.append((current[0], current[1], "".join(current[2]), current[3]))
    return groups, pending


@dataclass(slots=True)
class ChatJob:
    """One accepted chat request: everything needed to answer it, stream or not."""

    response_id: str
    created: int
    model: str
    prompt_ids: list[int]
    gen: Generation
    options: Options
    stream: bool
    directives: Directives
    error: OpenAIError | None = None

    def usage(self) -> dict[str, int]:
        prompt, completion = len(self.prompt_ids), len(self.gen.ids)
        return {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion}

    def _logprobs(self, indexes: range | list[int], entries: _LogprobEntries) -> dict[str, Any] | None:
        if not self.options.logprobs:
            return None
        gen, top, as_ids = self.gen, self.options.top_logprobs, self.options.tokens_as_ids
        return {"content": [entries.entry(gen.ids[i], gen.pieces[i], top, as_ids) for i in indexes]}

    def _tool_calls(self) -> list[dict[str, Any]]:
        return [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for c in self.gen.kept_calls
        ]

    def body(self, entries: _LogprobEntries) -> bytes:
        gen = self.gen
        choice: dict[str, Any] = {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": gen.content,
                "reasoning_content": gen.reasoning,
                "tool_calls": self._tool_calls(),
            },
            "logprobs": self._logprobs(range(len(gen.ids)), entries),
            "finish_reason": gen.finish_reason,
            "stop_reason": None,
        }
        if self.options.return_token_ids:
            choice["token_ids"] = gen.ids
        body: dict[str, Any] = {
            "id": self.response_id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": self.usage(),
            "prompt_logprobs": None,
        }
        if self.options.return_token_ids:
            body["prompt_token_ids"] = self.prompt_ids
        body["kv_transfer_params"] = None
        return orjson.dumps(body)

    def events(self, entries: _LogprobEntries, cache: _ChoiceCache | None = None) -> list[bytes]:
        """Every SSE event of the stream, `[DONE]` last."""
        gen, options = self.gen, self.options
        head = (
            b'data: {"id":'
            + orjson.dumps(self.response_id)
            + b',"object":"chat.completion.chunk","created":'
            + str(self.created).encode()
            + b',"model":'
            + orjson.dumps(self.model)
            + b',"choices":['
        )
        first = head + _FIRST_CHOICE + b"]"
        if options.return_token_ids:
            first += b',"prompt_token_ids":' + orjson.dumps(self.prompt_ids)
        events = [first + b"}\n\n"]
        # The chunk bodies depend only on the reply and the options, and benchmarks repeat replies.
        key = (
            gen.text,
            tuple(gen.ids),
            gen.finish_reason,
            tuple(c["id"] for c in gen.calls),
            options.return_token_ids,
            options.logprobs,
            options.top_logprobs,
            options.tokens_as_ids,
            self.directives.chunk,
        )
        choices = cache.get(key) if cache is not None else None
        if choices is None:
            choices = self._choices(entries)
            if cache is not None:
                cache.put(key, choices)
        events += [head + choice + b"]}\n\n" for choice in choices]
        if options.include_usage:
            events.append(head + b'],"usage":' + orjson.dumps(self.usage()) + b"}\n\n")
        events.append(b"data: [DONE]\n\n")
        return events

    def _choices(self, entries: _LogprobEntries) -> list[bytes]:
        """The serialized `choices[0]` of every chunk after the first, the finish chunk last."""
        gen, options = self.gen, self.options
        out = []
        groups, trailing = stream_groups(gen, self.directives.chunk)
        for kind, tool_index, text, indexes in groups:
            if kind == "content":
                delta: dict[str, Any] = {"content": text}
            elif kind == "reasoning":
                delta = {"reasoning_content": text}
            elif kind == "header":
                call = gen.calls[tool_index]
                delta = {
                    "tool_calls": [
                        {
                            "index": tool_index,
                            "id": call["id"],
                            "type": "function",
                            "function": {"name": call["name"], "arguments": ""},
                        }
                    ]
                }
            else:
                delta = {"tool_calls": [{"index": tool_index, "function": {"arguments": text}}]}
            choice = {"index": 0, "delta": delta, "logprobs": self._logprobs(indexes, entries), "finish_reason": None}
            if options.return_token_ids:
                choice["token_ids"] = [gen.ids[i] for i in indexes]
            out.append(orjson.dumps(choice))
        final = {
            "index": 0,
            "delta": {},
            "logprobs": self._logprobs(trailing, entries),
            "finish_reason": gen.finish_reason,
            "stop_reason": None,
        }
        if options.return_token_ids:
            final["token_ids"] = [gen.ids[i] for i in trailing]
        out.append(orjson.dumps(final))
        return out


_FIRST_CHOICE = orjson.dumps(
    {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
)


class _ChoiceCache:
    """A small LRU of serialized stream chunk bodies, keyed by reply and options."""

    def __init__(self, entries: int = 1024) -> None:
        self._data: OrderedDict[Any, list[bytes]] = OrderedDict()
        self._entries = entries

    def get(self, key: Any) -> list[bytes] | None:
        value = self._data.get(key)
        if value is not None:
            self._data.move_to_end(key)
        return value

    def put(self, key: Any, value: list[bytes]) -> None:
        self._data[key] = value
        if len(self._data) > self._entries:
            self._data.popitem(last=False)


# ---------------------------------------------------------------------------------------------
# HTTP
# ---------------------------------------------------------------------------------------------

_JSON_HEADERS = [(b"content-type", b"application/json")]
_SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]
_BAD_JSON = b'{"id": "chatcmpl-mock", "choices": [ this is not JSON'


class StreamCut(Exception):
    """Raised to make the server drop a stream's connection mid-way (the `streamcut` directive)."""


class _HideStreamCut(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], StreamCut))


@dataclass(slots=True)
class Stats:
    requests: int = 0
    completed: int = 0
    cancelled: int = 0
    cut: int = 0
    errors: int = 0
    in_flight: int = 0
    tokenize: int = 0

    def as_dict(self) -> dict[str, int]:
        return {
            "requests": self.requests,
            "completed": self.completed,
            "cancelled": self.cancelled,
            "in_flight": self.in_flight,
            "cut": self.cut,
            "errors": self.errors,
            "tokenize": self.tokenize,
        }


def _bool(value: Any) -> bool:
    return value is True


def _int_field(body: dict[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise OpenAIError(400, f"{name} must be a non-negative integer", param=name)
    return value


class MockState:
    """Everything the mock keeps between requests: tokenizer caches, counters, the request log."""

    def __init__(self, model_name: str, max_model_len: int) -> None:
        self.model_name = model_name
        self.max_model_len = max_model_len
        self.tokenizer = Tokenizer()
        self.entries = _LogprobEntries()
        self.choice_cache = _ChoiceCache()
        self.stats = Stats()
        self.log: deque[dict[str, Any]] = deque(maxlen=200)
        self.error_hits: dict[str, int] = {}
        self._seq = 0
        self._responses = 0
        self._id_prefix = os.urandom(4).hex()
        self._generation_prompt = tuple(self.tokenizer.encode(GENERATION_PROMPT))

    def reset(self) -> None:
        in_flight = self.stats.in_flight
        self.stats = Stats(in_flight=in_flight)
        self.log.clear()
        self.error_hits.clear()

    def record(self, scope: Scope, body: Any) -> None:
        self._seq += 1
        headers: dict[str, str] = {}
        for name, value in scope.get("headers", ()):
            key = name.decode("latin-1")
            text = value.decode("latin-1")
            headers[key] = headers[key] + ", " + text if key in headers else text
        self.log.append(
            {
                "seq": self._seq,
                "time": time.time(),
                "method": scope.get("method"),
                "path": scope.get("path"),
                "query": scope.get("query_string", b"").decode("latin-1"),
                "headers": headers,
                "body": body,
            }
        )

    def prompt_ids(
        self, messages: list[dict[str, Any]], tools: list[Any] | None, add_generation_prompt: bool = True
    ) -> list[int]:
        ids: list[int] = []
        encode_block = self.tokenizer.encode_block
        for block in render_blocks(messages, tools):
            ids += encode_block(block)
        if add_generation_prompt:
            ids += self._generation_prompt
        return ids

    def new_response_id(self) -> str:
        self._responses += 1
        return f"chatcmpl-{self._id_prefix}{self._responses:010x}"

    def error_fires(self, d: Directives, seed: str) -> bool:
        """`error ... times=K` fails only the first K requests carrying it; otherwise every one."""
        assert d.error is not None
        times = d.error[2]
        if times is None:
            return True
        key = seed + "\x00" + d.error_key
        hits = self.error_hits.get(key, 0)
        self.error_hits[key] = hits + 1
        return hits < times

    def plan(self, body: Any) -> ChatJob:
        if not isinstance(body, dict):
            raise OpenAIError(400, "request body must be a JSON object", code="invalid_body")
        messages = body.get("messages")
        if not isinstance(messages, list) or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages
        ):
            raise OpenAIError(400, "messages must be a list of objects with a string role", param="messages")
        tools = body.get("tools")
        if tools is not None and not isinstance(tools, list):
            raise OpenAIError(400, "tools must be a list", param="tools")
        n = body.get("n")
        if n not in (None, 1):
            raise OpenAIError(400, "the mock upstream only supports n=1", param="n")
        max_tokens = _int_field(body, "max_completion_tokens")
        if max_tokens is None:
            max_tokens = _int_field(body, "max_tokens")
        top_logprobs = _int_field(body, "top_logprobs") or 0
        if top_logprobs > 20:
            raise OpenAIError(400, "top_logprobs must be at most 20", param="top_logprobs")
        stream_options = body.get("stream_options")
        options = Options(
            return_token_ids=_bool(body.get("return_token_ids")),
            logprobs=_bool(body.get("logprobs")),
            top_logprobs=top_logprobs,
            tokens_as_ids=_bool(body.get("return_tokens_as_token_ids")),
            include_usage=isinstance(stream_options, dict) and _bool(stream_options.get("include_usage")),
        )
        user_text, _ = last_user_text(messages)
        directives = parse_directives(user_text) if DIRECTIVE_OPEN in user_text else Directives(stripped_text=user_text)
        seed = f"{len(messages)}\x00{user_text}"
        error = None
        if directives.error is not None and self.error_fires(directives, seed):
            status, retry_after, _ = directives.error
            headers = {}
            if retry_after is not None or status == 429:
                headers["retry-after"] = _format_seconds(1.0 if retry_after is None else retry_after)
            error = OpenAIError(status, f"mock upstream error {status} (scripted)", code="mock_error", headers=headers)
        prompt_ids = self.prompt_ids(messages, tools)
        if len(prompt_ids) >= self.max_model_len:
            raise OpenAIError(
                400,
                f"This model's maximum context length is {self.max_model_len} tokens. However, your request has "
                f"{len(prompt_ids)} input tokens. Please reduce the length of the input messages.",
                param="messages",
                code="context_length_exceeded",
            )
        # Unlike vLLM, a max_tokens that overshoots the context is clamped, not rejected: opencode
        # asks for 32000 output tokens when its config has no limit, and the demo should still run.
        room = self.max_model_len - len(prompt_ids)
        max_tokens = room if max_tokens is None else min(max_tokens, room)
        gen = plan_reply(
            self.tokenizer,
            messages,
            tools,
            directives,
            allow_tools=body.get("tool_choice") != "none",
            max_tokens=max_tokens,
            seed=seed,
        )
        model = body.get("model")
        return ChatJob(
            response_id=self.new_response_id(),
            created=int(time.time()),
            model=model if isinstance(model, str) and model else self.model_name,
            prompt_ids=prompt_ids,
            gen=gen,
            options=options,
            stream=_bool(body.get("stream")),
            directives=directives,
            error=error,
        )


def _format_seconds(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


async def _read_body(receive: Receive) -> bytes | None:
    """The request body, or None if the client went away first."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _wait_for_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _send_whole(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": headers + [(b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def _send_error(send: Send, error: OpenAIError) -> None:
    extra = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in error.headers.items()]
    await _send_whole(send, error.status, error.to_json(), _JSON_HEADERS + extra)


class ChatCompletionsEndpoint:
    """`POST /v1/chat/completions` as a raw ASGI app, so it can watch for disconnects itself."""

    def __init__(self, state: MockState) -> None:
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        state = self.state
        stats = state.stats
        stats.requests += 1
        stats.in_flight += 1
        outcome = "cancelled"
        try:
            raw = await _read_body(receive)
            if raw is None:
                return
            try:
                body = orjson.loads(raw)
            except orjson.JSONDecodeError:
                state.record(scope, raw.decode("utf-8", "replace"))
                outcome = "completed"
                stats.errors += 1
                await _send_error(send, OpenAIError(400, "request body must be valid JSON", code="invalid_body"))
                return
            state.record(scope, body)
            try:
                job = state.plan(body)
            except OpenAIError as error:
                outcome = "completed"
                stats.errors += 1
                await _send_error(send, error)
                return
            outcome = await self._answer(job, receive, send)
        except StreamCut:
            outcome = "cut"
            raise
        finally:
            stats = state.stats  # may have been replaced by /mock/reset meanwhile
            stats.in_flight -= 1
            if outcome == "completed":
                stats.completed += 1
            elif outcome == "cut":
                stats.cut += 1
            else:
                stats.cancelled += 1

    async def _answer(self, job: ChatJob, receive: Receive, send: Send) -> str:
        d = job.directives
        watcher: asyncio.Task[None] | None = None
        needs_watch = d.hang > 0 or d.sleep_ms > 0 or (job.stream and (d.slow_ms > 0 or d.streamcut is not None))
        if needs_watch:
            watcher = asyncio.ensure_future(_wait_for_disconnect(receive))
        try:
            if d.hang > 0 and await _client_gone(watcher, d.hang):
                return "cancelled"
            if job.error is not None:
                self.state.stats.errors += 1
                if d.sleep_ms > 0 and await _client_gone(watcher, d.sleep_ms / 1000):
                    return "cancelled"
                await _send_error(send, job.error)
                return "completed"
            if d.badjson:
                if d.sleep_ms > 0 and await _client_gone(watcher, d.sleep_ms / 1000):
                    return "cancelled"
                if job.stream:
                    await _send_whole(send, 200, b"data: " + _BAD_JSON + b"\n\ndata: [DONE]\n\n", _SSE_HEADERS)
                else:
                    await _send_whole(send, 200, _BAD_JSON, _JSON_HEADERS)
                return "completed"
            if not job.stream:
                if d.sleep_ms > 0 and await _client_gone(watcher, d.sleep_ms / 1000):
                    return "cancelled"
                await _send_whole(send, 200, job.body(self.state.entries), _JSON_HEADERS)
                return "completed"
            return await self._stream(job, watcher, send)
        finally:
            if watcher is not None:
                watcher.cancel()

    async def _stream(self, job: ChatJob, watcher: asyncio.Task[None] | None, send: Send) -> str:
        d = job.directives
        events = job.events(self.state.entries, self.state.choice_cache)
        await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
        if d.sleep_ms > 0 and await _client_gone(watcher, d.sleep_ms / 1000):
            return "cancelled"
        if d.streamcut is not None:
            # Never the [DONE]: the point is a stream that ends without its terminator.
            events = events[: min(d.streamcut, len(events) - 1)]
        if d.slow_ms <= 0:
            # No pacing asked for: the first chunk alone (a real first byte), then the rest in one write.
            await send({"type": "http.response.body", "body": events[0], "more_body": True})
            if len(events) > 1:
                await send({"type": "http.response.body", "body": b"".join(events[1:]), "more_body": True})
        else:
            for index, event in enumerate(events):
                if index and await _client_gone(watcher, d.slow_ms / 1000):
                    return "cancelled"
                await send({"type": "http.response.body", "body": event, "more_body": True})
        if watcher is not None and watcher.done():
            return "cancelled"
        if d.streamcut is not None:
            raise StreamCut(f"stream cut after {len(events)} chunks (scripted)")
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return "completed"


async def _client_gone(watcher: asyncio.Task[None] | None, seconds: float) -> bool:
    """Wait `seconds`; True as soon as the client disconnects."""
    if watcher is None:
        await asyncio.sleep(seconds)
        return False
    done, _ = await asyncio.wait({watcher}, timeout=seconds)
    return bool(done)


def create_app(*, model_name: str = "mock-model", max_model_len: int = 32768) -> Starlette:
    """The mock upstream as a Starlette app (see docs/mock-upstream.md for the directives)."""
    state = MockState(model_name, max_model_len)
    models_body = orjson.dumps(
        {
            "object": "list",
            "data": [
                {
                    "id": model_name,
                    "object": "model",
                    "created": int(time.time()),
                    "owned_by": "vllm",
                    "root": model_name,
                    "parent": None,
                    "max_model_len": max_model_len,
                    "permission": [],
                }
            ],
        }
    )

    async def models(request: Request) -> Response:
        return Response(models_body, media_type="application/json")

    async def health(request: Request) -> Response:
        return Response(b"", status_code=200)

    async def tokenize(request: Request) -> Response:
        state.stats.tokenize += 1
        raw = await request.body()
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            body = None
        state.record(request.scope, body if body is not None else raw.decode("utf-8", "replace"))
        try:
            if not isinstance(body, dict):
                raise OpenAIError(400, "request body must be a JSON object", code="invalid_body")
            if isinstance(body.get("messages"), list):
                messages = body["messages"]
                if not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
                    raise OpenAIError(400, "messages must be a list of objects with a string role", param="messages")
                tools = body.get("tools") if isinstance(body.get("tools"), list) else None
                add_prompt = body.get("add_generation_prompt", True) is not False
                tokens = state.prompt_ids(messages, tools, add_prompt)
                text = render_prompt(messages, tools, add_prompt) if body.get("return_token_strs") else ""
            elif isinstance(body.get("prompt"), str):
                text = body["prompt"]
                tokens = state.tokenizer.encode(text)
            else:
                raise OpenAIError(400, "give either messages or prompt", param="messages")
        except OpenAIError as error:
            return Response(error.to_json(), status_code=error.status, media_type="application/json")
        answer: dict[str, Any] = {
            "count": len(tokens),
            "max_model_len": max_model_len,
            "tokens": tokens,
            "token_strs": split_pieces(text) if body.get("return_token_strs") else None,
        }
        return Response(orjson.dumps(answer), media_type="application/json")

    async def mock_requests(request: Request) -> Response:
        entries = list(state.log)
        last = request.query_params.get("last")
        if last and last.isdigit():
            entries = entries[-int(last) :] if int(last) else []
        return Response(orjson.dumps({"requests": entries}), media_type="application/json")

    async def mock_stats(request: Request) -> Response:
        return Response(orjson.dumps(state.stats.as_dict()), media_type="application/json")

    async def mock_reset(request: Request) -> Response:
        state.reset()
        return Response(orjson.dumps({"ok": True}), media_type="application/json")

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # Installed here, after the server has configured logging, so a scripted stream cut
        # does not print a traceback for every request.
        hide = _HideStreamCut()
        logger = logging.getLogger("uvicorn.error")
        logger.addFilter(hide)
        try:
            yield
        finally:
            logger.removeFilter(hide)

    app = Starlette(
        routes=[
            Route("/v1/chat/completions", ChatCompletionsEndpoint(state), methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/tokenize", tokenize, methods=["POST"]),
            Route("/health", health, methods=["GET"]),
            Route("/mock/requests", mock_requests, methods=["GET"]),
            Route("/mock/stats", mock_stats, methods=["GET"]),
            Route("/mock/reset", mock_reset, methods=["POST"]),
        ],
        lifespan=lifespan,
    )
    app.state.mock = state
    return app


def run(host: str = "127.0.0.1", port: int = 8000, **kw: Any) -> None:
    """Serve the mock upstream with uvicorn until interrupted (`model_name`/`max_model_len` go to the app)."""
    import uvicorn

    app_kw = {name: kw.pop(name) for name in ("model_name", "max_model_len") if name in kw}
    settings: dict[str, Any] = {"log_level": "warning", "access_log": False}
    try:
        import uvloop  # noqa: F401

        settings["loop"] = "uvloop"
    except ImportError:
        pass
    try:
        import httptools  # noqa: F401

        settings["http"] = "httptools"
    except ImportError:
        pass
    settings.update(kw)
    uvicorn.run(create_app(**app_kw), host=host, port=port, **settings)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m server.dev.mock_upstream", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--model-name", default="mock-model")
    parser.add_argument("--max-model-len", type=int, default=32768)
    args = parser.parse_args(argv)
    run(args.host, args.port, model_name=args.model_name, max_model_len=args.max_model_len)


if __name__ == "__main__":
    main()
