"""OpenAI-shaped errors: one exception type and its JSON body, used by every layer."""

from __future__ import annotations

from typing import Any

import orjson

# The OpenAI `type` that goes with each status this server produces.
_TYPE_FOR_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    409: "conflict_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    502: "upstream_error",
    503: "service_unavailable",
    504: "timeout_error",
}


class OpenAIError(Exception):
    """An error a client should see as `{"error": {"message", "type", "param", "code"}}`."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str | None = None,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type or _TYPE_FOR_STATUS.get(status, "server_error" if status >= 500 else "invalid_request_error")
        self.param = param
        self.code = code
        self.headers = headers or {}

    def to_dict(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def to_json(self) -> bytes:
        return orjson.dumps(self.to_dict())


# The Anthropic Messages API's error `type` for each status (what its SDKs and Claude Code expect).
_ANTHROPIC_TYPE_FOR_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def anthropic_error_dict(error: OpenAIError) -> dict[str, Any]:
    """The error as the Messages API shapes it: `{"type": "error", "error": {"type", "message"}}`."""
    kind = _ANTHROPIC_TYPE_FOR_STATUS.get(error.status)
    if kind is None:
        kind = "api_error" if error.status >= 500 else "invalid_request_error"
    return {"type": "error", "error": {"type": kind, "message": error.message}}


def anthropic_error_json(error: OpenAIError) -> bytes:
    return orjson.dumps(anthropic_error_dict(error))
