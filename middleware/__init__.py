"""Pure ASGI middleware for switchyard-model (correlation and request guards)."""

from __future__ import annotations

from middleware.auth import AuthMiddleware, BearerKeys, presented_key, reject, speaks_anthropic
from middleware.correlation import Correlation, RefusedIds, correlate, current_correlation, id_rule, publish, unpublish
from middleware.hosts import HostAllowList, HostCheckMiddleware, is_json_request, refuse_content_type, refuse_host

__all__ = [
    "AuthMiddleware",
    "BearerKeys",
    "correlate",
    "Correlation",
    "current_correlation",
    "HostAllowList",
    "HostCheckMiddleware",
    "id_rule",
    "is_json_request",
    "presented_key",
    "publish",
    "refuse_content_type",
    "refuse_host",
    "RefusedIds",
    "reject",
    "speaks_anthropic",
    "unpublish",
]
