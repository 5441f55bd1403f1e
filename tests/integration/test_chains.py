"""Chains through the real chain (openai SDK → this server → hosted Switchyard → mock engine): clients
that break the conversation still leave every generated token in a whole, token-exact chain.

Each client below changes the history the way a real framework does; the engine's own request log
is the reference for the tokens. The rollout of each session is partial and names the kind of break.
"""

from __future__ import annotations

import json

import httpx
import openai
import pytest

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]
SYSTEM = {"role": "system", "content": "You are a coding agent."}


def sdk(chain, session: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=chain.v1,
        api_key="sk-test",
        max_retries=0,
        default_headers={"x-session-id": session},
        http_client=httpx.Client(timeout=60),
    )


@pytest.fixture(autouse=True)
def fresh_mock(mock_upstream):
    httpx.post(mock_upstream + "/mock/reset")
    yield


def get(chain, path: str) -> dict:
    reply = httpx.get(chain.v1 + path, timeout=60)
    assert reply.status_code == 200, reply.text
    return reply.json()


def check_against_the_engine(chain, session: str, calls: int) -> dict:
    """The session's chains hold every call once, each chain token-exact against what the engine served."""
    body = get(chain, f"/sessions/{session}/chains")
    engine = chain.engine_calls()
    assert len(engine) == calls
    records = get(chain, f"/sessions/{session}/completions")["completions"]
    assert [r["prompt_token_ids"] for r in records] == [e["prompt_token_ids"] for e in engine]
    assert [r["generation_token_ids"] for r in records] == [e["generation_token_ids"] for e in engine]
    by_uuid = {r["uuid"]: n for n, r in enumerate(records)}
    covered = sorted(by_uuid[uuid] for chain_body in body["chains"] for uuid in chain_body["record_uuids"])
    assert covered == list(range(calls))
    for chain_body in body["chains"]:
        served = [engine[by_uuid[uuid]] for uuid in chain_body["record_uuids"]]
        for before, after in zip(served, served[1:]):
            carried = before["prompt_token_ids"] + before["generation_token_ids"]
            assert after["prompt_token_ids"][: len(carried)] == carried
        last = served[-1]
        assert chain_body["token_ids"] == last["prompt_token_ids"] + last["generation_token_ids"]
        generated = [t for t, m in zip(chain_body["token_ids"], chain_body["generation_mask"]) if m]
        assert generated == [t for e in served for t in e["generation_token_ids"]]
    assert body["trainable_fraction"] == 1.0
    return body


def test_a_client_that_resends_tool_calls_as_text(chain):
    client = sdk(chain, "chains-tool-text")
    task = {"role": "user", "content": 'list files [[mock:tool bash {"command": "ls"}]]'}
    first = client.chat.completions.create(model="mock-model", messages=[SYSTEM, task], tools=TOOLS)
    call = first.choices[0].message.tool_calls[0]
    # The framework's own format: the tool call as assistant text, its result as a user message.
    as_text = {"role": "assistant", "content": f"Action: {call.function.name}({call.function.arguments})"}
    observation = {
        "role": "user",
        "content": 'Observation: a.txt [[mock:tool bash {"command": "cat a.txt"}]] [[mock:next]] [[mock:say done]]',
    }
    history = [SYSTEM, task, as_text, observation]
    second = client.chat.completions.create(model="mock-model", messages=history, tools=TOOLS)
    reply = second.choices[0].message
    history += [
        reply.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": reply.tool_calls[0].id, "content": "hi"},
    ]
    client.chat.completions.create(model="mock-model", messages=history, tools=TOOLS)

    body = check_against_the_engine(chain, "chains-tool-text", 3)
    assert [len(c["record_uuids"]) for c in body["chains"]] == [1, 2]
    assert body["breaks"][0]["kind"] == "tool_call_as_text"
    rollout = get(chain, "/sessions/chains-tool-text/rollout")
    assert rollout["mask_sample"] is True
    assert "the client re-sent a tool call as text" in rollout["partial_reason"]


def test_a_client_that_sends_previous_response_id_with_the_history(chain):
    client = sdk(chain, "chains-twice")
    tools = [{"type": "function", **TOOLS[0]["function"]}]
    task = {"role": "user", "content": 'list files [[mock:tool bash {"command": "ls"}]] [[mock:next]] [[mock:say ok]]'}
    first = client.responses.create(model="mock-model", input=[task], tools=tools, store=True)
    call = next(item for item in first.output if item.type == "function_call")
    history = [task, *[item.model_dump(exclude_none=True) for item in first.output]]
    history.append({"type": "function_call_output", "call_id": call.call_id, "output": "a.txt"})
    # Both: the stored conversation by id, and the whole history again.
    client.responses.create(model="mock-model", input=history, tools=tools, previous_response_id=first.id)

    body = check_against_the_engine(chain, "chains-twice", 2)
    assert [len(c["record_uuids"]) for c in body["chains"]] == [1, 1]
    assert body["breaks"][0]["kind"] == "history_sent_twice"
    rollout = get(chain, "/sessions/chains-twice/rollout")
    assert "previous_response_id and the history together" in rollout["partial_reason"]


def test_a_client_that_compacts(chain):
    client = sdk(chain, "chains-compact")
    task = {"role": "user", "content": 'go [[mock:tool bash {"command": "ls"}]] [[mock:next]] [[mock:say listed]]'}
    history = [SYSTEM, task]
    for _ in range(2):
        reply = client.chat.completions.create(model="mock-model", messages=history, tools=TOOLS).choices[0].message
        history.append(reply.model_dump(exclude_none=True))
        for call in reply.tool_calls or []:
            history.append({"role": "tool", "tool_call_id": call.id, "content": "a.txt"})
    # A condenser: the task kept, the turns since replaced by one short summary.
    summary = {"role": "user", "content": f"Summary of the work so far: {json.dumps(history[-1]['content'])}"}
    client.chat.completions.create(
        model="mock-model",
        messages=[SYSTEM, task, summary, {"role": "user", "content": "go on [[mock:say fine]]"}],
        tools=TOOLS,
    )

    body = check_against_the_engine(chain, "chains-compact", 3)
    assert [len(c["record_uuids"]) for c in body["chains"]] == [2, 1]
    assert body["breaks"][0]["kind"] == "compacted"
    assert isinstance(body["breaks"][0]["position"], int)
    rollout = get(chain, "/sessions/chains-compact/rollout")
    assert "the client compacted the history" in rollout["partial_reason"]
    listing = httpx.get(chain.v1 + "/sessions", params={"q": "chains-compact", "summary": "true"})
    summary_row = listing.json()["sessions"][0]["summary"]
    assert summary_row["trainable_fraction"] == 1.0 and summary_row["rollout_fraction"] == 0.0
