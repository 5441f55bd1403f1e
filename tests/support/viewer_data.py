"""Capture directories for the viewer's tests and benchmark, written fast with the store's own writer.

Each call goes to the mock upstream in-process (its HTTP app, through Starlette's test client), so
the token ids, token strings and log probabilities are the mock's real ones; the record is built
by `build_record`, exactly as the server builds it, and written by `CaptureStore`. A fake clock
gives every call a known `captured_at` and latency, so sub-agents fall between their parent's calls.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from starlette.testclient import TestClient

from server.capture.store import CaptureStore
from server.capture.write.record import build_record
from server.dev.mock_upstream.app import create_app

SYSTEM = "You are a coding agent. Use the tools."
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"the {name} tool",
            "parameters": {"type": "object", "properties": {}, "additionalProperties": True},
        },
    }
    for name in ("read", "bash", "task")
]
XSS_MARKUP = '<img src=x onerror="window.__xss=1"><script>window.__xss=2</script>'


@dataclass
class Clock:
    """Hands out call times: each call starts `gap` after the previous one ended and lasts `latency`."""

    now: datetime = field(default_factory=lambda: datetime(2025, 3, 1, 12, 0, tzinfo=UTC))
    gap: timedelta = timedelta(milliseconds=200)
    latency_ms: float = 850.0

    def call(self) -> tuple[str, float]:
        self.now += self.gap + timedelta(milliseconds=self.latency_ms)
        return self.now.isoformat(timespec="microseconds"), self.latency_ms


class Writer:
    """Runs scripted agent sessions against the in-process mock and writes their records."""

    def __init__(self, capture_dir: Path, *, clock: Clock | None = None) -> None:
        self.store = CaptureStore(capture_dir)
        self.store.start()
        self.mock = TestClient(create_app())
        self.clock = clock or Clock()

    def close(self) -> None:
        # Everything queued is written before this returns, however long the run was.
        if not self.store.flush(timeout=600):
            raise RuntimeError("the capture writer did not catch up within 600 s")
        self.store.close()
        self.mock.close()

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(
        self,
        session_id: str,
        messages: list[dict],
        *,
        parent: str | None = None,
        tools: list[dict] | None = None,
        model: str = "mock-model",
        route: str = "mock-route",
    ) -> dict:
        """One chat call as the server makes it (token ids and logprobs asked for), recorded; returns the reply message."""
        body: dict[str, Any] = {
            "model": model,
            "messages": messages,
            "return_token_ids": True,
            "logprobs": True,
            "top_logprobs": 0,
        }
        if tools:
            body["tools"] = tools
        response = self.mock.post("/v1/chat/completions", json=body)
        response.raise_for_status()
        chat_response = response.json()
        captured_at, latency = self.clock.call()
        record = build_record(
            session_id=session_id,
            parent_session_id=parent,
            rollout_id=None,
            request_id=None,
            chat_request=json.loads(json.dumps(body)),  # the record keeps what was sent then, not later edits
            chat_response=chat_response,
            route=route,
            api="chat",
            stream=False,
            latency_ms=latency,
            captured_at=captured_at,
        )
        assert self.store.submit(record)
        return chat_response["choices"][0]["message"]

    def agent(
        self,
        session_id: str,
        task: str,
        *,
        parent: str | None = None,
        keep_reasoning: bool = True,
        max_steps: int = 8,
        model: str = "mock-model",
        route: str = "mock-route",
        tool_output_words: int = 0,
    ) -> str:
        """An agent loop: call, run the tool calls (a `task` call runs a sub-agent session), repeat until text."""
        messages: list[dict] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task}]
        for _ in range(max_steps):
            reply = self.call(session_id, messages, parent=parent, tools=TOOLS, model=model, route=route)
            assistant = {"role": "assistant", "content": reply.get("content")}
            if keep_reasoning and reply.get("reasoning_content"):
                assistant["reasoning_content"] = reply["reasoning_content"]
            if reply.get("tool_calls"):
                assistant["tool_calls"] = reply["tool_calls"]
            messages.append(assistant)
            if not reply.get("tool_calls"):
                return reply.get("content") or ""
            for n, tool_call in enumerate(reply["tool_calls"]):
                name = tool_call["function"]["name"]
                args = json.loads(tool_call["function"]["arguments"] or "{}")
                if name == "task":
                    child = f"{session_id}-sub{n + 1}"
                    output = self.agent(child, args.get("prompt", ""), parent=session_id, model=model, route=route)
                else:
                    output = f"{name} ran with {json.dumps(args)}" + " output" * tool_output_words
                messages.append({"role": "tool", "tool_call_id": tool_call["id"], "content": output})
        return ""


MAIN_TASK = (
    "fix the failing test [[mock:reasoning]] "
    '[[mock:tool read {"path": "src/app.py"}]] [[mock:next]] '
    '[[mock:tool task {"description": "look around", "prompt": "inspect the repo '
    '[[mock:tool bash {\\"command\\": \\"find . -name *.py\\"}]]"}]] [[mock:next]] '
    "[[mock:say The test passes now.]]"
)
BROKEN_TASK = (
    'check the logs [[mock:reasoning]] [[mock:tool bash {"command": "tail log"}]] [[mock:next]] [[mock:say ok]]'
)
XSS_TASK = (
    f"render this {XSS_MARKUP} "
    f'[[mock:tool bash {{"command": "echo {XSS_MARKUP.replace(chr(34), chr(39))}"}}]] [[mock:next]] '
    f"[[mock:say {XSS_MARKUP}]]"
)


def write_demo_sessions(capture_dir: Path, *, fillers: int = 0) -> dict[str, Any]:
    """The viewer's test data; returns facts the tests check the page against.

    - `agent-main`: reasoning kept, a `read`, then a `task` that runs sub-agent `agent-main-sub1`, then text (whole).
    - `broken-reasoning`: reasoning dropped when the history is resent, so call 1's prompt stops
      extending call 0's prompt + generation right where the generation began (partial).
    - `xss-session`: markup in the user text, tool arguments, tool result and the reply.
    - `filler-NNN`: one call each, alternating model and route, half on a later day (pagination, filters).
    """
    with Writer(capture_dir) as writer:
        writer.agent("agent-main", MAIN_TASK)
        writer.agent("broken-reasoning", BROKEN_TASK, keep_reasoning=False)
        writer.agent("xss-session", XSS_TASK)
        for i in range(fillers):
            if i == fillers // 2:
                writer.clock.now += timedelta(days=1)
            messages = [{"role": "user", "content": f"question {i} [[mock:tokens {5 + i % 7}]]"}]
            model, route = ("model-a", "route-x") if i % 2 == 0 else ("model-b", "route-y")
            writer.call(f"filler-{i:03d}", messages, model=model, route=route)
    store = CaptureStore.open_read_only(capture_dir)
    broken, _ = store.read_completions("broken-reasoning")
    return {"broken_position": len(broken[0]["prompt_token_ids"]), "broken_records": broken}
