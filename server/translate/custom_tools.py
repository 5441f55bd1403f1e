"""Freeform (`custom`) tools as chat functions with one string argument, and that argument decoded back; pure.

A Responses `custom` tool takes free text (optionally constrained by a Lark or regex grammar), which
Chat Completions cannot express. It goes upstream as a function whose only parameter is the string
`input`, the grammar carried in the description; the model's JSON arguments are decoded back into
the raw text for the client's `custom_tool_call`, both whole (`decode_input`) and while they stream
(`InputDecoder`). Decoding is lenient: arguments that are not the expected JSON still give the
client text (the model's own), never an error.
"""

from __future__ import annotations

import json
from typing import Any

from server.translate.checks import invalid, wrong_type

INPUT_ARGUMENT = "input"

_WHITESPACE = " \t\r\n"
_SIMPLE_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
# What must come before the string value, in order: `{`, `"input"`, `:`, `"` (whitespace between).
_PREFIX_TOKENS = ("{", f'"{INPUT_ARGUMENT}"', ":", '"')


def _grammar_note(fmt: Any, param: str) -> str | None:
    """The sentence telling the model what text the tool accepts; None for unconstrained text."""
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise wrong_type(f"{param}.format", "an object")
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind != "grammar":
        raise invalid(f"`{param}.format.type` must be text or grammar (got {kind!r})", f"{param}.format.type")
    syntax, definition = fmt.get("syntax"), fmt.get("definition")
    if syntax not in ("lark", "regex"):
        raise invalid(f"`{param}.format.syntax` must be lark or regex (got {syntax!r})", f"{param}.format.syntax")
    if not isinstance(definition, str):
        raise wrong_type(f"{param}.format.definition", "a string")
    what = "Lark grammar" if syntax == "lark" else "regular expression"
    return f"The `{INPUT_ARGUMENT}` string must match this {what}:\n{definition}"


def custom_function_tool(tool: dict[str, Any], param: str, name: str) -> dict[str, Any]:
    """The chat function standing for the custom tool `tool`, named `name` upstream."""
    description = tool.get("description")
    if description is not None and not isinstance(description, str):
        raise wrong_type(f"{param}.description", "a string")
    note = _grammar_note(tool.get("format"), param)
    text = "\n\n".join(part for part in (description, note) if part)
    function: dict[str, Any] = {
        "name": name,
        "parameters": {
            "type": "object",
            "properties": {
                INPUT_ARGUMENT: {"type": "string", "description": "The tool's input, as raw text (not JSON)."}
            },
            "required": [INPUT_ARGUMENT],
            "additionalProperties": False,
        },
    }
    if text:
        function["description"] = text
    return {"type": "function", "function": function}


def encode_input(text: str) -> str:
    """A custom tool call's input as the function arguments the model would have written."""
    return json.dumps({INPUT_ARGUMENT: text}, ensure_ascii=False)


def _printable(text: str) -> str:
    # A lone surrogate (an escape the model left unpaired) cannot be written as JSON or UTF-8.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")
    return text


class InputDecoder:
    """Decodes `{"input": "..."}` arguments as they arrive in fragments, yielding the text so far.

    `feed` returns the text the new fragment completed; an escape split across fragments waits for
    its end. Arguments that do not start as expected make it stop (`gave_up`): the caller then
    relies on `decode_input` over the whole arguments at the end.
    """

    __slots__ = ("_pending", "_prefix_step", "state", "text", "rest")

    def __init__(self) -> None:
        self._pending = ""  # undecoded input: a partial prefix token or a partial escape
        self._prefix_step = 0
        self.state = "prefix"  # prefix | string | end | gave_up
        self.text = ""  # everything decoded so far
        self.rest = ""  # what followed the closing quote

    def feed(self, fragment: str) -> str:
        if self.state == "end":
            self.rest += fragment
            return ""
        if self.state == "gave_up":
            return ""
        buffer = self._pending + fragment
        self._pending = ""
        position = self._match_prefix(buffer) if self.state == "prefix" else 0
        if self.state != "string":
            return ""
        decoded = self._decode_string(buffer, position)
        self.text += decoded
        return decoded

    def _match_prefix(self, buffer: str) -> int:
        i = 0
        while self._prefix_step < len(_PREFIX_TOKENS):
            while i < len(buffer) and buffer[i] in _WHITESPACE:
                i += 1
            token = _PREFIX_TOKENS[self._prefix_step]
            available = buffer[i : i + len(token)]
            if not token.startswith(available):
                self.state = "gave_up"
                return i
            if len(available) < len(token):
                self._pending = available  # wait for the rest of the token
                return len(buffer)
            i += len(token)
            self._prefix_step += 1
        self.state = "string"
        return i

    def _decode_string(self, buffer: str, i: int) -> str:
        out: list[str] = []
        while i < len(buffer):
            char = buffer[i]
            if char == '"':
                self.state = "end"
                self.rest = buffer[i + 1 :]
                break
            if char != "\\":
                out.append(char)  # raw control characters are let through, as json's strict=False does
                i += 1
                continue
            escape = self._escape(buffer, i)
            if escape is None:
                self._pending = buffer[i:]  # an escape cut by the fragment boundary
                break
            decoded, i = escape
            out.append(decoded)
        return _printable("".join(out))

    def _escape(self, buffer: str, i: int) -> tuple[str, int] | None:
        """(decoded text, index after it) for the escape at `i`, or None if it is not complete yet."""
        if i + 1 >= len(buffer):
            return None
        kind = buffer[i + 1]
        if kind != "u":
            # An unknown escape is kept as written: lenient, like the rest of the decoding.
            return _SIMPLE_ESCAPES.get(kind, buffer[i : i + 2]), i + 2
        code = _hex4(buffer, i + 2)
        if code is None:
            return None if len(buffer) < i + 6 else (buffer[i : i + 2], i + 2)
        if 0xD800 <= code <= 0xDBFF:
            # A high surrogate pairs with a following `\uDC00`..`\uDFFF` escape into one character.
            follow = buffer[i + 6 : i + 12]
            if len(follow) < 6 and "\\u".startswith(follow[:2]):
                return None  # the low half may be in the next fragment
            low = _hex4(follow, 2) if follow.startswith("\\u") else None
            if low is not None and 0xDC00 <= low <= 0xDFFF:
                return chr(0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)), i + 12
        return chr(code), i + 6


def _hex4(buffer: str, start: int) -> int | None:
    digits = buffer[start : start + 4]
    if len(digits) < 4:
        return None
    try:
        return int(digits, 16)
    except ValueError:
        return None


def decode_input(arguments: str) -> str:
    """The raw text a custom tool call carries, from the arguments the model generated.

    `{"input": "..."}` is the expected form. Otherwise, leniently: an object's `input` string or
    its only string value, a bare JSON string, the text of an `input` string cut short (a length
    stop), and failing all of these the arguments exactly as the model wrote them.
    """
    decoder = InputDecoder()
    decoder.feed(arguments)
    if decoder.state == "end" and decoder.rest.strip(_WHITESPACE) == "}":
        return decoder.text
    try:
        value = json.loads(arguments, strict=False)
    except ValueError:
        value = None
    if isinstance(value, dict):
        if isinstance(value.get(INPUT_ARGUMENT), str):
            return _printable(value[INPUT_ARGUMENT])
        if len(value) == 1:
            (only,) = value.values()
            if isinstance(only, str):
                return _printable(only)
    elif isinstance(value, str):
        return _printable(value)
    if decoder.state in ("string", "end"):
        return decoder.text
    return arguments
