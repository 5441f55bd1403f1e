"""server/errors.py: an OpenAIError's repr, and the one helper that makes it an HTTP answer (Starlette and raw ASGI)."""

from __future__ import annotations

import ast
import asyncio
import re
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.testclient import TestClient

import server.errors
from server.errors import OpenAIError, error_response, send_error, with_error_responses
from tests.support.procs import REPO


def _sent(error: OpenAIError, **kw: Any) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []

    async def send(message: Any) -> None:
        messages.append(message)

    asyncio.run(send_error(send, error, **kw))
    return messages


def test_repr_shows_the_status_and_code():
    error = OpenAIError(429, "slow down", code="rate_limited")
    assert repr(error) == "OpenAIError(429, 'slow down', type='rate_limit_error', code='rate_limited')"


def test_repr_of_a_subclass_names_the_subclass():
    from server.stateful.sealing import SealError

    assert repr(SealError("input", "bad seal")).startswith("SealError(400, ")


def test_response_and_raw_asgi_answer_carry_the_same_status_body_and_headers():
    error = OpenAIError(401, "no key", code="invalid_api_key", headers={"www-authenticate": "Bearer"})
    response = error_response(error)
    start, body = _sent(error)
    assert response.status_code == start["status"] == 401
    assert response.body == body["body"] == error.to_json()
    raw_headers = dict(start["headers"])
    assert raw_headers[b"www-authenticate"] == response.headers["www-authenticate"].encode() == b"Bearer"
    assert raw_headers[b"content-type"] == b"application/json"
    assert raw_headers[b"content-length"] == str(len(error.to_json())).encode()


def test_anthropic_clients_get_the_messages_api_shape():
    error = OpenAIError(429, "slow down")
    assert orjson.loads(error_response(error, anthropic=True).body) == {
        "type": "error",
        "error": {"type": "rate_limit_error", "message": "slow down"},
    }
    _, body = _sent(error, anthropic=True)
    assert orjson.loads(body["body"])["type"] == "error"
    # Negative control: without the flag, the OpenAI shape.
    assert "type" not in orjson.loads(error_response(error).body)


def test_extra_headers_are_added_to_the_errors_own():
    error = OpenAIError(405, "no", headers={"allow": "GET"})
    response = error_response(error, headers={"x-frame-options": "DENY"})
    assert response.headers["allow"] == "GET" and response.headers["x-frame-options"] == "DENY"
    assert error.headers == {"allow": "GET"}  # the error itself is left as it was


def test_a_wrapped_route_answers_a_raised_error_on_an_app_without_handlers():
    async def refuses(request: Request) -> Response:
        raise OpenAIError(409, "busy", code="conflict")

    app = Starlette(routes=[Route("/wrapped", with_error_responses(refuses)), Route("/bare", refuses)])
    with TestClient(app, raise_server_exceptions=False) as client:
        wrapped = client.get("/wrapped")
        bare = client.get("/bare")
    assert wrapped.status_code == 409 and wrapped.json()["error"]["code"] == "conflict"
    assert bare.status_code == 500  # negative control: unwrapped, the app's default 500


def _exception_classes() -> dict[str, str]:
    """Every class in server/ and middleware/ that derives (at any depth) from an exception, with its file."""
    bases: dict[str, list[str]] = {}
    files: dict[str, str] = {}
    for package in ("server", "middleware"):
        for path in (REPO / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef):
                    bases[node.name] = [b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases]
                    files[node.name] = path.relative_to(REPO).as_posix()
    found: set[str] = set()
    known = {"Exception", "ValueError", "RuntimeError", "LookupError", "KeyError", "OSError", "TimeoutError"}
    changed = True
    while changed:
        changed = False
        for name, parents in bases.items():
            if name not in found and any(p in known or p in found for p in parents):
                found.add(name)
                changed = True
    return {name: files[name] for name in found}


def _listed_in_tree(name: str, where: str, doc: str) -> bool:
    """Whether a line of the docstring's tree names the class (as a whole word) and the file it is in."""
    return any(re.search(rf"\b{re.escape(name)}\b", line) and where in line for line in doc.splitlines())


def test_the_module_docstring_lists_every_exception_class_of_the_project_where_it_lives():
    classes = _exception_classes()
    assert {"OpenAIError", "SealError", "ClientGone", "UnknownSession"} <= set(classes)  # the scan finds them
    doc = server.errors.__doc__ or ""
    missing = sorted(f"{name} ({where})" for name, where in classes.items() if not _listed_in_tree(name, where, doc))
    assert not missing, f"add these to the exception tree in server/errors.py's docstring: {missing}"


def test_a_class_named_only_inside_another_name_or_beside_another_file_is_not_listed():
    assert not _listed_in_tree("NotFound", "server/cli/session_sources.py", "_NotFound  server/cli/session_sources.py")
    assert not _listed_in_tree("NotFound", "server/cli/session_sources.py", "NotFound  server/cli/sessions.py")
    assert _listed_in_tree(
        "NotFound", "server/cli/session_sources.py", "NotFound, Failed  server/cli/session_sources.py"
    )
