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


MAX_METADATA_PAIRS, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512


def check_metadata(value: Any) -> dict[str, str]:
    """`metadata` as the OpenAI API bounds it: at most 16 pairs of short strings (so it cannot fill a store)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise OpenAIError(400, "`metadata` must be an object of strings", param="metadata", code="invalid_type")
    if len(value) > MAX_METADATA_PAIRS:
        raise OpenAIError(
            400, f"`metadata` holds at most {MAX_METADATA_PAIRS} pairs", param="metadata", code="invalid_value"
        )
    for key, item in value.items():
        if len(key) > MAX_METADATA_KEY or not isinstance(item, str) or len(item) > MAX_METADATA_VALUE:
            raise OpenAIError(
                400,
                f"`metadata.{key[:64]}`: keys are at most {MAX_METADATA_KEY} characters, values strings of at most "
                f"{MAX_METADATA_VALUE}",
                param="metadata",
                code="invalid_value",
            )
    return value
