"""Capture records for the rollout tests: a Switchyard-shaped session with tools, token triples and helpers."""

from __future__ import annotations

import copy

from server.capture.rollout import reconstruct_session

SESSION_ID = "abc123"
MODEL = "Qwen/Qwen3-0.6B"
TOOL_SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
TOOLS = [{"id": "str_replace_editor", "description": "Edit files", "inputSchema": {"jsonSchema": TOOL_SCHEMA}}]
TRIPLE_0 = {"prompt_token_ids": [1, 2, 3], "generation_token_ids": [4, 5], "generation_log_probs": [-0.1, -0.2]}
TRIPLE_1 = {"prompt_token_ids": [1, 2, 3, 4, 5, 6], "generation_token_ids": [7], "generation_log_probs": [-0.3]}
SYSTEM = "You are a careful coding agent."


def make_record(index: int, messages: list, triple: dict, *, session_id: str = SESSION_ID, **extra) -> dict:
    record = {
        "schema_version": 1,
        "uuid": f"uuid-{index}",
        "session_id": session_id,
        "parent_session_id": None,
        "captured_at": f"2026-07-14T00:00:{index:02d}.000000+00:00",
        "request_id": f"req-{index}",
        "model": MODEL,
        "messages": messages,
        "tools": TOOLS,
        "tool_choice": "auto",
        "finish_reason": "stop",
        "is_valid": True,
        "token_count": 7,
        **copy.deepcopy(triple),
    }
    record.update(extra)
    return record


def make_tool_call(arguments: str = "{}", **extra) -> dict:
    function = {"name": "str_replace_editor", "arguments": arguments}
    return {"id": "call_1", "type": "function", "function": function, **extra}


def two_call_records(arguments_0: str = "{}", arguments_1: str = "{}") -> list[dict]:
    first = make_record(
        0,
        [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": "Fix the bug."},
            {"role": "assistant", "content": None, "tool_calls": [make_tool_call(arguments_0)]},
        ],
        TRIPLE_0,
    )
    # The client re-sends the same conversation in its own spelling: text parts, null content,
    # and an extra "index" on the echoed tool call. None of that is a change.
    second = make_record(
        1,
        [
            {"role": "system", "content": [{"type": "text", "text": SYSTEM}]},
            {"role": "user", "content": [{"type": "text", "text": "Fix the "}, {"type": "text", "text": "bug."}]},
            {"role": "assistant", "content": None, "tool_calls": [make_tool_call(arguments_1, index=0)]},
            {"role": "tool", "tool_call_id": "call_1", "content": "edited ok"},
            {"role": "assistant", "content": "All fixed."},
        ],
        TRIPLE_1,
    )
    return [first, second]


def strict_rollout(records: list[dict]) -> dict:
    return reconstruct_session(SESSION_ID, records, allow_partial=False)


def triple_of(item: dict) -> dict:
    return {k: item[k] for k in ("prompt_token_ids", "generation_token_ids", "generation_log_probs")}


def has_triple(item: dict) -> bool:
    return "prompt_token_ids" in item


def linear_session(n_calls: int, *, session_id: str = SESSION_ID, parent: str | None = None) -> list[dict]:
    """n_calls records of a user/assistant ping-pong whose tokens extend properly."""
    messages: list[dict] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "turn 0"}]
    tokens: list[int] = [100, 101]
    records = []
    for k in range(n_calls):
        generation = [1000 + k, 2000 + k]
        reply = {"role": "assistant", "content": f"answer {k}"}
        records.append(
            make_record(
                k,
                [*copy.deepcopy(messages), reply],
                {
                    "prompt_token_ids": list(tokens),
                    "generation_token_ids": generation,
                    "generation_log_probs": [-0.5, -0.25],
                },
                session_id=session_id,
                parent_session_id=parent,
                uuid=f"{session_id}-{k}",
            )
        )
        messages += [reply, {"role": "user", "content": f"turn {k + 1}"}]
        tokens += generation + [300 + k]
    return records
