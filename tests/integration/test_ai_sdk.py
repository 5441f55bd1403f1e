"""The Vercel AI SDK (Node) against the real stack, with its defaults: a three-turn conversation with a
tool, stream and not. Its default OpenAI model is the Responses API, which sends earlier assistant
turns back as `item_reference` items naming the `msg_...` ids this server returned and stored."""

from __future__ import annotations

import shutil

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


def run_ai_sdk(chain, tmp_path, base_url: str, provider: str, stream: bool, session_id: str):
    """(the request bodies the SDK sent, the text of each turn)."""
    node = shutil.which("node")
    assert node is not None
    run = run_client(
        [node, str(SCRIPT), base_url, provider, "1" if stream else "0", session_id],
        cwd=CLIENTS_DIR,
        env=client_env(tmp_path / f"home-{session_id}"),
    )
    assert run.returncode == 0, run.describe(chain.proc.output())
    lines = [orjson.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
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


@pytest.mark.parametrize("provider", ["chat", "compatible", "anthropic"])
@pytest.mark.parametrize("stream", [False, True], ids=["generate", "stream"])
def test_the_other_node_providers_run_the_same_conversation_captured_whole(chain, tmp_path, provider, stream):
    """`.chat()`, `@ai-sdk/openai-compatible` and `@ai-sdk/anthropic`, each with the base URL docs/harnesses.md gives."""
    session_id = f"ai-sdk-{provider}-{'stream' if stream else 'generate'}"
    requests, turns = run_ai_sdk(chain, tmp_path, chain.v1, provider, stream, session_id)
    assert turns == [f"Done. The tool said: sunny in {city}" for city in CITIES]
    assert len(requests) == 6 and all("messages" in body for body in requests)
    assert {record["api"] for record in chain.records(session_id)} == {"messages" if provider == "anthropic" else "chat"}
    assert_captured_whole(chain, session_id, calls=6)
