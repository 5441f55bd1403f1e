"""Real Settings for unit tests of the stateful services (attach mode: nothing is started)."""

from __future__ import annotations

from server.config import Settings


def stateful_settings(capture_dir, **overrides) -> Settings:
    values = {
        "switchyard_base_url": "http://127.0.0.1:9/v1",  # never contacted by these services
        "capture_dir": str(capture_dir),
        "response_store_max_count": 1000,
        "response_store_max_bytes": 10**9,
        "response_store_max_age_s": 3600.0,
        "conversation_store_max_count": 1000,
        "conversation_store_max_bytes": 10**9,
    }
    values.update(overrides)
    return Settings(**values)
