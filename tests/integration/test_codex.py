"""Codex CLI (npm @openai/codex) runs headless against the chain: its tools really run and its sessions are captured."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import httpx
import orjson
import pytest

from tests.support.agents import (
    ClientRun,
    assert_token_exact,
    client_env,
    codex_argv,
    get_json,
    installed,
    not_installed_reason,
    run_client,
)
from tests.support.stack import token_breaks

pytestmark = [
    pytest.mark.clients,
    pytest.mark.skipif(not installed("@openai/codex"), reason=not_installed_reason("@openai/codex")),
]

KEY_ENV = "SWITCHYARD_TEST_API_KEY"


def codex_config(base_url: str, *, model_catalog: Path | None = None) -> str:
    # Retries off so a broken stream fails the run instead of being retried into a pass.
    catalog = f'model_catalog_json = "{model_catalog}"\n' if model_catalog is not None else ""
    return f"""\
model = "demo"
{catalog}model_provider = "switchyard"
approval_policy = "never"
sandbox_mode = "danger-full-access"

[model_providers.switchyard]
name = "switchyard"
base_url = "{base_url}"
env_key = "{KEY_ENV}"
wire_api = "responses"
stream_max_retries = 0
request_max_retries = 0

[features]
plugins = false
remote_plugin = false
"""


def run_codex(chain, tmp_path: Path, prompt: str, *, model_entry: dict | None = None) -> tuple[ClientRun, Path]:
    """`codex exec --json` with its own CODEX_HOME, HOME and working directory; returns the run and its cwd.

    `model_entry` describes the `demo` model to Codex (a model catalog entry), for settings such as
    its apply_patch tool type that Codex only takes from model metadata.
    """
    codex_home = tmp_path / "codex-home"
    codex_home.mkdir()
    catalog = None
    if model_entry is not None:
        catalog = codex_home / "models.json"
        catalog.write_bytes(orjson.dumps({"models": [model_entry]}))
    (codex_home / "config.toml").write_text(codex_config(chain.v1, model_catalog=catalog))
    workdir = tmp_path / "work"
    workdir.mkdir(exist_ok=True)
    env = client_env(tmp_path / "home", CODEX_HOME=str(codex_home), **{KEY_ENV: "sk-switchyard-test"})
    argv = [*codex_argv(), "exec", "--json", "--skip-git-repo-check", "--ephemeral", prompt]
    return run_client(argv, cwd=workdir, env=env), workdir


def directive(tool: str, arguments: dict) -> str:
    return f"[[mock:tool {tool} {orjson.dumps(arguments).decode()}]]"


def thread_id(run: ClientRun) -> str:
    started = [e for e in run.events() if e.get("type") == "thread.started"]
    assert started, run.describe()
    return started[0]["thread_id"]


def completed_items(run: ClientRun, kind: str) -> list[dict]:
    return [
        e["item"] for e in run.events() if e.get("type") == "item.completed" and e.get("item", {}).get("type") == kind
    ]


def test_codex_runs_its_shell_tool_and_the_session_is_captured(chain, tmp_path):
    prompt = "Please write the marker file. " + directive("exec_command", {"cmd": "echo hello-from-codex > marker.txt"})
    run, workdir = run_codex(chain, tmp_path, prompt)
    details = run.describe(chain.proc.output())
    assert run.returncode == 0, details

    marker = workdir / "marker.txt"
    assert marker.is_file(), "Codex did not run the tool call\n" + details
    assert marker.read_text().strip() == "hello-from-codex"

    commands = completed_items(run, "command_execution")
    assert len(commands) == 1 and commands[0]["exit_code"] == 0, details
    assert "echo hello-from-codex > marker.txt" in commands[0]["command"]
    messages = completed_items(run, "agent_message")
    # The mock answers a tool result with "Done. The tool said: <output excerpt>".
    assert messages and messages[-1]["text"].startswith("Done. The tool said:"), details
    assert any(e.get("type") == "turn.completed" for e in run.events()), details

    # Codex's thread-id / session-id headers name the session.
    session_id = thread_id(run)
    sessions = {s["session_id"]: s for s in get_json(chain.v1 + "/sessions")["sessions"]}
    assert session_id in sessions, details
    assert sessions[session_id]["parent_session_id"] is None
    assert sessions[session_id]["record_count"] == 2  # the tool call, then the answer

    records = chain.records(session_id)
    assert all(r["is_valid"] and r["api"] == "responses" and r["stream"] for r in records), records
    tool_calls = records[0]["messages"][-1]["tool_calls"]
    assert [c["function"]["name"] for c in tool_calls] == ["exec_command"]

    rollout = get_json(f"{chain.v1}/sessions/{session_id}/rollout")
    assert rollout["partial_reason"] is None and rollout["mask_sample"] is False, rollout["partial_reason"]
    assert rollout["subagents"] == []
    kinds = [item["type"] for item in rollout["output"]]
    assert kinds == ["function_call", "function_call_output", "message"], kinds
    assert "Process exited with code 0" in rollout["output"][1]["output"]
    assert_token_exact(chain, rollout)


# The root agent blocks in its shell tool until the child's second call (its final answer) has
# been captured, so the child is finished before the root's turn can end: no sleeps, no races on
# whether the child got to run at all. (Whether Codex then makes one more root call for the
# child's completion notification still depends on timing, so the root's call count is not asserted.)
WAIT_FOR_CHILD = """\
import json, sys, time, urllib.request
base = sys.argv[1]
known = set(json.load(open("known-sessions.json")))
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
deadline = time.monotonic() + 25
while time.monotonic() < deadline:
    sessions = json.load(opener.open(base + "/sessions"))["sessions"]
    done = [s["session_id"] for s in sessions
            if s["parent_session_id"] and s["session_id"] not in known and s["record_count"] >= 2]
    if done:
        print("child finished:", done[0])
        sys.exit(0)
    time.sleep(0.1)
print("the child session did not finish in time")
sys.exit(1)
"""


def test_codex_spawns_a_sub_agent_through_a_namespaced_tool(chain, tmp_path):
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "wait_child.py").write_text(WAIT_FOR_CHILD)
    known = [s["session_id"] for s in get_json(chain.v1 + "/sessions")["sessions"]]
    (workdir / "known-sessions.json").write_bytes(orjson.dumps(known))

    child_prompt = "Write the child marker. " + directive("exec_command", {"cmd": "echo hello-from-child > child.txt"})
    wait_cmd = f"{shlex.quote(sys.executable)} wait_child.py {shlex.quote(chain.v1)}"
    # Codex's namespace tool `multi_agent_v1` reaches the model as flattened chat functions
    # (`multi_agent_v1__spawn_agent`); the model's call must come back to Codex namespaced.
    prompt = (
        "Delegate this to a sub-agent. "
        + directive("multi_agent_v1__spawn_agent", {"message": child_prompt})
        + " [[mock:next]] "
        + directive("exec_command", {"cmd": wait_cmd, "yield_time_ms": 30000})
    )
    run, _ = run_codex(chain, tmp_path, prompt)
    details = run.describe(chain.proc.output())
    assert run.returncode == 0, details

    spawns = [item for item in completed_items(run, "collab_tool_call") if item["tool"] == "spawn_agent"]
    assert len(spawns) == 1 and spawns[0]["status"] == "completed", details
    assert len(spawns[0]["receiver_thread_ids"]) == 1, details
    child_id = spawns[0]["receiver_thread_ids"][0]
    assert (workdir / "child.txt").read_text().strip() == "hello-from-child", details
    waits = [item for item in completed_items(run, "command_execution") if "wait_child.py" in item["command"]]
    assert len(waits) == 1 and waits[0]["exit_code"] == 0, details
    assert "child finished" in waits[0]["aggregated_output"], details
    assert completed_items(run, "agent_message"), details

    root_id = thread_id(run)
    sessions = {s["session_id"]: s for s in get_json(chain.v1 + "/sessions")["sessions"]}
    assert sessions[root_id]["parent_session_id"] is None, details
    # x-codex-parent-thread-id makes the child a child of the root thread.
    assert sessions[child_id]["parent_session_id"] == root_id, details
    assert sessions[child_id]["record_count"] == 2  # the shell call, then the answer
    tree = get_json(f"{chain.v1}/sessions/{root_id}/tree")
    assert [c["session_id"] for c in tree["children"]] == [child_id]

    root_records = chain.records(root_id)
    first_call = root_records[0]["messages"][-1]["tool_calls"][0]["function"]
    assert first_call["name"] == "multi_agent_v1__spawn_agent"
    assert orjson.loads(first_call["arguments"]) == {"message": child_prompt}

    rollout = get_json(f"{chain.v1}/sessions/{root_id}/rollout")
    assert rollout["partial_reason"] is None and rollout["mask_sample"] is False, rollout["partial_reason"]
    assert [s["session_id"] for s in rollout["subagents"]] == [child_id]
    child = rollout["subagents"][0]
    assert child["parent_session_id"] == root_id
    assert child["partial_reason"] is None and child["mask_sample"] is False, child["partial_reason"]
    assert [item["type"] for item in child["output"]] == ["function_call", "function_call_output", "message"]
    assert child["output"][0]["name"] == "exec_command"
    assert_token_exact(chain, rollout)
    assert_token_exact(chain, child)


# The fields Codex 0.171.0 requires of a model catalog entry, for a `demo` model whose apply_patch
# is the freeform (`custom`) tool. Without the catalog Codex offers no apply_patch at all to an
# unknown model, and `[features] apply_patch_freeform` alone does not change that.
FREEFORM_MODEL = {
    "slug": "demo",
    "display_name": "demo",
    "apply_patch_tool_type": "freeform",
    "shell_type": "shell_command",
    "visibility": "list",
    "supported_in_api": True,
    "priority": 1,
    "supported_reasoning_levels": [],
    "context_window": 32768,
    "support_verbosity": False,
    "truncation_policy": {"mode": "tokens", "limit": 10000},
    "experimental_supported_tools": [],
    "base_instructions": "You are a coding agent. Edit files with apply_patch.",
}
PATCH = """\
*** Begin Patch
*** Update File: greeting.txt
@@
-hello
+hello from a "freeform" patch \u00e9
*** Add File: notes/added.txt
+written by apply_patch
*** End Patch
"""


def test_codex_edits_a_file_with_the_freeform_apply_patch_tool(chain, tmp_path):
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "greeting.txt").write_text("hello\n")
    prompt = "Update the greeting. " + directive("apply_patch", {"input": PATCH})
    run, _ = run_codex(chain, tmp_path, prompt, model_entry=FREEFORM_MODEL)
    details = run.describe(chain.proc.output())
    assert run.returncode == 0, details

    # The patch reached Codex as a custom_tool_call with the raw patch text, and Codex applied it.
    assert (workdir / "greeting.txt").read_text() == 'hello from a "freeform" patch \u00e9\n', details
    assert (workdir / "notes" / "added.txt").read_text() == "written by apply_patch\n", details
    changes = completed_items(run, "file_change")
    assert len(changes) == 1 and changes[0]["status"] == "completed", details
    assert sorted(c["kind"] for c in changes[0]["changes"]) == ["add", "update"], details
    # The model's next turn saw Codex's custom_tool_call_output (the mock quotes the tool result).
    messages = completed_items(run, "agent_message")
    assert messages and "Success. Updated the following" in messages[-1]["text"], details

    # Codex offered apply_patch as a `custom` tool with its Lark grammar; upstream it was a function
    # with one string argument, the grammar in its description.
    session_id = thread_id(run)
    records = chain.records(session_id)
    assert len(records) == 2 and all(r["is_valid"] for r in records), records
    tool = next(t for t in records[0]["tools"] if t["id"] == "apply_patch")
    assert "Lark grammar" in tool["description"] and "*** Begin Patch" in tool["description"]
    assert tool["inputSchema"]["jsonSchema"]["required"] == ["input"]
    call = records[0]["messages"][-1]["tool_calls"][0]["function"]
    assert call["name"] == "apply_patch" and orjson.loads(call["arguments"]) == {"input": PATCH}
    # Codex echoed the call back with its output; they reached the model as a tool call and result.
    history = records[1]["messages"]
    assert orjson.loads(history[-3]["tool_calls"][0]["function"]["arguments"]) == {"input": PATCH}
    assert history[-2]["role"] == "tool" and "Success." in history[-2]["content"]

    rollout = get_json(f"{chain.v1}/sessions/{session_id}/rollout")
    assert rollout["partial_reason"] is None and rollout["mask_sample"] is False, rollout["partial_reason"]
    assert [item["type"] for item in rollout["output"]] == ["function_call", "function_call_output", "message"]
    assert_token_exact(chain, rollout)


@pytest.mark.parametrize("injection", [True, False], ids=["injected", "plain"])
def test_codex_on_a_reasoning_model_is_one_token_chain_with_injection(reasoning_chains, tmp_path, injection):
    """Codex unchanged (Responses, reasoning items sent back as it keeps them): with injection its calls
    reach the engine as one token chain and the rollout is whole; without it the rollout reports the break."""
    chain = reasoning_chains[injection]
    httpx.post(chain.upstream_url + "/mock/reset")
    prompt = "Write the marker. [[mock:reasoning]] " + directive("exec_command", {"cmd": "echo reasoned > marker.txt"})
    run, workdir = run_codex(chain, tmp_path, prompt)
    assert run.returncode == 0, run.describe(chain.proc.output())
    assert (workdir / "marker.txt").read_text().strip() == "reasoned"

    session_id = thread_id(run)
    records = chain.records(session_id)
    assert len(records) == 2
    engine = {e["headers"].get("x-request-id"): e for e in chain.engine_calls()}
    assert token_breaks([engine[r["request_id"]] for r in records]) == ([] if injection else [1])
    rollout = get_json(f"{chain.v1}/sessions/{session_id}/rollout")
    if injection:
        assert [r["injection"]["fallback_reason"] for r in records] == ["first_call", None]
        assert rollout["partial_reason"] is None and rollout["mask_sample"] is False, rollout["partial_reason"]
        assert_token_exact(chain, rollout)
    else:
        assert rollout["mask_sample"] is True and "do not extend" in rollout["partial_reason"]
