"""Claude Code (npm @anthropic-ai/claude-code) runs headless and offline against the chain: Bash and Write, then a sub-agent, captured token-exactly."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from tests.support.agents import (
    NODE_MODULES,
    ClientRun,
    assert_token_exact,
    client_env,
    get_json,
    installed,
    not_installed_reason,
    run_client,
)

pytestmark = [
    pytest.mark.clients,
    pytest.mark.skipif(
        not installed("@anthropic-ai/claude-code"), reason=not_installed_reason("@anthropic-ai/claude-code")
    ),
]


def claude_binary() -> Path:
    """Claude Code's native binary, linked into `bin/claude.exe` by its postinstall (else its platform package)."""
    for path in (
        NODE_MODULES / "@anthropic-ai" / "claude-code" / "bin" / "claude.exe",
        NODE_MODULES / "@anthropic-ai" / "claude-code-linux-x64" / "claude",
    ):
        if path.is_file() and path.stat().st_size > 1_000_000:
            return path
    raise AssertionError("@anthropic-ai/claude-code is installed but its native binary is missing")


def directive(tool: str, arguments: dict) -> str:
    return f"[[mock:tool {tool} {orjson.dumps(arguments).decode()}]]"


def run_claude(base_url: str, tmp_path: Path, prompt: str, tools: str) -> tuple[ClientRun, Path]:
    workdir = tmp_path / "work"
    workdir.mkdir()
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = client_env(
        tmp_path / "home",
        TMPDIR=str(scratch),
        ANTHROPIC_BASE_URL=base_url,  # the server root: Claude Code adds /v1/messages
        ANTHROPIC_API_KEY="dummy",
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",  # no telemetry, no update check: only the base URL
        DISABLE_AUTOUPDATER="1",
        CLAUDE_CODE_MAX_RETRIES="0",
        API_TIMEOUT_MS="60000",
    )
    argv = [str(claude_binary()), "-p", prompt, "--output-format", "json", "--allowedTools", tools]
    return run_client(argv, cwd=workdir, env=env), workdir


def result_of(run: ClientRun, details: str) -> dict:
    assert run.returncode == 0, details
    result = orjson.loads(run.stdout.strip().splitlines()[-1])
    assert result["is_error"] is False, details
    return result


def test_claude_code_runs_bash_and_write_and_its_session_is_token_exact(chain, tmp_path):
    target = tmp_path / "work" / "notes.txt"
    prompt = (
        "Check the shell, then write the notes file. "
        + directive("Bash", {"command": "echo from-bash > bash-out.txt", "description": "Write a file with echo"})
        + " [[mock:next]] "
        + directive("Write", {"file_path": str(target), "content": "written by claude code\n"})
    )
    run, workdir = run_claude(chain.url, tmp_path, prompt, "Bash,Write")
    details = run.describe(chain.proc.output())
    result = result_of(run, details)
    assert (workdir / "bash-out.txt").read_text().strip() == "from-bash", details
    assert target.read_text() == "written by claude code\n", details

    session = result["session_id"]
    records = get_json(f"{chain.v1}/sessions/{session}/completions")["completions"]
    assert len(records) == 3 and all(r["api"] == "messages" and r["is_valid"] for r in records), details
    rollout = get_json(f"{chain.v1}/sessions/{session}/rollout")
    assert rollout["partial_reason"] is None and rollout["mask_sample"] is False, rollout["partial_reason"]
    kinds = [item["type"] for item in rollout["output"]]
    assert kinds == ["function_call", "function_call_output"] * 2 + ["message"], kinds
    assert [item["name"] for item in rollout["output"] if item["type"] == "function_call"] == ["Bash", "Write"]
    assert_token_exact(chain, rollout)

    # Claude Code asks for max_tokens 128000; the engine is asked for no more than the route's context.
    max_model_len = next(m["max_model_len"] for m in get_json(chain.v1 + "/models")["data"] if m["id"] == "demo")
    upstream = {e["headers"].get("x-request-id"): e["body"] for e in chain.mock_requests()}
    assert max_model_len < 128000
    assert {upstream[r["request_id"]]["max_tokens"] for r in records} == {max_model_len}


def test_claude_code_sub_agent_is_a_child_session_with_its_own_whole_rollout(chain, tmp_path):
    child_prompt = "Write the marker. " + directive(
        "Bash", {"command": "echo from-sub-agent > marker.txt", "description": "Write the marker"}
    )
    prompt = "Delegate this. " + directive(
        "Agent", {"description": "Write a marker", "prompt": child_prompt, "subagent_type": "general-purpose"}
    )
    run, workdir = run_claude(chain.url, tmp_path, prompt, "Bash,Agent")
    details = run.describe(chain.proc.output())
    result = result_of(run, details)
    assert (workdir / "marker.txt").read_text().strip() == "from-sub-agent", details

    session = result["session_id"]
    timeline = get_json(f"{chain.v1}/sessions/{session}/timeline")
    tree = timeline["tree"]
    assert len(tree["children"]) == 1, tree
    child = tree["children"][0]
    assert child["session_id"].startswith(session + "/")
    agent_id = child["session_id"].rsplit("/", 1)[1]

    root_records = get_json(f"{chain.v1}/sessions/{session}/completions")["completions"]
    assert all(r["api"] == "messages" for r in root_records)
    # The root call that asked for the Agent tool spawned the child; its result names the agent id.
    spawner = next(call for call in timeline["calls"] if call["uuid"] == child["spawned_by"])
    assert spawner["finish_reason"] == "tool_calls" and spawner["spawned"] == [child["session_id"]]
    assert "Agent" in orjson.dumps(spawner["reply"]).decode(), spawner["reply"]
    assert any(agent_id in orjson.dumps(r["messages"]).decode() for r in root_records), details

    root_rollout = get_json(f"{chain.v1}/sessions/{session}/rollout")
    assert root_rollout["partial_reason"] is None and root_rollout["mask_sample"] is False, root_rollout[
        "partial_reason"
    ]
    assert [s["session_id"] for s in root_rollout["subagents"]] == [child["session_id"]]
    assert_token_exact(chain, root_rollout)

    child_rollout = get_json(f"{chain.v1}/sessions/{child['session_id']}/rollout")
    assert child_rollout["parent_session_id"] == session
    child_records = get_json(f"{chain.v1}/sessions/{child['session_id']}/completions")["completions"]
    assert child_rollout["partial_reason"] is None and child_rollout["mask_sample"] is False, [
        [(m["role"], str(m.get("content"))[:60].replace("\n", " ")) for m in r["messages"]] for r in child_records
    ]
    # Claude Code adds a system message (the agent types) after the tool result: environment, kept in place.
    kinds = [(item["type"], item.get("role")) for item in child_rollout["output"]]
    assert kinds == [
        ("function_call", None),
        ("function_call_output", None),
        ("message", "system"),
        ("message", "assistant"),
    ], kinds
    assert_token_exact(chain, child_rollout)
