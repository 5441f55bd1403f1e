"""Query parameters of the list endpoints: cursor pages (after, limit, order), page sizes, flags, object ids."""

from __future__ import annotations

import re

from starlette.requests import Request

from server.errors import OpenAIError

DEFAULT_LIMIT = 20
MAX_LIMIT = 100
# Ids this server makes (resp_, conv_, msg_, ...) and ids clients give items; checked before any store call.
_OBJECT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,199}")


def object_id(request: Request, name: str, what: str) -> str:
    """The path parameter `name`; a malformed id is simply not found (404)."""
    value: str = request.path_params[name]
    if not _OBJECT_ID.fullmatch(value):
        raise not_found(what, value)
    return value


def not_found(what: str, value: str) -> OpenAIError:
    return OpenAIError(404, f"no {what} with id {value[:200]!r}", param=None, code=f"{what}_not_found")


def list_params(request: Request) -> tuple[str | None, int, str]:
    """(after, limit 1-100 default 20, order asc|desc default desc)."""
    query = request.query_params
    after = query.get("after") or None
    limit = limit_param(query.get("limit"), default=DEFAULT_LIMIT, maximum=MAX_LIMIT)
    order = query.get("order") or "desc"
    if order not in ("asc", "desc"):
        raise OpenAIError(400, "`order` must be asc or desc", param="order", code="invalid_value")
    return after, limit, order


def limit_param(value: str | None, *, default: int, maximum: int, code: str = "invalid_value") -> int:
    """A page size from 1 to `maximum`; `default` when absent. Shared by every list endpoint."""
    if value is None or value == "":
        return default
    try:
        limit = int(value)
    except ValueError:
        limit = 0
    if not 1 <= limit <= maximum:
        raise OpenAIError(400, f"`limit` must be an integer from 1 to {maximum}", param="limit", code=code)
    return limit


def flag(request: Request, name: str) -> bool:
    value = (request.query_params.get(name) or "false").lower()
    if value in ("true", "1"):
        return True
    if value in ("false", "0"):
        return False
    raise OpenAIError(400, f"`{name}` must be true or false", param=name, code="invalid_value")


def integer(request: Request, name: str, default: int) -> int:
    value = request.query_params.get(name)
    if value in (None, ""):
        return default
    try:
        return int(value)
    except ValueError:
        raise OpenAIError(400, f"`{name}` must be an integer", param=name, code="invalid_value") from None
