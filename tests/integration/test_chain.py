"""The serving chain on real loopback processes: mock upstream → hosted Switchyard → this server."""

from __future__ import annotations

import signal
import socket
import sys
import time

import httpx
import openai
import psutil
import pytest

from tests.support.procs import free_port, start_server, start_switchyard_host, wait_for
from tests.support.stack import launch_stack

TOKEN_FIELDS = {"return_token_ids": True, "logprobs": True, "top_logprobs": 0}


def client(chain, **headers) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=chain.v1,
        api_key="sk-test",
        default_headers=headers or None,
        http_client=httpx.Client(),
        max_retries=0,
    )


def last_upstream_body(chain) -> dict:
    return chain.mock_requests()[-1]["body"]


def test_chat_non_stream_keeps_token_ids_and_logprobs(chain):
    reply = client(chain).chat.completions.create(
        model="anything", messages=[{"role": "user", "content": "hello there"}], extra_body=TOKEN_FIELDS
    )
    raw = reply.model_dump()
    choice = raw["choices"][0]
    assert reply.model == "mock-model"  # the routed target Switchyard reports
    assert choice["message"]["content"]
    assert isinstance(raw["prompt_token_ids"], list) and raw["prompt_token_ids"]
    assert len(choice["token_ids"]) == len(choice["logprobs"]["content"]) == raw["usage"]["completion_tokens"]
    body = last_upstream_body(chain)
    assert body["model"] == "mock-model"  # Switchyard swapped the route for the target id


def test_chat_stream_keeps_per_chunk_token_ids(chain):
    stream = client(chain).chat.completions.create(
        model="x", messages=[{"role": "user", "content": "stream please"}], stream=True, extra_body=TOKEN_FIELDS
    )
    chunks = [c.model_dump() for c in stream]
    assert chunks[0].get("prompt_token_ids")
    ids = [i for c in chunks for ch in c["choices"] for i in (ch.get("token_ids") or [])]
    text = "".join(ch["delta"].get("content") or "" for c in chunks for ch in c["choices"])
    final = (
        client(chain)
        .chat.completions.create(
            model="x", messages=[{"role": "user", "content": "stream please"}], extra_body=TOKEN_FIELDS
        )
        .model_dump()
    )
    assert ids == final["choices"][0]["token_ids"]
    assert text == final["choices"][0]["message"]["content"]


def test_client_gets_the_shape_it_asked_for(chain):
    """Token ids requested for capture are not pushed onto a client that did not ask for them."""
    sdk = client(chain, **{"x-session-id": "shape-check"})
    reply = sdk.chat.completions.create(model="x", messages=[{"role": "user", "content": "hi"}]).model_dump()
    assert "prompt_token_ids" not in reply and "token_ids" not in reply["choices"][0]
    assert reply["choices"][0]["logprobs"] is None
    sent = last_upstream_body(chain)
    assert sent["return_token_ids"] is True and sent["logprobs"] is True  # but capture asked for them
    chunks = [
        c.model_dump()
        for c in sdk.chat.completions.create(model="x", messages=[{"role": "user", "content": "hi"}], stream=True)
    ]
    assert all("prompt_token_ids" not in c for c in chunks)
    assert all(ch.get("logprobs") is None and "token_ids" not in ch for c in chunks for ch in c["choices"])


@pytest.mark.parametrize(
    "path_prefix, headers, body_extra, expected",
    [
        ("/ng-rollout/task0-r1-a0", {}, {}, "task0-r1-a0"),
        ("", {"x-switchyard-session-id": "S-switchyard"}, {}, "S-switchyard"),
        ("", {"proxy_x_session_id": "S-proxyhdr"}, {}, "S-proxyhdr"),
        ("", {}, {"proxy_x_session_id": "S-body"}, "S-body"),
        ("", {"x-session-id": "S-opencode"}, {}, "S-opencode"),
        ("", {"thread-id": "S-codex-thread"}, {}, "S-codex-thread"),
        ("", {"session-id": "S-codex-session"}, {}, "S-codex-session"),
    ],
)
def test_session_id_from_each_source_reaches_switchyard(chain, path_prefix, headers, body_extra, expected):
    body = {"model": "x", "messages": [{"role": "user", "content": "who am i"}], **body_extra}
    response = httpx.post(chain.url + path_prefix + "/v1/chat/completions", json=body, headers=headers, timeout=30)
    assert response.status_code == 200, response.text
    # Switchyard's own request log (fd 2 of the server process) names the session.
    assert wait_for(lambda: f'session_id="{expected}"' in chain.proc.output(), 5)
    assert "proxy_x_session_id" not in last_upstream_body(chain)  # ours, never forwarded


def test_bad_session_id_is_never_forwarded(chain):
    response = httpx.post(
        chain.url + "/v1/chat/completions",
        timeout=30,
        json={"model": "x", "messages": [{"role": "user", "content": "x"}], "proxy_x_session_id": "../ ../etc/passwd"},
    )
    assert response.status_code == 200
    assert "../ ../etc/passwd" not in chain.proc.output()


def test_models_and_health(chain):
    models = httpx.get(chain.v1 + "/models").json()
    assert models["data"][0]["id"] == "demo" and models["data"][0]["max_model_len"] == 32768
    health = httpx.get(chain.url + "/health").json()
    assert health["status"] == "ok" and health["mode"] == "launch-hosted" and health["proxy"]["up"] is True


# ---- errors in the OpenAI shape -------------------------------------------------------------------


def assert_openai_error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) >= {"message", "type", "param", "code"} and error["message"]
    return error


def chat(chain, content: str, **kw) -> httpx.Response:
    return httpx.post(
        chain.v1 + "/chat/completions",
        timeout=60,
        json={"model": "x", "messages": [{"role": "user", "content": content}], **kw},
    )


def test_upstream_statuses_are_kept(chain):
    assert_openai_error(chat(chain, "[[mock:error 500]]"), 500)
    assert_openai_error(chat(chain, "[[mock:error 400]]"), 400)
    limited = chat(chain, "[[mock:error 429 1]]")
    assert_openai_error(limited, 429)
    assert limited.headers.get("retry-after")


def test_client_errors(chain):
    bad_json = httpx.post(
        chain.v1 + "/chat/completions",
        content=b'{"messages": [',
        headers={"content-type": "application/json"},
    )
    assert_openai_error(bad_json, 400)
    too_big = httpx.post(chain.v1 + "/chat/completions", content=b"x" * (33 * 1024 * 1024))
    assert_openai_error(too_big, 413)
    assert_openai_error(httpx.get(chain.v1 + "/nope"), 404)
    assert_openai_error(httpx.get(chain.v1 + "/chat/completions"), 405)
    assert_openai_error(httpx.post(chain.v1 + "/chat/completions", json={"messages": "hi"}), 400)


def test_mid_stream_failure_ends_with_an_error_event(chain):
    with httpx.stream(
        "POST",
        chain.v1 + "/chat/completions",
        timeout=30,
        json={
            "model": "x",
            "stream": True,
            "messages": [{"role": "user", "content": "[[mock:tokens 40]] [[mock:streamcut 5]]"}],
        },
    ) as r:
        assert r.status_code == 200
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert '"error"' in lines[-1]
    assert lines[-1] != "data: [DONE]"


def test_upstream_timeout_is_504(mock_upstream, tmp_path):
    config = tmp_path / "cfg.yaml"
    config.write_text("upstream_timeout_s: 1.0\n")
    stack = launch_stack(mock_upstream, tmp_path / "cap", "--config", str(config))
    try:
        started = time.monotonic()
        assert_openai_error(chat(stack, "[[mock:hang 30]]"), 504)
        # Far from a timing test: the upstream would have answered only after 30 s.
        assert time.monotonic() - started < 20
    finally:
        stack.proc.stop()


def test_connection_refused_is_502():
    dead = free_port()  # nothing listens there
    proc, url = start_server(
        "--switchyard-base-url", f"http://127.0.0.1:{dead}/v1", "--switchyard-model", "r", "--no-capture", wait=False
    )
    try:
        proc.wait_http(url + "/health", expect=503)
        health = httpx.get(url + "/health").json()
        assert health["proxy"]["up"] is False and health["mode"] == "attach"
        response = httpx.post(
            url + "/v1/chat/completions",
            timeout=30,
            json={"messages": [{"role": "user", "content": "x"}]},
        )
        assert_openai_error(response, 502)
    finally:
        proc.stop()


def test_attach_to_a_switchyard_hosted_by_another_process(mock_upstream, tmp_path):
    host, switchyard_v1 = start_switchyard_host(mock_upstream)
    try:
        proc, url = start_server("--switchyard-base-url", switchyard_v1, "--capture-dir", str(tmp_path))
        try:
            health = httpx.get(url + "/health").json()
            assert health["mode"] == "attach" and health["route"] == "demo"
            reply = httpx.post(
                url + "/v1/chat/completions",
                headers={"x-session-id": "attached-1"},
                timeout=30,
                json={"messages": [{"role": "user", "content": "hi"}]},
            )
            assert reply.status_code == 200 and reply.json()["model"] == "mock-model"
            assert wait_for(lambda: 'session_id="attached-1"' in host.output(), 5)
        finally:
            proc.stop()
    finally:
        host.stop()


def test_launched_switchyard_that_dies_gives_503_then_is_restarted(mock_upstream, tmp_path):
    command = f"{sys.executable} -m server.switchyard.host --config {{deployment}} --port {{port}}"
    config = tmp_path / "cfg.yaml"
    config.write_text("proxy_restart_backoff_s: [3.0]\n")  # a wide window in which it is down
    stack = launch_stack(mock_upstream, tmp_path / "cap", "--switchyard-command", command, "--config", str(config))
    try:
        assert httpx.get(stack.url + "/health").json()["mode"] == "launch-process"
        assert chat(stack, "hi").status_code == 200
        children = psutil.Process(stack.proc.pid).children()
        assert len(children) == 1, "the launched Switchyard should be the server's only child"
        children[0].send_signal(signal.SIGKILL)
        children[0].wait(5)
        health = httpx.get(stack.url + "/health")
        assert health.status_code == 503 and health.json()["proxy"]["up"] is False
        assert_openai_error(chat(stack, "hi"), 503)
        wait_for(lambda: httpx.get(stack.url + "/health").status_code == 200, 30, interval=0.1)
        assert chat(stack, "hi again").status_code == 200
        restarted = psutil.Process(stack.proc.pid).children()
        assert len(restarted) == 1 and restarted[0].pid != children[0].pid
    finally:
        stack.proc.stop()
    restarted[0].wait(10)  # stopping the server stops the restarted Switchyard too


def test_bad_deployment_and_busy_port_fail_startup_with_exit_2(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("schema_version = 1\n[routes.broken]\n")
    proc, _ = start_server("--deployment", str(bad), wait=False)
    assert proc.popen.wait(60) == 2
    assert "missing field" in proc.output() and str(bad) in proc.output()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        proc, _ = start_server("--deployment", "demo", port=sock.getsockname()[1], wait=False)
        assert proc.popen.wait(60) == 2
        assert "cannot listen on" in proc.output()


def test_shutdown_closes_the_hosted_proxy(mock_upstream, tmp_path):
    stack = launch_stack(mock_upstream, tmp_path)
    proxy_url = httpx.get(stack.url + "/health").json()["proxy"]["url"]
    assert httpx.get(proxy_url + "/health").status_code == 200
    # uvicorn re-raises the signal after its graceful shutdown, so -SIGTERM is a clean exit too.
    assert stack.proc.stop() in (0, -signal.SIGTERM)
    assert "shutdown signal received; draining" in stack.proc.output()  # Switchyard's close() ran
    with pytest.raises(httpx.ConnectError):
        httpx.get(proxy_url + "/health")


@pytest.mark.parametrize("endpoint", ["/chat/completions", "/responses"])
def test_an_engine_error_reaches_the_client_unwrapped(chain, endpoint):
    """Switchyard wraps a context-length error's JSON body inside its own message; the client gets the engine's."""
    long_text = "word " * 40_000  # over the mock's 32768-token context
    body = (
        {"messages": [{"role": "user", "content": long_text}]}
        if endpoint == "/chat/completions"
        else {"input": long_text}
    )
    reply = httpx.post(chain.v1 + endpoint, json=body, timeout=60)
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["message"].startswith("This model's maximum context length is 32768 tokens.")
    assert (error["code"], error["param"], error["type"]) == (
        "context_length_exceeded",
        "messages",
        "invalid_request_error",
    )
