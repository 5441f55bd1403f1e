"""Bad input against the real stack: a clear 4xx in the OpenAI shape, nothing forwarded, nothing captured.

Here: what needs the real stack (a bare socket, uvicorn's HTTP layer, Switchyard's logs, the capture dir on
disk). The request/response shape checks run in process, in tests/unit/api/test_bad_input.py."""

from __future__ import annotations

import hashlib
import re
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote, unquote_to_bytes

import httpx
import orjson
import pytest

from tests.support.openai_errors import assert_openai_error, check_error_body
from tests.support.procs import wait_for
from tests.support.stack import Stack, launch_stack

# Small, so the over-limit cases send one or two megabytes rather than the default 32 MiB.
MAX_BODY_BYTES = 1024 * 1024
SENTINEL_TEXT = "sentinel: no request may read or delete this file"
KEPT_SESSION = "keep-me-1"


@pytest.fixture(scope="module")
def stack(mock_upstream, tmp_path_factory) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("bad-input")
    config = root / "config.yaml"
    config.write_text(f"max_body_bytes: {MAX_BODY_BYTES}\n")
    stack = launch_stack(mock_upstream, root / "captures", "--config", str(config))
    try:
        # One real session, so the traversal attempts below have something they could destroy.
        reply = httpx.post(
            stack.v1 + "/responses",
            json={"input": "keep this"},
            timeout=30,
            headers={"x-session-id": KEPT_SESSION},
        )
        assert reply.status_code == 200, reply.text
        assert _record_count(stack, KEPT_SESSION) == 1
        for path in _sentinels(stack):
            path.write_text(SENTINEL_TEXT)
        yield stack
    finally:
        stack.proc.stop()


# ---- helpers ------------------------------------------------------------------------------------


def _sentinels(stack: Stack) -> list[Path]:
    """A file beside the capture dir and one inside it, outside any session directory."""
    return [stack.capture_dir.parent / "sentinel.txt", stack.capture_dir / "sentinel.txt"]


def _record_count(stack: Stack, session_id: str) -> int:
    response = httpx.get(f"{stack.v1}/sessions/{session_id}/completions", timeout=30)
    return len(response.json()["completions"]) if response.status_code == 200 else 0


def _capture_files(stack: Stack) -> set[str]:
    # GET /v1/sessions first waits for queued records, so anything a request caused is on disk now.
    assert httpx.get(stack.v1 + "/sessions", timeout=30).status_code == 200
    return {str(path.relative_to(stack.capture_dir)) for path in stack.capture_dir.rglob("*")}


def _session_dir(stack: Stack, session_id: bytes) -> Path:
    return stack.capture_dir / "sessions" / hashlib.sha256(session_id).hexdigest()


@contextmanager
def nothing_forwarded(stack: Stack) -> Iterator[None]:
    """The block's requests reach neither the upstream nor the capture store."""
    upstream_before = stack.mock_stats()["requests"]
    files_before = _capture_files(stack)
    yield
    assert stack.mock_stats()["requests"] == upstream_before, "a bad request was forwarded upstream"
    assert _capture_files(stack) == files_before, "a bad request changed the capture dir"


@contextmanager
def nothing_captured(stack: Stack) -> Iterator[None]:
    files_before = _capture_files(stack)
    yield
    assert _capture_files(stack) == files_before, "the request was captured"


def post(stack: Stack, endpoint: str, content: bytes | Iterator[bytes], headers: dict | None = None) -> httpx.Response:
    return httpx.post(
        stack.v1 + endpoint,
        content=content,
        timeout=60,
        headers={"content-type": "application/json", **(headers or {})},
    )


def post_json(stack: Stack, endpoint: str, body: dict, headers: dict | None = None) -> httpx.Response:
    return post(stack, endpoint, orjson.dumps(body), headers)


def raw_request(
    stack: Stack,
    method: str,
    target: bytes,
    headers: list[bytes] = (),
    body: bytes = b"",
    declared_length: int | None = None,
) -> tuple[int, bytes, bytes]:
    """One HTTP/1.1 exchange on a bare socket, so nothing (no client library) normalises or refuses the bytes."""
    port = int(stack.url.rsplit(":", 1)[1])
    head = method.encode() + b" " + target + b" HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n"
    for header in headers:
        head += header + b"\r\n"
    if body or method == "POST":
        length = len(body) if declared_length is None else declared_length
        head += b"content-type: application/json\r\ncontent-length: %d\r\n" % length
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head + b"\r\n" + body)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    status_line, _, rest = data.partition(b"\r\n")
    response_headers, _, response_body = rest.partition(b"\r\n\r\n")
    return int(status_line.split()[1]), response_headers.lower(), response_body


def switchyard_session_of(stack: Stack, request_id: str, timeout: float = 10.0) -> str:
    """The session id Switchyard logged for the call with this x-request-id (its `correlation_id`)."""
    marker = f'correlation_id="{request_id}"'

    def logged() -> list[str]:  # a list, so that an empty session id still counts as found
        for line in stack.proc.output().splitlines():
            if marker in line and "LLM request" in line and "session_id=" in line:
                # Switchyard quotes the value, escaping `"` and `\` with a backslash.
                quoted = re.match(r'((?:[^"\\]|\\.)*)"', line.split('session_id="', 1)[1])
                assert quoted is not None, line
                return [re.sub(r"\\(.)", r"\1", quoted.group(1))]
        return []

    found = wait_for(logged, timeout)
    assert found, f"Switchyard logged no request with {marker}"
    return found[0]


_request_counter = iter(range(1_000_000))


def request_id() -> str:
    return f"badinput-{next(_request_counter)}"


# ---- size (the HTTP layer's part; the shape checks are in tests/unit/api/test_bad_input.py) -----------------


@pytest.mark.parametrize("endpoint", ["/responses", "/chat/completions"])
def test_body_over_the_limit_is_413_when_chunked(stack, endpoint):
    def chunks() -> Iterator[bytes]:
        yield b'{"input": "'
        for _ in range(32):
            yield b"x" * (64 * 1024)
        yield b'"}'

    with nothing_forwarded(stack):
        response = post(stack, endpoint, chunks())
        assert response.request.headers.get("transfer-encoding") == "chunked"
        assert_openai_error(response, 413)


def test_413_does_not_wait_for_the_rest_of_an_announced_huge_body(stack):
    """The limit is applied while reading: a client announcing 100 MB gets its 413 after the limit, not the end."""
    with nothing_forwarded(stack):
        started = time.monotonic()
        status, headers, body = raw_request(
            stack, "POST", b"/v1/responses", body=b"x" * (MAX_BODY_BYTES + 4096), declared_length=100 * 1024 * 1024
        )
        assert status == 413 and time.monotonic() - started < 10
        check_error_body(body)


# ---- session ids that must never be used -------------------------------------------------------------

BAD_IDS = {
    "10k chars": b"A" * 10_000,
    "201 chars": b"a" * 201,
    "space": b"a b",
    "dot-dot": b"..",
    "non-ascii utf-8": "s\u00e9ance".encode(),
    "invalid utf-8": b"\xff\xfe",
}
# Printable ASCII without spaces is a safe header value, and the capture path is a hash: all accepted.
ACCEPTED_IDS = [
    "../../etc/passwd",
    "swe:django-1234:0",
    "user@example.com",
    "job/7/worker-2",
    "..\\..\\x",
    'a"b',
    "-abc",
    ".hidden",
]
SESSION_HEADERS = ["x-switchyard-session-id", "proxy_x_session_id", "x-session-id", "thread-id", "session-id"]


def _assert_uncorrelated_and_uncaptured(stack: Stack, response_status: int, rid: str, bad: bytes) -> None:
    assert response_status == 200
    # Switchyard saw the call, with no session at all: the bad id was neither forwarded nor replaced.
    assert switchyard_session_of(stack, rid) == ""
    assert not _session_dir(stack, bad).exists()


@pytest.mark.parametrize("header", SESSION_HEADERS)
@pytest.mark.parametrize("bad", list(BAD_IDS.values()), ids=list(BAD_IDS))
def test_bad_session_id_header_is_never_forwarded_or_captured(stack, header, bad):
    rid = request_id()
    with nothing_captured(stack):
        response = post_json(stack, "/responses", {"input": "hi"}, headers={header: bad, "x-request-id": rid})
        _assert_uncorrelated_and_uncaptured(stack, response.status_code, rid, bad)
    # ... but not silently: the answer names the source that was refused.
    assert response.headers["x-switchyard-model-refused-id"] == "header:" + header


def _refused_counts(stack: Stack) -> dict[str, int]:
    return httpx.get(stack.url + "/health", timeout=30).json()["correlation"]["refused_ids"]


def _metric_value(stack: Stack, name: str, label: str) -> float:
    text = httpx.get(stack.url + "/metrics", timeout=30).text
    for line in text.splitlines():
        if line.startswith(name + "{") and label in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.mark.parametrize("session_id", ACCEPTED_IDS)
def test_header_ids_with_colons_slashes_and_at_signs_are_forwarded_and_captured(stack, session_id):
    rid = request_id()
    response = post_json(
        stack, "/responses", {"input": "hi"}, headers={"x-session-id": session_id, "x-request-id": rid}
    )
    assert response.status_code == 200, response.text
    assert "x-switchyard-model-refused-id" not in response.headers
    assert switchyard_session_of(stack, rid) == session_id
    # The session API names it back (percent-encoded, as any client does with a path segment).
    reply = httpx.get(f"{stack.v1}/sessions/{quote(session_id, safe='')}/completions", timeout=30)
    assert reply.status_code == 200, reply.text
    assert [r["session_id"] for r in reply.json()["completions"]] == [session_id]
    # On disk it is one hashed directory directly under sessions/, whatever it holds.
    assert _session_dir(stack, session_id.encode()).is_dir()


def test_refused_ids_are_counted_in_health_and_metrics(stack):
    before = _refused_counts(stack).get("header:thread-id", 0)
    metric_before = _metric_value(stack, "switchyard_model_correlation_refused_ids_total", 'source="header:thread-id"')
    for _ in range(2):
        response = post_json(stack, "/responses", {"input": "hi"}, headers={"thread-id": "has space"})
        assert response.status_code == 200
    assert _refused_counts(stack)["header:thread-id"] == before + 2
    metric = _metric_value(stack, "switchyard_model_correlation_refused_ids_total", 'source="header:thread-id"')
    assert metric == metric_before + 2
    assert "refused the id in header:thread-id" in stack.proc.output()


@pytest.mark.parametrize(
    "bad",
    [v.decode("utf-8", "replace") for v in BAD_IDS.values()] + ["a\r\nb", "a\x00b"],
    ids=list(BAD_IDS) + ["CRLF", "NUL"],
)
def test_bad_session_id_body_field_is_never_forwarded_or_captured(stack, bad):
    rid = request_id()
    with nothing_captured(stack):
        response = post_json(
            stack,
            "/chat/completions",
            {"messages": [{"role": "user", "content": "hi"}], "proxy_x_session_id": bad},
            headers={"x-request-id": rid},
        )
        _assert_uncorrelated_and_uncaptured(stack, response.status_code, rid, bad.encode("utf-8", "surrogatepass"))
    assert "proxy_x_session_id" not in stack.mock_requests()[-1]["body"]
    # Not silent either: counted under its source.
    assert _refused_counts(stack).get("body:proxy_x_session_id", 0) > 0


def test_bad_parent_id_is_dropped_but_the_call_is_still_captured(stack):
    response = post_json(
        stack,
        "/responses",
        {"input": "child"},
        headers={"x-session-id": "child-of-bad-parent", "x-parent-session-id": "../ ../etc"},
    )
    assert response.status_code == 200
    assert response.headers["x-switchyard-model-refused-id"] == "header:x-parent-session-id"
    records = httpx.get(stack.v1 + "/sessions/child-of-bad-parent/completions").json()["completions"]
    assert [r["parent_session_id"] for r in records] == [None]


@pytest.mark.parametrize("header", ["x-session-id", "x-switchyard-session-id", "x-parent-session-id"])
@pytest.mark.parametrize("bad", [b"a\rb", b"a\nb", b"a\x00b", b"a\r\n\tb"], ids=["CR", "LF", "NUL", "CRLF fold"])
def test_control_characters_in_a_header_are_refused_by_the_http_layer(stack, header, bad):
    """uvicorn refuses these before the app runs: a plain-text 400 (not the OpenAI shape), nothing forwarded."""
    with nothing_forwarded(stack):
        status, _, _ = raw_request(
            stack, "POST", b"/v1/responses", [header.encode() + b": " + bad], body=b'{"input": "hi"}'
        )
    assert status == 400


ROLLOUT_PATH_IDS = {
    "CRLF": b"a%0D%0Ab",
    "NUL": b"a%00b",
    "dot-dot": b"..",
    "encoded dot-dot": b"%2e%2e",
    "10k chars": b"A" * 10_000,
    "space": b"a%20b",
    "leading dash": b"-x",
    "non-ascii": b"s%C3%A9ance",
    "invalid utf-8": b"%FF%FE",
    "encoded slashes": b"..%2F..%2Fetc",
    "encoded slash": b"a%2Fb",
    "raw NUL": b"a\x00b",
}


@pytest.mark.parametrize(
    "endpoint, body",
    [
        ("/v1/responses", b'{"input": "hi"}'),
        ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}]}'),
    ],
)
@pytest.mark.parametrize("raw_id", list(ROLLOUT_PATH_IDS.values()), ids=list(ROLLOUT_PATH_IDS))
def test_bad_rollout_prefix_id_is_never_forwarded_or_captured(stack, endpoint, body, raw_id):
    rid = request_id()
    upstream_before = stack.mock_stats()["requests"]
    with nothing_captured(stack):
        status, headers, reply = raw_request(
            stack, "POST", b"/ng-rollout/" + raw_id + endpoint.encode(), [b"x-request-id: " + rid.encode()], body
        )
        if status == 200:
            # The prefix was stripped and the call went on uncorrelated, as the design says.
            _assert_uncorrelated_and_uncaptured(stack, status, rid, unquote_to_bytes(raw_id))
            assert b"x-switchyard-model-refused-id: path:ng-rollout" in headers
        else:
            # An id holding a slash moves the route (404); a raw NUL is not HTTP at all (uvicorn's 400).
            assert status in (400, 404), (status, reply[:300])
            if status == 404:
                check_error_body(reply)
            assert stack.mock_stats()["requests"] == upstream_before
    assert f'session_id="{unquote_to_bytes(raw_id).decode("latin-1")}"' not in stack.proc.output()


# ---- the session API: no way out of the capture dir ----------------------------------------------------

TRAVERSAL_IDS = {
    "dot-dot": b"..",
    "dot": b".",
    "encoded dot-dot": b"%2e%2e",
    "upper encoded dot-dot": b"%2E%2E",
    "double encoded": b"%252e%252e",
    "encoded slash to sentinel": b"..%2F..%2Fsentinel.txt",
    "encoded slash to inner sentinel": b"..%2Fsentinel.txt",
    "all encoded": b"%2e%2e%2f%2e%2e%2fsentinel.txt",
    "encoded slash only": b"%2F",
    "backslashes": b"..%5C..%5Csentinel.txt",
    "NUL": b"a%00b",
    "kept id then NUL": KEPT_SESSION.encode() + b"%00",
    "kept id then slash": KEPT_SESSION.encode() + b"%2F..",
    "CRLF": b"a%0D%0Ab",
    "10k chars": b"A" * 10_000,
    "201 chars": b"a" * 201,
    "absolute path": b"%2Fetc%2Fpasswd",
    "sessions dir name": b"sessions",
}
SESSION_ROUTES = [("GET", b"/completions"), ("GET", b"/tree"), ("GET", b"/rollout"), ("DELETE", b"")]


def test_session_routes_never_leave_the_capture_dir(stack):
    files_before = _capture_files(stack)
    for raw_id in TRAVERSAL_IDS.values():
        for method, suffix in SESSION_ROUTES:
            target = b"/v1/sessions/" + raw_id + suffix
            status, headers, body = raw_request(stack, method, target)
            if status == 307:
                # Starlette's trailing-slash redirect ("/v1/sessions//" -> "/v1/sessions"): harmless, nothing read.
                assert b"location: http://127.0.0.1/v1/sessions\r\n" in headers + b"\r\n", headers
                continue
            assert status in (400, 404, 405), (method, target[:80], status, body[:300])
            assert b"application/json" in headers
            check_error_body(body)
            assert SENTINEL_TEXT.encode() not in body
    # Raw dot segments too: no client library normalises them away on a bare socket.
    for target in (
        b"/v1/sessions/../../sentinel.txt",
        b"/v1/sessions/../sentinel.txt",
        b"/v1/sessions/./..",
        b"/v1/sessions/" + KEPT_SESSION.encode() + b"/../../sentinel.txt",
    ):
        for method in ("GET", "DELETE"):
            status, _, body = raw_request(stack, method, target)
            assert status in (400, 404, 405), (method, target, status, body[:300])
            assert SENTINEL_TEXT.encode() not in body
    for path in _sentinels(stack):
        assert path.read_text() == SENTINEL_TEXT
    assert _record_count(stack, KEPT_SESSION) == 1
    assert _capture_files(stack) == files_before


def test_server_is_healthy_after_all_of_it(stack):
    assert httpx.get(stack.url + "/health").json()["status"] == "ok"
    assert post_json(stack, "/responses", {"input": "still here?"}).status_code == 200
    assert stack.proc.popen.poll() is None
    for path in _sentinels(stack):
        assert path.read_text() == SENTINEL_TEXT
