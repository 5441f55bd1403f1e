"""Every request/answer example in docs/ runs against the demo stack, and the answer has the shape shown.

How an example joins: put the marker line `<!-- example -->` right above a ```bash block that holds
one `curl` to http://127.0.0.1:8080, and follow that block directly with a ```json block showing
the answer. The marker may name the expected HTTP status, `<!-- example status=404 -->` (default
200). An example that cannot run against the demo stack (it needs a real engine, a key, another
mode) says so instead: `<!-- example skip: why -->`. Every curl block followed by a JSON answer
must carry one of the two (`test_every_answered_curl_in_the_docs_is_an_example`), so a new example
cannot silently go stale.

What "the shape shown" means (`shape_mismatches`): every key the documented object shows exists in
the real one, recursively (a documented key `"…"` only says more keys were left out); a documented
list that is not empty is matched by its first element against the real list's first element;
scalars match in type (any number for a number; `null` only `null`); and the values of `object`,
`type` and `code` must be equal, since those are what clients branch on. Other values (ids, times,
texts, token ids) may differ.

Examples run in document order, file by file, on one demo stack on which the demo's scripted agent
has run first (so `demo-root` and `demo-child` exist, as in the docs) and one call's session id was
refused (as the `/health` example counts), so an example may use what an earlier one in its file
created (`my-session`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest

from server.dev.demo import run_agent
from tests.test_docs import DOC_BASE, REPO, SHELL_LANGS, command_lines, parse_curl

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
_BLOCK = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```[ \t]*\n?", re.MULTILINE | re.DOTALL)
_MARKER = re.compile(r"<!--\s*example(?:\s+status=(?P<status>\d{3}))?(?:\s+skip:\s*(?P<skip>[^>]*?))?\s*-->\s*$")
EXACT_KEYS = {"object", "type", "code"}


def answered_curls(path: Path) -> list[dict]:
    """Each shell block with one curl to the docs' address followed at once by a JSON block, with its marker."""
    text = path.read_text()
    blocks = list(_BLOCK.finditer(text))
    found = []
    for block, after in zip(blocks, blocks[1:], strict=False):
        if block.group(1).lower() not in SHELL_LANGS or after.group(1).lower() != "json":
            continue
        if text[block.end() : after.start()].strip():
            continue
        curls = [line for line in command_lines(block.group(2)) if line.startswith("curl ")]
        if len(curls) != 1 or DOC_BASE not in curls[0]:
            continue
        preceding = text[: block.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = _MARKER.search(preceding)
        found.append(
            {
                "where": f"{path.relative_to(REPO)}:{text[: block.start()].count(chr(10)) + 1}",
                "curl": curls[0],
                "answer": after.group(2),
                "marked": marker is not None,
                "skip": marker.group("skip") if marker else None,
                "status": int(marker.group("status")) if marker and marker.group("status") else 200,
            }
        )
    return found


def shape_mismatches(documented: object, real: object, at: str = "$") -> list[str]:
    """Where `real` does not have the shape `documented` shows (see the module's docstring)."""
    if isinstance(documented, dict):
        if not isinstance(real, dict):
            return [f"{at}: documented an object, got {type(real).__name__}"]
        problems = []
        for key, value in documented.items():
            if key == "…":
                continue
            if key not in real:
                problems.append(f"{at}.{key}: documented, absent")
            elif key in EXACT_KEYS and isinstance(value, str) and value != "…":
                if value != real[key]:
                    problems.append(f"{at}.{key}: documented {value!r}, got {real[key]!r}")
            else:
                problems += shape_mismatches(value, real[key], f"{at}.{key}")
        return problems
    if isinstance(documented, list):
        if not isinstance(real, list):
            return [f"{at}: documented a list, got {type(real).__name__}"]
        if documented and not real:
            return [f"{at}: documented items, got an empty list"]
        return shape_mismatches(documented[0], real[0], f"{at}[0]") if documented else []
    if documented is None:
        return [] if real is None else [f"{at}: documented null, got {type(real).__name__}"]
    if isinstance(documented, bool) or isinstance(real, bool):
        return [] if type(documented) is type(real) else [f"{at}: documented {documented!r}, got {real!r}"]
    if isinstance(documented, int | float):
        return [] if isinstance(real, int | float) else [f"{at}: documented a number, got {real!r}"]
    if isinstance(documented, str):
        return [] if isinstance(real, str) else [f"{at}: documented a string, got {real!r}"]
    return []


def test_the_shape_comparison_catches_what_it_should():
    documented = {"object": "list", "data": [{"id": "demo", "n": 1, "x": None}], "…": "…"}
    assert shape_mismatches(documented, {"object": "list", "data": [{"id": "r", "n": 2.5, "x": None}], "more": 1}) == []
    assert shape_mismatches(documented, {"object": "model", "data": [{"id": "r", "n": 1, "x": None}]})
    assert shape_mismatches(documented, {"object": "list", "data": [{"id": "r", "x": None}]})
    assert shape_mismatches(documented, {"object": "list", "data": [{"id": 3, "n": 1, "x": None}]})
    assert shape_mismatches(documented, {"object": "list", "data": []})
    error = {"error": {"type": "invalid_request_error", "code": "previous_response_not_found"}}
    assert shape_mismatches(error, {"error": {"type": "invalid_request_error", "code": "unsupported_parameter"}})


def test_the_docs_have_examples_and_the_marker_is_read():
    examples = [example for path in DOCS for example in answered_curls(path)]
    assert sum(1 for e in examples if e["marked"] and not e["skip"]) >= 10, examples
    assert _MARKER.search("<!-- example status=404 -->").group("status") == "404"
    assert _MARKER.search("<!-- example skip: needs vLLM -->").group("skip") == "needs vLLM"


def test_every_answered_curl_in_the_docs_is_an_example():
    unmarked = [e["where"] for path in DOCS for e in answered_curls(path) if not e["marked"]]
    assert not unmarked, f"mark these <!-- example --> (or <!-- example skip: why -->): {unmarked}"


@pytest.fixture(scope="module")
def demo_chain(chain):
    run_agent(chain.url)  # the demo's sessions, which the docs' examples name
    # One refused session id, which the /health example counts.
    refused = httpx.post(
        chain.v1 + "/chat/completions",
        json={"model": "demo", "messages": [{"role": "user", "content": "hi"}]},
        headers={"x-session-id": "has a space"},
        timeout=30,
    )
    assert refused.status_code == 200
    return chain


@pytest.mark.parametrize("path", [p for p in DOCS if any(e["marked"] for e in answered_curls(p))], ids=lambda p: p.name)
def test_every_example_answers_with_the_documented_shape(demo_chain, path):
    problems = []
    with httpx.Client(timeout=60) as client:
        for example in answered_curls(path):
            if not example["marked"] or example["skip"] is not None:
                continue
            request = parse_curl(example["curl"])
            url = demo_chain.url + request["url"].split(DOC_BASE, 1)[1]
            body = json.loads(request["data"]) if request["data"] is not None else None
            response = client.request(request["method"], url, json=body, headers=request["headers"])
            if response.status_code != example["status"]:
                problems.append(f"{example['where']}: status {response.status_code}, documented {example['status']}")
                continue
            mismatches = shape_mismatches(json.loads(example["answer"]), response.json())
            problems += [f"{example['where']}: {m}" for m in mismatches]
    assert not problems, "\n".join(problems)
