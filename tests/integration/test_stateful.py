"""The stateful Responses API on the real chain, driven by the openai SDK, the Agents SDK and raw HTTP.

Each bug known from peer proxies of this API has its regression test here: tool calls surviving
previous_response_id, a follow-up sent the instant the first answer ends, one id across events,
store and records, a restart keeping stored responses, and the store's bounds under load.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from server.stateful.responses import LARGE_BODY_BYTES
from tests.support.stack import launch_stack

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def sdk_for(url: str, key: str = "sk-test", **headers) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=url + "/v1",
        api_key=key,
        max_retries=0,
        default_headers=headers or None,
        http_client=httpx.Client(timeout=60),
    )


@pytest.fixture(scope="module")
def sdk(chain) -> openai.OpenAI:
    return sdk_for(chain.url)


def sse_events(response: httpx.Response) -> list[dict]:
    return [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")]


def upstream_messages(chain, marker: str) -> list[dict]:
    """The chat messages of the last upstream request whose text contains `marker`."""
    for request in reversed(chain.mock_requests()):
        if marker in json.dumps(request["body"]):
            return request["body"]["messages"]
    raise AssertionError(f"no upstream request mentions {marker!r}")


# ---- one id everywhere; stored before the answer ends -------------------------------------------


def test_stream_ids_agree_across_events_store_and_record(chain, sdk):
    with httpx.stream(
        "POST",
        chain.v1 + "/responses",
        timeout=60,
        headers={"x-session-id": "ids-agree"},
        json={"model": "x", "input": "hello ids", "stream": True},
    ) as reply:
        events = sse_events(reply)
    ids = {e["response"]["id"] for e in events if e["type"].startswith("response.") and "response" in e}
    assert len(ids) == 1
    (response_id,) = ids
    completed = events[-1]["response"]
    assert events[-1]["type"] == "response.completed" and completed["store"] is True
    stored = sdk.responses.retrieve(response_id)
    assert stored.id == response_id and stored.output_text == completed["output"][0]["content"][0]["text"]
    (record,) = chain.records("ids-agree")
    assert record["response_id"] == response_id


def test_non_stream_is_stored_with_store_true(chain, sdk):
    response = sdk.responses.create(model="x", input="store me", extra_headers={"x-session-id": "ids-ns"})
    assert response.store is True
    assert sdk.responses.retrieve(response.id).output_text == response.output_text
    assert chain.records("ids-ns")[0]["response_id"] == response.id


def test_store_false_is_not_stored(sdk):
    response = sdk.responses.create(model="x", input="forget me", store=False)
    assert response.store is False
    with pytest.raises(openai.NotFoundError):
        sdk.responses.retrieve(response.id)


def test_follow_up_sent_the_instant_the_answer_ends_finds_it(chain, sdk):
    """LiteLLM's history lagged its log writer; ours is written before the answer goes out."""
    for i in range(10):
        stream = i % 2 == 1
        if stream:
            with sdk.responses.stream(model="x", input=f"first {i}") as events:
                first_id = events.get_final_response().id
        else:
            first_id = sdk.responses.create(model="x", input=f"first {i}").id
        follow = sdk.responses.create(model="x", input=f"second {i}", previous_response_id=first_id)
        assert follow.previous_response_id == first_id


# ---- previous_response_id -----------------------------------------------------------------------


def test_tool_calls_and_outputs_survive_previous_response_id(chain, sdk):
    """vLLM dropped function_call / function_call_output items from the stored context."""
    first = sdk.responses.create(
        model="x", input='weather? [[mock:tool get_weather {"city": "Lima"}]] [[mock:reasoning]]', tools=[WEATHER]
    )
    call = next(item for item in first.output if item.type == "function_call")
    second = sdk.responses.create(
        model="x",
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "drizzle, 14C lima-marker"}],
        tools=[WEATHER],
        instructions="second instructions",
    )
    assert "lima-marker" in second.output_text
    messages = upstream_messages(chain, "lima-marker")
    roles = [m["role"] for m in messages]
    assert roles == ["system", "user", "assistant", "tool"]
    assert messages[0]["content"] == "second instructions"  # the new call's; the previous had none
    assistant = messages[2]
    assert assistant["tool_calls"][0]["id"] == call.call_id and assistant.get("reasoning_content")
    assert messages[3]["tool_call_id"] == call.call_id
    items = sdk.responses.input_items.list(second.id, order="asc")
    assert [item.type for item in items.data] == ["message", "reasoning", "function_call", "function_call_output"]


def test_previous_instructions_are_not_carried(chain, sdk):
    first = sdk.responses.create(model="x", input="one", instructions="FIRST-INSTRUCTIONS")
    sdk.responses.create(model="x", input="two instr-marker", previous_response_id=first.id)
    assert "FIRST-INSTRUCTIONS" not in json.dumps(upstream_messages(chain, "instr-marker"))


def test_unknown_previous_response_is_404_and_with_conversation_400(sdk):
    with pytest.raises(openai.NotFoundError) as caught:
        sdk.responses.create(model="x", input="x", previous_response_id="resp_nope")
    assert caught.value.body["code"] == "previous_response_not_found"
    conv = sdk.conversations.create()
    first = sdk.responses.create(model="x", input="x")
    with pytest.raises(openai.BadRequestError):
        sdk.responses.create(model="x", input="x", previous_response_id=first.id, conversation=conv.id)


def test_chained_session_reconstructs_as_one_rollout(chain, sdk):
    """The follow-ups carry no session of their own: they inherit it, so the rollout is one session."""
    first = sdk.responses.create(
        model="x",
        input='go [[mock:tool get_weather {"city": "Rome"}]]',
        tools=[WEATHER],
        extra_headers={"x-session-id": "chained-rollout"},
    )
    call = next(item for item in first.output if item.type == "function_call")
    second = sdk.responses.create(
        model="x",
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "hot"}],
        tools=[WEATHER],
    )
    sdk.responses.create(model="x", previous_response_id=second.id, input="thanks", tools=[WEATHER])
    assert [r["response_id"] for r in chain.records("chained-rollout")][:2] == [first.id, second.id]
    assert len(chain.records("chained-rollout")) == 3
    rollout = httpx.get(f"{chain.v1}/sessions/chained-rollout/rollout", timeout=30).json()
    assert rollout.get("partial_reason") is None and rollout.get("mask_sample") is False, rollout
    generated = [item for item in rollout["output"] if item.get("generation_token_ids")]
    assert len(generated) == 3


# ---- the endpoints through the openai SDK --------------------------------------------------------


def test_sdk_retrieve_input_items_delete(sdk):
    first = sdk.responses.create(model="x", input=[{"role": "user", "content": f"m{i}"} for i in range(5)])
    page = sdk.responses.input_items.list(first.id, limit=2)
    assert [item.content[0].text for item in page.data] == ["m4", "m3"]  # desc by default
    assert page.has_more
    everything = [item.content[0].text for item in sdk.responses.input_items.list(first.id, limit=2, order="asc")]
    assert everything == ["m0", "m1", "m2", "m3", "m4"]  # the SDK pages on with `after`
    assert sdk.responses.retrieve(first.id).id == first.id
    deleted = sdk.responses.delete(first.id)
    assert deleted is None or getattr(deleted, "deleted", True)
    with pytest.raises(openai.NotFoundError):
        sdk.responses.retrieve(first.id)
    with pytest.raises(openai.BadRequestError):
        sdk.responses.input_items.list(sdk.responses.create(model="x", input="y").id, limit=101)


def test_a_large_stored_input_reads_back_whole(chain, sdk):
    """An input past the store's blob-I/O threshold (its row written as a zeroblob, then filled in)
    comes back byte for byte: to the follow-up that names it, and in its listed input items."""
    words = [f"{i}" + "w" * 40_000 for i in range(2 * LARGE_BODY_BYTES // 40_000)]
    first = sdk.responses.create(model="x", input=[{"role": "user", "content": word} for word in words])
    assert first.store is True
    follow = sdk.responses.create(model="x", input="and the large-input marker", previous_response_id=first.id)
    sent = upstream_messages(chain, "the large-input marker")
    assert [m["content"] for m in sent if m["role"] == "user"][:-1] == words
    listed = [item.content[0].text for item in sdk.responses.input_items.list(follow.id, limit=100, order="asc")]
    assert listed[: len(words)] == words


def test_retrieve_stream_replays_with_starting_after(chain, sdk):
    response = sdk.responses.create(model="x", input="replay me")
    with httpx.stream("GET", f"{chain.v1}/responses/{response.id}", params={"stream": "true"}, timeout=30) as reply:
        events = sse_events(reply)
    assert events[0]["type"] == "response.created" and events[-1]["type"] == "response.completed"
    stored = httpx.get(f"{chain.v1}/responses/{response.id}", timeout=30).json()
    assert events[-1]["response"] == stored
    with httpx.stream(
        "GET",
        f"{chain.v1}/responses/{response.id}",
        params={"stream": "true", "starting_after": "3"},
        timeout=30,
    ) as reply:
        resumed = sse_events(reply)
    assert resumed == events[4:]


def test_background_run_polls_and_completes(sdk):
    started = sdk.responses.create(model="x", input="[[mock:tokens 30]] [[mock:sleep 300]]", background=True)
    assert started.status in ("queued", "in_progress") and started.background is True
    final = started
    for _ in range(200):
        final = sdk.responses.retrieve(started.id)
        if final.status not in ("queued", "in_progress"):
            break
        threading.Event().wait(0.05)
    assert final.status == "completed" and final.usage.output_tokens > 0


def test_background_cancel_cancels_the_upstream_call(chain, sdk):
    before = chain.mock_stats()
    started = sdk.responses.create(model="x", input="[[mock:tokens 400]] [[mock:slow 50]] cancel-me", background=True)
    for _ in range(200):  # until the upstream call is under way
        if sdk.responses.retrieve(started.id).status == "in_progress":
            break
        threading.Event().wait(0.05)
    cancelled = sdk.responses.cancel(started.id)
    assert cancelled.status == "cancelled"
    assert sdk.responses.retrieve(started.id).status == "cancelled"
    for _ in range(100):
        stats = chain.mock_stats()
        if stats["cancelled"] > before["cancelled"]:
            break
        threading.Event().wait(0.05)
    assert stats["cancelled"] > before["cancelled"], stats
    with pytest.raises(openai.BadRequestError):
        sdk.responses.cancel(sdk.responses.create(model="x", input="not background").id)


def test_background_stream_resumes_after_a_dropped_connection(chain):
    body = {"model": "x", "input": "[[mock:tokens 30]] [[mock:slow 20]]", "stream": True, "background": True}
    seen: list[dict] = []
    with httpx.stream("POST", chain.v1 + "/responses", json=body, timeout=60) as reply:
        for line in reply.iter_lines():
            if line.startswith("data: {"):
                seen.append(json.loads(line[6:]))
            if len(seen) == 6:
                break  # the client goes away mid-stream; the run goes on
    response_id = seen[0]["response"]["id"]
    last = seen[-1]["sequence_number"]
    with httpx.stream(
        "GET",
        f"{chain.v1}/responses/{response_id}",
        params={"stream": "true", "starting_after": str(last)},
        timeout=60,
    ) as reply:
        rest = sse_events(reply)
    assert rest[0]["sequence_number"] == last + 1
    assert [e["sequence_number"] for e in seen + rest] == list(range(len(seen) + len(rest)))
    assert rest[-1]["type"] == "response.completed"
    text = "".join(e["delta"] for e in seen + rest if e["type"] == "response.output_text.delta")
    assert text == rest[-1]["response"]["output"][0]["content"][0]["text"]


# ---- conversations ------------------------------------------------------------------------------


def test_conversations_through_the_sdk(chain, sdk):
    conv = sdk.conversations.create(metadata={"topic": "t"}, items=[{"role": "user", "content": "conv-first"}])
    assert sdk.conversations.retrieve(conv.id).metadata == {"topic": "t"}
    assert sdk.conversations.update(conv.id, metadata={"topic": "u"}).metadata == {"topic": "u"}
    added = sdk.conversations.items.create(conv.id, items=[{"role": "user", "content": "conv-second"}])
    item_id = added.data[0].id
    assert sdk.conversations.items.retrieve(item_id, conversation_id=conv.id).id == item_id
    response = sdk.responses.create(model="x", input="conv-third", conversation=conv.id)
    assert response.conversation.id == conv.id
    listed = list(sdk.conversations.items.list(conv.id, order="asc", limit=2))
    assert [item.type for item in listed] == ["message"] * 4
    assert listed[-1].role == "assistant" and listed[-1].content[0].text == response.output_text
    messages = upstream_messages(chain, "conv-third")
    assert [m["content"] for m in messages[:3]] == ["conv-first", "conv-second", "conv-third"]
    # The conversation is the session: its calls are recorded under its id.
    assert chain.records(conv.id)[-1]["response_id"] == response.id
    sdk.conversations.items.delete(item_id, conversation_id=conv.id)
    assert len(list(sdk.conversations.items.list(conv.id))) == 3
    assert sdk.conversations.delete(conv.id).deleted
    with pytest.raises(openai.NotFoundError):
        sdk.conversations.retrieve(conv.id)
    with pytest.raises(openai.NotFoundError):
        sdk.responses.create(model="x", input="x", conversation=conv.id)


# ---- sealed reasoning -----------------------------------------------------------------------------


def test_encrypted_reasoning_round_trip_and_forgery(chain, sdk):
    first = sdk.responses.create(
        model="x", input="think [[mock:reasoning]]", store=False, include=["reasoning.encrypted_content"]
    )
    reasoning = next(item for item in first.output if item.type == "reasoning")
    assert reasoning.encrypted_content and reasoning.content[0].text not in reasoning.encrypted_content
    sent_back = {
        "type": "reasoning",
        "id": reasoning.id,
        "summary": [],
        "encrypted_content": reasoning.encrypted_content,
    }
    message = next(item for item in first.output if item.type == "message")
    history = [
        {"role": "user", "content": "think"},
        sent_back,
        {"role": "assistant", "content": message.content[0].text},
        {"role": "user", "content": "again sealed-marker"},
    ]
    sdk.responses.create(model="x", input=history, store=False)
    assistant = upstream_messages(chain, "sealed-marker")[1]
    assert assistant["role"] == "assistant" and assistant["reasoning_content"] == reasoning.content[0].text
    forged = {**sent_back, "encrypted_content": reasoning.encrypted_content[:-6] + "AAAAAA"}
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.responses.create(model="x", input=[forged, {"role": "user", "content": "x"}], store=False)
    assert caught.value.body["param"] == "input[0].encrypted_content"


# ---- the Agents SDK ---------------------------------------------------------------------------------


def _agent(url: str):
    from agents import Agent, OpenAIResponsesModel, function_tool, set_tracing_disabled

    set_tracing_disabled(True)  # the SDK would otherwise export traces to its vendor

    @function_tool
    def get_weather(city: str) -> str:
        """Weather for a city."""
        return f"fog in {city}, agent-tool-output"

    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="sk-test", max_retries=0, http_client=httpx.AsyncClient())
    model = OpenAIResponsesModel(model="x", openai_client=client)
    return Agent(name="weather", instructions="Answer briefly.", model=model, tools=[get_weather])


def test_agents_sdk_multi_turn_with_previous_response_id(chain):
    from agents import Runner

    agent = _agent(chain.url)

    async def run():
        first = await Runner.run(
            agent, 'weather in Oslo? [[mock:tool get_weather {"city": "Oslo"}]]', auto_previous_response_id=True
        )
        second = await Runner.run(
            agent,
            "and tomorrow? agents-turn-two",
            previous_response_id=first.last_response_id,
            auto_previous_response_id=True,
        )
        return first, second

    first, second = asyncio.run(run())
    assert "agent-tool-output" in first.final_output
    assert second.final_output
    # Turn two's upstream call saw turn one whole: the question, the tool call, its output, the answer.
    messages = upstream_messages(chain, "agents-turn-two")
    roles = [m["role"] for m in messages]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert "agent-tool-output" in messages[3]["content"]


def test_agents_sdk_with_a_conversation(chain, sdk):
    from agents import Runner

    agent = _agent(chain.url)
    conv = sdk.conversations.create()

    async def run():
        await Runner.run(agent, 'weather in Bern? [[mock:tool get_weather {"city": "Bern"}]]', conversation_id=conv.id)
        await Runner.run(agent, "and later? agents-conv-two", conversation_id=conv.id)

    asyncio.run(run())
    kinds = [item.type for item in sdk.conversations.items.list(conv.id, order="asc", limit=100)]
    assert kinds == ["message", "function_call", "function_call_output", "message", "message", "message"]
    roles = [m["role"] for m in upstream_messages(chain, "agents-conv-two")]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert {r["session_id"] for r in chain.records(conv.id)} == {conv.id} and len(chain.records(conv.id)) == 3


def test_stored_content_stays_out_of_the_logs(chain, sdk):
    marker = "zq-secret-stored-content-71"
    first = sdk.responses.create(model="x", input=f"remember {marker}", extra_headers={"x-session-id": "no-leak"})
    sdk.responses.create(model="x", input="and?", previous_response_id=first.id)
    sdk.responses.input_items.list(first.id)
    conv = sdk.conversations.create(items=[{"role": "user", "content": marker}])
    sdk.responses.create(model="x", input="go on", conversation=conv.id)
    assert marker in json.dumps(chain.records("no-leak"))  # it went through the server, and was captured
    assert marker not in chain.proc.output()


# ---- restart, scoping, bounds, the switch ------------------------------------------------------------


def test_restart_keeps_stored_responses_and_conversations(mock_upstream, tmp_path):
    first = launch_stack(mock_upstream, tmp_path / "cap")
    try:
        sdk = sdk_for(first.url)
        response = sdk.responses.create(model="x", input="remember me")
        conv = sdk.conversations.create(items=[{"role": "user", "content": "kept"}])
    finally:
        first.proc.stop()
    second = launch_stack(mock_upstream, tmp_path / "cap")
    try:
        sdk = sdk_for(second.url)
        assert sdk.responses.retrieve(response.id).output_text == response.output_text
        assert sdk.responses.create(model="x", input="again", previous_response_id=response.id).status == "completed"
        assert [item.content[0].text for item in sdk.conversations.items.list(conv.id)] == ["kept"]
    finally:
        second.proc.stop()


def test_auth_scoping_and_bounds_under_load(mock_upstream, tmp_path):
    config = tmp_path / "cfg.yaml"
    config.write_text("api_keys: [key-a, key-b]\nresponse_store_max_count: 20\n")
    chain = launch_stack(mock_upstream, tmp_path / "cap", "--config", str(config))
    try:
        alice, bob = sdk_for(chain.url, "key-a"), sdk_for(chain.url, "key-b")
        mine = alice.responses.create(model="x", input="alice's")
        conv = alice.conversations.create()
        for call in (
            lambda: bob.responses.retrieve(mine.id),
            lambda: bob.responses.delete(mine.id),
            lambda: bob.responses.create(model="x", input="x", previous_response_id=mine.id),
            lambda: bob.conversations.retrieve(conv.id),
            lambda: bob.responses.create(model="x", input="x", conversation=conv.id),
        ):
            with pytest.raises(openai.NotFoundError):
                call()
        assert alice.responses.retrieve(mine.id).id == mine.id

        # A bounded load: 80 responses from 6 threads at once (4x the bound), then the store's own count.
        def one(i: int) -> str:
            return alice.responses.create(model="x", input=f"load {i}").id

        with ThreadPoolExecutor(6) as pool:
            made = list(pool.map(one, range(80)))
        last_ids = [alice.responses.create(model="x", input="after the load").id]
        assert len(set(made)) == 80  # without eviction the store would hold all of them
        with sqlite3.connect(tmp_path / "cap" / "state.sqlite3") as db:
            count = db.execute("SELECT COUNT(*) FROM responses").fetchone()[0]
        assert count <= 20
        assert alice.responses.retrieve(last_ids[-1]).id == last_ids[-1]  # the newest survive
    finally:
        chain.proc.stop()


def test_response_store_off(mock_upstream, tmp_path):
    config = tmp_path / "cfg.yaml"
    config.write_text("response_store: false\n")
    chain = launch_stack(mock_upstream, tmp_path / "cap", "--config", str(config))
    try:
        sdk = sdk_for(chain.url)
        response = sdk.responses.create(model="x", input="not kept")
        assert response.store is False
        with pytest.raises(openai.NotFoundError):
            sdk.responses.retrieve(response.id)
        with pytest.raises(openai.BadRequestError) as caught:
            sdk.responses.create(model="x", input="x", previous_response_id=response.id)
        assert caught.value.body["code"] == "response_store_disabled"
        assert not (tmp_path / "cap" / "state.sqlite3").exists()
    finally:
        chain.proc.stop()
