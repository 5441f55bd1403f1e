"""One source per list: the engines, the model APIs, the break kinds and the error codes are each defined
once in the code; every other place that names them (docs tables, the tests' toy engine, test
parameters) is checked here against that source, so a place that misses an entry fails a test."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import yaml

from server.api.call import ModelEndpoint
from server.app import create_app
from server.capture.rollout.breaks import KINDS
from server.config import Settings
from server.injection.id_fields import ENGINES, id_field_for
from tests.support.model_paths import model_paths
from tests.support.toy_engine import ENGINE_FIELDS

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"


def disagreements(source: set[str], places: dict[str, set[str]]) -> list[str]:
    """What each place misses of the source, and what it names that the source does not hold."""
    found = []
    for place, names in places.items():
        found += [f"{place} misses {name}" for name in sorted(source - names)]
        found += [f"{place} names {name}, which is not in the list" for name in sorted(names - source)]
    return found


def table_column(text: str, heading: str, column: int) -> set[str]:
    """The backticked names in one column of the first table under `heading` (asides in brackets left out)."""
    section = text[text.index(heading) :]
    rows = re.findall(r"^\|(.*)\|$", section[section.index("\n|") :].split("\n\n", 1)[0], re.MULTILINE)
    return {
        name
        for row in rows[2:]
        for name in re.findall(r"`([a-z0-9_]+)`", re.sub(r"\([^)]*\)", "", row.split("|")[column]))
    }


# Engines: the `injection_transport` setting's Literal (server/config.py), read as id_fields.ENGINES.


def engine_places() -> dict[str, set[str]]:
    working = set()
    for engine in ENGINES:
        try:
            id_field_for(engine)
            working.add(engine)
        except ValueError:
            pass
    injection_doc = (DOCS / "injection.md").read_text()
    return {
        "id_field_for": working,
        "the toy engine's ENGINE_FIELDS": set(ENGINE_FIELDS),
        "docs/injection.md's transport table": table_column(injection_doc, "## Transports and engines", 0),
    }


def test_every_place_names_every_engine():
    assert disagreements(set(ENGINES), engine_places()) == []


# Model APIs: the model handlers the app dispatches, each with its `path` and its `api` name.


def model_handlers() -> dict[str, ModelEndpoint]:
    handlers = create_app(Settings(switchyard_base_url="http://127.0.0.1:9")).model_handlers  # nothing starts
    return {path: handler for path, handler in handlers.items() if isinstance(handler, ModelEndpoint)}


def api_places() -> tuple[set[str], set[str], dict[str, set[str]], dict[str, set[str]]]:
    handlers = model_handlers()
    paths = set(handlers)
    apis = {handler.api for handler in handlers.values()}
    openapi = yaml.safe_load((DOCS / "openapi.yaml").read_text())
    capture_doc = (DOCS / "capture.md").read_text()
    api_row = next(line for line in capture_doc.splitlines() if line.startswith("| `api` |"))
    path_places = {
        "the handlers' own paths": {handler.path for handler in handlers.values()},
        "tests/support/model_paths.py (the tests' parameters)": set(model_paths()),
        "docs/openapi.yaml": set(openapi["paths"]) & paths,  # it holds the other routes too
    }
    api_places = {"docs/capture.md's `api` field": set(re.findall(r"`([a-z]+)`", api_row.split("|")[3]))}
    return paths, apis, path_places, api_places


def test_every_place_names_every_model_api():
    paths, apis, path_places, names = api_places()
    assert apis == {"chat", "responses", "messages"}  # three APIs ...
    assert len(paths) == 4  # ... on four POST paths (Messages' count_tokens too)
    assert disagreements(paths, path_places) == []
    assert disagreements(apis, names) == []


# Break kinds: KINDS in server/capture/rollout/breaks.py (read at test time: the list grows).


def documented_break_kinds() -> set[str]:
    text = (DOCS / "capture.md").read_text()
    section = text[text.index("### Break kinds") :]
    section = section[: section.index("\n## ", 1) if "\n## " in section else len(section)]
    return set(re.findall(r"^\| `([a-z_]+)` \|", section, flags=re.M))


def test_every_break_kind_is_documented():
    assert disagreements(set(KINDS), {"docs/capture.md's break kinds": documented_break_kinds()}) == []


# Error codes: the `code=` of every OpenAIError the server raises (server/ and middleware/, not the dev
# tools); `not_found(what, ...)` in server/api/cursor.py makes `<what>_not_found`.


def raised_error_codes() -> set[str]:
    codes = set()
    for package in ("server", "middleware"):
        for path in (REPO / package).rglob("*.py"):
            if (REPO / "server" / "dev") in path.parents:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.keyword) and node.arg == "code" and isinstance(node.value, ast.Constant):
                    if isinstance(node.value.value, str):
                        codes.add(node.value.value)
                if (
                    isinstance(node, ast.Call)
                    and getattr(node.func, "id", None) == "not_found"
                    and node.args
                    and isinstance(node.args[0], ast.Constant)
                ):
                    codes.add(f"{node.args[0].value}_not_found")
    return codes


def documented_error_codes() -> set[str]:
    return table_column((DOCS / "http-api.md").read_text(), "## Error codes", 1)


def test_every_error_code_is_documented():
    codes = raised_error_codes()
    assert {"invalid_json", "session_forbidden", "response_not_found", "upstream_timeout"} <= codes  # the scan works
    assert disagreements(codes, {"docs/http-api.md's error codes": documented_error_codes()}) == []


# Negative controls: each check fails when a place misses an entry of its list, or names one it lacks.


@pytest.mark.parametrize(
    "source,places",
    [
        (lambda: {*ENGINES, "tgi"}, engine_places),
        (lambda: api_places()[0] | {"/v1/completions"}, lambda: api_places()[2]),
        (lambda: {*KINDS, "reordered_tools"}, lambda: {"docs": documented_break_kinds()}),
        (lambda: raised_error_codes() | {"quota_exceeded"}, lambda: {"docs": documented_error_codes()}),
    ],
    ids=["engines", "apis", "break-kinds", "error-codes"],
)
def test_a_place_missing_an_entry_fails(source, places):
    found = disagreements(source(), places())
    assert found and all("misses" in line for line in found)


def test_a_place_naming_an_unknown_entry_fails():
    documented = documented_error_codes()
    assert disagreements(documented - {"invalid_json"}, {"docs": documented}) == [
        "docs names invalid_json, which is not in the list"
    ]
