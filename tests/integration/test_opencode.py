"""opencode (npm opencode-ai) runs headless against the chain: a task sub-agent runs bash, and both sessions are captured token-exactly."""

from __future__ import annotations

from pathlib import Path

import httpx
import orjson
import pytest

from tests.support.agents import (
    ClientRun,
    assert_token_exact,
    client_env,
    get_json,
    installed,
    not_installed_reason,
    opencode_binary,
    run_client,
)
from tests.support.stack import token_breaks

pytestmark = [
    pytest.mark.clients,
    pytest.mark.skipif(not installed("opencode-ai"), reason=not_installed_reason("opencode-ai")),
]

ROUTE = "demo"
# opencode sends its session headers only for a provider whose id does not start with "opencode".
PROVIDER = "switchyard"


def opencode_limit(max_model_len: int) -> dict[str, int]:
    """Gym's rule for the model's `limit` block, from the route's max_model_len."""
    return {"context": max_model_len, "output": min(32000, max_model_len // 4)}


def opencode_config(base_url: str, limit: dict[str, int] | None) -> dict:
    model: dict = {"name": ROUTE}
    if limit is not None:
        model["limit"] = limit
    return {
        "$schema": "https://opencode.ai/config.json",
        "autoupdate": False,
        "share": "disabled",
        "model": f"{PROVIDER}/{ROUTE}",
        "provider": {
            PROVIDER: {
                "npm": "@ai-sdk/openai-compatible",
                "name": PROVIDER,
                "options": {"baseURL": base_url, "apiKey": "dummy"},
                "models": {ROUTE: model},
            },
        },
    }


def run_opencode(config: dict, tmp_path: Path, prompt: str) -> tuple[ClientRun, Path]:
    config_path = tmp_path / "opencode.json"
    config_path.write_bytes(orjson.dumps(config, option=orjson.OPT_INDENT_2))
    workdir = tmp_path / "work"
    workdir.mkdir()
    env = client_env(
        tmp_path / "home",
        OPENCODE_CONFIG=str(config_path),
        OPENCODE_DISABLE_MODELS_FETCH="1",
        OPENCODE_DISABLE_AUTOUPDATE="1",
        OPENCODE_DISABLE_SHARE="1",
        OPENCODE_DISABLE_LSP_DOWNLOAD="1",
        OPENCODE_DISABLE_DEFAULT_PLUGINS="1",
        # Nothing listens there: opencode's background plugin install fails at once instead of going online.
        npm_config_registry="http://127.0.0.1:9/",
    )
    # Separate words: opencode joins them with spaces (one quoted argument arrives wrapped in quotes).
    argv = [str(opencode_binary()), "run", "--format", "json", *prompt.split(" ")]
    return run_client(argv, cwd=workdir, env=env), workdir


def directive(tool: str, arguments: dict) -> str:
    return f"[[mock:tool {tool} {orjson.dumps(arguments).decode()}]]"


def is_title_call(record: dict) -> bool:
    system = record["messages"][0]
    return system["role"] == "system" and "title generator" in str(system["content"]).lower()


def test_opencode_task_sub_agent_runs_bash_and_both_sessions_are_token_exact(chain, tmp_path):
    models = get_json(chain.v1 + "/models")["data"]
    max_model_len = next(m["max_model_len"] for m in models if m["id"] == ROUTE)
    limit = opencode_limit(max_model_len)

    # The sub-agent's own prompt carries its directive; the main agent's directive parser skips
    # over it (it sits inside the task call's JSON), so it fires only in the sub-agent's turn.
    child_prompt = "Write the marker file. " + directive(
        "bash", {"command": "echo hello-from-opencode > marker.txt", "description": "Write the marker"}
    )
    prompt = "Delegate this to a sub-agent. " + directive(
        "task", {"description": "Write a marker", "prompt": child_prompt, "subagent_type": "general"}
    )
    run, workdir = run_opencode(opencode_config(chain.v1, limit), tmp_path, prompt)
    details = run.describe(chain.proc.output())
    assert run.returncode == 0, details
    assert (workdir / "marker.txt").is_file(), "the sub-agent's bash call did not run\n" + details
    assert (workdir / "marker.txt").read_text().strip() == "hello-from-opencode"

    events = run.events()
    root_id = events[0]["sessionID"]
    tasks = [e["part"] for e in events if e.get("type") == "tool_use" and e["part"].get("tool") == "task"]
    assert len(tasks) == 1 and tasks[0]["state"]["status"] == "completed", details
    child_id = tasks[0]["state"]["metadata"]["sessionId"]
    texts = [e["part"]["text"] for e in events if e.get("type") == "text"]
    # The main agent's final answer quotes the task result, which quotes the sub-agent's answer.
    assert texts and texts[-1].startswith("Done. The tool said:") and child_id in texts[-1], details

    # The session tree: opencode's x-session-id / x-parent-session-id headers.
    sessions = get_json(chain.v1 + "/sessions")["sessions"]
    roots = [s for s in sessions if not s["parent_session_id"]]
    assert [s["session_id"] for s in roots] == [root_id], sessions
    children = [s for s in sessions if s["parent_session_id"] == root_id]
    assert [s["session_id"] for s in children] == [child_id], sessions
    assert len(sessions) == 2, sessions

    # The title request shares the main session's ids: captured there, set aside by the rollout.
    root_records = chain.records(root_id)
    titles = [r["uuid"] for r in root_records if is_title_call(r)]
    assert len(titles) == 1, [r["messages"][0]["content"][:80] for r in root_records]
    assert len(root_records) == 3  # title, task call, final answer
    assert all(r["is_valid"] and r["api"] == "chat" for r in root_records)

    rollout = get_json(f"{chain.v1}/sessions/{root_id}/rollout")
    assert rollout["side_calls"] == titles
    assert titles[0] not in rollout["record_uuids"] and len(rollout["record_uuids"]) == 2
    assert rollout["partial_reason"] is None and rollout["mask_sample"] is False, rollout["partial_reason"]
    assert [item["type"] for item in rollout["output"]] == ["function_call", "function_call_output", "message"]
    assert rollout["output"][0]["name"] == "task"

    assert [s["session_id"] for s in rollout["subagents"]] == [child_id]
    child = get_json(f"{chain.v1}/sessions/{child_id}/rollout")
    assert child["parent_session_id"] == root_id
    assert child["partial_reason"] is None and child["mask_sample"] is False, child["partial_reason"]
    assert child["side_calls"] == [] and len(child["record_uuids"]) == 2
    assert [item["type"] for item in child["output"]] == ["function_call", "function_call_output", "message"]
    assert child["output"][0]["name"] == "bash"
    assert "task" not in {tool["name"] for tool in child["tools"]}  # sub-agents cannot spawn further

    assert_token_exact(chain, rollout)
    assert_token_exact(chain, child)
    assert_token_exact(chain, rollout["subagents"][0])

    # opencode budgets max_tokens from the limit derived from GET /v1/models.
    upstream = {e["headers"].get("x-request-id"): e["body"] for e in chain.mock_requests()}
    agent_calls = [upstream[r["request_id"]] for r in root_records if not is_title_call(r)]
    assert [body.get("max_tokens") for body in agent_calls] == [limit["output"]] * 2


def test_gym_limit_rule():
    assert opencode_limit(32768) == {"context": 32768, "output": 8192}
    assert opencode_limit(131072) == {"context": 131072, "output": 32000}


# ---- a reasoning model, with and without token injection --------------------------------------------


@pytest.mark.parametrize("injection", [True, False], ids=["injected", "plain"])
def test_opencode_on_a_reasoning_model_keeps_one_token_chain_beside_its_title_call(
    reasoning_chains, tmp_path, injection
):
    """opencode's title generator shares the main session id: with injection it neither breaks nor joins the
    agent's chain, whose calls reach the engine as one token chain; without it (the negative control) they break."""
    chain = reasoning_chains[injection]
    httpx.post(chain.upstream_url + "/mock/reset")
    command = {"command": "echo reasoned > marker.txt", "description": "Write the marker"}
    run, workdir = run_opencode(
        opencode_config(chain.v1, None), tmp_path, "Write the marker. [[mock:reasoning]] " + directive("bash", command)
    )
    assert run.returncode == 0, run.describe(chain.proc.output())
    assert (workdir / "marker.txt").read_text().strip() == "reasoned"

    root_id = run.events()[0]["sessionID"]
    records = chain.records(root_id)
    agent = [r for r in records if not is_title_call(r)]
    titles = [r for r in records if is_title_call(r)]
    assert len(agent) == 2 and len(titles) == 1
    # What the engine used (by request id): does the agent's second prompt extend its first prompt + generation?
    engine = {e["headers"].get("x-request-id"): e for e in chain.engine_calls()}
    assert token_breaks([engine[r["request_id"]] for r in agent]) == ([] if injection else [1])
    rollout = get_json(f"{chain.v1}/sessions/{root_id}/rollout")
    assert rollout["side_calls"] == [titles[0]["uuid"]]
    if injection:
        assert agent[1]["injection"]["fallback_reason"] is None
        assert agent[0]["injection"]["chain"] == agent[1]["injection"]["chain"] != titles[0]["injection"]["chain"]
        assert rollout["record_uuids"] == [r["uuid"] for r in agent]
        assert rollout["partial_reason"] is None and rollout["mask_sample"] is False, rollout["partial_reason"]
        assert_token_exact(chain, rollout)
    else:
        assert rollout["mask_sample"] is True and "do not extend" in rollout["partial_reason"]
