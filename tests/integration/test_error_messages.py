"""Errors say what happened: an engine that cut its stream, a base URL without `/v1`."""

from __future__ import annotations

import json

import httpx
import pytest

CUT = "[[mock:tokens 40]] [[mock:streamcut 5]]"  # the model server drops the connection mid-stream


def test_a_chat_stream_the_engine_cut_says_so(chain):
    body = {"model": "x", "stream": True, "messages": [{"role": "user", "content": CUT}]}
    headers = {"x-session-id": "cut-chat"}
    with httpx.stream("POST", chain.v1 + "/chat/completions", json=body, headers=headers) as r:
        assert r.status_code == 200
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    error = json.loads(lines[-1].removeprefix("data: "))["error"]
    assert error["code"] == "upstream_stream_cut", error
    assert "engine's stream ended early" in error["message"], error


def test_a_responses_stream_the_engine_cut_says_so(chain):
    body = {"model": "x", "stream": True, "input": CUT}
    headers = {"x-session-id": "cut-responses"}
    events = []
    with httpx.stream("POST", chain.v1 + "/responses", json=body, headers=headers) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                events.append(json.loads(line.removeprefix("data: ")))
    error = next(event for event in events if event["type"] == "error")
    assert error["code"] == "upstream_stream_cut", error
    assert "engine's stream ended early" in error["message"], error
    assert events[-1]["type"] == "response.failed"


@pytest.mark.parametrize(
    ("method", "path", "meant"),
    [
        ("POST", "/chat/completions", "/v1/chat/completions"),
        ("POST", "/responses", "/v1/responses"),
        ("GET", "/models", "/v1/models"),
        ("POST", "/v1/v1/chat/completions", "/v1/chat/completions"),
    ],
)
def test_a_path_that_exists_under_v1_gets_a_did_you_mean(chain, method, path, meant):
    response = httpx.request(method, chain.url + path, json={}, timeout=10)
    assert response.status_code == 404
    error = response.json()["error"]
    assert error["code"] == "endpoint_not_found"
    assert error["message"].endswith(f"did you mean {meant}?"), error


def test_a_path_that_exists_nowhere_gets_no_suggestion(chain):
    error = httpx.post(chain.url + "/completely/else", json={}, timeout=10).json()["error"]
    assert error["code"] == "endpoint_not_found" and "did you mean" not in error["message"], error
