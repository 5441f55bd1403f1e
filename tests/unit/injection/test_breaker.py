"""The per-route breaker: K fallbacks in a row pause injection on a route, with one warning per pause."""

from __future__ import annotations

import logging

import pytest

from server.injection.breaker import RouteBreaker


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "switchyard_model.injection" and r.levelno == logging.WARNING
    ]


def test_one_warning_per_pause_however_many_calls_fall_back(caplog):
    caplog.set_level(logging.WARNING, logger="switchyard_model.injection")
    clock = Clock()
    breaker = RouteBreaker(limit=3, pause_s=60, clock=clock)
    breaker.failed("a", "echo_mismatch")
    breaker.failed("a", "echo_mismatch")
    assert not breaker.paused("a") and _warnings(caplog) == []
    breaker.failed("a", "echo_mismatch")
    assert breaker.paused("a")
    for _ in range(20):  # calls injected before the pause began keep falling back as they finish
        breaker.failed("a", "echo_mismatch")
        assert breaker.paused("a")
    warned = _warnings(caplog)
    assert len(warned) == 1 and "'a'" in warned[0] and "echo_mismatch" in warned[0]
    clock.now += 61  # the pause is over: injection is tried again, the count starts afresh
    assert not breaker.paused("a")
    breaker.failed("a", "upstream_rejected")
    breaker.failed("a", "upstream_rejected")
    assert not breaker.paused("a") and len(_warnings(caplog)) == 1
    breaker.failed("a", "upstream_rejected")
    assert breaker.paused("a") and len(_warnings(caplog)) == 2  # the second pause, its own warning


def test_a_success_resets_the_count_and_routes_are_apart(caplog):
    caplog.set_level(logging.WARNING, logger="switchyard_model.injection")
    breaker = RouteBreaker(limit=2, pause_s=60, clock=Clock())
    breaker.failed("a", "echo_mismatch")
    breaker.succeeded("a")
    breaker.failed("a", "echo_mismatch")
    breaker.failed("b", "echo_mismatch")
    assert not breaker.paused("a") and not breaker.paused("b") and _warnings(caplog) == []
    breaker.failed("b", "echo_mismatch")
    assert breaker.paused("b") and not breaker.paused("a") and len(_warnings(caplog)) == 1
