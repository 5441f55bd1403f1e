"""The 400s a malformed Responses request gets from translation, and the value checks behind them."""

from __future__ import annotations

from typing import Any

from server.errors import OpenAIError


def invalid(message: str, param: str, code: str = "invalid_value") -> OpenAIError:
    return OpenAIError(400, message, param=param, code=code)


def wrong_type(param: str, expected: str) -> OpenAIError:
    return OpenAIError(400, f"`{param}` must be {expected}", param=param, code="invalid_type")


def unsupported(message: str, param: str) -> OpenAIError:
    return OpenAIError(400, message, param=param, code="unsupported_parameter")


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
