"""The 400s a malformed Responses or Messages request gets from translation, and the value checks behind them."""

from __future__ import annotations

from typing import Any

from server.errors import OpenAIError


def invalid(message: str, param: str, code: str = "invalid_value") -> OpenAIError:
    return OpenAIError(400, message, param=param, code=code)


def wrong_type(param: str, expected: str) -> OpenAIError:
    return OpenAIError(400, f"`{param}` must be {expected}", param=param, code="invalid_type")


def unsupported(message: str, param: str) -> OpenAIError:
    return OpenAIError(400, message, param=param, code="unsupported_parameter")


def text_of(part: dict[str, Any], param: str) -> str:
    """A content part's (or block's) `text`, which must be a string (the 400 names `<param>.text`)."""
    text = part.get("text")
    if not isinstance(text, str):
        raise wrong_type(f"{param}.text", "a string")
    return text


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


# How many of each list one request may hold. Far above what agents send (a long Codex session is
# a few thousand items), far below what turns a 32 MiB body into gigabytes of work and records.
MAX_REQUEST_ITEMS = 20_000  # `input` items, or chat `messages`
MAX_CONTENT_PARTS = 50_000  # content parts across all of them
MAX_TOOLS = 1_000


def check_counts(body: dict[str, Any]) -> None:
    """400 naming the list when a request holds more items, messages, content parts or tools than allowed."""
    for name in ("input", "messages"):
        items = body.get(name)
        if not isinstance(items, list):
            continue
        if len(items) > MAX_REQUEST_ITEMS:
            raise invalid(f"`{name}` holds {len(items)} entries; at most {MAX_REQUEST_ITEMS} are allowed", name)
        parts = 0
        for item in items:
            content = item.get("content") if isinstance(item, dict) else None
            if isinstance(content, list):
                parts += len(content)
        if parts > MAX_CONTENT_PARTS:
            raise invalid(f"`{name}` holds {parts} content parts; at most {MAX_CONTENT_PARTS} are allowed", name)
    tools = body.get("tools")
    if isinstance(tools, list) and len(tools) > MAX_TOOLS:
        raise invalid(f"`tools` holds {len(tools)} tools; at most {MAX_TOOLS} are allowed", "tools")
