"""Secrets in deployments: which names and keys hold credentials, and hiding their values before anything is shown or stored."""

from __future__ import annotations

import re
from collections.abc import Iterable

from server.switchyard.interpolation import OC_ENV, VAR, escape_basic

# A variable whose name says it holds a credential never has its value shown, stored or logged.
_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL", re.IGNORECASE)
# Keys whose value is a credential when written literally into a file (`api_key_env` is a variable
# *name*, not a credential, so it is kept).
_SECRET_KEY = re.compile(r"(?:^|[_-])(?:api[_-]?key|token|secret|password|authorization)$", re.IGNORECASE)
REDACTED = "<redacted>"


def is_secret_name(name: str) -> bool:
    """Whether a variable's name marks its value as a credential."""
    return bool(_SECRET_NAME.search(name))


def scrub(text: str, secrets: Iterable[str]) -> str:
    """Replace each secret value, as written or as escaped in a TOML string, with <redacted>."""
    for value in sorted((s for s in secrets if s), key=len, reverse=True):
        text = text.replace(escape_basic(value), REDACTED).replace(value, REDACTED)
    return text


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

    def one(match: re.Match[str]) -> str:
        key = match.group("key").strip("\"'")
        value = match.group("val")
        if not _SECRET_KEY.search(key):
            return match.group(0)
        bare = value.strip("\"'")
        if VAR.fullmatch(bare) or OC_ENV.fullmatch(bare):
            return match.group(0)
        shown = REDACTED if yaml else f"'{REDACTED}'"
        return match.group("lead") + match.group("key") + match.group("sep") + shown

    return pattern.sub(one, text)
