"""Switchyard deployments: `${VAR}` / `${VAR:-default}` in TOML strings, rendered privately for Switchyard."""

from __future__ import annotations

import logging
import os
import re
import tempfile
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx

from server.config import PROFILES_DIR, ConfigError

log = logging.getLogger("switchyard_model.profiles")

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
# Gym's OmegaConf resolver, as a Gym-shaped YAML settings file writes it.
_OC_ENV = re.compile(r"\$\{oc\.env:([A-Za-z_][A-Za-z0-9_]*)(?:,([^}]*))?\}")

# A variable whose name says it holds a credential never has its value shown, stored or logged.
_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL", re.IGNORECASE)
# Keys whose value is a credential when written literally into a file (`api_key_env` is a variable
# *name*, not a credential, so it is kept).
_SECRET_KEY = re.compile(r"(?:^|[_-])(?:api[_-]?key|token|secret|password|authorization)$", re.IGNORECASE)
REDACTED = "<redacted>"


def is_secret_name(name: str) -> bool:
    """Whether a variable's name marks its value as a credential."""
    return bool(_SECRET_NAME.search(name))


@dataclass(frozen=True)
class Variable:
    """One `${NAME}` / `${NAME:-default}` (or Gym's `${oc.env:NAME,default}`) reference in a file."""

    name: str
    default: str | None
    line: int

    @property
    def required(self) -> bool:
        return self.default is None


@dataclass(frozen=True)
class RenderedDeployment:
    source: Path
    text: str  # what Switchyard reads; may hold secrets, never show or store it
    variables: dict[str, str]  # the values used (secrets included); see `scrub` before showing anything
    redacted_text: str = ""  # `text` with secret variables' values replaced by <redacted>: safe to show or store

    def secret_values(self) -> list[str]:
        return [value for name, value in self.variables.items() if value and is_secret_name(name)]

    def scrub(self, message: str) -> str:
        """Remove secret values from a message about this deployment (Switchyard quotes TOML lines)."""
        return scrub(message, self.secret_values())


def scrub(text: str, secrets: Iterable[str]) -> str:
    """Replace each secret value, as written or as escaped in a TOML string, with <redacted>."""
    for value in sorted((s for s in secrets if s), key=len, reverse=True):
        text = text.replace(_escape_basic(value), REDACTED).replace(value, REDACTED)
    return text


def shipped_profiles() -> list[Path]:
    return sorted(PROFILES_DIR.glob("*.toml")) + sorted(PROFILES_DIR.glob("*.yaml"))


def resolve_profile(name_or_path: str) -> Path:
    """A file as given, or a bare shipped profile name (`vllm`, `gym`) resolved to its TOML or YAML."""
    path = Path(name_or_path).expanduser()
    if path.is_file():
        return path.resolve()
    if "/" not in name_or_path and not path.suffix:
        for suffix in (".toml", ".yaml"):
            shipped = PROFILES_DIR / f"{name_or_path}{suffix}"
            if shipped.is_file():
                return shipped
    names = ", ".join(p.stem for p in shipped_profiles())
    raise ConfigError(f"{name_or_path!r} is neither a file nor a shipped profile ({names})")


# ---- TOML string scanning -------------------------------------------------------------------

_CONTROL = {"\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def _escape_basic(value: str) -> str:
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


def _interpolate(text: str, path: Path, environ: Mapping[str, str], used: dict[str, str], redact: bool) -> str:
    def on_string(body: str, quote: str, line: int) -> str:
        escape = (lambda v, name, ln: _escape_basic(v)) if quote[0] == '"' else _literal_escaper(quote, path)

        def one(match: re.Match) -> str:
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
            if redact and value and is_secret_name(name):
                value = REDACTED
            return escape(value, name, at)

        return _VAR.sub(one, body)

    return _map_strings(text, path, on_string)


def interpolate(text: str, path: Path, environ: Mapping[str, str] | None = None) -> tuple[str, dict[str, str]]:
    """Replace variables inside TOML string values only; a number or bool stays a literal.

    Returns the text and the values used. `${NAME}` must be set; `${NAME:-default}` falls back to
    the default when NAME is unset or empty. Values are escaped for the string they land in.
    """
    used: dict[str, str] = {}
    out = _interpolate(text, path, os.environ if environ is None else environ, used, redact=False)
    return out, used


def references(text: str, path: Path) -> list[Variable]:
    """Every `${NAME}` / `${NAME:-default}` inside a TOML string, in file order."""
    found: list[Variable] = []

    def on_string(body: str, quote: str, line: int) -> str:
        for match in _VAR.finditer(body):
            found.append(Variable(match.group(1), match.group(2), line + body[: match.start()].count("\n")))
        return body

    _map_strings(text, path, on_string)
    return found


def yaml_references(text: str) -> list[Variable]:
    """Every `${oc.env:NAME,default}` in a Gym-shaped YAML file, outside comments, in file order."""
    found: list[Variable] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = re.split(r"(?:^|\s)#", raw, maxsplit=1)[0]
        for match in _OC_ENV.finditer(line):
            default = match.group(2)
            found.append(Variable(match.group(1), None if default is None else default.strip(), number))
    return found


def api_key_envs(text: str) -> list[str]:
    """The variable names Switchyard itself reads (`api_key_env`); it fails to load if one is unset."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return []
    names = []
    for client in (doc.get("llm_clients") or {}).values():
        name = client.get("api_key_env") if isinstance(client, dict) else None
        if isinstance(name, str) and name and "${" not in name and name not in names:
            names.append(name)
    return names


def redact_assignments(text: str, yaml: bool = False) -> str:
    """Hide values written literally under credential-like keys (`api_key = ...`, `x-api-token = ...`).

    A value that is only a variable reference (`"${KEY}"`, `${oc.env:KEY,...}`) names no secret
    and is kept, so `profiles show` still says where the credential comes from.
    """
    if yaml:
        pattern = re.compile(
            r"^(?P<lead>[ \t]*(?:-[ \t]*)?)(?P<key>[\"']?[\w.-]+[\"']?)(?P<sep>[ \t]*:[ \t]*)(?P<val>\S.*?)[ \t]*$",
            re.MULTILINE,
        )
    else:
        pattern = re.compile(
            r"(?P<lead>)(?P<key>\"[^\"\n]*\"|'[^'\n]*'|[A-Za-z0-9_-]+)(?P<sep>[ \t]*=[ \t]*)"
            r"(?P<val>\"(?:[^\"\\\n]|\\.)*\"|'[^'\n]*'|[^\s,}#\n]+)"
        )

    def one(match: re.Match) -> str:
        key = match.group("key").strip("\"'")
        value = match.group("val")
        if not _SECRET_KEY.search(key):
            return match.group(0)
        bare = value.strip("\"'")
        if _VAR.fullmatch(bare) or _OC_ENV.fullmatch(bare):
            return match.group(0)
        shown = REDACTED if yaml else f"'{REDACTED}'"
        return match.group("lead") + match.group("key") + match.group("sep") + shown

    return pattern.sub(one, text)


# ---- rendering ------------------------------------------------------------------------------


def render(path: Path, environ: Mapping[str, str] | None = None) -> RenderedDeployment:
    """Read a deployment and resolve its variables (unset ones fail with file:line)."""
    try:
        raw = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read deployment {path}: {exc.strerror or exc}") from exc
    environ = os.environ if environ is None else environ
    used: dict[str, str] = {}
    text = _interpolate(raw, path, environ, used, redact=False)
    redacted = redact_assignments(_interpolate(raw, path, environ, {}, redact=True))
    return RenderedDeployment(path, text, used, redacted)


def switchyard_error(
    message: str, rendered: RenderedDeployment, private_path: Path, shown_path: str | None = None
) -> str:
    """Switchyard's message about a rendered deployment, fit to show: one copy of the inner error
    (0.3.0 repeats it after `: `), the user's file instead of the private copy, secrets removed."""
    head, sep, rest = message.partition(": ")
    if sep:
        for k in range(1, len(rest)):
            if rest.startswith(": ", k) and rest[k + 2 :].startswith(rest[:k].rstrip()):
                message = head + sep + rest[:k].rstrip()
                break
    message = message.replace(str(private_path), shown_path or str(rendered.source))
    return rendered.scrub(message)


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


# ---- model discovery ------------------------------------------------------------------------


@dataclass(frozen=True)
class RouteUpstream:
    """A passthrough route and the one model behind it (enough to ask that model's server)."""

    route_id: str
    base_url: str
    model: str
    api_key_env: str | None
    context_window: int | None


def route_upstreams(text: str) -> list[RouteUpstream]:
    """Passthrough routes of a rendered deployment with their target's base URL and model id.

    Only a passthrough route has one model whose `max_model_len` is the route's context window.
    """
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return []
    clients, targets = doc.get("llm_clients") or {}, doc.get("targets") or {}
    found = []
    for route in (doc.get("routes") or {}).values():
        if not isinstance(route, dict) or route.get("type") != "passthrough":
            continue
        target = targets.get(route.get("target")) or {}
        client = clients.get(target.get("llm_client")) or {}
        if not (
            isinstance(route.get("id"), str)
            and isinstance(client.get("base_url"), str)
            and isinstance(target.get("id"), str)
        ):
            continue
        window = route.get("context_window")
        found.append(
            RouteUpstream(
                route["id"],
                client["base_url"],
                target["id"],
                client.get("api_key_env"),
                window if isinstance(window, int) and not isinstance(window, bool) else None,
            )
        )
    return found


def _int_len(entry: object) -> int | None:
    value = entry.get("max_model_len") if isinstance(entry, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


async def discover_max_model_len(base_url: str, model: str, client: httpx.AsyncClient) -> int | None:
    """Ask a vLLM server's /v1/models for `max_model_len`; None when it does not say (never raises).

    The entry whose id is `model` wins; otherwise the first entry that carries one (a vLLM server
    serves one base model, and its LoRA adapters share its length).
    """
    root = base_url.rstrip("/")
    url = root + "/models" if root.endswith("/v1") else root + "/v1/models"
    try:
        response = await client.get(url, timeout=5.0)
        response.raise_for_status()
        data = response.json().get("data") or []
    except (httpx.HTTPError, ValueError, AttributeError) as exc:
        log.warning("cannot read max_model_len from %s: %s", url, type(exc).__name__)
        return None
    if not isinstance(data, list):
        return None
    for entry in data:
        if isinstance(entry, dict) and entry.get("id") == model and _int_len(entry) is not None:
            return _int_len(entry)
    return next((length for length in map(_int_len, data) if length is not None), None)
