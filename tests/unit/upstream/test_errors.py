"""Upstream failures as OpenAI errors: error replies keep their status and message; transport failures are 502/504."""

from __future__ import annotations

import asyncio

import httpx
import orjson
import pytest

from server.errors import OpenAIError
from server.upstream import http1
from server.upstream.client import Upstream
from server.upstream.errors import error_from_exception, error_from_httpx, error_from_reply
from tests.support.raw_http import RawServer, fixed


def test_an_openai_shaped_error_reply_keeps_status_message_type_code_and_param():
    body = b'{"error": {"message": "bad temperature", "type": "invalid_request_error", "code": "bad", "param": "t"}}'
    error = error_from_reply(400, body, {})
    assert (error.status, error.message, error.type, error.code, error.param) == (
        400,
        "bad temperature",
        "invalid_request_error",
        "bad",
        "t",
    )


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"error": "route not found"}', "route not found"),
        (b'{"message": "model overloaded"}', "model overloaded"),
        (b"<html>Bad Gateway</html>", "upstream returned HTTP 502: <html>Bad Gateway</html>"),
        (b"", "upstream returned HTTP 502"),
        (b'{"error": {"message": ""}}', 'upstream returned HTTP 502: {"error": {"message": ""}}'),
        (b"[1, 2]", "upstream returned HTTP 502: [1, 2]"),
    ],
)
def test_other_error_bodies_still_give_a_message(body, message):
    error = error_from_reply(502, body, {})
    assert error.status == 502 and error.message == message
    assert error.code == "upstream_error" and error.type == OpenAIError(502, "").type  # the default for the status


def test_a_429_always_carries_retry_after():
    assert error_from_reply(429, b"{}", {}).headers == {"retry-after": "1"}
    assert error_from_reply(429, b"{}", {"retry-after": "7"}).headers == {"retry-after": "7"}
    assert error_from_reply(503, b"{}", {"retry-after": "7"}).headers == {}


@pytest.mark.parametrize(
    ("exc", "status", "code"),
    [
        (http1.TimeoutError_("silent"), 504, "upstream_timeout"),
        (http1.ConnectError("refused"), 502, "upstream_unreachable"),
        (http1.ProtocolError("cut"), 502, "upstream_disconnected"),
        (http1.HTTPError("other"), 502, "upstream_error"),
    ],
)
def test_pooled_client_failures(exc, status, code):
    error = error_from_exception(exc, "http://127.0.0.1:4000/v1")
    assert (error.status, error.code) == (status, code)
    assert str(exc) in error.message


@pytest.mark.parametrize(
    ("exc", "status", "code"),
    [
        (httpx.ReadTimeout("silent"), 504, "upstream_timeout"),
        (httpx.ConnectTimeout("slow"), 504, "upstream_timeout"),
        (httpx.ConnectError("refused"), 502, "upstream_unreachable"),
        (httpx.RemoteProtocolError("cut"), 502, "upstream_disconnected"),
        (httpx.TooManyRedirects("loop"), 502, "upstream_error"),
    ],
)
def test_httpx_failures_map_the_same_way(exc, status, code):
    error = error_from_httpx(exc, "http://127.0.0.1:4000/v1")
    assert (error.status, error.code) == (status, code)


def upstream(port: int, timeout_s: float = 5.0) -> Upstream:
    return Upstream(
        f"http://127.0.0.1:{port}/v1",
        api_key="k",
        default_headers={},
        timeout_s=timeout_s,
        connect_timeout_s=2.0,
        max_connections=2,
    )


def get_json(reply, path: str = "/models", timeout_s: float = 2.0):
    """Upstream.get_json against a raw loopback server answering with `reply`: (result or error, request)."""

    async def scenario():
        async with RawServer(reply) as server:
            client = upstream(server.port)
            try:
                return await client.get_json(path, timeout_s=timeout_s), server.requests
            except OpenAIError as error:
                return error, server.requests
            finally:
                await client.aclose()

    return asyncio.run(scenario())


def test_get_json_returns_the_object():
    async def reply(request):
        return fixed(b'{"data": [{"id": "demo"}]}')

    result, requests = get_json(reply)
    assert result == {"data": [{"id": "demo"}]}
    assert requests[0].startswith(b"GET /v1/models HTTP/1.1") and b"authorization: Bearer k" in requests[0]


@pytest.mark.parametrize(
    ("answer", "status", "code"),
    [
        (fixed(b'{"error": {"message": "down for maintenance"}}', status=503), 503, "upstream_error"),
        (fixed(b"not json"), 502, "upstream_error"),
        (fixed(b"[1, 2, 3]"), 502, "upstream_error"),
        (None, 502, "upstream_disconnected"),  # the server hangs up without answering
    ],
)
def test_get_json_failures_are_openai_errors(answer, status, code):
    async def reply(request):
        return answer

    error, _ = get_json(reply)
    assert isinstance(error, OpenAIError) and (error.status, error.code) == (status, code)


def test_get_json_timeout_is_504():
    async def reply(request):
        await asyncio.sleep(30)
        return fixed(b"{}")

    error, _ = get_json(reply, timeout_s=0.3)
    assert isinstance(error, OpenAIError) and (error.status, error.code) == (504, "upstream_timeout")


def test_get_json_with_nothing_listening_is_502_unreachable():
    async def scenario():
        async with RawServer(lambda request: None) as server:
            port = server.port
        client = upstream(port)
        try:
            with pytest.raises(OpenAIError) as caught:
                await client.get_json("/models")
        finally:
            await client.aclose()
        return caught.value

    error = asyncio.run(scenario())
    assert (error.status, error.code) == (502, "upstream_unreachable")


def test_switchyards_wrapped_engine_error_is_unwrapped():
    # Switchyard 0.3.0 puts the engine's whole JSON error, as text, in its own error's message.
    engine = {
        "error": {
            "message": "This model's maximum context length is 32768 tokens. However, your request has 40009 input tokens.",
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
    }
    wrapped = {
        "error": {
            "message": orjson.dumps(engine).decode(),
            "type": "invalid_request_error",
            "param": None,
            "code": "context_length_exceeded",
        }
    }
    error = error_from_reply(400, orjson.dumps(wrapped), {})
    assert error.status == 400
    body = orjson.loads(error.to_json())["error"]
    assert body == engine["error"]


@pytest.mark.parametrize(
    "message",
    ['{"not": "an error"}', "{broken json", '{"error": {"message": ""}}', '{"error": 5}', "[1, 2]"],
)
def test_a_message_that_only_looks_like_json_is_kept_as_it_is(message):
    wrapped = {"error": {"message": message, "type": "invalid_request_error", "code": "x"}}
    body = orjson.loads(error_from_reply(400, orjson.dumps(wrapped), {}).to_json())["error"]
    assert body["message"] == message and body["code"] == "x"


def test_the_outer_code_and_param_stay_when_the_engine_gave_none():
    inner = {"error": {"message": "engine says no", "type": "BadRequestError"}}
    wrapped = {"error": {"message": orjson.dumps(inner).decode(), "param": "model", "code": "outer_code"}}
    body = orjson.loads(error_from_reply(400, orjson.dumps(wrapped), {}).to_json())["error"]
    assert (body["message"], body["param"], body["code"]) == ("engine says no", "model", "outer_code")


def test_an_engine_error_given_as_a_plain_string_is_unwrapped_too():
    wrapped = {"error": {"message": '{"error": "engine overloaded"}', "code": "upstream_busy"}}
    body = orjson.loads(error_from_reply(503, orjson.dumps(wrapped), {}).to_json())["error"]
    assert (body["message"], body["code"]) == ("engine overloaded", "upstream_busy")
