"""Switchyard deployments: the shipped profiles, and a deployment rendered privately for Switchyard to read."""

from __future__ import annotations

import os
import shutil
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from server.config import PROFILES_DIR, ConfigError
from server.files import process_temp_dir
from server.switchyard.interpolation import substitute
from server.switchyard.redaction import REDACTED, is_secret_name, redact_assignments, scrub


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


# ---- rendering ------------------------------------------------------------------------------


def _hide_secret(name: str, value: str) -> str:
    return REDACTED if value and is_secret_name(name) else value


def render(path: Path, environ: Mapping[str, str] | None = None) -> RenderedDeployment:
    """Read a deployment and resolve its variables (unset ones fail with file:line)."""
    try:
        raw = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read deployment {path}: {exc.strerror or exc}") from exc
    environ = os.environ if environ is None else environ
    used: dict[str, str] = {}
    text = substitute(raw, path, environ, used)
    redacted = redact_assignments(substitute(raw, path, environ, {}, shown=_hide_secret))
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


PRIVATE_DIR_PREFIX = "switchyard-model-deployment-"


def write_private(rendered: RenderedDeployment) -> Path:
    """Write the resolved deployment where only this user can read it (it may hold secrets)."""
    # A folder named after this process: a SIGKILLed server cannot remove its copy, the next one does.
    directory = Path(process_temp_dir(PRIVATE_DIR_PREFIX))
    target = directory / rendered.source.name
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(rendered.text)
    return target


def remove_private(path: Path) -> None:
    """Remove the private copy with its folder (and what was kept beside it: a launched Switchyard's stderr)."""
    if path.parent.name.startswith(PRIVATE_DIR_PREFIX):  # only ever a folder `write_private` made
        shutil.rmtree(path.parent, ignore_errors=True)
