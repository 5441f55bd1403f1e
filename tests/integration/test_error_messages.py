"""Errors say what happened: an engine that cut its stream, through the real Switchyard.

(A base URL without `/v1` gets a did-you-mean: in process, tests/unit/api/test_route_errors.py.)"""

from __future__ import annotations

import json

import httpx

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
