"""Bearer-key checks: open when no keys are set, model keys for model calls, session keys for /v1/sessions."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from middleware.auth import AuthMiddleware


async def inner_app(scope, receive, send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"inner"})


def call(app, path: str, authorization: bytes | None = None, scope_type: str = "http") -> tuple[int, dict, bytes]:
    """(status, headers, body) of one request through `app`."""
    headers = [(b"content-type", b"application/json")]
    if authorization is not None:
        headers.append((b"authorization", authorization))
    scope = {"type": scope_type, "path": path, "method": "GET", "headers": headers}
    sent: list[dict] = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    start = sent[0]
    body = b"".join(m.get("body", b"") for m in sent[1:])
    return start["status"], {k.decode(): v.decode() for k, v in start["headers"]}, body


def guarded(api_keys=("model-key",), session_api_keys=()) -> AuthMiddleware:
    return AuthMiddleware(inner_app, api_keys=list(api_keys), session_api_keys=list(session_api_keys))


def test_without_keys_everything_is_open():
    app = guarded(api_keys=())
    assert call(app, "/v1/chat/completions")[0] == 200
    assert call(app, "/v1/sessions")[0] == 200


@pytest.mark.parametrize(
    "authorization",
    [None, b"Bearer wrong", b"model-key", b"Basic model-key", b"Bearer ", b"Bearer model-key-and-more"],
)
def test_a_missing_or_wrong_key_is_a_401_in_the_openai_shape(authorization):
    status, headers, body = call(guarded(), "/v1/chat/completions", authorization)
    assert status == 401
    assert headers["www-authenticate"] == "Bearer"
    error = orjson.loads(body)["error"]
    assert error["code"] == "invalid_api_key" and set(error) == {"message", "type", "param", "code"}


@pytest.mark.parametrize("authorization", [b"Bearer model-key", b"bearer model-key", b"BEARER  model-key "])
def test_the_right_key_passes_whatever_the_scheme_case(authorization):
    assert call(guarded(), "/v1/responses", authorization) == (200, {}, b"inner")


def test_one_of_several_keys_is_enough():
    app = guarded(api_keys=("a-key", "b-key"))
    assert call(app, "/v1/responses", b"Bearer b-key")[0] == 200
    assert call(app, "/v1/responses", b"Bearer c-key")[0] == 401


def test_health_stays_open_and_non_http_scopes_pass():
    app = guarded()
    assert call(app, "/health")[0] == 200
    assert call(app, "/v1/chat/completions", scope_type="lifespan-like")[0] == 200


def test_metrics_take_a_model_key_unless_metrics_open():
    assert call(guarded(), "/metrics")[0] == 401
    assert call(guarded(), "/metrics", b"Bearer model-key")[0] == 200
    open_metrics = AuthMiddleware(inner_app, api_keys=["model-key"], session_api_keys=[], metrics_open=True)
    assert call(open_metrics, "/metrics")[0] == 200
    assert call(open_metrics, "/v1/models")[0] == 401  # only /metrics is opened


def test_session_endpoints_take_the_session_keys_when_set():
    app = guarded(api_keys=("model-key",), session_api_keys=("session-key",))
    assert call(app, "/v1/sessions", b"Bearer session-key")[0] == 200
    assert call(app, "/v1/sessions/abc/rollout", b"Bearer model-key")[0] == 401  # a model key is not enough
    assert call(app, "/v1/chat/completions", b"Bearer session-key")[0] == 401  # nor the other way round
    assert call(app, "/v1/chat/completions", b"Bearer model-key")[0] == 200


def test_session_endpoints_fall_back_to_the_model_keys():
    app = guarded(api_keys=("model-key",))
    assert call(app, "/v1/sessions", b"Bearer model-key")[0] == 200
    assert call(app, "/v1/sessions")[0] == 401


def _call_with(app, path: str, headers: list[tuple[bytes, bytes]]) -> tuple[int, bytes]:
    scope = {"type": "http", "path": path, "method": "POST", "headers": headers}
    sent: list[dict] = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])


def test_anthropic_clients_key_is_taken_from_x_api_key():
    assert _call_with(guarded(), "/v1/messages", [(b"x-api-key", b"model-key")]) == (200, b"inner")
    assert _call_with(guarded(), "/v1/messages", [(b"x-api-key", b"wrong")])[0] == 401


def test_an_anthropic_client_is_refused_in_anthropic_shape():
    for path, headers in (("/v1/messages", []), ("/v1/models", [(b"anthropic-version", b"2023-06-01")])):
        status, body = _call_with(guarded(), path, headers)
        assert status == 401
        assert orjson.loads(body) == {
            "type": "error",
            "error": {"type": "authentication_error", "message": orjson.loads(body)["error"]["message"]},
        }
    # Everyone else keeps the OpenAI shape.
    assert "code" in orjson.loads(_call_with(guarded(), "/v1/responses", [])[1])["error"]
