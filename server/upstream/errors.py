"""Every upstream failure as an OpenAIError: an error reply (status and message kept) or a transport exception."""

from __future__ import annotations

from collections.abc import Mapping

import httpx
import orjson

from server.errors import OpenAIError
from server.upstream import http1


def error_from_reply(status: int, body: bytes, headers: Mapping[str, str]) -> OpenAIError:
    """Keep the upstream status and message; put them in the OpenAI shape."""
    message = None
    err_type = code = param = None
    try:
        doc = orjson.loads(body)
        err = doc.get("error") if isinstance(doc, dict) else None
        if isinstance(err, dict):
            message = err.get("message")
            err_type, code, param = err.get("type"), err.get("code"), err.get("param")
        elif isinstance(err, str):
            message = err
        elif isinstance(doc, dict) and isinstance(doc.get("message"), str):
            message = doc["message"]
    except (orjson.JSONDecodeError, AttributeError):
        pass
    if isinstance(message, str) and message.startswith("{"):
        message, inner_type, inner_code, inner_param = _unwrap(message)
        # The engine's own fields win where it gave them; Switchyard's stay where it did not.
        err_type, code, param = inner_type or err_type, inner_code or code, inner_param or param
    if not isinstance(message, str) or not message:
        text = body[:500].decode("utf-8", "replace").strip()
        message = f"upstream returned HTTP {status}" + (f": {text}" if text else "")
    extra = {}
    if status == 429:
        # Switchyard 0.3.0 honours Retry-After itself, then relays the 429 without it; a client
        # still needs some back-off hint, so a missing one becomes a conservative 1 s.
        extra["retry-after"] = headers.get("retry-after", "1")
    return OpenAIError(
        status,
        message,
        type=err_type if isinstance(err_type, str) else None,
        code=code if isinstance(code, str) else "upstream_error",
        param=param if isinstance(param, str) else None,
        headers=extra,
    )


def _unwrap(message: str) -> tuple[str, str | None, str | None, str | None]:
    """The engine's error inside Switchyard's: message, type, code and param (None where absent).

    Switchyard 0.3.0 answers some engine errors (a context-length error, for one) with the engine's
    whole JSON error body as the text of its own `error.message`: JSON inside JSON. A message that
    is not such a body is returned as it is.
    """
    try:
        doc = orjson.loads(message)
    except orjson.JSONDecodeError:
        return message, None, None, None
    inner = doc.get("error") if isinstance(doc, dict) else None
    if isinstance(inner, str) and inner:
        return inner, None, None, None
    if not isinstance(inner, dict) or not isinstance(inner.get("message"), str) or not inner["message"]:
        return message, None, None, None

    def text(key: str) -> str | None:
        value = inner.get(key)
        return value if isinstance(value, str) and value else None

    return inner["message"], text("type"), text("code"), text("param")


def error_from_exception(exc: http1.HTTPError, target: str) -> OpenAIError:
    """A failure of the pooled HTTP/1.1 client: a timeout is 504, anything else 502."""
    if isinstance(exc, http1.TimeoutError_):
        return OpenAIError(504, f"the upstream ({target}) did not answer in time: {exc}", code="upstream_timeout")
    if isinstance(exc, http1.ConnectError):
        return OpenAIError(502, f"cannot connect to the upstream ({target}): {exc}", code="upstream_unreachable")
    if isinstance(exc, http1.ProtocolError):
        return OpenAIError(502, f"the upstream ({target}) broke off: {exc}", code="upstream_disconnected")
    return OpenAIError(502, f"upstream call failed: {type(exc).__name__}: {exc}", code="upstream_error")


def error_from_httpx(exc: httpx.HTTPError, target: str) -> OpenAIError:
    """The same mapping for a failure of the httpx client (the occasional GET)."""
    if isinstance(exc, httpx.TimeoutException):
        return OpenAIError(504, f"the upstream ({target}) did not answer in time: {exc}", code="upstream_timeout")
    if isinstance(exc, httpx.ConnectError):
        return OpenAIError(502, f"cannot connect to the upstream ({target}): {exc}", code="upstream_unreachable")
    if isinstance(exc, (httpx.RemoteProtocolError, httpx.ReadError)):
        return OpenAIError(502, f"the upstream ({target}) broke off: {exc}", code="upstream_disconnected")
    return OpenAIError(502, f"upstream call failed: {type(exc).__name__}: {exc}", code="upstream_error")
