"""Base URLs: one rule for the `/v1` suffix, which users give or leave off as they like."""

from __future__ import annotations


def root_url(url: str) -> str:
    """`http://h:p/v1/` or `http://h:p/v1` or `http://h:p` → `http://h:p` (the server's root)."""
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url
