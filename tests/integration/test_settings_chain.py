"""Settings that shape the upstream call, seen from the upstream's side (this server attached to the mock)."""

from __future__ import annotations

import threading
import time

import httpx

from tests.support.procs import start_attached


def last_request(mock_upstream) -> dict:
    return httpx.get(mock_upstream + "/mock/requests").json()["requests"][-1]


def post(url, path="/v1/chat/completions", headers=None, **body):
    if path.endswith("/chat/completions"):
        body.setdefault("messages", [{"role": "user", "content": "hi"}])
    return httpx.post(url + path, json=body, headers=headers or {}, timeout=30)


def test_headers_body_and_route_sent_upstream(tmp_path, mock_upstream):
    proc, url = start_attached(
        tmp_path,
        mock_upstream,
        switchyard_api_key="sy-key",
        default_headers={"x-team": "gym"},
        extra_body={"temperature": 0.5, "seed": 7},
        session_id_headers=["x-switchyard-session-id", "proxy_x_session_id"],
    )
    try:
        response = post(
            url,
            path="/ng-rollout/task0-r1/v1/chat/completions",
            model="caller-model",
            seed=1,
            headers={"authorization": "Bearer caller-secret"},
        )
        assert response.status_code == 200
        seen = last_request(mock_upstream)
        headers = {k.lower(): v for k, v in seen["headers"].items()}
        assert headers["authorization"] == "Bearer sy-key"  # the caller's key is not forwarded
        assert headers["x-team"] == "gym"
        assert headers["x-switchyard-session-id"] == headers["proxy_x_session_id"] == "task0-r1"
        body = seen["body"]
        assert body["model"] == "route-a"  # the route always replaces the caller's model
        assert body["temperature"] == 0.5 and body["seed"] == 1  # extra_body goes under the body
        post(url)  # no session headers at all: its session is inferred, and sent on like a named one
        headers = {k.lower(): v for k, v in last_request(mock_upstream)["headers"].items()}
        assert headers["x-switchyard-session-id"] == headers["proxy_x_session_id"]
        assert headers["proxy_x_session_id"].startswith("inferred-")
    finally:
        proc.stop()


def test_forward_session_id_off(tmp_path, mock_upstream):
    proc, url = start_attached(tmp_path, mock_upstream, forward_session_id=False)
    try:
        assert post(url, headers={"x-session-id": "s1"}).status_code == 200
        assert "x-switchyard-session-id" not in {k.lower() for k in last_request(mock_upstream)["headers"]}
    finally:
        proc.stop()


def test_aliases_strict_mode_and_auth(tmp_path, mock_upstream):
    proc, url = start_attached(
        tmp_path,
        mock_upstream,
        model_aliases={"default": "mock-model"},
        strict_models=True,
        api_keys=["model-key"],
        session_api_keys=["session-key"],
        forward_client_authorization=False,
    )
    model_auth = {"authorization": "Bearer model-key"}
    try:
        assert post(url, model="default").status_code == 401
        assert post(url, model="default", headers={"authorization": "Bearer wrong"}).status_code == 401
        assert post(url, model="default", headers=model_auth).status_code == 200
        assert last_request(mock_upstream)["body"]["model"] == "mock-model"
        unknown = post(url, model="nope", headers=model_auth)
        assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
        # The mock's own /v1/models lists mock-model, so the route name itself is accepted in strict mode.
        assert post(url, model="mock-model", headers=model_auth).status_code == 200
        sessions = url + "/v1/sessions"
        assert httpx.get(sessions, headers=model_auth).status_code == 401
        assert httpx.get(sessions, headers={"authorization": "Bearer session-key"}).status_code == 200
        assert httpx.get(url + "/health").status_code == 200  # probes stay open
    finally:
        proc.stop()


def test_forward_client_authorization(tmp_path, mock_upstream):
    proc, url = start_attached(tmp_path, mock_upstream, forward_client_authorization=True)
    try:
        post(url, headers={"authorization": "Bearer caller-secret"})
        assert last_request(mock_upstream)["headers"].get("authorization") == "Bearer caller-secret"
    finally:
        proc.stop()


def test_max_concurrent_requests_caps_upstream_calls(tmp_path, mock_upstream):
    proc, url = start_attached(tmp_path, mock_upstream, max_concurrent_requests=2)
    peak = 0
    done = threading.Event()

    def watch():
        nonlocal peak
        while not done.is_set():
            peak = max(peak, httpx.get(mock_upstream + "/mock/stats").json()["in_flight"])
            time.sleep(0.01)

    try:
        watcher = threading.Thread(target=watch)
        watcher.start()
        threads = [
            threading.Thread(
                target=post, args=(url,), kwargs={"messages": [{"role": "user", "content": "[[mock:sleep 300]] hi"}]}
            )
            for _ in range(6)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        done.set()
        watcher.join()
        assert peak == 2  # six calls at once, never more than two upstream
    finally:
        proc.stop()


def test_buffered_upstream_streams_still_stream_to_the_client_with_token_ids(tmp_path, mock_upstream):
    proc, url = start_attached(tmp_path, mock_upstream, buffer_upstream_streams=True)
    try:
        with httpx.stream(
            "POST",
            url + "/v1/chat/completions",
            headers={"x-session-id": "buffered"},
            timeout=30,
            json={"stream": True, "messages": [{"role": "user", "content": "hi there"}]},
        ) as r:
            lines = [line for line in r.iter_lines() if line.startswith("data: ")]
        assert lines[-1] == "data: [DONE]" and len(lines) >= 3
        assert last_request(mock_upstream)["body"]["stream"] is False  # called non-stream upstream
        records = httpx.get(url + "/v1/sessions/buffered/completions").json()["completions"]
        assert records[0]["stream"] is True and records[0]["is_valid"] is True
        assert records[0]["generation_token_ids"]
    finally:
        proc.stop()


def test_extra_body_goes_under_the_body_of_the_api_called(tmp_path, mock_upstream):
    """Gym's `extra_body: {max_output_tokens: 16}` is a Responses field; a vLLM knob reaches the chat body."""
    proc, url = start_attached(
        tmp_path,
        mock_upstream,
        extra_body={"max_output_tokens": 16, "chat_template_kwargs": {"enable_thinking": False}},
    )
    try:
        assert post(url, path="/v1/responses", input="hi").status_code == 200
        body = last_request(mock_upstream)["body"]
        assert body["max_tokens"] == 16 and body["chat_template_kwargs"] == {"enable_thinking": False}
        assert "max_output_tokens" not in body
        assert post(url, path="/v1/responses", input="hi", max_output_tokens=5).status_code == 200
        assert last_request(mock_upstream)["body"]["max_tokens"] == 5  # the caller's value wins
    finally:
        proc.stop()


def test_return_token_id_information_on_chat_returns_vllm_token_fields(tmp_path, mock_upstream):
    proc, url = start_attached(tmp_path, mock_upstream)
    try:
        reply = post(url, return_token_id_information=True).json()
        assert reply["prompt_token_ids"] and reply["choices"][0]["token_ids"]
        assert "return_token_id_information" not in last_request(mock_upstream)["body"]
    finally:
        proc.stop()
