"""Correlation rules: which id wins, what is stripped, and which ids are refused."""

from __future__ import annotations

import asyncio

import pytest

from middleware.correlation import CorrelationMiddleware, current_correlation, resolve, valid_id


def h(**headers: str) -> list[tuple[bytes, bytes]]:
    return [(k.replace("_", "-").encode(), v.encode()) for k, v in headers.items()]


def test_path_prefix_wins_and_is_stripped():
    corr, path = resolve("/ng-rollout/task0-r1-a0/v1/responses", h(x_switchyard_session_id="hdr"))
    assert path == "/v1/responses"
    assert corr.session_id == "task0-r1-a0" and corr.rollout_id == "task0-r1-a0"
    assert corr.source == "path:ng-rollout"


@pytest.mark.parametrize(
    "headers, expected",
    [
        ({"x-switchyard-session-id": "a", "proxy_x_session_id": "b", "x-session-id": "c"}, "a"),
        ({"proxy_x_session_id": "b", "x-session-id": "c", "thread-id": "d"}, "b"),
        ({"x-session-id": "c", "thread-id": "d", "session-id": "e"}, "c"),
        ({"thread-id": "d", "session-id": "e"}, "d"),
        ({"session-id": "e"}, "e"),
        ({}, None),
    ],
)
def test_header_precedence(headers, expected):
    corr, path = resolve("/v1/chat/completions", [(k.encode(), v.encode()) for k, v in headers.items()])
    assert path is None
    assert corr.session_id == expected


def test_body_field_ranks_between_the_header_groups():
    low, _ = resolve("/v1/responses", h(x_session_id="opencode"))
    assert low.with_body_session_id("from-body").session_id == "from-body"
    high, _ = resolve("/v1/responses", h(x_switchyard_session_id="sy"))
    assert high.with_body_session_id("from-body").session_id == "sy"
    path, _ = resolve("/ng-rollout/r1/v1/responses", [])
    assert path.with_body_session_id("from-body").session_id == "r1"
    assert low.with_body_session_id("bad id\r\n").session_id == "opencode"
    assert low.with_body_session_id(42).session_id == "opencode"


def test_parents_from_opencode_then_codex():
    corr, _ = resolve("/v1/x", h(x_session_id="c", x_parent_session_id="p", x_codex_parent_thread_id="q"))
    assert corr.parent_session_id == "p"
    corr, _ = resolve("/v1/x", h(thread_id="child", x_codex_parent_thread_id="root"))
    assert (corr.session_id, corr.parent_session_id) == ("child", "root")


@pytest.mark.parametrize("bad", ["bad\r\nx-injected: 1", "../etc", "..", ".hidden", "a/b", "x" * 201, "", "nul\x00"])
def test_ids_outside_the_charset_are_dropped(bad):
    assert valid_id(bad) is None
    corr, _ = resolve("/v1/x", [(b"x-session-id", bad.encode())])
    assert corr.session_id is None


def test_bad_rollout_id_still_strips_the_prefix_but_goes_uncorrelated():
    corr, path = resolve("/ng-rollout/bad%0d%0a/v1/responses", [])
    assert path == "/v1/responses" and corr.session_id is None
    # The first source present decides: a malformed one does not fall through to a weaker source.
    corr, path = resolve("/ng-rollout/" + "y" * 201 + "/v1/responses", h(x_session_id="fallback"))
    assert path == "/v1/responses" and corr.session_id is None


def test_a_malformed_header_id_makes_the_call_uncorrelated():
    corr, _ = resolve("/v1/x", [(b"x-switchyard-session-id", b"../x"), (b"x-session-id", b"good")])
    assert corr.session_id is None and corr.source is None
    # ... and the body field, which ranks below it, cannot take over either.
    assert corr.with_body_session_id("from-body").session_id is None
    # A malformed weaker header leaves room for the body field, which outranks it.
    corr, _ = resolve("/v1/x", [(b"x-session-id", b"bad id")])
    assert corr.with_body_session_id("from-body").session_id == "from-body"


def test_longest_valid_id_is_accepted():
    assert valid_id("a" * 200) == "a" * 200


def test_middleware_publishes_context_and_passes_non_http_untouched():
    seen = {}

    async def inner(scope, receive, send):
        seen["scope"] = scope
        seen["corr"] = current_correlation()

    mw = CorrelationMiddleware(inner)
    lifespan = {"type": "lifespan"}
    asyncio.run(mw(lifespan, None, None))
    assert seen["scope"] is lifespan
    scope = {"type": "http", "path": "/ng-rollout/r-7/v1/chat/completions", "raw_path": b"", "headers": []}
    asyncio.run(mw(scope, None, None))
    assert seen["scope"]["path"] == "/v1/chat/completions"
    assert seen["scope"]["raw_path"] == b"/v1/chat/completions"
    assert seen["corr"].session_id == "r-7"
    assert current_correlation().session_id is None  # reset after the request
