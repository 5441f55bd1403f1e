"""Checks of the OpenAI error shape {"error": {"message","type","param","code"}}, shared by unit and integration tests."""

from __future__ import annotations

from typing import Any

import httpx
import orjson


def assert_openai_error(
    response: httpx.Response, status: int | tuple[int, ...], param: str | None = None
) -> dict[str, Any]:
    statuses = (status,) if isinstance(status, int) else status
    assert response.status_code in statuses, (response.status_code, response.text[:500])
    assert response.headers["content-type"].startswith("application/json")
    return check_error_body(response.content, param)


def check_error_body(body: bytes, param: str | None = None) -> dict[str, Any]:
    error: dict[str, Any] = orjson.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["type"], str) and error["type"]
    if param is not None:
        assert error["param"] == param, error
    return error


def nested_arrays(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth
