"""The `[[mock:...]]` scripting language: parse a user message's directives into a plan of steps."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

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
