"""Calls without a session id through the real stack (openai SDK → this server → hosted Switchyard → mock
engine): each conversation becomes one session, whole, and every answer names its session in a header.
"""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest
import yaml

from tests.support.stack import launch_stack

SESSION_HEADER = "x-switchyard-session-id"
CAPTURE_HEADER = "x-switchyard-model-capture"
CONVERSATIONS = 64
GROUP = 16  # the first GROUP conversations open with one identical call, as a GRPO group does
TURNS = 3


def first_message(n: int) -> str:
    return "Solve the shared task." if n < GROUP else f"Solve task {n}."


async def chat_conversation(client: openai.AsyncOpenAI, n: int) -> list[str]:
    """TURNS chat calls, sending back each answer as the client got it; the session header of each."""
    messages: list[dict] = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": first_message(n)},
    ]
    seen = []
    for turn in range(TURNS):
        stream = (n + turn) % 2 == 1
        raw = await client.chat.completions.with_raw_response.create(model="demo", messages=messages, stream=stream)
        seen.append(raw.headers.get(SESSION_HEADER))
        assert raw.headers.get(CAPTURE_HEADER) == "recorded"
        if stream:
            text = ""
            async for chunk in raw.parse():
                if chunk.choices and chunk.choices[0].delta.content:
                    text += chunk.choices[0].delta.content
        else:
            text = raw.parse().choices[0].message.content or ""
        messages += [
            {"role": "assistant", "content": text},
            {"role": "user", "content": f"Go on with {n}, step {turn}."},
        ]
    return seen


async def responses_conversation(client: openai.AsyncOpenAI, n: int) -> list[str]:
    """TURNS stateless Responses calls (the whole input each time, `store` off), as a Responses agent sends them."""
    items: list = [{"role": "user", "content": first_message(n)}]
    seen = []
    for turn in range(TURNS):
        raw = await client.responses.with_raw_response.create(
            model="demo", instructions="You are terse.", input=items, store=False
        )
        seen.append(raw.headers.get(SESSION_HEADER))
        assert raw.headers.get(CAPTURE_HEADER) == "recorded"
        response = raw.parse()
        items += [item.model_dump(exclude_none=True) for item in response.output]
        items.append({"role": "user", "content": f"Go on with {n}, step {turn}."})
    return seen


async def run_all(v1: str) -> list[list[str]]:
    async with openai.AsyncOpenAI(
        base_url=v1, api_key="sk-test", max_retries=0, http_client=httpx.AsyncClient(timeout=120)
    ) as client:
        # The group's conversations all use chat (their first calls must be one identical request);
        # the others alternate between chat and Responses.
        return await asyncio.gather(
            *(
                responses_conversation(client, n) if n >= GROUP and n % 2 else chat_conversation(client, n)
                for n in range(CONVERSATIONS)
            )
        )


def test_interleaved_conversations_without_ids_become_one_whole_session_each(chain):
    seen = asyncio.run(run_all(chain.v1))
    for n, headers in enumerate(seen):
        assert all(header is not None and header.startswith("inferred-") for header in headers)
        # The group's first calls are one request answered alike: which of their sessions a second
        # call joins is the earliest still open, so only from then on is a member's session its own.
        named = headers[1:] if n < GROUP else headers
        assert len(set(named)) == 1, "one session per conversation, named in each answer"
    assert len({headers[-1] for headers in seen}) == CONVERSATIONS, "no two conversations share a session"
    assert {headers[0] for headers in seen[:GROUP]} == {headers[-1] for headers in seen[:GROUP]}

    listing = httpx.get(chain.v1 + "/sessions", params={"limit": 1000}, timeout=60).json()["sessions"]
    inferred = {s["session_id"]: s for s in listing if s["session_id"].startswith("inferred-")}
    assert set(inferred) == {headers[-1] for headers in seen}
    for session_id, entry in inferred.items():
        assert entry["record_count"] == TURNS and entry["identified_by"] == "inferred"
        body = httpx.get(f"{chain.v1}/sessions/{session_id}/chains", timeout=60).json()
        assert len(body["chains"]) == 1 and body["breaks"] == [], (
            "each session is one whole chain",
            {k: body[k] for k in ("calls", "rollout", "chains")},
        )
        assert body["rollout"]["status"] == "whole"
        # The session holds one conversation: each call's prompt extends the one before.
        records = httpx.get(f"{chain.v1}/sessions/{session_id}/completions", timeout=60).json()["completions"]
        for before, after in zip(records, records[1:]):
            assert after["messages"][: len(before["messages"])] == before["messages"] or after["api"] == "responses"
            carried = before["prompt_token_ids"] + before["generation_token_ids"]
            assert after["prompt_token_ids"][: len(carried)] == carried


def test_every_api_names_the_session_it_used_stream_or_not(chain):
    bodies = {
        "/chat/completions": {"model": "demo", "messages": [{"role": "user", "content": "hi"}]},
        "/responses": {"model": "demo", "input": "hi"},
        "/messages": {"model": "demo", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]},
    }
    for path, body in bodies.items():
        for stream in (False, True):
            for headers in ({}, {"x-session-id": f"named-{path[1:4]}-{stream}"}):
                reply = httpx.post(chain.v1 + path, json={**body, "stream": stream}, headers=headers, timeout=60)
                assert reply.status_code == 200, reply.text
                named = reply.headers[SESSION_HEADER]
                assert named == headers.get("x-session-id", named) and named.startswith(("inferred-", "named-"))
                assert reply.headers[CAPTURE_HEADER] == "recorded"
    named = httpx.get(chain.v1 + "/sessions/named-cha-False/completions", timeout=60)
    assert named.status_code == 200 and named.json()["completions"][0]["session_source"] == "header:x-session-id"


def test_a_retried_call_joins_the_conversation_it_retries(chain):
    """A continuation that failed gives its claim back: the client's retry still lands in the session."""
    messages = [{"role": "user", "content": "retry me"}]
    first = httpx.post(chain.v1 + "/chat/completions", json={"model": "demo", "messages": messages}, timeout=60)
    session = first.headers[SESSION_HEADER]
    messages += [first.json()["choices"][0]["message"], {"role": "user", "content": "again [[mock:error 400 times=1]]"}]
    failed = httpx.post(chain.v1 + "/chat/completions", json={"model": "demo", "messages": messages}, timeout=60)
    assert failed.status_code == 400 and failed.headers[CAPTURE_HEADER] == "not recorded: the call failed"
    retry = httpx.post(chain.v1 + "/chat/completions", json={"model": "demo", "messages": messages}, timeout=60)
    assert retry.headers[SESSION_HEADER] == session


@pytest.fixture(scope="module")
def no_inference(mock_upstream, tmp_path_factory):
    folder = tmp_path_factory.mktemp("no-inference")
    config = folder / "settings.yaml"
    config.write_text(yaml.safe_dump({"session_inference": False}))
    stack = launch_stack(mock_upstream, folder / "captures", "--config", str(config))
    yield stack
    stack.proc.stop()


def test_with_inference_off_the_answer_says_the_call_was_not_recorded(no_inference):
    body = {"model": "demo", "messages": [{"role": "user", "content": "hi"}]}
    for stream in (False, True):
        reply = httpx.post(no_inference.v1 + "/chat/completions", json={**body, "stream": stream}, timeout=60)
        assert reply.status_code == 200
        assert SESSION_HEADER not in reply.headers
        assert reply.headers[CAPTURE_HEADER] == "not recorded: no session id, and session_inference is off"
    named = httpx.post(no_inference.v1 + "/chat/completions", json=body, headers={"x-session-id": "kept"}, timeout=60)
    assert named.headers[SESSION_HEADER] == "kept" and named.headers[CAPTURE_HEADER] == "recorded"
    assert [s["session_id"] for s in httpx.get(no_inference.v1 + "/sessions", timeout=60).json()["sessions"]] == [
        "kept"
    ]


def test_tool_calls_sent_back_continue_the_session_in_every_api(chain):
    """Each API's own shape of an answer with a tool call, sent back with the tool's result, lands in
    the session of the call that made it (the comparison survives each translation to chat)."""
    task = 'Look around [[mock:tool bash {"command": "ls"}]] [[mock:next]] [[mock:say done]]'
    chat_tools = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]

    def post(path: str, body: dict) -> httpx.Response:
        reply = httpx.post(chain.v1 + path, json=body, timeout=60)
        assert reply.status_code == 200, reply.text
        return reply

    # Chat: the assistant message with its tool call, then a tool message.
    messages: list[dict] = [{"role": "user", "content": "chat: " + task}]
    first = post("/chat/completions", {"model": "demo", "messages": messages, "tools": chat_tools})
    call = first.json()["choices"][0]["message"]
    messages += [call, {"role": "tool", "tool_call_id": call["tool_calls"][0]["id"], "content": "a.txt"}]
    second = post("/chat/completions", {"model": "demo", "messages": messages, "tools": chat_tools})
    assert second.headers[SESSION_HEADER] == first.headers[SESSION_HEADER]

    # Responses (stateless): the output items, then a function_call_output.
    tools = [{"type": "function", "name": "bash", "parameters": {"type": "object"}}]
    items: list = [{"role": "user", "content": "responses: " + task}]
    first = post("/responses", {"model": "demo", "input": items, "tools": tools, "store": False})
    output = first.json()["output"]
    function_call = next(item for item in output if item["type"] == "function_call")
    items += [*output, {"type": "function_call_output", "call_id": function_call["call_id"], "output": "a.txt"}]
    second = post("/responses", {"model": "demo", "input": items, "tools": tools, "store": False})
    assert second.headers[SESSION_HEADER] == first.headers[SESSION_HEADER]

    # Messages: the content blocks (a tool_use), then a user tool_result.
    anthropic_tools = [{"name": "bash", "input_schema": {"type": "object"}}]
    turns: list[dict] = [{"role": "user", "content": "messages: " + task}]
    body = {"model": "demo", "max_tokens": 256, "tools": anthropic_tools}
    first = post("/messages", {**body, "messages": turns})
    blocks = first.json()["content"]
    tool_use = next(block for block in blocks if block["type"] == "tool_use")
    turns += [
        {"role": "assistant", "content": blocks},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_use["id"], "content": "a.txt"}]},
    ]
    second = post("/messages", {**body, "messages": turns})
    assert second.headers[SESSION_HEADER] == first.headers[SESSION_HEADER]
    for reply in (first, second):
        assert reply.headers[SESSION_HEADER].startswith("inferred-")


def test_the_anthropic_sdk_with_no_headers_gets_one_session_per_conversation(chain):
    """Two conversations through the anthropic SDK, as it comes (no header), one streamed: each one
    session, named in every answer."""
    import anthropic

    sdk = anthropic.Anthropic(base_url=chain.url, api_key="unused", max_retries=0)
    seen = []
    for n, stream in enumerate((False, True)):
        turns: list[dict] = [{"role": "user", "content": f"anthropic conversation {n}"}]
        names = []
        for step in range(2):
            if stream:
                with sdk.messages.with_streaming_response.create(
                    model="demo", max_tokens=64, messages=turns, stream=True
                ) as raw:
                    names.append(raw.headers[SESSION_HEADER])
                    text = "".join(
                        event.delta.text
                        for event in raw.parse()
                        if event.type == "content_block_delta" and event.delta.type == "text_delta"
                    )
            else:
                raw = sdk.messages.with_raw_response.create(model="demo", max_tokens=64, messages=turns)
                names.append(raw.headers[SESSION_HEADER])
                text = "".join(block.text for block in raw.parse().content if block.type == "text")
            turns += [{"role": "assistant", "content": text}, {"role": "user", "content": f"more {step}"}]
        assert len(set(names)) == 1 and names[0].startswith("inferred-")
        seen.append(names[0])
    assert seen[0] != seen[1]


def test_a_stored_responses_conversation_without_ids_stays_in_its_session(chain):
    """`previous_response_id` names the stored response, whose session (inferred on the first call) the
    next call takes."""
    first = httpx.post(chain.v1 + "/responses", json={"model": "demo", "input": "remember me"}, timeout=60)
    second = httpx.post(
        chain.v1 + "/responses",
        json={"model": "demo", "input": "and now?", "previous_response_id": first.json()["id"]},
        timeout=60,
    )
    assert second.status_code == 200, second.text
    assert second.headers[SESSION_HEADER] == first.headers[SESSION_HEADER]
    records = httpx.get(f"{chain.v1}/sessions/{first.headers[SESSION_HEADER]}/completions", timeout=60).json()
    assert [r["session_source"].partition(":")[0] for r in records["completions"]] == ["inferred", "stored"]
