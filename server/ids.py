"""The one id charset: what a session, parent or rollout id must fit, and the name of calls that have none."""

from __future__ import annotations

import re

# An id becomes a header value and (hashed) a directory name; this charset is NeMo Gym's.
ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
MAX_ID_LENGTH = 200

# A call with no session id is recorded (when capture_uncorrelated is on) as its own one-call session.
UNCORRELATED_PREFIX = "uncorrelated-"


def valid_id(value: object) -> str | None:
    """The id if it is safe to forward and to use in a path, else None (the call goes uncorrelated)."""
    if isinstance(value, str) and value and len(value) <= MAX_ID_LENGTH and ID_PATTERN.fullmatch(value):
        return value
    return None


def is_valid_session_id(value: object) -> bool:
    return valid_id(value) is not None


def uncorrelated_session_id(call_id: str) -> str:
    """The session id an uncorrelated call is recorded under: nothing ties it to any other call."""
    return UNCORRELATED_PREFIX + call_id
