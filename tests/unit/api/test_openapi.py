"""docs/openapi.yaml (written by hand) against the real app: the same paths and methods, and on every
non-model route the same path and query parameters as its handler reads.

A handler's query parameters are read from its source: the literal names it (or a helper of
`server.api` or of its own module that it calls) passes to `query_params.get`, a `query.get`, or `flag` / `integer`. Model calls
are raw ASGI handlers whose parameters are headers and body fields: only their path and method are
compared."""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
from collections.abc import Callable, Iterable
from pathlib import Path
from types import FunctionType
from typing import Any

import pytest
import yaml
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from server.app import create_app
from server.config import Settings
from tests.support.procs import REPO

SPEC = REPO / "docs" / "openapi.yaml"
METHODS = ("get", "post", "put", "patch", "delete")
QUERY_READERS = {"flag", "integer"}  # server.api.cursor: `flag(request, "stream")`


def app_routes(tmp_path: Path) -> list[BaseRoute]:
    """Every route of a server with each optional surface on (capture, the response store)."""
    settings = Settings(
        switchyard_base_url="http://127.0.0.1:4000/v1", capture=True, capture_dir=str(tmp_path / "captures")
    )
    return list(create_app(settings).routes)


def spec_path(route_path: str) -> str:
    """A Starlette path in OpenAPI's spelling: `{session_id:path}` is `{session_id}`."""
    return re.sub(r"\{(\w+):\w+\}", r"{\1}", route_path)


def unwrapped(endpoint: Callable[..., Any]) -> Callable[..., Any]:
    """The handler under `with_error_responses` (which keeps it in its closure as `endpoint`)."""
    inner = inspect.getclosurevars(endpoint).nonlocals.get("endpoint") if isinstance(endpoint, FunctionType) else None
    return unwrapped(inner) if callable(inner) else endpoint


def query_names(function: Callable[..., Any], seen: set[Any] | None = None) -> set[str]:
    """The query parameters `function` reads, itself or through the helpers it calls (of `server.api` or its own module)."""
    seen = seen if seen is not None else set()
    if function in seen:
        return set()
    seen.add(function)
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    scope = inspect.getclosurevars(function)
    in_scope = {**scope.globals, **scope.nonlocals}
    followed = ("server.api", function.__module__)  # helpers of the API and of the handler's own module
    names: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        literal = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "get" and literal:
            receiver = func.value
            if (isinstance(receiver, ast.Attribute) and receiver.attr == "query_params") or (
                isinstance(receiver, ast.Name) and receiver.id == "query"
            ):
                names.add(literal[0])
        if isinstance(func, ast.Name):
            if func.id in QUERY_READERS and literal:
                names.add(literal[0])
            callee = in_scope.get(func.id)
            if isinstance(callee, FunctionType) and callee.__module__.startswith(followed):
                names |= query_names(callee, seen)
    return names


def resolve(spec: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    ref = node.get("$ref")
    if ref is None:
        return node
    found: Any = spec
    for part in ref.removeprefix("#/").split("/"):
        found = found[part]
    return resolve(spec, found)


def documented(spec: dict[str, Any]) -> dict[tuple[str, str], dict[str, set[str]]]:
    """(path, METHOD) -> {"path": names, "query": names} as the spec declares them."""
    found = {}
    for path, item in spec["paths"].items():
        shared = item.get("parameters", [])
        for method in METHODS:
            if method not in item:
                continue
            params = [resolve(spec, p) for p in [*shared, *item[method].get("parameters", [])]]
            found[(path, method.upper())] = {
                where: {p["name"] for p in params if p["in"] == where} for where in ("path", "query")
            }
    return found


def served(routes: Iterable[BaseRoute]) -> dict[tuple[str, str], dict[str, set[str]] | None]:
    """(path, METHOD) -> the parameters its handler reads; None for a model call (a raw ASGI handler)."""
    found: dict[tuple[str, str], dict[str, set[str]] | None] = {}
    for route in routes:
        assert isinstance(route, Route), f"{route!r}: only Route is expected in the app"
        for method in sorted((route.methods or set()) - {"HEAD"}):  # HEAD: Starlette's, with every GET
            handler = unwrapped(route.endpoint)
            params = None
            if isinstance(handler, FunctionType):
                params = {"path": set(route.param_convertors), "query": query_names(handler)}
            found[(spec_path(route.path), method)] = params
    return found


def mismatches(routes: Iterable[BaseRoute], spec: dict[str, Any]) -> list[str]:
    """What the spec and the app disagree on, one line each; empty when they agree."""
    docs, app = documented(spec), served(routes)
    problems = [f"{m} {p} is served but not in openapi.yaml" for p, m in sorted(app.keys() - docs.keys())]
    problems += [f"{m} {p} is in openapi.yaml but not served" for p, m in sorted(docs.keys() - app.keys())]
    for key in sorted(app.keys() & docs.keys()):
        reads = app[key]
        if reads is None:
            continue
        for where in ("path", "query"):
            if reads[where] != docs[key][where]:
                problems.append(
                    f"{key[1]} {key[0]}: {where} parameters read {sorted(reads[where])}, "
                    f"documented {sorted(docs[key][where])}"
                )
    return problems


@pytest.fixture(scope="module")
def spec() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(SPEC.read_text())
    return loaded


def test_openapi_yaml_documents_every_route_and_parameter_and_nothing_else(tmp_path, spec):
    assert mismatches(app_routes(tmp_path), spec) == []


def test_the_check_sees_a_route_missing_from_either_side(tmp_path, spec):
    """Negative controls: an operation dropped from the spec, and a route dropped from the app."""
    routes = app_routes(tmp_path)
    fewer_docs = {**spec, "paths": {p: item for p, item in spec["paths"].items() if p != "/v1/sessions/{session_id}"}}
    assert mismatches(routes, fewer_docs) == ["DELETE /v1/sessions/{session_id} is served but not in openapi.yaml"]
    kept = [r for r in routes if not (isinstance(r, Route) and r.path == "/v1/conversations/{conversation_id}/items")]
    assert sorted(mismatches(kept, spec)) == [
        "GET /v1/conversations/{conversation_id}/items is in openapi.yaml but not served",
        "POST /v1/conversations/{conversation_id}/items is in openapi.yaml but not served",
    ]


def test_the_check_sees_a_query_parameter_read_but_not_documented(tmp_path, spec):
    """Negative control: a handler that reads one more query parameter, through a helper, disagrees."""

    def verbose(request: Request) -> bool:
        return request.query_params.get("verbose") == "true"

    async def health(request: Request) -> Response:
        return Response(str(verbose(request)))

    routes = [
        Route("/health", health, methods=["GET"]) if getattr(r, "path", "") == "/health" else r
        for r in app_routes(tmp_path)
    ]
    assert mismatches(routes, spec) == ["GET /health: query parameters read ['verbose'], documented []"]


def test_the_check_reads_the_query_parameters_of_helpers_and_wrapped_handlers(tmp_path):
    """The reader finds what the real handlers read, under `with_error_responses` and through helpers."""
    app = served(app_routes(tmp_path))
    assert app[("/v1/sessions/{session_id}/rollout", "GET")] == {
        "path": {"session_id"},
        "query": {"allow_partial", "run", "dispatch"},
    }
    assert app[("/v1/responses/{response_id}", "GET")] == {
        "path": {"response_id"},
        "query": {"stream", "starting_after"},
    }
    assert app[("/v1/conversations/{conversation_id}/items", "GET")]["query"] == {"after", "limit", "order"}  # type: ignore[index]
    assert app[("/v1/chat/completions", "POST")] is None
