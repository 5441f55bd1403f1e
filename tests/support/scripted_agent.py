"""A scripted agent for scale-out tests: a root session with a tool call and a sub-agent session, over plain HTTP.

Every call opens a fresh connection, so behind `serve --workers N` consecutive calls of one session
land on whichever worker accepts them. The mock upstream's directives script the tool calls.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from tests.support.procs import wait_for

SHELL_TOOL = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a shell command",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    },
}
WORKER_HEADER = "x-switchyard-model-worker"


def _turns(base_url: str, headers: dict[str, str], task: str, served_by: list[str]) -> None:
    """Two chat turns: the model calls `bash`, gets its output back, and answers."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": f'{task} [[mock:tool bash {{"command": "ls"}}]]'}]
    for _ in range(2):
        response = httpx.post(
            base_url + "/chat/completions",
            json={"model": "demo", "messages": messages, "tools": [SHELL_TOOL]},
            headers={**headers, "connection": "close"},
            timeout=60,
        )
        response.raise_for_status()
        served_by.append(response.headers.get(WORKER_HEADER, ""))
        message = response.json()["choices"][0]["message"]
        messages.append({k: v for k, v in message.items() if k in ("role", "content", "tool_calls") and v is not None})
        for call in message.get("tool_calls") or []:
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": "README.md\nserver\n"})


def run(base_url: str, rollout_id: str, hold_file: str | None = None, hold_s: float = 120.0) -> dict[str, Any]:
    """The root's two turns, then a sub-agent's two turns. Returns which worker served each call.

    With `hold_file`, after the root's turns it writes `<hold_file>.started` and waits (at most
    `hold_s`) until `hold_file` exists: a rollout that is running, for a test to act on.
    """
    served_by: list[str] = []
    _turns(base_url, {"x-session-id": rollout_id}, f"Task {rollout_id}: look around.", served_by)
    if hold_file is not None:
        Path(hold_file + ".started").write_text(rollout_id)
        wait_for(lambda: Path(hold_file).exists(), hold_s, interval=0.1)
    sub_headers = {"x-session-id": f"{rollout_id}-sub", "x-parent-session-id": rollout_id}
    _turns(base_url, sub_headers, f"Sub-task of {rollout_id}: list files.", served_by)
    return {"rollout_id": rollout_id, "served_by": served_by}


CALLS_PER_ROLLOUT = 4
