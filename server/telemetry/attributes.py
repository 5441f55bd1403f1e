"""GenAI semantic-convention attributes for a model call: request, response, session, errors, opt-in content."""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Mapping
from typing import Any, TypeGuard

import orjson
from opentelemetry.trace import Span, Status, StatusCode

from middleware.correlation import Correlation
from server.capture.tokens import reasoning_of
from server.errors import OpenAIError

# We call Switchyard, which picks the real backend per route; the backend shows as gen_ai.response.model.
PROVIDER_NAME = "switchyard"
OPERATION = "chat"
_TRACEPARENT = re.compile(r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")


def api_type(api: str) -> str:
    """Which API the client called: `chat_completions`, `responses` or (Anthropic's) `messages`."""
    return api if api in ("responses", "messages") else "chat_completions"


def error_type(error: BaseException) -> str:
    """A low-cardinality `error.type`: the HTTP status of an OpenAIError, `cancelled` for a gone
    client, else the exception's qualified class name."""
    if isinstance(error, OpenAIError):
        return str(error.status)
    if isinstance(error, asyncio.CancelledError):
        return "cancelled"
    cls = type(error)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def record_error(span: Span, error: BaseException) -> None:
    span.set_attribute("error.type", error_type(error))
    if isinstance(error, OpenAIError):
        if error.code:
            span.set_attribute("switchyard_model.error.code", error.code)
        description = error.message
    elif isinstance(error, asyncio.CancelledError):
        description = "cancelled: the client went away or the server is shutting down"
    else:
        span.record_exception(error)
        description = f"{type(error).__name__}: {error}"
    span.set_status(Status(StatusCode.ERROR, description[:500]))


def session_attributes(correlation: Correlation | None, route: str) -> dict[str, Any]:
    attrs: dict[str, Any] = {"switchyard_model.route": route}
    if correlation is None:
        return attrs
    session_id = correlation.session_id
    if session_id:
        attrs["gen_ai.conversation.id"] = session_id
        attrs["session.id"] = session_id
    for value, key in (
        (correlation.parent_session_id, "switchyard_model.parent_session.id"),
        (correlation.rollout_id, "switchyard_model.rollout.id"),
        (correlation.source, "switchyard_model.session.source"),
        (correlation.request_id, "switchyard_model.request.id"),
    ):
        if value:
            attrs[key] = value
    return attrs


_FLOAT_PARAMS = (
    ("temperature", "gen_ai.request.temperature"),
    ("top_p", "gen_ai.request.top_p"),
    ("frequency_penalty", "gen_ai.request.frequency_penalty"),
    ("presence_penalty", "gen_ai.request.presence_penalty"),
)
_INT_PARAMS = (("top_k", "gen_ai.request.top_k"), ("seed", "gen_ai.request.seed"))


def request_attributes(request: dict[str, Any], stream: bool) -> dict[str, Any]:
    attrs: dict[str, Any] = {}
    if stream:
        attrs["gen_ai.request.stream"] = True
    if not isinstance(request, dict):
        return attrs
    for key, attr in _FLOAT_PARAMS:
        value = request.get(key)
        if _is_number(value):
            attrs[attr] = float(value)
    for key, attr in _INT_PARAMS:
        value = request.get(key)
        if is_int(value):
            attrs[attr] = value
    max_tokens = request.get("max_completion_tokens", request.get("max_tokens"))
    if is_int(max_tokens):
        attrs["gen_ai.request.max_tokens"] = max_tokens
    choices = request.get("n")
    if is_int(choices) and choices != 1:
        attrs["gen_ai.request.choice.count"] = choices
    stop = request.get("stop")
    if isinstance(stop, str):
        attrs["gen_ai.request.stop_sequences"] = (stop,)
    elif isinstance(stop, list) and stop and all(isinstance(s, str) for s in stop):
        attrs["gen_ai.request.stop_sequences"] = tuple(stop)
    fmt = request.get("response_format")
    if isinstance(fmt, dict) and isinstance(fmt.get("type"), str):
        attrs["gen_ai.output.type"] = "json" if fmt["type"] in ("json_object", "json_schema") else fmt["type"]
    tier = request.get("service_tier")
    if isinstance(tier, str):
        attrs["openai.request.service_tier"] = tier
    return attrs


def response_attributes(response: dict[str, Any]) -> dict[str, Any]:
    attrs: dict[str, Any] = {}
    for key, attr in (
        ("id", "gen_ai.response.id"),
        ("model", "gen_ai.response.model"),
        ("system_fingerprint", "openai.response.system_fingerprint"),
        ("service_tier", "openai.response.service_tier"),
    ):
        value = response.get(key)
        if isinstance(value, str) and value:
            attrs[attr] = value
    choices = response.get("choices")
    if isinstance(choices, list):
        reasons = tuple(
            c["finish_reason"] for c in choices if isinstance(c, dict) and isinstance(c.get("finish_reason"), str)
        )
        if reasons:
            attrs["gen_ai.response.finish_reasons"] = reasons
    usage = response.get("usage")
    if isinstance(usage, dict):
        # Chat Completions names first, then the Responses API's (a passthrough reply).
        for paths, attr in (
            ((("prompt_tokens",), ("input_tokens",)), "gen_ai.usage.input_tokens"),
            ((("completion_tokens",), ("output_tokens",)), "gen_ai.usage.output_tokens"),
            (
                (("prompt_tokens_details", "cached_tokens"), ("input_tokens_details", "cached_tokens")),
                "gen_ai.usage.cache_read.input_tokens",
            ),
            (
                (("completion_tokens_details", "reasoning_tokens"), ("output_tokens_details", "reasoning_tokens")),
                "gen_ai.usage.reasoning.output_tokens",
            ),
        ):
            for path in paths:
                found: Any = usage
                for key in path:
                    found = found.get(key) if isinstance(found, dict) else None
                if is_int(found):
                    attrs[attr] = found
                    break
    return attrs


# ---- opt-in content (gen_ai.input.messages / gen_ai.output.messages, as JSON strings) ----------------
def content_input_attributes(request: dict[str, Any]) -> dict[str, str]:
    attrs = {}
    messages = request.get("messages") if isinstance(request, dict) else None
    if isinstance(messages, list):
        attrs["gen_ai.input.messages"] = _json([_message_parts(m) for m in messages if isinstance(m, dict)])
    tools = request.get("tools") if isinstance(request, dict) else None
    if isinstance(tools, list) and tools:
        attrs["gen_ai.tool.definitions"] = _json([flat_tool(t) for t in tools if isinstance(t, dict)])
    return attrs


def flat_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """A tool definition in the conventions' flat shape ({type, name, description, parameters}):
    the Chat Completions `{"type": "function", "function": {...}}` is unwrapped; a Responses
    function tool is flat already; any other tool keeps its own fields, and its type as its name
    if it has none (the schema requires a name: one tool without it voids the whole list)."""
    inner = tool.get("function")
    if tool.get("type") == "function" and isinstance(inner, dict):
        flat: dict[str, Any] = {"type": "function"}
        for key in ("name", "description", "parameters"):
            if key in inner:
                flat[key] = inner[key]
        return flat
    if not isinstance(tool.get("name"), str):
        return {**tool, "name": str(tool.get("type", "tool"))}
    return tool


def root_input_attributes(client_request: Any) -> dict[str, str]:
    """The call's input for list views (Phoenix, Langfuse): the request as the client sent it."""
    if not isinstance(client_request, dict):
        return {}
    return {"input.value": _json(client_request), "input.mime_type": "application/json"}


def root_output_attributes(response: dict[str, Any]) -> dict[str, str]:
    """The call's output for list views: the model's text, or the whole answer as JSON when it
    called tools (or was not a chat completion)."""
    choices = response.get("choices")
    if isinstance(choices, list) and len(choices) == 1 and isinstance(choices[0], dict):
        message = choices[0].get("message")
        if isinstance(message, dict) and not message.get("tool_calls") and isinstance(message.get("content"), str):
            return {"output.value": message["content"], "output.mime_type": "text/plain"}
        if isinstance(message, dict):
            return {"output.value": _json(message), "output.mime_type": "application/json"}
    text = response.get("output_text")  # a Responses object (the passthrough)
    if isinstance(text, str) and text:
        return {"output.value": text, "output.mime_type": "text/plain"}
    return {"output.value": _json(response), "output.mime_type": "application/json"}


def token_count_attributes(usage_attrs: dict[str, Any]) -> dict[str, int]:
    """OpenInference's token counts, which Phoenix adds up per trace and session, from gen_ai.usage.*."""
    out: dict[str, int] = {}
    prompt = usage_attrs.get("gen_ai.usage.input_tokens")
    completion = usage_attrs.get("gen_ai.usage.output_tokens")
    if is_int(prompt):
        out["llm.token_count.prompt"] = prompt
    if is_int(completion):
        out["llm.token_count.completion"] = completion
    if is_int(prompt) and is_int(completion):
        out["llm.token_count.total"] = prompt + completion
    cached = usage_attrs.get("gen_ai.usage.cache_read.input_tokens")
    if is_int(cached):
        out["llm.token_count.prompt_details.cache_read"] = cached
    reasoning = usage_attrs.get("gen_ai.usage.reasoning.output_tokens")
    if is_int(reasoning):
        out["llm.token_count.completion_details.reasoning"] = reasoning
    return out


def content_output_attributes(response: dict[str, Any]) -> dict[str, str]:
    out = []
    for choice in response.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        raw_message = choice.get("message")
        message = _message_parts(raw_message if isinstance(raw_message, dict) else {})
        message["role"] = "assistant"
        if isinstance(choice.get("finish_reason"), str):
            message["finish_reason"] = choice["finish_reason"]
        out.append(message)
    return {"gen_ai.output.messages": _json(out)}


def _message_parts(message: dict[str, Any]) -> dict[str, Any]:
    """A chat message in the conventions' role/parts shape."""
    role = message.get("role") if isinstance(message.get("role"), str) else "user"
    parts: list[dict[str, Any]] = []
    content = message.get("content")
    if role == "tool":
        parts.append({"type": "tool_call_response", "id": message.get("tool_call_id"), "response": content})
    elif isinstance(content, str):
        if content:
            parts.append({"type": "text", "content": content})
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append({"type": "text", "content": part["text"]})
            elif isinstance(part, dict):
                parts.append({"type": str(part.get("type", "unknown"))})
    reasoning = reasoning_of(message)
    if reasoning is not None:
        parts.insert(0, {"type": "reasoning", "content": reasoning})
    for call in message.get("tool_calls") or ():
        if isinstance(call, dict):
            raw_fn = call.get("function")
            fn = raw_fn if isinstance(raw_fn, dict) else {}
            parts.append(
                {"type": "tool_call", "id": call.get("id"), "name": fn.get("name"), "arguments": fn.get("arguments")}
            )
    return {"role": role, "parts": parts}


def _json(value: Any) -> str:
    return orjson.dumps(value, default=str).decode()


# ---- helpers -------------------------------------------------------------------------------------
def is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def incoming_trace_headers(scope: Mapping[str, Any]) -> dict[str, str]:
    """The request's W3C trace context (traceparent, tracestate), if well-formed."""
    headers = scope.get("headers") if isinstance(scope, dict) else None
    if not headers:
        return {}
    traceparent = None
    states = []
    for name, value in headers:
        lowered = name.lower()
        if lowered == b"traceparent" and traceparent is None:
            traceparent = value.decode("latin-1").strip().lower()
        elif lowered == b"tracestate":
            states.append(value.decode("latin-1").strip())
    if traceparent is None or not _TRACEPARENT.match(traceparent):
        return {}
    out = {"traceparent": traceparent}
    state = ",".join(s for s in states if s)
    if state and len(state) <= 512 and state.isprintable():
        out["tracestate"] = state
    return out
