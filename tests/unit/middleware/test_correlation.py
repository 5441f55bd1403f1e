"""Correlation rules: which id wins, what is stripped, and which ids are refused."""

from __future__ import annotations

import asyncio

import pytest

from middleware.correlation import (
    REFUSED_ID_HEADER,
    CorrelationMiddleware,
    RefusedIds,
    current_correlation,
    resolve,
)
from server.ids import valid_id
from tests.support.model_paths import model_paths


def h(**headers: str) -> list[tuple[bytes, bytes]]:
    return [(k.replace("_", "-").encode(), v.encode()) for k, v in headers.items()]


def test_path_prefix_wins_and_is_stripped():
    corr, path = resolve("/ng-rollout/task0-r1-a0/v1/responses", h(x_switchyard_session_id="hdr"))
    assert path == "/v1/responses"
    assert corr.session_id == "task0-r1-a0" and corr.rollout_id == "task0-r1-a0"
    assert corr.source == "path:ng-rollout"
    assert not corr.training_capture


@pytest.mark.parametrize("route", model_paths())
def test_gym_training_segment_is_stripped_and_flagged(route):
    corr, path = resolve(f"/ng-rollout/task0-r1/training-token-capture{route}", h(x_session_id="hdr"))
    assert path == route
    assert corr.session_id == corr.rollout_id == "task0-r1" and corr.source == "path:ng-rollout"
    assert corr.training_capture


def test_training_segment_only_counts_right_after_the_rollout_id():
    corr, path = resolve("/v1/training-token-capture/v1/responses", [])
    assert path is None and not corr.training_capture
    corr, path = resolve("/ng-rollout/r1/v1/training-token-capture/x", [])
    assert path == "/v1/training-token-capture/x" and not corr.training_capture


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


@pytest.mark.parametrize(
    "good",
    ["swe:django-1234:0", "user@example.com", "a/b", "tenant:a", 'a"b', "..\\..\\x", ".hidden", "-lead", "~" * 200],
)
def test_header_ids_accept_any_printable_ascii_without_spaces(good):
    assert valid_id(good) == good
    corr, _ = resolve("/v1/x", [(b"x-session-id", good.encode()), (b"x-parent-session-id", b"job:7")])
    assert (corr.session_id, corr.parent_session_id, corr.refused) == (good, "job:7", ())


@pytest.mark.parametrize(
    "bad", ["bad\r\nx-injected: 1", "a b", "tab\there", "x" * 201, "", "nul\x00", "del\x7f", ".", "..", "s\u00e9ance"]
)
def test_ids_outside_the_header_rule_are_refused_and_named(bad):
    assert valid_id(bad) is None
    corr, _ = resolve("/v1/x", [(b"x-session-id", bad.encode())])
    assert corr.session_id is None
    assert corr.refused == ("header:x-session-id",)


def test_undecodable_header_bytes_are_refused():
    corr, _ = resolve("/v1/x", [(b"thread-id", b"\xff\xfe"), (b"x-parent-session-id", b"\xff")])
    assert corr.session_id is None and corr.parent_session_id is None
    assert corr.refused == ("header:thread-id", "header:x-parent-session-id")


def test_the_rollout_prefix_keeps_gyms_charset():
    corr, path = resolve("/ng-rollout/swe:django-1:0/v1/responses", [])
    assert path == "/v1/responses" and corr.session_id is None
    assert corr.refused == ("path:ng-rollout",)


def test_a_refused_parent_falls_through_to_the_next_parent_header():
    corr, _ = resolve("/v1/x", h(x_session_id="c", x_parent_session_id="a b", x_codex_parent_thread_id="q"))
    assert corr.parent_session_id == "q"
    assert corr.refused == ("header:x-parent-session-id",)


def test_a_refused_body_field_is_named():
    low, _ = resolve("/v1/responses", h(x_session_id="opencode"))
    assert low.with_body_session_id("bad id").refused == ("body:proxy_x_session_id",)
    assert low.with_body_session_id("bad id").session_id == "opencode"


def test_bad_rollout_id_still_strips_the_prefix_but_goes_uncorrelated():
    corr, path = resolve("/ng-rollout/bad%0d%0a/v1/responses", [])
    assert path == "/v1/responses" and corr.session_id is None
    # The first source present decides: a malformed one does not fall through to a weaker source.
    corr, path = resolve("/ng-rollout/" + "y" * 201 + "/v1/responses", h(x_session_id="fallback"))
    assert path == "/v1/responses" and corr.session_id is None


def test_a_malformed_header_id_makes_the_call_uncorrelated():
    corr, _ = resolve("/v1/x", [(b"x-switchyard-session-id", b"../ x"), (b"x-session-id", b"good")])
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


def run_request(mw: CorrelationMiddleware, headers: list[tuple[bytes, bytes]], path: str = "/v1/x") -> list[dict]:
    sent: list[dict] = []

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "path": path, "raw_path": path.encode(), "headers": headers}
    asyncio.run(mw(scope, None, send))
    return sent


async def answer(scope, receive, send):
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"ok"})


def test_a_refused_id_is_counted_warned_about_and_named_in_the_response(caplog):
    refused = RefusedIds()
    mw = CorrelationMiddleware(answer, refused_ids=refused)
    with caplog.at_level("WARNING", logger="switchyard_model.correlation"):
        for _ in range(3):
            sent = run_request(mw, [(b"x-session-id", b"user name@example.com")])
        start = sent[0]
        assert (REFUSED_ID_HEADER, b"header:x-session-id") in start["headers"]
        assert (b"content-type", b"text/plain") in start["headers"]
        assert refused.counts() == {"header:x-session-id": 3} and refused.total() == 3
        # Rate-limited: one warning for the three, naming the source but not echoing the refused value.
        warnings = [r.getMessage() for r in caplog.records if r.name == "switchyard_model.correlation"]
        assert len(warnings) == 1
        assert "header:x-session-id" in warnings[0] and "user name" not in warnings[0]
        # A different source is not hidden by the first one's window.
        run_request(mw, [], path="/ng-rollout/a:b/v1/responses")
        warnings = [r.getMessage() for r in caplog.records if r.name == "switchyard_model.correlation"]
        assert len(warnings) == 2 and "path:ng-rollout" in warnings[1]


def test_an_accepted_id_adds_no_header_and_counts_nothing():
    refused = RefusedIds()
    sent = run_request(CorrelationMiddleware(answer, refused_ids=refused), [(b"x-session-id", b"swe:django-1234:0")])
    assert all(name != REFUSED_ID_HEADER for name, _ in sent[0]["headers"])
    assert refused.total() == 0


def test_claude_code_session_header_is_the_weakest_source():
    corr, _ = resolve("/v1/messages", h(x_claude_code_session_id="cc-1"))
    assert corr.session_id == "cc-1" and corr.source == "header:x-claude-code-session-id"
    corr, _ = resolve("/v1/messages", h(x_claude_code_session_id="cc-1", session_id="e"))
    assert corr.session_id == "e"


def test_a_claude_code_agent_is_a_child_session_of_its_session():
    corr, _ = resolve("/v1/messages", h(x_claude_code_session_id="cc-1", x_claude_code_agent_id="a1b2"))
    assert (corr.session_id, corr.parent_session_id) == ("cc-1/a1b2", "cc-1")
    # Without a session the agent id means nothing; a child id too long stays in the session, said so.
    corr, _ = resolve("/v1/messages", h(x_claude_code_agent_id="a1b2"))
    assert corr.session_id is None and corr.parent_session_id is None
    corr, _ = resolve("/v1/messages", h(x_claude_code_session_id="s" * 150, x_claude_code_agent_id="a" * 60))
    assert corr.session_id == "s" * 150 and corr.refused == ("header:x-claude-code-agent-id",)
