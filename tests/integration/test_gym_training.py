"""NeMo Gym 0.7's training path against this server, checked with Gym's own code.

Gym's agents call `/ng-rollout/<id>/training-token-capture/v1/...` when its token capture is on, and
its collector reads the rollout's tokens from its own token store. The tests start this server the
way Gym's launcher does (Gym's shipped YAML, the drop-in entrypoint), make agent-shaped calls on that
path, and read the result with Gym's `trajectories_for_rollout`, comparing it with this server's own
`/rollout`. They need NeMo Gym 0.7.0 installed (`make venv` does it).
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from tests.support.procs import REPO, Proc, free_port, wait_for

DROP_IN = REPO / "profiles" / "gym" / "responses_api_models" / "switchyard_model"
TRAINING = "training-token-capture"
TOOLS = [
    {
        "type": "function",
        "name": "bash",
        "description": "run a shell command",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
    }
]
CHAT_TOOLS = [{"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}} for tool in TOOLS]


def post(url: str, path: str, body: dict, headers: dict | None = None) -> httpx.Response:
    return httpx.post(url + path, json=body, headers=headers, timeout=30)


def test_the_training_path_is_served_and_correlated(chain):
    """Without Gym's capture configured the path still works: stripped, correlated, recorded."""
    responses = post(
        chain.url, f"/ng-rollout/train-a/{TRAINING}/v1/responses", {"model": "m", "input": "hi [[mock:say one]]"}
    )
    assert responses.status_code == 200, responses.text
    assert responses.json()["output"][0]["content"][0]["text"] == "one"
    chat = post(
        chain.url,
        f"/ng-rollout/train-a/{TRAINING}/v1/chat/completions",
        {"model": "m", "messages": [{"role": "user", "content": "hi [[mock:say two]]"}]},
    )
    assert chat.status_code == 200, chat.text
    session = httpx.get(chain.url + "/v1/sessions/train-a/completions").json()
    assert session["session_id"] == "train-a" and len(session["completions"]) == 2


# ---- with NeMo Gym's own code ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def gym():
    return pytest.importorskip("nemo_gym.token_id_capture", reason="NeMo Gym 0.7.0 is installed by `make venv`")


def shipped_gym_block() -> dict:
    """The `switchyard_model` block of Gym 0.7.0's own configs/switchyard_model.yaml, from the installed wheel."""
    import importlib.util

    spec = importlib.util.find_spec("responses_api_models")
    assert spec is not None and spec.submodule_search_locations, "Gym's responses_api_models is not installed"
    path = Path(next(iter(spec.submodule_search_locations))) / "switchyard_model" / "configs" / "switchyard_model.yaml"
    return yaml.safe_load(path.read_text())["policy_model"]["responses_api_models"]["switchyard_model"]


def start_as_gym(
    mock_upstream: str,
    tmp_path: Path,
    global_settings: dict,
    wait: bool = True,
    env: dict | None = None,
    **block_overrides,
) -> tuple[Proc, str]:
    """Gym's launcher: `python app.py` in the server directory with the merged config in the environment."""
    port = free_port()
    block = {**shipped_gym_block(), "host": "127.0.0.1", "port": port, "name": "policy_model", **block_overrides}
    merged = {
        "policy_model_name": "demo",
        "policy_model": {"responses_api_models": {"switchyard_model": block}},
        **global_settings,
    }
    proc = Proc(
        [sys.executable, "app.py"],
        cwd=DROP_IN,
        env={
            "NEMO_GYM_CONFIG_DICT": yaml.safe_dump(merged),
            "NEMO_GYM_CONFIG_PATH": "policy_model",
            "SWITCHYARD_DEPLOYMENT": "demo",
            "MOCK_UPSTREAM_URL": mock_upstream + "/v1",
            "SWITCHYARD_MODEL_CAPTURE_DIR": str(tmp_path / "captures"),
            "PYTHONPATH": str(REPO),
            **(env or {}),
        },
    )
    url = f"http://127.0.0.1:{port}"
    if not wait:
        return proc, url
    try:
        proc.wait_http(url + "/health")
    except BaseException:
        proc.stop()
        raise
    return proc, url


@pytest.fixture(scope="module")
def gym_server(gym, mock_upstream, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gym")
    tokens = tmp / "tokens"
    global_settings = {
        "token_id_capture": {"enabled": True, "dir": str(tokens)},
        "observability_enabled": True,
        "model_call_capture_dir": str(tmp / "calls"),
    }
    proc, url = start_as_gym(mock_upstream, tmp, global_settings)
    yield url, tokens, proc
    proc.stop()


def triples(items: list[dict]) -> list[tuple[list, list, list]]:
    return [
        (item["prompt_token_ids"], item["generation_token_ids"], item["generation_log_probs"])
        for item in items
        if item.get("generation_token_ids") is not None
    ]


def gym_rollout(gym, tokens: Path, rollout_id: str) -> dict:
    from nemo_gym.token_id_capture.consumer import trajectories_for_rollout

    built = trajectories_for_rollout(rollout_id, [tokens])
    assert built is not None
    return built


def our_rollout(url: str, session_id: str) -> dict:
    return httpx.get(f"{url}/v1/sessions/{session_id}/rollout", timeout=30).json()


def responses_agent(url: str, rollout_id: str, *, stream: bool, headers: dict | None = None) -> None:
    """Two turns of a Responses agent: reasoning and a tool call, then the tool's output and an answer."""
    path = f"/ng-rollout/{rollout_id}/{TRAINING}/v1/responses"
    items: list[dict] = [
        {
            "role": "user",
            "content": 'list it [[mock:reasoning]] [[mock:tool bash {"command": "ls"}]] [[mock:next]] [[mock:say done]]',
        }
    ]
    for _ in range(2):
        body = {"model": "m", "input": items, "tools": TOOLS, "instructions": "be brief", "stream": stream}
        if stream:
            with httpx.stream("POST", url + path, json=body, headers=headers, timeout=30) as reply:
                assert reply.status_code == 200
                events = [json.loads(line[6:]) for line in reply.iter_lines() if line.startswith("data: {")]
            response = next(e["response"] for e in events if e.get("type") == "response.completed")
        else:
            reply = post(url, path, body, headers)
            assert reply.status_code == 200, reply.text
            response = reply.json()
        items = items + response["output"]
        calls = [item for item in response["output"] if item["type"] == "function_call"]
        if calls:
            items.append({"type": "function_call_output", "call_id": calls[0]["call_id"], "output": "a b"})


def chat_agent(url: str, rollout_id: str, *, stream: bool) -> None:
    path = f"/ng-rollout/{rollout_id}/{TRAINING}/v1/chat/completions"
    messages: list[dict] = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": 'go [[mock:tool bash {"command": "ls"}]] [[mock:next]] [[mock:say done]]'},
    ]
    for _ in range(2):
        body = {"model": "m", "messages": messages, "tools": CHAT_TOOLS, "stream": stream}
        if stream:
            with httpx.stream("POST", url + path, json=body, timeout=30) as reply:
                assert reply.status_code == 200
                chunks = [json.loads(line[6:]) for line in reply.iter_lines() if line.startswith("data: {")]
            message: dict = {
                "role": "assistant",
                "content": "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices"))
                or None,
            }
            calls: dict[int, dict] = {}
            for chunk in chunks:
                for choice in chunk.get("choices") or []:
                    for delta in choice["delta"].get("tool_calls") or []:
                        call = calls.setdefault(
                            delta["index"], {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
                        )
                        call["id"] += delta.get("id") or ""
                        call["function"]["name"] += (delta.get("function") or {}).get("name") or ""
                        call["function"]["arguments"] += (delta.get("function") or {}).get("arguments") or ""
            if calls:
                message["tool_calls"] = [calls[i] for i in sorted(calls)]
        else:
            reply = post(url, path, body)
            assert reply.status_code == 200, reply.text
            message = reply.json()["choices"][0]["message"]
        messages.append(message)
        if message.get("tool_calls"):
            messages.append({"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": "a b"})


@pytest.mark.parametrize(
    "agent, stream",
    [(responses_agent, False), (responses_agent, True), (chat_agent, False), (chat_agent, True)],
    ids=["responses", "responses-stream", "chat", "chat-stream"],
)
def test_training_calls_land_in_gyms_token_store(gym, gym_server, agent, stream):
    url, tokens, _ = gym_server
    rollout_id = f"{agent.__name__}-{'s' if stream else 'n'}"
    agent(url, rollout_id, stream=stream)
    built = gym_rollout(gym, tokens, rollout_id)
    assert built["mask_sample"] is False, built["metrics"]
    assert built["metrics"]["n_calls"] == 2 and built["metrics"]["chains"] == 1
    ours = our_rollout(url, rollout_id)
    assert ours["mask_sample"] is False
    gym_triples = triples(built["rebuilt_response"]["output"])
    assert len(gym_triples) == 2 and gym_triples == triples(ours["output"])


def test_a_sub_agent_is_a_rollout_of_its_own_in_both(gym, gym_server):
    url, tokens, _ = gym_server
    responses_agent(url, "parent-1", stream=False)
    responses_agent(url, "child-1", stream=True, headers={"x-parent-session-id": "parent-1"})
    for rollout_id in ("parent-1", "child-1"):
        built = gym_rollout(gym, tokens, rollout_id)
        assert built["mask_sample"] is False
        assert triples(built["rebuilt_response"]["output"]) == triples(our_rollout(url, rollout_id)["output"])
    subagents = our_rollout(url, "parent-1")["subagents"]
    assert [s["session_id"] for s in subagents] == ["child-1"]


def test_a_call_without_token_ids_masks_the_rollout_in_gyms_eyes(gym, gym_server):
    """The engine fails the second call: Gym's store holds an intent without an entry, and masks."""
    url, tokens, _ = gym_server
    path = f"/ng-rollout/lost-1/{TRAINING}/v1/responses"
    first = post(url, path, {"model": "m", "input": "one [[mock:say a]]"})
    assert first.status_code == 200
    from nemo_gym.token_id_capture.store import TokenCaptureStore

    assert len(TokenCaptureStore(tokens).read_entries("lost-1")) == 1  # not frozen: the collector does that
    items = [{"role": "user", "content": "one [[mock:say a]]"}, *first.json()["output"]]
    items.append({"role": "user", "content": "two [[mock:error 500]]"})
    assert post(url, path, {"model": "m", "input": items}).status_code >= 500
    built = gym_rollout(gym, tokens, "lost-1")
    assert built["mask_sample"] is True and built["metrics"].get("capture_incomplete") is True


def test_a_cut_stream_masks_the_rollout_in_gyms_eyes(gym, gym_server):
    """The engine's stream breaks off: the client gets an in-band error, Gym's store an intent without an entry."""
    url, tokens, _ = gym_server
    body = {"model": "m", "input": "hi [[mock:streamcut 3]]", "stream": True}
    with httpx.stream("POST", f"{url}/ng-rollout/cut-1/{TRAINING}/v1/responses", json=body, timeout=30) as reply:
        assert reply.status_code == 200 and "response.failed" in reply.read().decode()
    built = gym_rollout(gym, tokens, "cut-1")
    assert built["mask_sample"] is True and built["metrics"].get("capture_incomplete") is True


def test_a_failed_write_marks_the_rollout_incomplete(gym, gym_server):
    """The store cannot take the entry (its rollout file is a directory): the call is served, the
    rollout marked incomplete, as Gym's own model servers do."""
    url, tokens, _ = gym_server
    from nemo_gym.token_id_capture.store import TokenCaptureStore

    store = TokenCaptureStore(tokens)
    store.path_for("unwritable-1").mkdir(parents=True)
    reply = post(url, f"/ng-rollout/unwritable-1/{TRAINING}/v1/responses", {"model": "m", "input": "hi"})
    assert reply.status_code == 200
    assert store.is_incomplete("unwritable-1")


def test_gyms_conformance_and_golden_vectors_pass_on_the_store_it_writes(gym, gym_server):
    from nemo_gym.token_id_capture.conformance import run_conformance
    from nemo_gym.token_id_capture.lineage import FileLineageStore
    from nemo_gym.token_id_capture.staging import assert_golden_vectors
    from nemo_gym.token_id_capture.store import TokenCaptureStore

    assert_golden_vectors()  # Gym's digests, computed on this Python as on Gym's
    _, tokens, _ = gym_server
    passed = asyncio.run(
        run_conformance(
            lambda: TokenCaptureStore(tokens), lambda: TokenCaptureStore(tokens), lambda: FileLineageStore(tokens)
        )
    )
    assert len(passed) == 10


def test_forward_session_id_without_capture_warns_when_defaulted_and_refuses_when_explicit(
    gym, mock_upstream, tmp_path
):
    """Gym's startup check: without evaluation or token capture Gym's agents send no rollout prefix."""
    explicit, _ = start_as_gym(mock_upstream, tmp_path, {}, wait=False, forward_session_id=True)
    try:
        assert explicit.popen.wait(60) == 2
        assert "forward_session_id is on" in explicit.output()
    finally:
        explicit.stop()
    defaulted, url = start_as_gym(mock_upstream, tmp_path, {})  # Gym's shipped block leaves it unset
    try:
        assert defaulted.output().count("forward_session_id is on") == 1  # told once
        assert post(url, "/v1/responses", {"model": "m", "input": "hi"}).status_code == 200
    finally:
        defaulted.stop()
    observed, _ = start_as_gym(
        mock_upstream, tmp_path, {"observability_enabled": True, "model_call_capture_dir": str(tmp_path / "mc")}
    )
    try:
        assert "forward_session_id is on" not in observed.output()
    finally:
        observed.stop()


def test_chat_answers_carry_the_token_bundle_where_gym_reads_it(gym, gym_server):
    """In Gym mode, a chat answer asked for its ids has them on choices[0].message (Gym's vllm_model)."""
    from nemo_gym.token_id_capture.records import extract_token_fields

    url, _, _ = gym_server
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "return_token_id_information": True}
    answer = post(url, "/v1/chat/completions", body).json()
    fields = extract_token_fields(answer)
    assert fields is not None and fields["generation_token_ids"] and fields["prompt_token_ids"]
    assert len(fields["generation_log_probs"]) == len(fields["generation_token_ids"])
    assert "prompt_token_ids" not in answer and "token_ids" not in answer["choices"][0]  # not twice


# The fields of one exchange in Gym 0.7.0's evaluation capture (`_record` in base_responses_api_model.py).
GYM_EXCHANGE_KEYS = {
    "model_call_id",
    "dialect",
    "model_ref",
    "started_at",
    "completed_at",
    "latency_ms",
    "latency_ttft_ms",
    "status_code",
    "error_category",
    "request",
    "response",
}


def exchanges(tokens: Path, rollout_id: str) -> list[dict]:
    path = tokens.parent / "calls" / f"{rollout_id}.capture.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_evaluation_capture_writes_gyms_exchanges_joined_to_the_token_entries(gym, gym_server):
    from nemo_gym.token_id_capture.store import TokenCaptureStore

    url, tokens, _ = gym_server
    responses_agent(url, "joined-1", stream=True)
    lines = exchanges(tokens, "joined-1")
    assert [set(line) for line in lines] == [GYM_EXCHANGE_KEYS] * 2
    assert [line["dialect"] for line in lines] == ["responses"] * 2 and lines[0]["status_code"] == 200
    assert lines[0]["model_ref"] == {"type": "responses_api_models", "name": "policy_model"}
    assert lines[0]["request"]["input"][0]["role"] == "user" and lines[1]["response"]["object"] == "response"
    entries = TokenCaptureStore(tokens).read_entries("joined-1")
    assert [line["model_call_id"] for line in lines] == [entry.model_call_id for entry in entries]

    # The evaluation prefix alone (no training segment): an exchange, no token entry; a failed call too.
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert post(url, "/ng-rollout/eval-only-1/v1/chat/completions", chat).status_code == 200
    failing = {"model": "m", "messages": [{"role": "user", "content": "[[mock:error 429 0]]"}]}
    assert post(url, "/ng-rollout/eval-only-1/v1/chat/completions", failing).status_code == 429
    # A failed call's exchange is written once its error has gone out: the client may read first.
    lines = wait_for(lambda: len(exchanges(tokens, "eval-only-1")) == 2 and exchanges(tokens, "eval-only-1"))
    assert [(line["dialect"], line["status_code"], line["error_category"]) for line in lines] == [
        ("chat", 200, None),
        ("chat", 429, "rate_limit"),
    ]
    assert lines[0]["response"]["choices"][0]["message"]["content"]
    assert TokenCaptureStore(tokens).read_entries("eval-only-1") == []


def test_several_workers_share_the_lineage_through_gyms_file_store(gym, mock_upstream, tmp_path):
    """Gym's num_workers (attached): two worker processes, each with Gym's file store and its
    process-shared lineage over one directory; every rollout builds whole whichever worker took a turn."""
    from tests.support.procs import start_switchyard_host

    host, switchyard_v1 = start_switchyard_host(mock_upstream)
    tokens = tmp_path / "tokens"
    try:
        proc, url = start_as_gym(
            mock_upstream,
            tmp_path,
            {"token_id_capture": {"enabled": True, "dir": str(tokens)}},
            num_workers=2,
            switchyard_base_url=switchyard_v1,
            deployment=None,
        )
        try:
            assert wait_for(lambda: "2 workers" in proc.output())  # announced once both are up
            for n in range(4):  # each turn on a fresh connection: the kernel spreads them over the workers
                responses_agent(url, f"workers-{n}", stream=bool(n % 2))
                built = gym_rollout(gym, tokens, f"workers-{n}")
                assert built["mask_sample"] is False and built["metrics"]["chains"] == 1, built["metrics"]
                assert triples(built["rebuilt_response"]["output"]) == triples(
                    our_rollout(url, f"workers-{n}")["output"]
                )
        finally:
            proc.stop()
    finally:
        host.stop()


# ---- Anthropic Messages on the training path ------------------------------------------------------

BASH = {
    "name": "bash",
    "description": "run a shell command",
    "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
}


def messages_agent(url: str, rollout_id: str, *, stream: bool, training: bool = True) -> list:
    """Two turns of a Claude-Code-shaped agent through Anthropic's SDK: thinking and a tool use, then
    the blocks sent back as served (signed thinking included) with the tool's result, and an answer."""
    import anthropic

    prefix = f"/ng-rollout/{rollout_id}/{TRAINING}" if training else f"/ng-rollout/{rollout_id}"
    sdk = anthropic.Anthropic(
        base_url=url + prefix,
        api_key="sk-test",
        max_retries=0,
        timeout=30,
        http_client=anthropic.DefaultHttpxClient(),
    )
    request = {"model": "m", "max_tokens": 300, "system": "be brief", "tools": [BASH]}
    request["thinking"] = {"type": "enabled", "budget_tokens": 100}
    history: list[dict] = [
        {
            "role": "user",
            "content": 'list it [[mock:reasoning]] [[mock:tool bash {"command": "ls"}]] [[mock:next]] [[mock:say done]]',
        }
    ]
    answers = []
    for _ in range(2):
        if stream:
            with sdk.messages.stream(**request, messages=history) as events:
                message = events.get_final_message()
        else:
            message = sdk.messages.create(**request, messages=history)
        answers.append(message)
        history.append(
            {"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in message.content]}
        )
        uses = [block for block in message.content if block.type == "tool_use"]
        if uses:
            history.append(
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": "a b"}]}
            )
    return answers


@pytest.mark.parametrize("stream", [False, True], ids=["messages", "messages-stream"])
def test_messages_calls_land_in_gyms_token_store_as_gym_writes_them(gym, gym_server, stream):
    """As Gym's own /v1/messages captures them: Responses output items under the served message's id,
    their parent found from the next request's tool_use blocks; Gym builds the same triples as /rollout."""
    from nemo_gym.token_id_capture.store import TokenCaptureStore

    url, tokens, _ = gym_server
    rollout_id = f"messages-{'s' if stream else 'n'}"
    first, second = messages_agent(url, rollout_id, stream=stream)
    assert first.stop_reason == "tool_use" and [b.type for b in first.content] == ["thinking", "tool_use"]
    assert second.content[-1].type == "text" and second.content[-1].text == "done"

    entries = TokenCaptureStore(tokens).read_entries(rollout_id)
    assert [entry.response_id for entry in entries] == [first.id, second.id]  # one id for both, as in Gym
    assert [item["type"] for item in entries[0].output_items] == ["reasoning", "function_call"]
    assert entries[0].output_items[1]["call_id"] == first.content[1].id
    assert entries[1].parent_call_id == entries[0].model_call_id

    built = gym_rollout(gym, tokens, rollout_id)
    assert built["mask_sample"] is False, built["metrics"]
    assert built["metrics"]["n_calls"] == 2 and built["metrics"]["chains"] == 1
    ours = our_rollout(url, rollout_id)
    assert ours["mask_sample"] is False
    gym_triples = triples(built["rebuilt_response"]["output"])
    assert len(gym_triples) == 2 and gym_triples == triples(ours["output"])

    # Gym's evaluation exchanges hold the answers as the client got them, joined to the entries.
    lines = exchanges(tokens, rollout_id)
    assert [line["dialect"] for line in lines] == ["messages"] * 2
    assert [line["response"]["id"] for line in lines] == [first.id, second.id]
    assert [b["type"] for b in lines[0]["response"]["content"]] == ["thinking", "tool_use"]
    assert [line["model_call_id"] for line in lines] == [entry.model_call_id for entry in entries]


def test_messages_calls_off_the_training_path_leave_gyms_rollout_without_tokens(gym, gym_server):
    """Negative control: the same agent on the evaluation prefix alone is served and logged, but Gym's
    store gets nothing, so Gym's collector masks the rollout: the entries above come from the training path."""
    url, tokens, _ = gym_server
    first, _ = messages_agent(url, "messages-eval-only", stream=False, training=False)
    assert first.stop_reason == "tool_use"
    assert len(exchanges(tokens, "messages-eval-only")) == 2
    built = gym_rollout(gym, tokens, "messages-eval-only")
    assert built["mask_sample"] is True and built["error"] == "capture contains no token records"


def test_a_cut_messages_stream_masks_the_rollout_in_gyms_eyes(gym, gym_server):
    """A Messages stream that breaks off ends with an `error` event; Gym's store keeps an intent without an entry."""
    url, tokens, _ = gym_server
    body = {
        "model": "m",
        "max_tokens": 50,
        "stream": True,
        "messages": [{"role": "user", "content": "[[mock:streamcut 3]]"}],
    }
    with httpx.stream("POST", f"{url}/ng-rollout/cut-m/{TRAINING}/v1/messages", json=body, timeout=30) as reply:
        assert reply.status_code == 200 and "event: error" in reply.read().decode()
    built = gym_rollout(gym, tokens, "cut-m")
    assert built["mask_sample"] is True and built["metrics"].get("capture_incomplete") is True


def test_under_gym_switchyard_says_only_what_went_wrong_and_every_line_names_the_server(gym, mock_upstream, tmp_path):
    """The hosted Switchyard's per-call INFO lines would flood Gym's console; its errors stay."""
    capture = {"observability_enabled": True, "model_call_capture_dir": str(tmp_path / "mc")}

    def console(env: dict | None) -> str:
        proc, url = start_as_gym(mock_upstream, tmp_path, capture, env=env)
        try:
            assert post(url, "/ng-rollout/quiet-0/v1/responses", {"model": "m", "input": "hi"}).status_code == 200
            failed = post(url, "/ng-rollout/quiet-1/v1/responses", {"model": "m", "input": "[[mock:error 400]]"})
            assert failed.status_code == 400
        finally:
            proc.stop()
        return proc.output()

    quiet = console(None)
    lines = [line for line in quiet.splitlines() if line.strip()]
    assert lines and all(line.startswith("(policy_model) ") for line in lines), quiet[-3000:]
    assert "LLM request handled" not in quiet  # Switchyard's INFO line for each call
    assert any("LLM request failed" in line for line in lines), quiet[-3000:]  # its error kept
    assert "listening on http://127.0.0.1" in quiet  # this server's own lines too
    # The control: the INFO lines are there to silence (a RUST_LOG the user sets wins).
    assert "LLM request handled" in console({"RUST_LOG": "info"})
