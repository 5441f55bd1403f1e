"""Gym's shapes: the rollout, a normalised message as Responses items (token triple on a generated turn's last item), tools as FunctionTools."""

from __future__ import annotations

import re
from typing import Any, NotRequired, TypedDict

from server.capture.rollout.breaks import Break
from server.capture.rollout.messages import RolloutError
from server.capture.tokens import TokenTriple, reasoning_of

_THINK = re.compile(r"<think>(.*?)</think>", re.DOTALL)


class Rollout(TypedDict):
    """One session's rollout as Gym reads it (docs/http-api.md): its items, and which calls made them.

    `input` / `output` are Gym Responses items, the token triple on the last item of each generated
    turn; `partial_reason` says where a rollout ends early and `mask_sample` that a trainer must not
    learn from it; `degraded_reason` that a sub-agent session below it is partial.
    """

    session_id: str
    parent_session_id: str | None
    model: Any  # the session's model as its records name it (None when no call was usable)
    tools: list[dict[str, Any]]
    input: list[dict[str, Any]]
    output: list[dict[str, Any]]
    record_uuids: list[str]
    partial_reason: str | None
    partial_break: Break | None
    mask_sample: bool
    degraded_reason: str | None
    side_calls: list[str]
    discarded_record_uuids: list[str]
    # Every descendant session's rollout, flat, depth first: set on the root of a tree.
    subagents: NotRequired[list[Rollout]]
    # Set on the root of a tree: which dispatch of a reused session id it is (from 1; None: every
    # record unsplit) and how many there are (docs/capture.md#dispatches).
    dispatch: NotRequired[int | None]
    dispatches: NotRequired[int]


def map_tools(raw_tools: object) -> list[dict[str, Any]]:
    """Record tools (Switchyard, Chat or Responses shape) as Gym `FunctionTool` dicts.

    Codex's `namespace` tools are flattened into their member functions. Hosted tools (any other
    `type`, e.g. `web_search`) are not function tools a policy is trained to call, so they are left out.
    """
    if raw_tools is None:
        return []
    if not isinstance(raw_tools, list):
        raise RolloutError(f"tools is not a list: {type(raw_tools).__name__}")
    out: list[dict[str, Any]] = []
    for i, tool in enumerate(raw_tools):
        if not isinstance(tool, dict):
            raise RolloutError(f"tool {i} has no usable id")
        kind = tool.get("type")
        function = tool.get("function")
        if isinstance(function, dict):  # Chat: {type: function, function: {name, ...}}
            spec, name = function, function.get("name")
        elif kind == "namespace" and isinstance(tool.get("tools"), list):
            out.extend(map_tools(tool["tools"]))
            continue
        elif kind == "function":  # Responses: {type: function, name, ...}
            spec, name = tool, tool.get("name")
        elif kind is None:  # Switchyard: {id, description, inputSchema: {jsonSchema}}
            schema_holder = tool.get("inputSchema")
            schema = schema_holder.get("jsonSchema") if isinstance(schema_holder, dict) else None
            spec = {"description": tool.get("description"), "parameters": schema, "strict": tool.get("strict")}
            name = tool.get("id")
        else:
            continue
        if not isinstance(name, str) or not name:
            raise RolloutError(f"tool {i} has no usable id")
        out.append(
            {
                "type": "function",
                "name": name,
                "description": spec.get("description") or None,
                "parameters": spec.get("parameters"),
                "strict": spec.get("strict"),
            }
        )
    return out


def message_items(
    message: dict[str, Any], raw: object, item_id: str, triple: TokenTriple | None
) -> list[dict[str, Any]]:
    """Gym Responses items for one normalized message; a generated turn's `triple` goes on its last item."""
    role = message["role"]
    if role == "tool":
        return [
            {
                "type": "function_call_output",
                "call_id": message["tool_call_id"],
                "output": message["content"],
                "status": "completed",
            }
        ]
    if role != "assistant":
        return [{"type": "message", "role": role, "content": message["content"]}]

    summaries: list[str] = []
    if isinstance(raw, dict):
        reasoning = reasoning_of(raw)
        if reasoning is not None:
            summaries.append(reasoning)
    text = message["content"]
    if "<think>" in text:
        summaries.extend(_THINK.findall(text))
        text = _THINK.sub("", text)
    tool_calls = message.get("tool_calls") or []

    items: list[dict[str, Any]] = []
    if summaries:
        items.append(
            {
                "type": "reasoning",
                "id": f"rs_{item_id}",
                "summary": [{"type": "summary_text", "text": s} for s in summaries],
            }
        )
    if text or not (items or tool_calls):
        items.append(
            {
                "type": "message",
                "id": f"msg_{item_id}",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        )
    for tool_call in tool_calls:
        items.append(
            {
                "type": "function_call",
                "id": tool_call["id"],
                "call_id": tool_call["id"],
                "name": tool_call["function"]["name"],
                "arguments": tool_call["function"]["arguments"],
                "status": "completed",
            }
        )
    if triple is not None:
        # The lists are shared with the record, not copied: rollouts of long sessions stay cheap.
        items[-1]["prompt_token_ids"] = triple.prompt_ids
        items[-1]["generation_token_ids"] = triple.generation_ids
        items[-1]["generation_log_probs"] = triple.log_probs
    return items


def failed_rollout(session_id: str, parent_session_id: str | None, reason: str) -> Rollout:
    """The rollout of a session that could not be reconstructed at all: no items, `reason` as why, masked."""
    return {
        "session_id": session_id,
        "parent_session_id": parent_session_id,
        "model": None,
        "tools": [],
        "input": [],
        "output": [],
        "record_uuids": [],
        "partial_reason": reason,
        "partial_break": None,
        "mask_sample": True,
        "degraded_reason": None,
        "side_calls": [],
        "discarded_record_uuids": [],
    }
