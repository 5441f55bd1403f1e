"""The shared rate-limited logging: one line per interval per message, then a count of what was held back."""

from __future__ import annotations

import logging

import pytest

from server.logs import OncePerInterval, RateLimitedLog

LOGGER = "switchyard_model.test_logs"


@pytest.fixture
def clock(monkeypatch):
    """A hand-moved monotonic clock, so intervals are exact."""
    now = [1000.0]
    monkeypatch.setattr("server.logs.time.monotonic", lambda: now[0])
    return now


def messages(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


def test_a_repeating_message_is_logged_once_per_interval_then_counts_what_it_held(clock, caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    limited = RateLimitedLog(logging.getLogger(LOGGER), interval_s=30.0)
    assert limited.error("write failed: %s", "disk full")
    for _ in range(4):
        assert not limited.error("write failed: %s", "disk full")
    # A different message has its own allowance.
    assert limited.warning("queue full")
    clock[0] += 30.0
    assert limited.error("write failed: %s", "still full")
    assert messages(caplog) == [
        "write failed: disk full",
        "queue full",
        "write failed: still full (4 similar messages suppressed)",
    ]


def test_negative_control_a_zero_interval_lets_every_message_through(clock, caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    limited = RateLimitedLog(logging.getLogger(LOGGER), interval_s=0.0)
    for _ in range(3):
        assert limited.warning("again")
    assert messages(caplog) == ["again"] * 3


def test_filter_on_a_foreign_logger_passes_one_warning_per_interval_and_all_info(clock, caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    logger = logging.getLogger(LOGGER)
    gate = OncePerInterval(60.0)
    logger.addFilter(gate)
    try:
        logger.warning("export failed")
        logger.warning("export failed")
        logger.info("retrying")
        logger.warning("export failed")
        clock[0] += 60.0
        logger.warning("export failed")
    finally:
        logger.removeFilter(gate)
    assert messages(caplog) == ["export failed", "retrying", "export failed [2 similar messages suppressed]"]
