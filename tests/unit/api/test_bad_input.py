"""Bad input gets a clear 4xx in the OpenAI shape, and nothing is forwarded or captured: the shape checks,
in process (tests/support/inprocess.py). What needs real sockets, uvicorn or Switchyard's logs stays in
tests/integration/test_bad_input.py."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import orjson
import pytest

from tests.support.inprocess import InProcessServer, in_process_server
from tests.support.openai_errors import assert_openai_error, check_error_body, nested_arrays

# Small, so the over-limit cases send one or two megabytes rather than the default 32 MiB.
MAX_BODY_BYTES = 1024 * 1024
KEPT_SESSION = "keep-me-1"

# orjson parses up to 1024 levels of nesting but serialises only up to 254, so a body between the two
# parses fine and then could not be sent upstream (or echoed back): it must be refused up front.
JSON_DEPTH_GAP = 500


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[InProcessServer]:
    with in_process_server(tmp_path_factory.mktemp("bad-input"), max_body_bytes=MAX_BODY_BYTES) as server:
        # One real session, for the session routes' parameter checks to have something to read.
        reply = server.post("/v1/responses", {"input": "keep this"}, headers={"x-session-id": KEPT_SESSION})
        assert reply.status_code == 200, reply.text
        yield server


def _capture_files(server: InProcessServer) -> set[str]:
    # GET /v1/sessions first waits for queued records, so anything a request caused is on disk now.
    assert server.get("/v1/sessions").status_code == 200
    return {str(path) for path in Path(server.settings.capture_dir).rglob("*")}


@contextmanager
def nothing_forwarded(server: InProcessServer) -> Iterator[None]:
    """The block's requests reach neither the upstream nor the capture store."""
    upstream_before = len(server.upstream.model_calls)
    files_before = _capture_files(server)
    yield
    assert len(server.upstream.model_calls) == upstream_before, "a bad request was forwarded upstream"
    assert _capture_files(server) == files_before, "a bad request changed the capture dir"


def post(server: InProcessServer, endpoint: str, content: bytes, headers: dict | None = None) -> httpx.Response:
    return server.client.post(
        "/v1" + endpoint, content=content, headers={"content-type": "application/json", **(headers or {})}
    )


def post_json(server: InProcessServer, endpoint: str, body: dict) -> httpx.Response:
    return post(server, endpoint, orjson.dumps(body))


def test_nothing_forwarded_notices_a_forwarded_call(server):
    """Negative control: the check the 4xx tests lean on fails for a call that did go upstream."""
    with pytest.raises(AssertionError, match="forwarded upstream"):
        with nothing_forwarded(server):
            assert post_json(server, "/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}).is_success


# ---- malformed bodies ------------------------------------------------------------------------------

MALFORMED = {
    "truncated": b'{"input": "hi", "messages": [{"role": "user"',
    "unclosed string": b'{"input": "hi',
    "trailing comma": b'{"input": "hi",}',
    "single quotes": b"{'input': 'hi'}",
    "trailing garbage": b'{"input": "hi"} {"input": "again"}',
    "form encoded": b"input=hi&model=x",
    "bare word": b"hello",
    "NaN": b'{"input": "hi", "temperature": NaN}',
    "number overflow": b'{"input": "hi", "temperature": 1e400}',
    "byte order mark": b'\xef\xbb\xbf{"input": "hi"}',
    "whitespace only": b"  \n\t ",
    "empty": b"",
}
INVALID_UTF8 = {
    "raw 0xff in a string": b'{"input": "caf\xff", "messages": [{"role": "user", "content": "caf\xff"}]}',
    "overlong slash": b'{"input": "\xc0\xaf", "messages": [{"role": "user", "content": "\xc0\xaf"}]}',
    "truncated multibyte": b'{"input": "\xe2\x82", "messages": [{"role": "user", "content": "\xe2\x82"}]}',
    "encoded surrogate": b'{"input": "\xed\xa0\x80", "messages": [{"role": "user", "content": "\xed\xa0\x80"}]}',
    "lone surrogate escape": b'{"input": "\\ud800", "messages": [{"role": "user", "content": "\\ud800"}]}',
    "invalid key": b'{"\xff": 1, "input": "hi"}',
}
NOT_AN_OBJECT = {
    "array": b"[]",
    "list of bodies": b'[{"input": "hi"}]',
    "string": b'"hi"',
    "number": b"5",
    "null": b"null",
    "true": b"true",
}


@pytest.mark.parametrize("endpoint", ["/responses", "/chat/completions"])
@pytest.mark.parametrize(
    "body", list(MALFORMED.values()) + list(INVALID_UTF8.values()), ids=list(MALFORMED) + list(INVALID_UTF8)
)
def test_malformed_or_invalid_utf8_json_is_400(server, endpoint, body):
    with nothing_forwarded(server):
        error = assert_openai_error(post(server, endpoint, body), 400)
    assert error["code"] == "invalid_json"


@pytest.mark.parametrize("endpoint", ["/responses", "/chat/completions"])
@pytest.mark.parametrize("body", list(NOT_AN_OBJECT.values()), ids=list(NOT_AN_OBJECT))
def test_json_that_is_not_an_object_is_400(server, endpoint, body):
    with nothing_forwarded(server):
        error = assert_openai_error(post(server, endpoint, body), 400)
    assert "object" in error["message"]


# ---- wrong types and values --------------------------------------------------------------------------


RESPONSES_WRONG = [
    ("input", 5),
    ("input", {"role": "user", "content": "hi"}),
    ("input", [5]),
    ("input", [{"type": "message", "role": "robot", "content": "hi"}]),
    ("input", [{"type": "message", "role": "user", "content": 5}]),
    ("input", [{"type": "message", "role": [], "content": "hi"}]),
    ("input", [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": 5}]}]),
    ("input", [{"type": "function_call", "call_id": 1, "name": "f", "arguments": "{}"}]),
    ("input", [{"type": "web_search_call"}]),
    ("input", []),
    ("tools", "x"),
    ("tools", [{"type": "function"}]),
    ("tools", [{"type": "function", "name": "f", "parameters": "x"}]),
    ("tool_choice", 5),
    ("tool_choice", "sometimes"),
    ("max_output_tokens", "10"),
    ("max_output_tokens", 10.5),
    ("max_output_tokens", True),
    ("temperature", "hot"),
    ("temperature", [1]),
    ("top_p", "x"),
    ("top_logprobs", 50),
    ("instructions", 5),
    ("text", "x"),
    ("text", {"format": {"type": "xml"}}),
    ("reasoning", "high"),
    ("metadata", [1]),
    ("user", 5),
    ("include", "x"),
    ("previous_response_id", 5),
    ("background", "yes"),
    ("store", "yes"),
    ("conversation", 5),
    ("stream", "yes"),
    ("stream", 1),
    ("parallel_tool_calls", "yes"),
    ("seed", "x"),
    ("presence_penalty", "x"),
    ("model", 5),
]


@pytest.mark.parametrize("field, value", RESPONSES_WRONG)
def test_responses_wrong_type_is_400_naming_the_field(server, field, value):
    body = {"input": "hi", field: value}
    with nothing_forwarded(server):
        error = assert_openai_error(post_json(server, "/responses", body), 400)
    assert error["param"] and error["param"].split(".")[0].split("[")[0] == field, error
    assert error["type"] == "invalid_request_error"


CHAT_WRONG = [
    ("messages", "x"),
    ("messages", []),
    ("messages", [1]),
    ("messages", [{"content": "no role"}]),
    ("messages", [{"role": 5, "content": "hi"}]),
    ("stream", "yes"),
    ("max_tokens", "10"),
    ("max_tokens", -1),
    ("max_completion_tokens", 1.5),
    ("n", "2"),
    ("top_logprobs", -1),
    ("temperature", "hot"),
    ("tools", "x"),
]


@pytest.mark.parametrize("field, value", CHAT_WRONG)
def test_chat_wrong_type_is_400_naming_the_field(server, field, value):
    body = {"model": "x", "messages": [{"role": "user", "content": "hi"}], field: value}
    with nothing_forwarded(server):
        error = assert_openai_error(post_json(server, "/chat/completions", body), 400)
    assert error["param"] and error["param"].split("[")[0] == field, error


@pytest.mark.parametrize("fields", [["bogus"], ["messages"], ["frobnicate", "input_text"]])
def test_responses_unknown_field_is_400_naming_it(server, fields):
    body = {"input": "hi", **{name: 1 for name in fields}}
    with nothing_forwarded(server):
        error = assert_openai_error(post_json(server, "/responses", body), 400)
    assert error["param"] in fields and error["param"] in error["message"]
    assert error["code"] == "unsupported_parameter"


def test_responses_without_input_is_400(server):
    with nothing_forwarded(server):
        error = assert_openai_error(post_json(server, "/responses", {"model": "x"}), 400, param="input")
    assert error["code"] == "missing_required_parameter"


# ---- token limits ----------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [b"-5", b"0", b"-1000000000000", b"1e12", b"1000000000000000000000000000000"])
def test_impossible_max_output_tokens_is_400(server, value):
    # 10**30 does not fit 64 bits and orjson parses it as a float: still not a positive integer.
    with nothing_forwarded(server):
        assert_openai_error(
            post(server, "/responses", b'{"input": "hi", "max_output_tokens": ' + value + b"}"),
            400,
            param="max_output_tokens",
        )


def test_absurd_but_well_formed_token_limit_is_forwarded(server):
    """Decision: 10**12 is a valid positive integer, so it is forwarded as is. Only the model server knows the
    route's context length (max_model_len discovery is best effort), and vLLM answers such a request with a 400
    that is relayed; the mock clamps instead, so here the call succeeds."""
    reply = post_json(server, "/responses", {"input": "hi", "max_output_tokens": 10**12})
    assert reply.status_code == 200, reply.text
    assert server.upstream.model_calls[-1].json()["max_tokens"] == 10**12
    reply = post_json(
        server, "/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10**12}
    )
    assert reply.status_code == 200, reply.text
    assert server.upstream.model_calls[-1].json()["max_tokens"] == 10**12
    # When the upstream refuses it (as vLLM does), the client gets that 400 in the OpenAI shape.
    refused = post_json(server, "/responses", {"input": "hi [[mock:error 400]]", "max_output_tokens": 10**12})
    assert_openai_error(refused, 400)


# ---- size and depth ----------------------------------------------------------------------------------


@pytest.mark.parametrize("endpoint", ["/responses", "/chat/completions"])
def test_body_over_the_limit_is_413_with_content_length(server, endpoint):
    body = b'{"input": "' + b"x" * (2 * MAX_BODY_BYTES) + b'"}'
    with nothing_forwarded(server):
        error = assert_openai_error(post(server, endpoint, body), 413)
    assert error["code"] == "request_too_large"


def test_body_just_under_the_limit_is_served(server):
    # `user` is passed on but never tokenized (metadata, the other such field, is bounded to short strings).
    body = orjson.dumps({"input": "hi", "user": "x" * (MAX_BODY_BYTES - 100)})
    assert len(body) <= MAX_BODY_BYTES
    assert post(server, "/responses", body).status_code == 200


@pytest.mark.parametrize("endpoint", ["/responses", "/chat/completions"])
@pytest.mark.parametrize(
    "body",
    [
        nested_arrays(100_000),
        b'{"input": "hi", "metadata": {"a": ' + nested_arrays(100_000) + b"}}",
        b'{"input": "hi", "messages": [{"role": "user", "content": "hi"}], "x": '
        + b'{"a":' * 5000
        + b"1"
        + b"}" * 5000
        + b"}",
    ],
    ids=["100k arrays", "100k arrays in a field", "5k objects in a field"],
)
def test_deeply_nested_json_is_400(server, endpoint, body):
    with nothing_forwarded(server):
        error = assert_openai_error(post(server, endpoint, body), 400)
    assert error["code"] == "invalid_json"


@pytest.mark.parametrize(
    "endpoint, body",
    [
        (
            "/chat/completions",
            b'{"messages": [{"role": "user", "content": "hi"}], "extra": ' + nested_arrays(JSON_DEPTH_GAP) + b"}",
        ),
        ("/responses", b'{"input": "hi", "metadata": {"deep": ' + nested_arrays(JSON_DEPTH_GAP) + b"}}"),
        (
            "/responses",
            b'{"input": "hi", "text": {"format": {"type": "json_schema", "schema": {"deep": '
            + nested_arrays(JSON_DEPTH_GAP)
            + b"}}}}",
        ),
    ],
    ids=["chat extra field", "responses metadata", "responses json_schema"],
)
def test_json_deeper_than_the_server_can_reserialise_is_400(server, endpoint, body):
    with nothing_forwarded(server):
        assert_openai_error(post(server, endpoint, body), 400)


# ---- the session API's parameters, and methods ---------------------------------------------------------


@pytest.mark.parametrize(
    "query",
    [
        b"parent=..",
        b"parent=a%00b",
        b"after=..%2F%20x",
        b"parent=" + b"A" * 10_000,
        b"limit=-1",
        b"limit=0",
        b"limit=abc",
        b"limit=99999999999999999999",
        b"roots_only=maybe",
    ],
)
def test_bad_session_list_parameters_are_400(server, query):
    response = server.get("/v1/sessions?" + query.decode())
    assert response.request.url.query == query  # sent as written, escapes and all
    assert response.status_code == 400, response.text[:300]
    check_error_body(response.content)


def test_bad_rollout_parameter_is_400(server):
    response = server.get(f"/v1/sessions/{KEPT_SESSION}/rollout", params={"allow_partial": "perhaps"})
    assert_openai_error(response, 400, param="allow_partial")


def test_wrong_method_is_405_in_the_openai_shape(server):
    assert_openai_error(server.get("/v1/responses"), 405)
    assert_openai_error(server.client.delete("/v1/sessions"), 405)
