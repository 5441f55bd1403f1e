"""`${VAR}` / `${VAR:-default}` in deployment TOML: found and replaced inside TOML strings only.

A small TOML string scanner does it, so a `${...}` in a comment, a key or a number is never touched,
and each value is escaped for the kind of string it lands in (basic, literal, multi-line).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from server.config import ConfigError

VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
# Gym's OmegaConf resolver, as a Gym-shaped YAML settings file writes it.
OC_ENV = re.compile(r"\$\{oc\.env:([A-Za-z_][A-Za-z0-9_]*)(?:,([^}]*))?\}")


@dataclass(frozen=True)
class Variable:
    """One `${NAME}` / `${NAME:-default}` (or Gym's `${oc.env:NAME,default}`) reference in a file."""

    name: str
    default: str | None
    line: int

    @property
    def required(self) -> bool:
        return self.default is None


# ---- TOML string scanning ---------------------------------------------------------------------

_CONTROL = {"\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def escape_basic(value: str) -> str:
    """Make a value safe inside a TOML "..." (or \"\"\"...\"\"\") string."""
    out = []
    for ch in value:
        if ch == "\\" or ch == '"':
            out.append("\\" + ch)
        elif ch in _CONTROL:
            out.append(_CONTROL[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04X}")
        else:
            out.append(ch)
    return "".join(out)


def _literal_escaper(quote: str, path: Path) -> Callable[[str, str, int], str]:
    # A '...' string has no escapes at all: a value that cannot be written there is an error.
    def escape(value: str, name: str, line: int) -> str:
        allowed = "\t\n" if quote == "'''" else "\t"
        bad = "'" in value or any((ord(c) < 0x20 and c not in allowed) or ord(c) == 0x7F for c in value)
        if bad:
            raise ConfigError(
                f"{path}:{line}: the value of {name} has a quote or control character, which a {quote}...{quote} "
                f'string cannot hold; use a "..." string there'
            )
        return value

    return escape


def _escaped(text: str, index: int) -> bool:
    backslashes = 0
    k = index - 1
    while k >= 0 and text[k] == "\\":
        backslashes += 1
        k -= 1
    return backslashes % 2 == 1


def _map_strings(text: str, path: Path, on_string: Callable[[str, str, int], str]) -> str:
    """Rebuild `text`, passing the body of every TOML string to `on_string(body, quote, line)`.

    Comments and everything outside strings (numbers, booleans, keys, table headers) are copied
    exactly, so `${...}` there is never touched.
    """
    out: list[str] = []
    i, n, line = 0, len(text), 1
    while i < n:
        ch = text[i]
        if ch == "#":
            end = text.find("\n", i)
            end = n if end == -1 else end
            out.append(text[i:end])
            i = end
            continue
        quote = next((q for q in ('"""', "'''", '"', "'") if text.startswith(q, i)), None)
        if quote is None:
            if ch == "\n":
                line += 1
            out.append(ch)
            i += 1
            continue
        basic = quote[0] == '"'
        start = i + len(quote)
        j = start
        while True:
            j = text.find(quote, j)
            if j == -1 or (len(quote) == 1 and "\n" in text[start:j]):
                raise ConfigError(f"{path}:{line}: unterminated string")
            if basic and _escaped(text, j):
                j += 1
                continue
            break
        if len(quote) == 3:
            # Up to two quote characters may sit just before the closing delimiter and belong to the body.
            extra = 0
            while extra < 2 and text.startswith(quote, j + 1):
                j += 1
                extra += 1
        body = text[start:j]
        out.append(quote + on_string(body, quote, line) + quote)
        line += body.count("\n")
        i = j + len(quote)
    return "".join(out)


def substitute(
    text: str,
    path: Path,
    environ: Mapping[str, str],
    used: dict[str, str],
    shown: Callable[[str, str], str] | None = None,
) -> str:
    """Resolve every variable inside TOML strings, recording the values used in `used`.

    `shown(name, value)`, if given, replaces a value in the output (render() uses it to write a copy
    with secrets hidden) without changing what is recorded.
    """

    def on_string(body: str, quote: str, line: int) -> str:
        escape = (lambda v, name, ln: escape_basic(v)) if quote[0] == '"' else _literal_escaper(quote, path)

        def one(match: re.Match[str]) -> str:
            name, default = match.group(1), match.group(2)
            at = line + body[: match.start()].count("\n")
            value = environ.get(name)
            # Shell semantics: `:-` also replaces a variable that is set but empty.
            if value is None or (value == "" and default is not None):
                if default is None:
                    raise ConfigError(
                        f"{path}:{at}: variable {name} is not set (set it, or write ${{{name}:-default}})"
                    )
                value = default
            used[name] = value
            if shown is not None:
                value = shown(name, value)
            return escape(value, name, at)

        return VAR.sub(one, body)

    return _map_strings(text, path, on_string)


def interpolate(text: str, path: Path, environ: Mapping[str, str] | None = None) -> tuple[str, dict[str, str]]:
    """Replace variables inside TOML string values only; a number or bool stays a literal.

    Returns the text and the values used. `${NAME}` must be set; `${NAME:-default}` falls back to
    the default when NAME is unset or empty. Values are escaped for the string they land in.
    """
    used: dict[str, str] = {}
    out = substitute(text, path, os.environ if environ is None else environ, used)
    return out, used


def references(text: str, path: Path) -> list[Variable]:
    """Every `${NAME}` / `${NAME:-default}` inside a TOML string, in file order."""
    found: list[Variable] = []

    def on_string(body: str, quote: str, line: int) -> str:
        for match in VAR.finditer(body):
            found.append(Variable(match.group(1), match.group(2), line + body[: match.start()].count("\n")))
        return body

    _map_strings(text, path, on_string)
    return found


def yaml_references(text: str) -> list[Variable]:
    """Every `${oc.env:NAME,default}` in a Gym-shaped YAML file, outside comments, in file order."""
    found: list[Variable] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = re.split(r"(?:^|\s)#", raw, maxsplit=1)[0]
        for match in OC_ENV.finditer(line):
            default = match.group(2)
            found.append(Variable(match.group(1), None if default is None else default.strip(), number))
    return found
