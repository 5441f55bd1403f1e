"""A path that is no route says so, and suggests the `/v1` path a client most likely meant (in process)."""

from __future__ import annotations

import pytest

from tests.support.inprocess import in_process_server


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with in_process_server(tmp_path_factory.mktemp("route-errors")) as server:
        yield server


@pytest.mark.parametrize(
    ("method", "path", "meant"),
    [
        ("POST", "/chat/completions", "/v1/chat/completions"),
        ("POST", "/responses", "/v1/responses"),
        ("GET", "/models", "/v1/models"),
        ("POST", "/v1/v1/chat/completions", "/v1/chat/completions"),
    ],
)
def test_a_path_that_exists_under_v1_gets_a_did_you_mean(server, method, path, meant):
    response = server.client.request(method, path, json={})
    assert response.status_code == 404
    error = response.json()["error"]
    assert error["code"] == "endpoint_not_found"
    assert error["message"].endswith(f"did you mean {meant}?"), error


def test_a_path_that_exists_nowhere_gets_no_suggestion(server):
    error = server.post("/completely/else", {}).json()["error"]
    assert error["code"] == "endpoint_not_found" and "did you mean" not in error["message"], error
