"""Captured calls for tests: a call to submit to the store, written and flushed, and read back the way
every reader should (through the store's loader: records may be delta files that only make sense
with their bases), counting what could not be read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from server.capture.store import CaptureStore
from server.capture.write.record import RecordInput


def chat_response(prompt=(1, 2, 3), generation=(7, 8), content="hi", tool_calls=None) -> dict[str, Any]:
    """A vLLM-style chat completion with its token fields: prompt ids, generated ids, a logprob each."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {
        "id": "chatcmpl-test",
        "model": "Qwen/Qwen3-0.6B",
        "prompt_token_ids": list(prompt),
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if tool_calls else "stop",
                "token_ids": list(generation),
                "logprobs": {"content": [{"token": "t", "logprob": -0.5} for _ in generation]},
            }
        ],
        "usage": {
            "prompt_tokens": len(prompt),
            "completion_tokens": len(generation),
            "total_tokens": len(prompt) + len(generation),
        },
    }


def captured_call(session_id, parent=None, messages=None, response=None, **overrides) -> dict[str, Any]:
    """The arguments of `CaptureStore.submit_call` (and `build_record`) for one chat call of a session."""
    return {
        "session_id": session_id,
        "parent_session_id": parent,
        "rollout_id": None,
        "request_id": None,
        "chat_request": {"messages": messages or [{"role": "user", "content": "hello"}]},
        "chat_response": response or chat_response(),
        "route": "policy-model",
        "api": "chat",
        "stream": False,
        "latency_ms": 1.0,
        **overrides,
    }


def two_turns(session_id, parent=None, sampled=3) -> tuple[dict[str, Any], dict[str, Any]]:
    """A whole two-turn conversation as two captured calls: the second prompt extends the first prompt and
    its generation. `sampled` is the first turn's generated token (a second run of a task samples anew)."""
    first = captured_call(session_id, parent, request_id="req-1", response=chat_response([1, 2], [sampled]))
    second = captured_call(
        session_id,
        parent,
        request_id="req-2",
        messages=[
            {"role": "user", "content": "hello"},
            {"role": "assistant", "content": "hi"},
            {"role": "user", "content": "more"},
        ],
        response=chat_response([1, 2, sampled, 4], [5]),
    )
    return first, second


def submit_all(store: CaptureStore, *calls: dict[str, Any]) -> None:
    """Each call submitted, then every record in its file."""
    for kwargs in calls:
        assert store.submit_call(RecordInput(**kwargs))
    assert store.flush(10)


def records_in(capture_dir: Path) -> tuple[list[dict], int]:
    """Every record in the directory, rebuilt as the API serves it, and how many files were skipped."""
    store = CaptureStore.open_read_only(capture_dir)
    records, skipped = [], 0
    for session in store.list_sessions(limit=1_000_000):
        found, lost = store.read_completions(session["session_id"])
        records += found
        skipped += lost
    return records, skipped
