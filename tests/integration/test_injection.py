"""Token-continuity injection through the real chain: openai SDK → this server → hosted Switchyard → mock upstream.

The mock renders past assistant turns without their reasoning (Qwen3-like), so a plain reasoning
session breaks token contiguity at every turn; every contiguity test below has that negative control.
What the engine really used is read from the mock's own request log.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from openai import OpenAI

from server.injection.id_fields import ENGINES
from tests.support.procs import start_mock_upstream, start_server, start_switchyard_host
from tests.support.stack import Stack, launch_stack, token_breaks
from tests.support.toy_engine import ENGINE_FIELDS

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
RESPONSES_TOOLS = [{"type": "function", **TOOLS[0]["function"]}]
SYSTEM = {"role": "system", "content": "You are a coding agent."}
# Reasoning on every reply; two tool calls (one per step), then a final answer.
TASK = (
    'fix it [[mock:reasoning]] [[mock:tool bash {"command": "ls"}]] [[mock:next]] '
    '[[mock:tool bash {"command": "cat a.txt"}]] [[mock:next]] [[mock:say all done]]'
)
TITLE_CALL = [
    {"role": "system", "content": "You are a title generator. Output a short title."},
    {"role": "user", "content": "fix it"},
]


@pytest.fixture(scope="module")
def upstream():
    proc, url = start_mock_upstream(None, "--template", "drop-reasoning")
    yield url
    proc.stop()


@pytest.fixture(scope="module")
def injected(upstream, tmp_path_factory):
    stack = launch_stack(upstream, tmp_path_factory.mktemp("inj"), "--token-injection")
    yield stack
    stack.proc.stop()


@pytest.fixture(scope="module")
def plain(upstream, tmp_path_factory):
    stack = launch_stack(upstream, tmp_path_factory.mktemp("plain"))
    yield stack
    stack.proc.stop()


@pytest.fixture(autouse=True)
def fresh_mock(upstream):
    httpx.post(upstream + "/mock/reset")
    httpx.post(upstream + "/mock/config", json={"token_in": "honor"})
    yield


# ---- clients ---------------------------------------------------------------------------------------


def client(
    chain: Stack | str, session: str, via_prefix: bool = False, http_client: httpx.Client | None = None
) -> OpenAI:
    """A client whose calls carry `session` in a header, or (`via_prefix`) only in Gym's `/ng-rollout/<id>/` path."""
    url = chain if isinstance(chain, str) else chain.url
    if via_prefix:
        return OpenAI(base_url=f"{url}/ng-rollout/{session}/v1", api_key="x", max_retries=0, http_client=http_client)
    headers = {"x-switchyard-session-id": session}
    return OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, default_headers=headers, http_client=http_client)


def tool_results(calls: list[dict]) -> list[dict]:
    return [
        {"role": "tool", "tool_call_id": c["id"], "content": f"output of {c['function']['arguments']}"} for c in calls
    ]


def chat_turn(cl: OpenAI, messages: list[dict], stream: bool) -> tuple[str, list[dict]]:
    """One chat call; returns (content, tool calls) as a client keeps them (reasoning dropped)."""
    if not stream:
        message = cl.chat.completions.create(model="demo", messages=messages, tools=TOOLS).choices[0].message
        calls = [
            {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
            for c in message.tool_calls or ()
        ]
        return message.content or "", calls
    content, calls = "", {}
    for chunk in cl.chat.completions.create(model="demo", messages=messages, tools=TOOLS, stream=True):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for tc in delta.tool_calls or ():
            slot = calls.setdefault(tc.index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
            slot["id"] = tc.id or slot["id"]
            if tc.function is not None:
                slot["function"]["name"] += tc.function.name or ""
                slot["function"]["arguments"] += tc.function.arguments or ""
    return content, [calls[i] for i in sorted(calls)]


def chat_session(
    chain_for: Callable[[int], Stack | str],
    session: str,
    stream: bool,
    side_call_after: int | None = None,
    via_prefix: bool = False,
    http_client: httpx.Client | None = None,
    task: str = TASK,
) -> None:
    messages: list[dict] = [SYSTEM, {"role": "user", "content": task}]
    for turn in range(3):
        cl = client(chain_for(turn), session, via_prefix, http_client)
        content, calls = chat_turn(cl, messages, stream)
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = calls
        messages += [message, *tool_results(calls)]
        if side_call_after == turn:
            cl.chat.completions.create(model="demo", messages=TITLE_CALL)
        if not calls:
            break


def responses_stream_session(chain: Stack, session: str, via_prefix: bool = False) -> None:
    """A Responses client that does not send reasoning items back."""
    cl = client(chain, session, via_prefix)
    items: list[dict] = [
        {"role": "system", "content": SYSTEM["content"]},
        {"role": "user", "content": TASK},
    ]
    for _ in range(3):
        final = None
        with cl.responses.stream(model="demo", input=items, tools=RESPONSES_TOOLS) as stream:
            for _event in stream:
                pass
            final = stream.get_final_response()
        calls = [o for o in final.output if o.type == "function_call"]
        for o in final.output:
            if o.type == "function_call":
                items.append({"type": "function_call", "call_id": o.call_id, "name": o.name, "arguments": o.arguments})
            elif o.type == "message":
                items.append({"role": "assistant", "content": o.content[0].text})
        items += [
            {"type": "function_call_output", "call_id": c.call_id, "output": f"output of {c.arguments}"} for c in calls
        ]
        if not calls:
            break


def responses_stateful_session(chain: Stack, session: str, stateful: str) -> None:
    """A Responses client that keeps no history itself: each call sends only its new items, on top of
    `previous_response_id` or a `conversation` (the server expands the stored history)."""
    cl = client(chain, session)
    conversation = cl.conversations.create().id if stateful == "conversation" else None
    items: list[dict] = [{"role": "system", "content": SYSTEM["content"]}, {"role": "user", "content": TASK}]
    previous = None
    for _ in range(3):
        context: dict[str, Any] = {"conversation": conversation} if conversation else {}
        if previous is not None:
            context["previous_response_id"] = previous
        reply = cl.responses.create(model="demo", input=items, tools=RESPONSES_TOOLS, **context)
        previous = None if conversation else reply.id
        calls = [o for o in reply.output if o.type == "function_call"]
        items = [
            {"type": "function_call_output", "call_id": c.call_id, "output": f"output of {c.arguments}"} for c in calls
        ]
        if not calls:
            break


# ---- what the engine saw and what was recorded ----------------------------------------------------


def engine_calls(upstream: str, main_only: bool = True) -> list[dict]:
    """The chat calls the mock served, in order (title calls left out unless asked)."""
    log = httpx.get(upstream + "/mock/requests").json()["requests"]
    calls = [e for e in log if e["path"] == "/v1/chat/completions" and "prompt_token_ids" in e]
    if main_only:
        calls = [e for e in calls if "title generator" not in json.dumps(e["body"]["messages"][0])]
    return calls


def rollout(chain: Stack, session: str, run: str | None = None) -> dict:
    params = {"run": run} if run else None
    return httpx.get(f"{chain.url}/v1/sessions/{session}/rollout", params=params).json()


def assert_one_chain(chain: Stack, upstream: str, session: str, run: str | None = None) -> None:
    calls = engine_calls(upstream)
    assert len(calls) == 3 and token_breaks(calls) == []
    main = [r for r in chain.records(session) if "title generator" not in json.dumps(r["messages"][0])]
    assert [r["prompt_token_ids"] for r in main] == [c["prompt_token_ids"] for c in calls]
    assert [r["injection"]["fallback_reason"] for r in main] == ["first_call", None, None]
    assert len({r["injection"]["chain"] for r in main}) == 1
    result = rollout(chain, session, run)
    assert result["partial_reason"] is None and result["mask_sample"] is False
    assert result["record_uuids"] == [r["uuid"] for r in main]


# ---- the three client shapes, and their negative controls -------------------------------------------


SHAPES = ["chat", "chat-stream", "responses-stream", "previous_response_id", "conversation"]


def run_session(chain: Stack, session: str, shape: str) -> None:
    if shape == "responses-stream":
        responses_stream_session(chain, session)
    elif shape in ("previous_response_id", "conversation"):
        responses_stateful_session(chain, session, shape)
    else:
        chat_session(lambda turn: chain, session, stream=shape == "chat-stream")


@pytest.mark.parametrize("shape", SHAPES)
def test_a_reasoning_session_reaches_the_engine_as_one_token_chain(injected, upstream, shape):
    session = f"inj-{shape}-{uuid.uuid4().hex[:8]}"
    run_session(injected, session, shape)
    assert_one_chain(injected, upstream, session)


@pytest.mark.parametrize("shape", SHAPES)
def test_without_injection_the_same_session_breaks_and_the_rollout_says_so(plain, upstream, shape):
    session = f"plain-{shape}-{uuid.uuid4().hex[:8]}"
    run_session(plain, session, shape)
    assert token_breaks(engine_calls(upstream)) == [1, 2]
    result = rollout(plain, session)
    assert result["mask_sample"] is True and "do not extend" in result["partial_reason"]


@pytest.mark.parametrize("shape", ["chat", "responses-stream"])
def test_a_session_under_the_ng_rollout_prefix_is_injected_and_its_rollout_is_whole(injected, plain, upstream, shape):
    """Gym's observability prefix names the session (no session header): the chain is keyed on it."""
    for chain, injects in ((injected, True), (plain, False)):  # the plain server: the negative control
        httpx.post(upstream + "/mock/reset")
        rollout_id = f"ngr-{shape}-{uuid.uuid4().hex[:8]}"
        if shape == "responses-stream":
            responses_stream_session(chain, rollout_id, via_prefix=True)
        else:
            chat_session(lambda turn, chain=chain: chain, rollout_id, stream=False, via_prefix=True)
        if injects:
            assert_one_chain(chain, upstream, rollout_id)
            assert {r["session_id"] for r in chain.records(rollout_id)} == {rollout_id}
        else:
            assert token_breaks(engine_calls(upstream)) == [1, 2]
            result = rollout(chain, rollout_id)
            assert result["mask_sample"] is True and "do not extend" in result["partial_reason"]


# ---- side calls, restarts, two processes, an engine without the field -----------------------------------


def test_a_side_call_neither_breaks_nor_joins_the_main_chain(injected, upstream):
    session = f"side-{uuid.uuid4().hex[:8]}"
    chat_session(lambda turn: injected, session, stream=False, side_call_after=0)
    assert_one_chain(injected, upstream, session)
    side = [r for r in injected.records(session) if "title generator" in json.dumps(r["messages"][0])]
    assert len(side) == 1 and side[0]["injection"]["fallback_reason"] == "no_matching_chain"
    main_chain = injected.records(session)[0]["injection"]["chain"]
    assert side[0]["injection"]["chain"] != main_chain
    assert rollout(injected, session)["side_calls"] == [side[0]["uuid"]]


def test_a_restart_mid_session_continues_the_chain_from_the_records(upstream, tmp_path):
    first = launch_stack(upstream, tmp_path, "--token-injection")
    session = f"restart-{uuid.uuid4().hex[:8]}"
    servers = [first]
    try:

        def chain_for(turn: int) -> Stack:
            if turn == 1:  # a fresh process: nothing in memory, only the records on disk
                servers[0].proc.stop()
                servers[0] = launch_stack(upstream, tmp_path, "--token-injection")
            return servers[0]

        chat_session(chain_for, session, stream=True)
        # Two server runs wrote the session: its default rollout covers the latest (docs/capture.md,
        # "Server runs"); the injected chain runs through both, which run=all shows whole.
        assert_one_chain(servers[0], upstream, session, run="all")
    finally:
        servers[0].proc.stop()


def test_two_processes_on_one_capture_dir_serve_a_session_alternately(upstream, tmp_path):
    a = launch_stack(upstream, tmp_path, "--token-injection")
    b = launch_stack(upstream, tmp_path, "--token-injection")
    session = f"alt-{uuid.uuid4().hex[:8]}"
    try:
        chat_session(lambda turn: (a, b)[turn % 2], session, stream=False)
        assert_one_chain(a, upstream, session, run="all")  # each process is a server run of its own
    finally:
        a.proc.stop()
        b.proc.stop()


def test_the_workers_of_one_server_serve_a_session_in_turn_and_keep_its_chain(upstream, tmp_path):
    """`serve --workers 2`: each call on a new connection, so the kernel hands a session's calls to either
    worker (the worker header says which); a worker that did not serve the previous call finds the chain
    in the capture records."""
    stack = launch_stack(upstream, tmp_path, "--token-injection", "--workers", "2")
    served_by: list[str] = []

    def note_worker(response: httpx.Response) -> None:
        if response.request.url.path.endswith("/chat/completions"):
            served_by.append(response.headers["x-switchyard-model-worker"])

    fresh_connections = httpx.Client(headers={"connection": "close"}, event_hooks={"response": [note_worker]})
    crossed = 0
    try:
        for attempt in range(12):  # until two sessions moved between workers mid-chain
            httpx.post(upstream + "/mock/reset")
            served_by.clear()
            session = f"workers-{attempt}-{uuid.uuid4().hex[:8]}"
            chat_session(lambda turn: stack, session, stream=attempt % 2 == 1, http_client=fresh_connections)
            assert_one_chain(stack, upstream, session, run="all")
            crossed += len(set(served_by)) > 1
            if crossed == 2:
                break
        assert crossed == 2, "the kernel never handed one session's calls to both workers"
    finally:
        fresh_connections.close()
        stack.proc.stop()


@pytest.mark.parametrize("injection", [True, False], ids=["injected", "plain"])
def test_concurrent_sessions_each_keep_a_chain_of_their_own(injected, plain, upstream, injection):
    """Eight sessions at once, streamed and not, each its own task: every session reaches the engine as
    one token chain of its own (no chain crosses sessions); without injection (the control) each breaks."""
    chain = injected if injection else plain
    sessions = [f"conc-{injection}-{i}-{uuid.uuid4().hex[:6]}" for i in range(8)]
    with ThreadPoolExecutor(len(sessions)) as pool:
        runs = [
            pool.submit(chat_session, lambda turn: chain, s, stream=i % 2 == 1, task=f"Task {i}: {TASK}")
            for i, s in enumerate(sessions)
        ]
        for run in runs:
            run.result()
    engine = {e["headers"].get("x-request-id"): e for e in engine_calls(upstream)}
    chain_ids = set()
    for session in sessions:
        calls = chain.records(session)
        assert len(calls) == 3
        assert token_breaks([engine[r["request_id"]] for r in calls]) == ([] if injection else [1, 2])
        if injection:
            assert [r["injection"]["fallback_reason"] for r in calls] == ["first_call", None, None]
            assert len({r["injection"]["chain"] for r in calls}) == 1
            chain_ids |= {r["injection"]["chain"] for r in calls}
    assert len(chain_ids) == (len(sessions) if injection else 0)


def test_attached_to_a_switchyard_run_elsewhere_it_asks_the_named_engine_to_tokenize(upstream, tmp_path):
    """Attach mode: Switchyard is another process, so the engine's /tokenize comes from the settings."""
    host, switchyard_v1 = start_switchyard_host(upstream)
    try:
        config = tmp_path / "settings.yaml"
        config.write_text(f"injection_tokenize_base_url: {upstream}\n")
        proc, url = start_server(
            "--switchyard-base-url",
            switchyard_v1,
            "--capture-dir",
            str(tmp_path / "captures"),
            "--token-injection",
            "--config",
            str(config),
        )
        attached = Stack(url, proc, tmp_path / "captures", upstream)
        try:
            assert httpx.get(url + "/health").json()["mode"] == "attach"
            session = f"attach-{uuid.uuid4().hex[:8]}"
            chat_session(lambda turn: attached, session, stream=False)
            assert_one_chain(attached, upstream, session)
            # The first call renders twice (learning the template's generation prompt), then one per call.
            assert httpx.get(upstream + "/mock/stats").json()["tokenize"] == 4
        finally:
            proc.stop()
    finally:
        host.stop()


def test_an_engine_that_ignores_the_field_gets_fallbacks_and_the_rollout_reports_the_break(injected, upstream):
    httpx.post(upstream + "/mock/config", json={"token_in": "ignore"})
    session = f"ignore-{uuid.uuid4().hex[:8]}"
    chat_session(lambda turn: injected, session, stream=False)
    calls = engine_calls(upstream)
    assert len(calls) == 3 and token_breaks(calls) == [1, 2]  # every call answered, plainly
    reasons = [r["injection"]["fallback_reason"] for r in injected.records(session)]
    assert reasons == ["first_call", "echo_mismatch", "echo_mismatch"]
    result = rollout(injected, session)
    assert result["mask_sample"] is True and "echo_mismatch" in result["partial_reason"]
    metrics = httpx.get(injected.url + "/metrics").text
    assert 'outcome="echo_mismatch"' in metrics and "switchyard_model_injection_calls_total" in metrics


@pytest.mark.parametrize("transport", [engine for engine in ENGINES if engine != "vllm"])
def test_the_other_transports_cross_switchyard_and_keep_the_chain(upstream, tmp_path, transport):
    """SGLang's input_ids and NeMo-RL's required_prefix_token_ids (the engine splices) reach the engine intact."""
    config = tmp_path / "settings.yaml"
    config.write_text(f"injection_transport: {transport}\n")
    stack = launch_stack(upstream, tmp_path / "captures", "--token-injection", "--config", str(config))
    session = f"{transport}-{uuid.uuid4().hex[:8]}"
    try:
        chat_session(lambda turn: stack, session, stream=False)
        assert_one_chain(stack, upstream, session)
        (field,) = ENGINE_FIELDS[transport]
        sent = [c["body"].get(field) for c in engine_calls(upstream)]
        assert sent[0] is None and all(isinstance(ids, list) and ids for ids in sent[1:])
        assert {r["injection"]["transport"] for r in stack.records(session)} == {transport}
        # NeMo-RL's engine renders and splices: its chains are matched by their messages, never tokenized here.
        tokenizes = httpx.get(upstream + "/mock/stats").json()["tokenize"]
        assert (tokenizes == 0) == (transport == "nemo_rl")
        # A Responses stream (its messages translated anew on every call) keeps its chain the same way.
        httpx.post(upstream + "/mock/reset")
        responses_stream_session(stack, session + "-responses")
        assert_one_chain(stack, upstream, session + "-responses")
        # And one whose history the server expands from its stored responses.
        httpx.post(upstream + "/mock/reset")
        responses_stateful_session(stack, session + "-stateful", "previous_response_id")
        assert_one_chain(stack, upstream, session + "-stateful")
    finally:
        stack.proc.stop()
