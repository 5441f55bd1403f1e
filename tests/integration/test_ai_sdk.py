"""The Vercel AI SDK (Node) against the real stack, with its defaults: a three-turn conversation with a
tool, stream and not. Its default OpenAI model is the Responses API, which sends earlier assistant
turns back as `item_reference` items naming the `msg_...` ids this server returned and stored."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import orjson
import pytest

from tests.support.agents import CLIENTS_DIR, assert_token_exact, client_env, get_json, installed, run_client

PACKAGES = ("ai", "@ai-sdk/openai", "@ai-sdk/openai-compatible", "@ai-sdk/anthropic")
SCRIPT = CLIENTS_DIR / "ai_sdk_chat.mjs"
CITIES = ("Oslo", "Lima", "Pune")

pytestmark = [
    pytest.mark.clients,
    pytest.mark.skipif(
        not all(installed(p) for p in PACKAGES) or shutil.which("node") is None,
        reason="the AI SDK is not installed in tests/clients/node_modules (run `make node`), or no node",
    ),
]


def run_ai_sdk(chain, tmp_path, base_url: str, provider: str, stream: bool, session_id: str, answers=None):
    """(the request bodies the SDK sent, the text of each turn); `answers`, if given, gets the session
    and capture headers of each answer. An empty `session_id` sends no session header."""
    node = shutil.which("node")
    assert node is not None
    run = run_client(
        [node, str(SCRIPT), base_url, provider, "1" if stream else "0", session_id],
        cwd=CLIENTS_DIR,
        env=client_env(tmp_path / f"home-{session_id or 'none'}"),
    )
    assert run.returncode == 0, run.describe(chain.proc.output())
    lines = [orjson.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    if answers is not None:
        answers.extend(line["answered"] for line in lines if "answered" in line)
    return [line["request"] for line in lines if "request" in line], lines[-1]["turns"]


def assert_captured_whole(chain, session_id: str, calls: int) -> None:
    """Every call of the conversation in one token-contiguous chain, the rollout whole and token-exact."""
    chains = get_json(f"{chain.v1}/sessions/{session_id}/chains")
    assert len(chains["calls"]) == calls, chains["calls"]
    assert chains["breaks"] == [], chains["breaks"]
    assert [c["kind"] for c in chains["chains"]] == ["main"]
    assert chains["trainable_fraction"] == 1.0 and chains["rollout"]["status"] == "whole", chains["rollout"]
    rollout = get_json(f"{chain.v1}/sessions/{session_id}/rollout")
    assert rollout["mask_sample"] is False, rollout["partial_reason"]
    assert_token_exact(chain, rollout)


@pytest.mark.parametrize("stream", [False, True], ids=["generate", "stream"])
def test_responses_default_multi_turn_with_tools_resolves_item_references(chain, tmp_path, stream):
    session_id = f"ai-sdk-responses-{'stream' if stream else 'generate'}"
    requests, turns = run_ai_sdk(chain, tmp_path, chain.v1, "responses", stream, session_id)
    assert turns == [f"Done. The tool said: sunny in {city}" for city in CITIES]
    # Three turns, each a tool call then the answer: six calls, all through /v1/responses.
    assert len(requests) == 6 and all("input" in body for body in requests)
    # Later requests name earlier assistant turns by reference (the SDK's default, store on), and
    # those are ids this server handed out.
    references = [item["id"] for body in requests for item in body["input"] if item.get("type") == "item_reference"]
    assert references and all(ref.startswith("msg_") for ref in references), requests[-1]["input"]
    # The stored inputs list them resolved: the assistant's own words, under the id that was referenced.
    by_id = {
        item["id"]: item
        for record in chain.records(session_id)
        for item in get_json(f"{chain.v1}/responses/{record['response_id']}/input_items", limit=100)["data"]
    }
    assert set(references) <= set(by_id)
    assert all(by_id[ref]["role"] == "assistant" and by_id[ref]["content"][0]["text"] for ref in references)
    assert_captured_whole(chain, session_id, calls=6)


@pytest.mark.parametrize("provider", ["responses", "chat"])
@pytest.mark.parametrize("stream", [False, True], ids=["generate", "stream"])
def test_with_no_session_header_each_conversation_is_one_inferred_session(chain, tmp_path, provider, stream):
    """No setup at all: the SDK's defaults and no header. The server infers the session from the
    conversation, names it on every answer, and the three turns are one whole chain."""
    answers: list[dict] = []
    before = {s["session_id"] for s in get_json(f"{chain.v1}/sessions")["sessions"]}
    _, turns = run_ai_sdk(chain, tmp_path, chain.v1, provider, stream, "", answers)
    assert turns == [f"Done. The tool said: sunny in {city}" for city in CITIES]
    assert len(answers) == 6 and all(answer["capture"] == "recorded" for answer in answers), answers
    (session_id,) = {answer["session"] for answer in answers}
    assert session_id.startswith("inferred-") and session_id not in before
    assert_captured_whole(chain, session_id, calls=6)


@pytest.mark.parametrize("provider", ["chat", "compatible", "anthropic"])
@pytest.mark.parametrize("stream", [False, True], ids=["generate", "stream"])
def test_the_other_node_providers_run_the_same_conversation_captured_whole(chain, tmp_path, provider, stream):
    """`.chat()`, `@ai-sdk/openai-compatible` and `@ai-sdk/anthropic`, each with the base URL docs/harnesses.md gives."""
    session_id = f"ai-sdk-{provider}-{'stream' if stream else 'generate'}"
    requests, turns = run_ai_sdk(chain, tmp_path, chain.v1, provider, stream, session_id)
    assert turns == [f"Done. The tool said: sunny in {city}" for city in CITIES]
    assert len(requests) == 6 and all("messages" in body for body in requests)
    assert {record["api"] for record in chain.records(session_id)} == {
        "messages" if provider == "anthropic" else "chat"
    }
    assert_captured_whole(chain, session_id, calls=6)


# ---- the recipe of docs/harnesses.md, run as written ------------------------------------------------

DOC = Path(__file__).resolve().parents[2] / "docs" / "harnesses.md"
DOC_URL = "http://127.0.0.1:8080"
_RECIPE = re.compile(r"<!-- recipe: ai-sdk -->\n```js\n(.*?)^```", re.MULTILINE | re.DOTALL)
_MODEL = re.compile(r"<!-- recipe-model: ([\w-]+) -->\n```js\n(.*?)^```", re.MULTILINE | re.DOTALL)
_TASK_LINE = re.compile(r'^const TASK = ".*";$', re.MULTILINE)


def recipe(model: str | None) -> str:
    """The doc's AI SDK recipe, with its first import and `model` line replaced by another provider's."""
    text = DOC.read_text()
    found = _RECIPE.search(text)
    assert found is not None, "docs/harnesses.md has no `ai-sdk` recipe"
    source = found.group(1)
    if model is None:
        return source
    import_line, model_line = dict(_MODEL.findall(text))[model].strip().splitlines()
    lines = source.splitlines()
    assert lines[0].startswith("import ") and sum(line.startswith("const model = ") for line in lines) == 1
    lines[0] = import_line
    lines = [model_line if line.startswith("const model = ") else line for line in lines]
    return "\n".join(lines) + "\n"


def test_the_doc_names_each_provider_once():
    assert sorted(dict(_MODEL.findall(DOC.read_text()))) == [
        "ai-sdk-anthropic",
        "ai-sdk-chat",
        "ai-sdk-openai-compatible",
    ]


@pytest.mark.parametrize("model", [None, "ai-sdk-chat", "ai-sdk-openai-compatible", "ai-sdk-anthropic"])
def test_the_docs_recipe_is_one_whole_session_per_conversation(chain, tmp_path, model):
    source = recipe(model)
    assert DOC_URL + "/v1" in source and _TASK_LINE.search(source), "the recipe has no /v1 base URL or TASK line"
    task = 'Weather in Oslo? [[mock:tool weather {"city": "Oslo"}]]'
    source = _TASK_LINE.sub(
        lambda _: f"const TASK = {orjson.dumps(task).decode()};", source.replace(DOC_URL, chain.url)
    )
    script = tmp_path / "recipe.mjs"
    script.write_text(source)
    (tmp_path / "node_modules").symlink_to(CLIENTS_DIR / "node_modules")  # what the recipe imports
    node = shutil.which("node")
    assert node is not None
    run = run_client([node, str(script)], cwd=tmp_path, env=client_env(tmp_path / "home"))
    assert run.returncode == 0, run.describe(chain.proc.output())
    session_id, answer = run.stdout.strip().splitlines()[-1].split(" ", 1)
    assert answer.startswith("OK. You said:"), answer  # the follow-up's answer, after the tool turn
    # Tool call, its answer, the follow-up: three calls in one session, one whole chain.
    assert_captured_whole(chain, session_id, calls=3)
