"""The id rules: what a session, parent or rollout id must fit, and the name of calls that have none."""

from __future__ import annotations

import re

# A session or parent id from a header (or the body field) is sent on to Switchyard as a header value,
# so it must be safe as one: printable ASCII without whitespace. Nothing else constrains it: on disk
# it is hashed into a fixed-width directory name, so `/`, `:` or `..` inside it reach no path.
ID_PATTERN = re.compile(r"[\x21-\x7e]+")
# Ids made only of dots cannot be named in a URL path (clients fold `.` and `..` segments away).
_DOTS_ONLY = re.compile(r"\.+")
# The `/ng-rollout/<id>/` prefix keeps NeMo Gym's own charset: there the id sits inside the URL path.
ROLLOUT_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
MAX_ID_LENGTH = 200

# A call with no session id is recorded (when capture_uncorrelated is on) as its own one-call session.
UNCORRELATED_PREFIX = "uncorrelated-"


def valid_id(value: object) -> str | None:
    """The id if it is safe to forward as a header value and to name in a URL, else None."""
    if (
        isinstance(value, str)
        and value
        and len(value) <= MAX_ID_LENGTH
        and ID_PATTERN.fullmatch(value)
        and not _DOTS_ONLY.fullmatch(value)
    ):
        return value
    return None


def valid_rollout_id(value: object) -> str | None:
    """The `/ng-rollout/<id>/` id if it fits Gym's charset (`^[A-Za-z0-9][A-Za-z0-9._-]*$`), else None."""
    if isinstance(value, str) and value and len(value) <= MAX_ID_LENGTH and ROLLOUT_ID_PATTERN.fullmatch(value):
        return value
    return None


def is_valid_session_id(value: object) -> bool:
    return valid_id(value) is not None


def uncorrelated_session_id(call_id: str) -> str:
    """The session id an uncorrelated call is recorded under: nothing ties it to any other call."""
    return UNCORRELATED_PREFIX + call_id
