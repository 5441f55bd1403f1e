"""Switchyard deployments: `${VAR}` / `${VAR:-default}` in TOML strings, rendered privately for Switchyard."""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from server.config import PROFILES_DIR, ConfigError

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


@dataclass(frozen=True)
class RenderedDeployment:
    source: Path
    text: str
    variables: dict[str, str]  # the values used, for provenance (redact before showing)


def shipped_profiles() -> list[Path]:
    return sorted(PROFILES_DIR.glob("*.toml")) + sorted(PROFILES_DIR.glob("*.yaml"))


def _escape_basic(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _escape_literal(value: str, path: Path, line: int) -> str:
    if "'" in value or "\n" in value:
        raise ConfigError(f"{path}:{line}: a value with a quote or newline cannot go in a '...' string")
    return value


def interpolate(text: str, path: Path, environ: dict[str, str] | None = None) -> tuple[str, dict[str, str]]:
    """Replace variables inside TOML string values only; a number or bool stays a literal.

    Walks the text with a small state machine (comment / basic / literal / multi-line strings) so
    that `${...}` in a comment or outside a string is left exactly as written.
    """
    environ = os.environ if environ is None else environ
    used: dict[str, str] = {}
    out: list[str] = []
    i, n, line = 0, len(text), 1

    def substitute(segment: str, escape) -> str:
        def one(match: re.Match) -> str:
            name, default = match.group(1), match.group(2)
            value = environ.get(name)
            if value is None or (value == "" and default is not None):
                if default is None:
                    raise ConfigError(
                        f"{path}:{line + segment[: match.start()].count(chr(10))}: variable {name} is not set "
                        f"(set it, or write ${{{name}:-default}})"
                    )
                value = default
            used[name] = value
            return escape(value)

        return _VAR.sub(one, segment)

    while i < n:
        ch = text[i]
        if ch == "#":
            end = text.find("\n", i)
            end = n if end == -1 else end
            out.append(text[i:end])
            i = end
            continue
        for quote, escape_fn in (('"""', _escape_basic), ("'''", None), ('"', _escape_basic), ("'", None)):
            if text.startswith(quote, i):
                start = i + len(quote)
                j = start
                while True:
                    j = text.find(quote, j)
                    if j == -1:
                        raise ConfigError(f"{path}:{line}: unterminated string")
                    # A backslash-escaped quote does not end a basic string.
                    if escape_fn is not None and _escaped(text, j):
                        j += 1
                        continue
                    break
                body = text[start:j]
                esc = escape_fn or (lambda v, p=path, ln=line: _escape_literal(v, p, ln))
                out.append(quote + substitute(body, esc) + quote)
                line += body.count("\n")
                i = j + len(quote)
                break
        else:
            if ch == "\n":
                line += 1
            out.append(ch)
            i += 1
    return "".join(out), used


def _escaped(text: str, index: int) -> bool:
    backslashes = 0
    k = index - 1
    while k >= 0 and text[k] == "\\":
        backslashes += 1
        k -= 1
    return backslashes % 2 == 1


def render(path: Path, environ: dict[str, str] | None = None) -> RenderedDeployment:
    try:
        raw = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read deployment {path}: {exc.strerror or exc}") from exc
    text, used = interpolate(raw, path, environ)
    return RenderedDeployment(path, text, used)


def write_private(rendered: RenderedDeployment) -> Path:
    """Write the resolved deployment where only this user can read it (it may hold secrets)."""
    directory = Path(tempfile.mkdtemp(prefix="switchyard-model-"))  # mkdtemp is 0700
    target = directory / rendered.source.name
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(rendered.text)
    return target


def remove_private(path: Path) -> None:
    try:
        path.unlink()
        path.parent.rmdir()
    except OSError:
        pass
