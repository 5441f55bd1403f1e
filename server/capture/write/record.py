"""The capture record: one upstream chat call as a token-exact, Switchyard-compatible JSON object."""

from __future__ import annotations

import uuid as uuid_module
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NotRequired, TypedDict

import orjson

from server.capture.tokens import (
    generation_token_texts,
    generation_tokens,
    prompt_token_ids,
    reasoning_of,
    triple_problem,
)
from server.ids import is_valid_session_id

SCHEMA_VERSION = 1

# How a call ended: whole; cut short because the client went away; ended by an upstream failure.
STATUSES = ("completed", "partial", "failed")

# A record's `injection.fallback_reason` values that mean a chain that was there to extend was not
# extended (docs/injection.md): reconstruction never presents such a call as contiguous.
INJECTION_BREAKING_FALLBACKS = frozenset(
    {"no_end_of_turn", "echo_mismatch", "upstream_rejected", "tokenize_failed", "paused"}
)


class TokenCount(TypedDict):
    """The upstream's usage counts as a record keeps them (0 where the upstream gave none)."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class RecordHead(TypedDict):
    """A record's small leading fields, which a reader can take from a file's first block alone."""

    schema_version: int
    uuid: str
    session_id: str
    parent_session_id: str | None
    captured_at: str
    server_run: str | None
    request_id: str | None
    response_id: str | None
    model: str | None
    route: str
    api: str
    stream: bool
    status: str
    rollout_id: str | None
    # Ours: how the call's session was named (`header:x-session-id`, `path:ng-rollout`,
    # `body:proxy_x_session_id`, `stored:...`, `inferred`); absent from records written before it existed.
    session_source: NotRequired[str | None]
    latency_ms: float
    is_valid: bool
    invalid_reason: str | None
    finish_reason: str | None
    token_count: TokenCount


class CaptureRecord(RecordHead):
    """One captured call as it is written to its file (docs/capture.md), in `build_record`'s key order.

    A record read back from a file is checked by `validate_record` for the identity fields only:
    readers of the token lists and messages still check their shape before they trust them.
    """

    usage: dict[str, Any] | None
    tools: list[dict[str, Any]]
    tool_choice: str
    messages: list[Any]
    # As the upstream returned them: a valid record (`is_valid`) holds a sound triple, others may not.
    prompt_token_ids: list[int] | None
    generation_token_ids: list[int] | None
    generation_log_probs: list[float] | None
    generation_token_texts: list[str] | None
    # Only on calls that token injection handled (docs/injection.md).
    injection: NotRequired[dict[str, Any]]
    # Only on Responses calls with `developer` messages: their indices in `messages`, which hold them as
    # `system` (as sent upstream); a rollout gives them their `developer` role back.
    developer_messages: NotRequired[list[int]]
    # Time to the first token: not written by this server, shown by the timeline when a writer set it.
    ttft_ms: NotRequired[float | None]


# Not frozen: the store stamps its run (and an uncorrelated call's ids) on the input it is handed,
# on the event loop; a frozen dataclass costs ~7 us to build and ~15 us per `replace`, a plain one
# ~2 us and an attribute set (measured on the bench machine).
@dataclass(slots=True)
class RecordInput:
    """What a call hands to capture: its record is built from this on the writer thread, not on the call's.

    The whole input is handed over, not copied: the caller must not touch it, or the
    `chat_request` / `chat_response` it holds, afterwards. Either may be the JSON bytes that
    crossed the wire, parsed on the writer thread.
    """

    session_id: str
    parent_session_id: str | None
    rollout_id: str | None
    request_id: str | None
    chat_request: dict[str, Any] | bytes
    chat_response: dict[str, Any] | bytes
    route: str
    api: str
    stream: bool
    latency_ms: float
    status: str = "completed"
    captured_at: str | None = None
    record_uuid: str | None = None
    injection: dict[str, Any] | None = None
    response_id: str | None = None
    server_run: str | None = None
    developer_messages: list[int] | None = None
    session_source: str | None = None


def utc_timestamp() -> str:
    """ISO 8601 UTC with a fixed-width microsecond field, so string order is time order."""
    return datetime.now(UTC).isoformat(timespec="microseconds")


def build_record(
    *,
    session_id: str,
    parent_session_id: str | None,
    rollout_id: str | None,
    request_id: str | None,
    chat_request: dict[str, Any],
    chat_response: dict[str, Any],
    route: str,
    api: str,
    stream: bool,
    latency_ms: float,
    status: str = "completed",
    captured_at: str | None = None,
    record_uuid: str | None = None,
    injection: dict[str, Any] | None = None,
    response_id: str | None = None,
    server_run: str | None = None,
    developer_messages: list[int] | None = None,
    session_source: str | None = None,
) -> CaptureRecord:
    """Build the record for one call. Never raises on odd upstream output: it marks the record invalid.

    The caller hands `chat_request` and `chat_response` over: they are referenced, not deep-copied
    (the record is serialised once by the store and never mutated).
    """
    choices = chat_response.get("choices")
    if not isinstance(choices, list):
        choices = []
    choice = choices[0] if choices and isinstance(choices[0], dict) else {}

    # A Responses call is known by the id its client saw (the stored response's), not the upstream's.
    upstream_id = chat_response.get("id")
    response_id = response_id or upstream_id
    if not (isinstance(request_id, str) and request_id):
        # Switchyard's token-capture record takes request_id from the upstream completion id: the fallback.
        request_id = upstream_id if isinstance(upstream_id, str) else None
    model = chat_response.get("model")

    prompt_ids = prompt_token_ids(chat_response, choice)
    generation_ids, log_probs = generation_tokens(choice)
    token_texts = generation_token_texts(choice)

    usage = chat_response.get("usage") if isinstance(chat_response.get("usage"), dict) else None
    request_messages = chat_request.get("messages")
    messages = list(request_messages) if isinstance(request_messages, list) else []
    messages.append(_assistant_message(choice.get("message")))

    invalid_reason = _first_problem(
        status=status,
        n_choices=len(choices),
        request_id=request_id,
        model=model,
        prompt_ids=prompt_ids,
        generation_ids=generation_ids,
        log_probs=log_probs,
    )

    # Key order: identity first, so a human (or a head-only reader) sees what the file is at once.
    record: CaptureRecord = {
        "schema_version": SCHEMA_VERSION,
        "uuid": record_uuid or str(uuid_module.uuid4()),
        "session_id": session_id,
        "parent_session_id": parent_session_id,
        "captured_at": captured_at or utc_timestamp(),
        # Ours: the server run that wrote the record (docs/capture.md#server-runs); read from the
        # first block by the index, so it sits with the identity fields.
        "server_run": server_run,
        "request_id": request_id,
        "response_id": response_id,
        "model": model,
        "route": route,
        "api": api,
        "stream": bool(stream),
        "status": status,
        "rollout_id": rollout_id,
        "session_source": session_source,
        "latency_ms": round(float(latency_ms), 3),
        "is_valid": invalid_reason is None,
        "invalid_reason": invalid_reason,
        "finish_reason": choice.get("finish_reason"),
        "token_count": _token_count(usage),
        "usage": usage,
        "tools": format_tools(chat_request.get("tools")),
        "tool_choice": format_tool_choice(chat_request.get("tool_choice")),
        "messages": messages,
        "prompt_token_ids": prompt_ids,
        "generation_token_ids": generation_ids,
        "generation_log_probs": log_probs,
        # Ours, after the fields of Switchyard's token-capture record: the upstream's text for each generated token
        # (vLLM's `logprobs.content[].token`), or null when it gave ids only.
        "generation_token_texts": token_texts,
    }
    if injection is not None:
        record["injection"] = injection
    if developer_messages:
        record["developer_messages"] = developer_messages
    return record


def record_of(call: RecordInput) -> CaptureRecord:
    """The record of a call handed to capture (on the writer thread: the wire bytes are parsed here)."""
    return build_record(
        session_id=call.session_id,
        parent_session_id=call.parent_session_id,
        rollout_id=call.rollout_id,
        request_id=call.request_id,
        chat_request=_parsed(call.chat_request),
        chat_response=_parsed(call.chat_response),
        route=call.route,
        api=call.api,
        stream=call.stream,
        latency_ms=call.latency_ms,
        status=call.status,
        captured_at=call.captured_at,
        record_uuid=call.record_uuid,
        injection=call.injection,
        response_id=call.response_id,
        server_run=call.server_run,
        developer_messages=call.developer_messages,
        session_source=call.session_source,
    )


def _parsed(body: dict[str, Any] | bytes) -> dict[str, Any]:
    if isinstance(body, (bytes, bytearray)):
        parsed: dict[str, Any] = orjson.loads(body)
        return parsed
    return body


def _assistant_message(message: object) -> dict[str, Any]:
    """The generated turn in chat format, its reasoning included."""
    out: dict[str, Any] = {"role": "assistant"}
    if not isinstance(message, dict):
        return out
    if message.get("content") is not None:
        out["content"] = message["content"]
    reasoning = reasoning_of(message)
    if reasoning is not None:
        out["reasoning_content"] = reasoning
    tool_calls = message.get("tool_calls")
    if isinstance(tool_calls, list) and tool_calls:
        out["tool_calls"] = tool_calls
    return out


def format_tools(tools: object) -> list[dict[str, Any]]:
    """Tools in the token-capture record's shape `{id, description, inputSchema: {jsonSchema}}` (what Gym reads)."""
    if not isinstance(tools, list):
        return []
    out: list[dict[str, Any]] = []
    for tool in tools:
        if not isinstance(tool, dict):
            continue
        # Chat tools nest the definition under "function"; Responses and Anthropic tools are flat.
        spec: dict[str, Any] = tool["function"] if isinstance(tool.get("function"), dict) else tool
        name = spec.get("name") or tool.get("id") or tool.get("type")
        schema = spec.get("parameters")
        if schema is None:
            schema = spec.get("input_schema")
        entry: dict[str, Any] = {
            "id": name,
            "description": spec.get("description") or "",
            "inputSchema": {"jsonSchema": schema if isinstance(schema, dict) else {}},
        }
        # Ours, beside the former shape: a function tool's `strict`, as the client gave it.
        if isinstance(spec.get("strict"), bool):
            entry["strict"] = spec["strict"]
        out.append(entry)
    return out


def format_tool_choice(tool_choice: object) -> str:
    """The mode string, or a named choice's `type` (the token-capture record's way); unset means "auto"."""
    if tool_choice is None:
        return "auto"
    if isinstance(tool_choice, dict):
        return str(tool_choice.get("type") or "auto")
    return str(tool_choice)


def _token_count(usage: dict[str, Any] | None) -> TokenCount:
    usage = usage or {}
    prompt, completion, total = (usage.get(key) for key in ("prompt_tokens", "completion_tokens", "total_tokens"))
    return {
        "prompt_tokens": prompt if type(prompt) is int else 0,
        "completion_tokens": completion if type(completion) is int else 0,
        "total_tokens": total if type(total) is int else 0,
    }


def _first_problem(
    *,
    status: str,
    n_choices: int,
    request_id: object,
    model: object,
    prompt_ids: object,
    generation_ids: object,
    log_probs: object,
) -> str | None:
    """Why the record cannot train a model, in the order Switchyard's token-capture record checks; None when it can."""
    if status != "completed":
        return f"call did not complete (status {status!r})"
    if n_choices != 1:
        return f"expected exactly one choice, got {n_choices}"
    if not (isinstance(request_id, str) and request_id):
        return "request_id is missing"
    if not (isinstance(model, str) and model):
        return "model is missing (token ids are meaningless without the tokenizer)"
    return triple_problem(prompt_ids, generation_ids, log_probs)


def validate_record(obj: object) -> str | None:
    """Why `obj` is not a readable capture record (a foreign or damaged file), or None if it is.

    This checks the shape a reader relies on, not trainability: an `is_valid: false` record is
    still a readable record.
    """
    if not isinstance(obj, dict):
        return f"not an object ({type(obj).__name__})"
    if obj.get("schema_version") != SCHEMA_VERSION:
        return f"unsupported schema_version {obj.get('schema_version')!r}"
    if not (isinstance(obj.get("uuid"), str) and obj["uuid"]):
        return "no uuid"
    if not is_valid_session_id(obj.get("session_id")):
        return "no valid session_id"
    parent = obj.get("parent_session_id")
    if parent is not None and not isinstance(parent, str):
        return "parent_session_id is not a string"
    if not isinstance(obj.get("captured_at"), str):
        return "no captured_at"
    if obj.get("server_run") is not None and not isinstance(obj["server_run"], str):
        return "server_run is not a string"
    if not isinstance(obj.get("messages"), list):
        return "messages is not a list"
    if not isinstance(obj.get("is_valid"), bool):
        return "is_valid is not a boolean"
    return None
