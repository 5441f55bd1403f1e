"""`refused_session_ids: reject`: a call whose session id breaks the rules is a 400 naming where and why."""

from __future__ import annotations

import httpx
import pytest

from tests.support.stack import launch_stack

CHAT = {"model": "x", "messages": [{"role": "user", "content": "hi"}]}
RESPONSES = {"model": "x", "input": "hi"}


@pytest.fixture(scope="module")
def strict_chain(mock_upstream, tmp_path_factory):
    folder = tmp_path_factory.mktemp("strict")
    config = folder / "settings.yaml"
    config.write_text("refused_session_ids: reject\n")
    stack = launch_stack(mock_upstream, folder / "captures", "--config", str(config))
    yield stack
    stack.proc.stop()


def _upstream_calls(chain) -> int:
    return chain.engine_mark()  # the mock's latest request number: unchanged when nothing went upstream


@pytest.mark.parametrize(
    "path,body", [("/chat/completions", CHAT), ("/responses", RESPONSES)], ids=["chat", "responses"]
)
@pytest.mark.parametrize("header", ["x-session-id", "x-switchyard-session-id", "thread-id", "x-parent-session-id"])
def test_a_refused_header_id_is_a_400_naming_the_header_and_the_rule(strict_chain, path, body, header):
    before = _upstream_calls(strict_chain)
    headers = {header: "has a space"}
    if header == "x-parent-session-id":  # a refused parent, beside a valid session id
        headers["x-session-id"] = "fine-id"
    response = httpx.post(strict_chain.v1 + path, json=body, headers=headers, timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_session_id" and error["param"] == header, error
    assert f"header {header}" in error["message"] and "printable ASCII characters without spaces" in error["message"]
    assert _upstream_calls(strict_chain) == before  # nothing was sent on


def test_a_refused_rollout_prefix_and_body_field_are_400s_too(strict_chain):
    prefixed = httpx.post(strict_chain.url + "/ng-rollout/bad@id/v1/chat/completions", json=CHAT, timeout=30)
    assert prefixed.status_code == 400 and "/ng-rollout/" in prefixed.json()["error"]["message"]
    assert "Gym's charset" in prefixed.json()["error"]["message"]
    body_field = httpx.post(strict_chain.v1 + "/responses", json={**RESPONSES, "proxy_x_session_id": "a b"}, timeout=30)
    assert body_field.status_code == 400 and body_field.json()["error"]["param"] == "proxy_x_session_id"


def test_a_valid_id_is_served_as_always(strict_chain):
    response = httpx.post(
        strict_chain.v1 + "/chat/completions",
        json=CHAT,
        headers={"x-session-id": "ok:id/1"},
        timeout=30,
    )
    assert response.status_code == 200, response.text


def test_by_default_a_refused_id_is_still_served_uncorrelated(chain):
    response = httpx.post(
        chain.v1 + "/chat/completions", json=CHAT, headers={"x-session-id": "has a space"}, timeout=30
    )
    assert response.status_code == 200
    assert response.headers["x-switchyard-model-refused-id"] == "header:x-session-id"
