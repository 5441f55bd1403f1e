"""Chat messages reduced to what the history comparison looks at (Gym's normalisation), and the rollout error."""

from __future__ import annotations

import json
from typing import Any

_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
# What may come between two model turns: anything but the model's own (a harness adds system
# messages mid-conversation too: Claude Code's environment and agent-list blocks).
ENVIRONMENT_ROLES = frozenset({"user", "tool", "system", "developer"})


class RolloutError(ValueError):
    """A session's records cannot be turned into a (longer) trustworthy rollout."""


def normalize(i: int, message: object) -> dict[str, Any]:
    """A message reduced to what the history comparison looks at (Gym's normalization)."""
    if not isinstance(message, dict):
        raise RolloutError(f"record {i} contains a non-object message")
    role = message.get("role")
    if not isinstance(role, str) or role not in _ROLES:
        raise RolloutError(f"record {i} contains a message with unsupported role {role!r}")
    content = message.get("content")
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    elif isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or not isinstance(part.get("text"), str):
                raise RolloutError(f"record {i} contains an unsupported content part")
            parts.append(part["text"])
        text = "".join(parts)
    else:
        raise RolloutError(f"record {i} contains unsupported content of type {type(content).__name__}")
    out: dict[str, Any] = {"role": role, "content": text}
    if role == "assistant":
        tool_calls = message.get("tool_calls")
        if tool_calls:
            if not isinstance(tool_calls, list):
                raise RolloutError(f"record {i} contains non-list tool_calls")
            out["tool_calls"] = [_normalize_tool_call(i, call) for call in tool_calls]
    elif role == "tool":
        call_id = message.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id:
            raise RolloutError(f"record {i} contains a tool message without tool_call_id")
        out["tool_call_id"] = call_id
    return out


def _normalize_tool_call(i: int, call: object) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(call, dict) or not isinstance(function, dict):
        raise RolloutError(f"record {i} contains a malformed tool call")
    call_id, name, arguments = call.get("id"), function.get("name"), function.get("arguments")
    if not (isinstance(call_id, str) and call_id and isinstance(name, str) and name and isinstance(arguments, str)):
        raise RolloutError(f"record {i} contains a malformed tool call")
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def canonical(message: dict[str, Any]) -> dict[str, Any]:
    """The message with tool-call arguments in one JSON spelling, for comparison only.

    Clients re-serialize the arguments they echo back (opencode compacts them), which is not a
    change to the conversation. Messages without tool calls are returned as they are.
    """
    tool_calls = message.get("tool_calls")
    if not tool_calls:
        return message
    return {
        **message,
        "tool_calls": [
            {**call, "function": {**call["function"], "arguments": _canonical_arguments(call["function"]["arguments"])}}
            for call in tool_calls
        ],
    }


def _canonical_arguments(arguments: str) -> str:
    # The stdlib json on purpose: what counts as "the same arguments" must match Gym's rule
    # exactly (NaN literals, huge ints, lone surrogates), and this runs on a few strings per call.
    try:
        return json.dumps(json.loads(arguments), sort_keys=True)
    except (ValueError, TypeError, RecursionError):
        return arguments
