"""The settings the stateful services read, for unit tests (the full Settings needs a Switchyard)."""

from __future__ import annotations

from types import SimpleNamespace


def stateful_settings(capture_dir, **overrides) -> SimpleNamespace:
    values = {
        "capture_dir": str(capture_dir),
        "api_keys": [],
        "response_store_max_count": 1000,
        "response_store_max_bytes": 10**9,
        "response_store_max_age_s": 3600.0,
        "conversation_store_max_count": 1000,
        "conversation_store_max_bytes": 10**9,
        "reasoning_seal_key": None,
    }
    values.update(overrides)
    return SimpleNamespace(**values)
