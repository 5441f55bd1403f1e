"""Responses <-> Chat Completions translation: requests, non-stream responses and streamed events (pure, no I/O)."""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from server.errors import OpenAIError
from server.translate.accumulate import ChatStreamAccumulator

log = logging.getLogger("switchyard_model.translate")

# A namespaced tool `{type: namespace, name: NS, tools: [{name: N}]}` becomes the chat function
# `NS__N`. Chat has no namespaces, and a double underscore is a legal function-name character in
# every tool-call parser we know. If `NS__N` is already taken (a real top-level tool, or another
# namespace flattening to the same string), `_2`, `_3`, ... is appended until it is free; the
# ToolMap remembers the pairing, so the reverse direction never parses the string.
NAMESPACE_SEPARATOR = "__"

# Accepted and deliberately ignored: they either configure things a single chat call has no notion
# of (storage, caching, tiers, truncation policy, client bookkeeping) or are set by the caller
# (`model`, `stream`). `background`, `conversation`, `prompt` and `previous_response_id` are only
# accepted when falsy/null; see `_check_conditional_fields`.
IGNORED_FIELDS = frozenset(
    {
        "model",
        "stream",
        "stream_options",
        "store",  # nothing is stored; the response reports store: false
        "include",  # only `message.output_text.logprobs` has an effect (it asks for logprobs)
        "prompt_cache_key",
        "prompt_cache_retention",
        "client_metadata",  # Codex
        "safety_identifier",
        "service_tier",
        "truncation",  # the upstream rejects an over-long prompt; we never truncate
        "max_tool_calls",  # one chat call is one model turn; nothing to cap across turns
        "background",
        "conversation",
        "prompt",
        "previous_response_id",
    }
)

# vLLM sampling fields a client may add (e.g. through the SDK's `extra_body`); forwarded verbatim.
VLLM_PASSTHROUGH_FIELDS = (
    "presence_penalty",
    "frequency_penalty",
    "seed",
    "stop",
    "top_k",
    "min_p",
    "repetition_penalty",
    "chat_template_kwargs",
)

_HANDLED_FIELDS = frozenset(
    {
        "input",
        "instructions",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "max_output_tokens",
        "temperature",
        "top_p",
        "text",
        "reasoning",
        "metadata",
        "user",
        "top_logprobs",
    }
)
# Every top-level Responses field this module accepts; anything else is a 400 naming it.
RESPONSES_FIELDS = IGNORED_FIELDS | _HANDLED_FIELDS | frozenset(VLLM_PASSTHROUGH_FIELDS)

# Gym's training variants of items carry these. Chat messages are rebuilt from known keys only, so
# they never reach the upstream; token_triple reads a bundle already on a message under these names.
_TRAINING_KEYS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs", "routed_experts")

_MESSAGE_ROLES = frozenset({"user", "system", "developer", "assistant"})
_TOOL_CHOICE_MODES = frozenset({"auto", "none", "required"})
_OUTPUT_LOGPROBS_INCLUDE = "message.output_text.logprobs"

# Chat finish_reason -> Responses incomplete reason; anything else finishes `completed`.
_INCOMPLETE_REASONS = {"length": "max_output_tokens", "content_filter": "content_filter"}

# `Response.error.code` is a closed set in the openai SDK; other codes are reported as server_error
# (the in-stream `error` event keeps the original code).
_RESPONSE_ERROR_CODES = frozenset(
    {
        "server_error",
        "rate_limit_exceeded",
        "invalid_prompt",
        "vector_store_timeout",
        "invalid_image",
        "invalid_image_format",
        "invalid_base64_image",
        "invalid_image_url",
        "image_too_large",
        "image_too_small",
        "image_parse_error",
        "image_content_policy_violation",
        "invalid_image_mode",
        "image_file_too_large",
        "unsupported_image_media_type",
        "empty_image_file",
        "failed_to_download_image",
        "image_file_not_found",
    }
)

# A logprob vLLM could not represent (-inf) arrives as null; the SDK wants a float.
_MISSING_LOGPROB = -9999.0

_warned_tool_types: set[str] = set()
_warned_late_tool_delta = False


# ---- errors -----------------------------------------------------------------------------------


def _invalid(message: str, param: str, code: str = "invalid_value") -> OpenAIError:
    return OpenAIError(400, message, param=param, code=code)


def _wrong_type(param: str, expected: str) -> OpenAIError:
    return OpenAIError(400, f"`{param}` must be {expected}", param=param, code="invalid_type")


def _unsupported(message: str, param: str) -> OpenAIError:
    return OpenAIError(400, message, param=param, code="unsupported_parameter")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# ---- tools --------------------------------------------------------------------------------------


@dataclass
class ToolMap:
    """How chat tool names relate to the Responses tools they came from."""

    # flattened chat name -> (namespace, name inside the namespace)
    namespaced: dict[str, tuple[str, str]] = field(default_factory=dict)
    # (namespace, inner name) -> flattened chat name
    flattened: dict[tuple[str, str], str] = field(default_factory=dict)
    # names of the top-level function tools, unchanged on the chat side
    functions: set[str] = field(default_factory=set)

    def response_name(self, chat_name: str) -> tuple[str, str | None]:
        """(name, namespace) for a tool call the model made under `chat_name`."""
        pair = self.namespaced.get(chat_name)
        if pair is None:
            return chat_name, None
        return pair[1], pair[0]

    def chat_name(self, name: str, namespace: str | None) -> str:
        """The chat function name for a Responses call `name` in `namespace`."""
        if namespace is None:
            return name
        flat = self.flattened.get((namespace, name))
        if flat is not None:
            return flat
        if namespace == name and name in self.functions:
            # A top-level function may report its own name as the namespace.
            return name
        # The namespace is no longer offered; keep the history readable with the plain scheme.
        return f"{namespace}{NAMESPACE_SEPARATOR}{name}"


@dataclass
class ChatRequest:
    """A translated Responses request: the chat body (no `model`/`stream`) and what maps the answer back."""

    body: dict[str, Any]
    tool_map: ToolMap
    dropped_tool_types: list[str] = field(default_factory=list)


def _function_tool(tool: dict[str, Any], param: str, name: str) -> dict[str, Any]:
    function: dict[str, Any] = {"name": name}
    description = tool.get("description")
    if description is not None:
        function["description"] = description
    parameters = tool.get("parameters")
    if parameters is not None:
        if not isinstance(parameters, dict):
            raise _wrong_type(f"{param}.parameters", "a JSON Schema object")
        function["parameters"] = parameters
    strict = tool.get("strict")
    if strict is not None:
        function["strict"] = strict
    return {"type": "function", "function": function}


def _tool_name(tool: dict[str, Any], param: str) -> str:
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise _invalid(f"`{param}.name` must be a non-empty string", f"{param}.name")
    return name


def _drop_tool(kind: str, dropped: list[str]) -> None:
    dropped.append(kind)
    if kind not in _warned_tool_types:
        _warned_tool_types.add(kind)
        log.warning("dropping tools of type %r: a chat completions upstream cannot serve them", kind)


def _translate_tools(tools: Any) -> tuple[list[dict[str, Any]], ToolMap, list[str]]:
    if tools is None:
        return [], ToolMap(), []
    if not isinstance(tools, list):
        raise _wrong_type("tools", "an array of tools")
    tool_map = ToolMap()
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or not isinstance(tool.get("type"), str):
            raise _invalid(f"`tools[{i}]` must be an object with a string `type`", f"tools[{i}]")
        if tool["type"] == "function":
            tool_map.functions.add(_tool_name(tool, f"tools[{i}]"))
    taken = set(tool_map.functions)
    chat_tools: list[dict[str, Any]] = []
    dropped: list[str] = []
    for i, tool in enumerate(tools):
        kind = tool["type"]
        if kind == "function":
            chat_tools.append(_function_tool(tool, f"tools[{i}]", tool["name"]))
        elif kind == "namespace":
            namespace = _tool_name(tool, f"tools[{i}]")
            inner_tools = tool.get("tools")
            if not isinstance(inner_tools, list):
                raise _wrong_type(f"tools[{i}].tools", "an array of tools")
            for j, inner in enumerate(inner_tools):
                param = f"tools[{i}].tools[{j}]"
                if not isinstance(inner, dict) or not isinstance(inner.get("type"), str):
                    raise _invalid(f"`{param}` must be an object with a string `type`", param)
                if inner["type"] != "function":
                    _drop_tool(f"namespace/{inner['type']}", dropped)
                    continue
                inner_name = _tool_name(inner, param)
                flat = base = f"{namespace}{NAMESPACE_SEPARATOR}{inner_name}"
                suffix = 2
                while flat in taken:
                    flat = f"{base}_{suffix}"
                    suffix += 1
                taken.add(flat)
                tool_map.namespaced[flat] = (namespace, inner_name)
                tool_map.flattened[(namespace, inner_name)] = flat
                chat_tools.append(_function_tool(inner, param, flat))
        else:
            _drop_tool(kind, dropped)
    return chat_tools, tool_map, dropped


def _chat_tool_name(choice: dict[str, Any], tool_map: ToolMap, chat_names: set[str], param: str) -> str:
    name = choice.get("name")
    if not isinstance(name, str):
        raise _invalid(f"`{param}.name` must be a string", f"{param}.name")
    namespace = choice.get("namespace")
    if namespace is not None:
        flat = tool_map.chat_name(name, namespace)
    elif name in tool_map.functions:
        flat = name
    else:
        # A bare inner name is accepted when exactly one namespace offers it.
        matches = [flat for (_, inner), flat in tool_map.flattened.items() if inner == name]
        flat = matches[0] if len(matches) == 1 else name
    if flat not in chat_names:
        raise _invalid(f"tool_choice names `{name}`, which is not among the function tools", param)
    return flat


def _translate_tool_choice(
    choice: Any, tool_map: ToolMap, chat_tools: list[dict[str, Any]]
) -> tuple[Any, list[dict[str, Any]]]:
    """The chat tool_choice (None = leave it out) and the tool list, which `allowed_tools` narrows."""
    if choice is None:
        return None, chat_tools
    chat_names = {tool["function"]["name"] for tool in chat_tools}
    if isinstance(choice, str):
        if choice not in _TOOL_CHOICE_MODES:
            raise _invalid(f"`tool_choice` must be one of auto, none, required (got {choice!r})", "tool_choice")
        if choice == "required" and not chat_tools:
            raise _invalid("tool_choice is `required` but no function tools are available", "tool_choice")
        return choice, chat_tools
    if not isinstance(choice, dict):
        raise _wrong_type("tool_choice", "a string or an object")
    kind = choice.get("type")
    if kind == "function":
        flat = _chat_tool_name(choice, tool_map, chat_names, "tool_choice")
        return {"type": "function", "function": {"name": flat}}, chat_tools
    if kind == "allowed_tools":
        mode = choice.get("mode", "auto")
        if mode not in ("auto", "required"):
            raise _invalid("`tool_choice.mode` must be auto or required", "tool_choice.mode")
        allowed = choice.get("tools")
        if not isinstance(allowed, list):
            raise _wrong_type("tool_choice.tools", "an array of tools")
        keep: set[str] = set()
        for j, entry in enumerate(allowed):
            param = f"tool_choice.tools[{j}]"
            if not isinstance(entry, dict) or entry.get("type") != "function":
                raise _unsupported(f"`{param}`: only function tools can be allowed here", param)
            keep.add(_chat_tool_name(entry, tool_map, chat_names, param))
        narrowed = [tool for tool in chat_tools if tool["function"]["name"] in keep]
        return mode, narrowed
    raise _unsupported(f"tool_choice of type {kind!r} cannot be served by a chat completions upstream", "tool_choice")


# ---- input items --------------------------------------------------------------------------------


def _text_of(part: dict[str, Any], param: str) -> str:
    text = part.get("text")
    if not isinstance(text, str):
        raise _wrong_type(f"{param}.text", "a string")
    return text


def _image_part(part: dict[str, Any], param: str) -> dict[str, Any]:
    url = part.get("image_url")
    if not isinstance(url, str):
        if part.get("file_id") is not None:
            raise _unsupported("input_image by `file_id` needs a file store; send `image_url` instead", param)
        raise _invalid(f"`{param}.image_url` must be a string", f"{param}.image_url")
    image: dict[str, Any] = {"url": url}
    detail = part.get("detail")
    if detail is not None:
        image["detail"] = detail
    return {"type": "image_url", "image_url": image}


def _chat_parts(content: list[Any], param: str, *, allow_refusal: bool) -> tuple[list[dict[str, Any]], list[str]]:
    """Chat content parts and, for assistant content, the refusal texts found among them."""
    parts: list[dict[str, Any]] = []
    refusals: list[str] = []
    for k, part in enumerate(content):
        part_param = f"{param}[{k}]"
        if not isinstance(part, dict):
            raise _wrong_type(part_param, "a content part object")
        kind = part.get("type")
        if kind in ("input_text", "output_text", "text"):
            parts.append({"type": "text", "text": _text_of(part, part_param)})
        elif kind == "input_image":
            parts.append(_image_part(part, part_param))
        elif kind == "refusal" and allow_refusal:
            refusal = part.get("refusal")
            if not isinstance(refusal, str):
                raise _wrong_type(f"{part_param}.refusal", "a string")
            refusals.append(refusal)
        elif kind == "input_file":
            raise _unsupported("input_file parts cannot be sent to a chat completions upstream", f"{part_param}.type")
        else:
            raise _invalid(f"unsupported content part type {kind!r}", f"{part_param}.type")
    return parts, refusals


def _simplify(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    # One text part is exactly a string to a chat template; anything richer stays a list and
    # the upstream applies its own joining rule.
    if not parts:
        return ""
    if len(parts) == 1 and parts[0]["type"] == "text":
        return parts[0]["text"]
    return parts


class _History:
    """Builds the chat message list, merging what Responses splits into separate items."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self._reasoning: list[str] = []
        # The assistant message a following function_call joins (same model turn), if any.
        self._turn: dict[str, Any] | None = None

    def _assistant(self, content: Any) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if self._reasoning:
            message["reasoning_content"] = "\n\n".join(self._reasoning)
            self._reasoning = []
        self.messages.append(message)
        return message

    def _flush_reasoning(self) -> None:
        # Reasoning that no assistant output followed (e.g. a length stop) is still what the
        # model generated; it becomes an assistant turn of its own.
        if self._reasoning:
            self._assistant("")

    def reasoning(self, text: str) -> None:
        self._reasoning.append(text)
        self._turn = None

    def assistant(self, content: Any, refusal: str | None) -> None:
        message = self._assistant(content)
        if refusal is not None:
            message["refusal"] = refusal
        self._turn = message

    def function_call(self, call: dict[str, Any]) -> None:
        if self._turn is None:
            self._turn = self._assistant("")
        self._turn.setdefault("tool_calls", []).append(call)

    def other(self, message: dict[str, Any]) -> None:
        self._flush_reasoning()
        self.messages.append(message)
        self._turn = None

    def finish(self) -> list[dict[str, Any]]:
        self._flush_reasoning()
        return self.messages


def _message_item(item: dict[str, Any], param: str, history: _History, developer_role: str) -> None:
    role = item.get("role")
    if not isinstance(role, str) or role not in _MESSAGE_ROLES:
        raise _invalid(
            f"`{param}.role` must be one of user, system, developer, assistant (got {role!r})", f"{param}.role"
        )
    content = item.get("content")
    if isinstance(content, str):
        chat_content: Any = content
        refusals: list[str] = []
    elif isinstance(content, list):
        parts, refusals = _chat_parts(content, f"{param}.content", allow_refusal=role == "assistant")
        if role == "assistant":
            if any(part["type"] != "text" for part in parts):
                raise _invalid("assistant content may only hold text and refusal parts", f"{param}.content")
            # The model produced one string; split output_text parts are pieces of it.
            chat_content = "".join(part["text"] for part in parts)
        else:
            chat_content = _simplify(parts)
    else:
        raise _wrong_type(f"{param}.content", "a string or an array of content parts")
    if role == "assistant":
        history.assistant(chat_content, "".join(refusals) if refusals else None)
    else:
        history.other({"role": developer_role if role == "developer" else role, "content": chat_content})


def _function_call_item(item: dict[str, Any], param: str, history: _History, tool_map: ToolMap) -> None:
    for key in ("call_id", "name", "arguments"):
        if not isinstance(item.get(key), str):
            raise _wrong_type(f"{param}.{key}", "a string")
    namespace = item.get("namespace")
    if namespace is not None and not isinstance(namespace, str):
        raise _wrong_type(f"{param}.namespace", "a string")
    history.function_call(
        {
            "id": item["call_id"],
            "type": "function",
            "function": {"name": tool_map.chat_name(item["name"], namespace), "arguments": item["arguments"]},
        }
    )


def _function_call_output_item(item: dict[str, Any], param: str, history: _History) -> None:
    call_id = item.get("call_id")
    if not isinstance(call_id, str):
        raise _wrong_type(f"{param}.call_id", "a string")
    output = item.get("output")
    if isinstance(output, str):
        content: Any = output
    elif isinstance(output, list):
        parts, _ = _chat_parts(output, f"{param}.output", allow_refusal=False)
        content = _simplify(parts)
    else:
        raise _wrong_type(f"{param}.output", "a string or an array of content parts")
    history.other({"role": "tool", "tool_call_id": call_id, "content": content})


def _reasoning_item(item: dict[str, Any], param: str, history: _History) -> None:
    # Raw reasoning text (what we emit) is preferred; a summary is the best a client may have.
    content = item.get("content")
    if isinstance(content, list) and content:
        texts = [_text_of(part, f"{param}.content[{k}]") for k, part in enumerate(content) if isinstance(part, dict)]
        text = "".join(texts)
    else:
        summary = item.get("summary") or []
        if not isinstance(summary, list):
            raise _wrong_type(f"{param}.summary", "an array")
        texts = [_text_of(part, f"{param}.summary[{k}]") for k, part in enumerate(summary) if isinstance(part, dict)]
        text = "\n\n".join(texts)
    # An item with only encrypted_content carries nothing a chat upstream could use.
    if text:
        history.reasoning(text)


def _input_messages(value: Any, tool_map: ToolMap, developer_role: str) -> list[dict[str, Any]]:
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list):
        raise _wrong_type("input", "a string or an array of input items")
    history = _History()
    for i, item in enumerate(value):
        param = f"input[{i}]"
        if not isinstance(item, dict):
            raise _wrong_type(param, "an input item object")
        kind = item.get("type")
        if kind is None and "role" in item:
            kind = "message"  # the "easy input message" form
        if kind == "message":
            _message_item(item, param, history, developer_role)
        elif kind == "function_call":
            _function_call_item(item, param, history, tool_map)
        elif kind == "function_call_output":
            _function_call_output_item(item, param, history)
        elif kind == "reasoning":
            _reasoning_item(item, param, history)
        else:
            raise _unsupported(
                f"input items of type {kind!r} cannot be sent to a chat completions upstream", f"{param}.type"
            )
    return history.finish()


# ---- the request --------------------------------------------------------------------------------


def _check_conditional_fields(body: dict[str, Any]) -> None:
    if body.get("previous_response_id") is not None:
        raise _unsupported(
            "previous_response_id is not supported: this server stores no responses; resend the full input",
            "previous_response_id",
        )
    if body.get("background"):
        raise _unsupported("background responses are not supported", "background")
    if body.get("conversation") is not None:
        raise _unsupported("conversations are not supported: this server stores no responses", "conversation")
    if body.get("prompt") is not None:
        raise _unsupported("stored prompt templates are not supported", "prompt")
    include = body.get("include")
    if include is not None and (not isinstance(include, list) or not all(isinstance(x, str) for x in include)):
        raise _wrong_type("include", "an array of strings")
    for key in ("user", "prompt_cache_key", "safety_identifier"):
        value = body.get(key)
        if value is not None and not isinstance(value, str):
            raise _wrong_type(key, "a string")


def _response_format(text: Any) -> dict[str, Any] | None:
    if text is None:
        return None
    if not isinstance(text, dict):
        raise _wrong_type("text", "an object")
    fmt = text.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise _wrong_type("text.format", "an object")
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        schema = fmt.get("schema")
        if not isinstance(schema, dict):
            raise _wrong_type("text.format.schema", "a JSON Schema object")
        json_schema: dict[str, Any] = {"name": fmt.get("name") or "response", "schema": schema}
        for key in ("strict", "description"):
            if fmt.get(key) is not None:
                json_schema[key] = fmt[key]
        return {"type": "json_schema", "json_schema": json_schema}
    raise _invalid(f"`text.format.type` must be text, json_object or json_schema (got {kind!r})", "text.format.type")


def _wants_output_logprobs(request: dict[str, Any]) -> bool:
    include = request.get("include")
    return request.get("top_logprobs") is not None or (
        isinstance(include, list) and _OUTPUT_LOGPROBS_INCLUDE in include
    )


def responses_to_chat(body: dict[str, Any], *, developer_role: str = "system") -> ChatRequest:
    """Translate a Responses request body to a chat completions body; 400 (OpenAIError) when it cannot.

    `developer` messages become `system` by default: open-model chat templates know `system` but
    many silently skip a role they do not know, which would drop Codex's base instructions.
    `max_output_tokens` becomes `max_tokens`, the field every OpenAI-compatible chat server accepts
    (vLLM, SGLang, older servers), where `max_completion_tokens` is newer and not universal.
    """
    if not isinstance(body, dict):
        raise _wrong_type("body", "a JSON object")
    for key in body:
        if key not in RESPONSES_FIELDS:
            raise _unsupported(f"unsupported parameter: {key}", key)
    for key in ("stream", "parallel_tool_calls"):
        if body.get(key) is not None and not isinstance(body[key], bool):
            raise _wrong_type(key, "a boolean")
    if body.get("model") is not None and not isinstance(body["model"], str):
        raise _wrong_type("model", "a string")
    _check_conditional_fields(body)
    if "input" not in body or body["input"] is None:
        raise _invalid("`input` is required", "input", code="missing_required_parameter")

    chat_tools, tool_map, dropped = _translate_tools(body.get("tools"))
    messages = _input_messages(body["input"], tool_map, developer_role)
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise _wrong_type("instructions", "a string")
        messages.insert(0, {"role": "system", "content": instructions})
    if not messages:
        raise _invalid("`input` must contain at least one item", "input")

    chat: dict[str, Any] = {"messages": messages}
    tool_choice, chat_tools = _translate_tool_choice(body.get("tool_choice"), tool_map, chat_tools)
    if chat_tools:
        chat["tools"] = chat_tools
        if tool_choice is not None:
            chat["tool_choice"] = tool_choice
        if body.get("parallel_tool_calls") is not None:
            chat["parallel_tool_calls"] = body["parallel_tool_calls"]

    max_output_tokens = body.get("max_output_tokens")
    if max_output_tokens is not None:
        if not _is_int(max_output_tokens) or max_output_tokens < 1:
            raise _wrong_type("max_output_tokens", "a positive integer")
        chat["max_tokens"] = max_output_tokens
    for key in ("temperature", "top_p"):
        value = body.get(key)
        if value is not None:
            if not _is_number(value):
                raise _wrong_type(key, "a number")
            chat[key] = value

    response_format = _response_format(body.get("text"))
    if response_format is not None:
        chat["response_format"] = response_format

    reasoning = body.get("reasoning")
    if reasoning is not None:
        if not isinstance(reasoning, dict):
            raise _wrong_type("reasoning", "an object")
        effort = reasoning.get("effort")
        if effort is not None:
            if not isinstance(effort, str):
                raise _wrong_type("reasoning.effort", "a string")
            chat["reasoning_effort"] = effort

    metadata = body.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise _wrong_type("metadata", "an object")
    if body.get("user") is not None:
        chat["user"] = body["user"]

    top_logprobs = body.get("top_logprobs")
    if top_logprobs is not None:
        if not _is_int(top_logprobs) or not 0 <= top_logprobs <= 20:
            raise _wrong_type("top_logprobs", "an integer between 0 and 20")
        chat["logprobs"] = True
        chat["top_logprobs"] = top_logprobs
    elif _wants_output_logprobs(body):
        chat["logprobs"] = True
        chat["top_logprobs"] = 0

    for key in VLLM_PASSTHROUGH_FIELDS:
        if body.get(key) is not None:
            check_passthrough_type(key, body[key])
            chat[key] = body[key]
    return ChatRequest(chat, tool_map, dropped)


def check_passthrough_type(key: str, value: Any) -> None:
    """The vLLM sampling fields are forwarded as given, so at least their types are checked here."""
    if key == "stop":
        if not (isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, str) for v in value))):
            raise _wrong_type(key, "a string or an array of strings")
    elif key == "chat_template_kwargs":
        if not isinstance(value, dict):
            raise _wrong_type(key, "an object")
    elif key in ("seed", "top_k"):
        if not _is_int(value):
            raise _wrong_type(key, "an integer")
    elif not _is_number(value):
        raise _wrong_type(key, "a number")


# ---- the response -------------------------------------------------------------------------------


def _id_base(response_id: str) -> str:
    return response_id[5:] if response_id.startswith("resp_") else response_id


def _item_id(prefix: str, base: str, output_index: int) -> str:
    return f"{prefix}_{base}_{output_index}"


def _or(value: Any, default: Any) -> Any:
    return default if value is None else value


def response_base(request: dict[str, Any], *, response_id: str, created_at: int, model: str | None) -> dict[str, Any]:
    """An in-progress response object with every key of the Open Responses response present.

    Request settings are echoed; those the request left out are reported with the Responses API
    defaults (the Open Responses schema makes them non-nullable), not the upstream's own defaults.
    """
    text = request.get("text")
    text_config = dict(text) if isinstance(text, dict) else {}
    if text_config.get("format") is None:
        text_config["format"] = {"type": "text"}
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "completed_at": None,
        "status": "in_progress",
        "error": None,
        "incomplete_details": None,
        "instructions": request.get("instructions"),
        "max_output_tokens": request.get("max_output_tokens"),
        "max_tool_calls": request.get("max_tool_calls"),
        "model": model if model is not None else request.get("model"),
        "output": [],
        "parallel_tool_calls": _or(request.get("parallel_tool_calls"), True),
        "previous_response_id": None,
        "reasoning": request.get("reasoning"),
        "store": False,
        "temperature": _or(request.get("temperature"), 1.0),
        "text": text_config,
        "tool_choice": _or(request.get("tool_choice"), "auto"),
        "tools": _or(request.get("tools"), []),
        "top_p": _or(request.get("top_p"), 1.0),
        "presence_penalty": _or(request.get("presence_penalty"), 0.0),
        "frequency_penalty": _or(request.get("frequency_penalty"), 0.0),
        "top_logprobs": _or(request.get("top_logprobs"), 0),
        "truncation": _or(request.get("truncation"), "disabled"),
        "usage": None,
        "user": request.get("user"),
        "metadata": _or(request.get("metadata"), {}),
        "background": False,
        "service_tier": "default",
        "prompt_cache_key": request.get("prompt_cache_key"),
        "safety_identifier": request.get("safety_identifier"),
        "conversation": None,
        "prompt": None,
    }


def responses_usage(chat_usage: dict[str, Any] | None, triple: tuple | None = None) -> dict[str, Any] | None:
    """Chat usage in Responses form (with `cache_write_tokens`, which the openai SDK requires)."""
    if chat_usage:
        input_tokens = chat_usage.get("prompt_tokens") or 0
        output_tokens = chat_usage.get("completion_tokens") or 0
        total = chat_usage.get("total_tokens") or input_tokens + output_tokens
        cached = (chat_usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        reasoning = (chat_usage.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0
    elif triple is not None:
        input_tokens, output_tokens = len(triple[0]), len(triple[1])
        total, cached, reasoning = input_tokens + output_tokens, 0, 0
    else:
        return None
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": total,
    }


def _status_for(finish_reason: str | None) -> tuple[str, dict[str, Any] | None]:
    reason = _INCOMPLETE_REASONS.get(finish_reason or "")
    if reason is None:
        return "completed", None
    return "incomplete", {"reason": reason}


def _logprob_value(value: Any) -> float:
    return float(value) if _is_number(value) else _MISSING_LOGPROB


def _token_bytes(entry: dict[str, Any], token: str) -> list[int]:
    raw = entry.get("bytes")
    return raw if isinstance(raw, list) else list(token.encode("utf-8", "surrogatepass"))


def response_logprobs(entries: Any) -> list[dict[str, Any]]:
    """Chat `logprobs.content` entries in the shape of Responses `output_text.logprobs`."""
    out: list[dict[str, Any]] = []
    for entry in entries or ():
        token = entry.get("token") or ""
        out.append(
            {
                "token": token,
                "logprob": _logprob_value(entry.get("logprob")),
                "bytes": _token_bytes(entry, token),
                "top_logprobs": [
                    {
                        "token": top.get("token") or "",
                        "logprob": _logprob_value(top.get("logprob")),
                        "bytes": _token_bytes(top, top.get("token") or ""),
                    }
                    for top in entry.get("top_logprobs") or ()
                ],
            }
        )
    return out


def _text_part(text: str, logprobs: list[dict[str, Any]]) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs}


def _refusal_part(text: str) -> dict[str, Any]:
    return {"type": "refusal", "refusal": text}


def _message_output(item_id: str, parts: list[dict[str, Any]], status: str) -> dict[str, Any]:
    return {"id": item_id, "type": "message", "role": "assistant", "status": status, "content": parts}


def _reasoning_output(item_id: str, text: str, status: str) -> dict[str, Any]:
    # Raw chain of thought is `content` (reasoning_text); we write no summary of our own.
    return {
        "id": item_id,
        "type": "reasoning",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
        "encrypted_content": None,
        "status": status,
    }


def _function_call_output(
    item_id: str, call_id: str, name: str, namespace: str | None, arguments: str, status: str
) -> dict[str, Any]:
    item = {
        "id": item_id,
        "type": "function_call",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }
    if namespace is not None:
        item["namespace"] = namespace
    return item


def _parse_token_id(entry: Any) -> int | None:
    if not isinstance(entry, dict):
        return None
    token_id = entry.get("token_id")
    if _is_int(token_id):
        return token_id
    token = entry.get("token")
    if isinstance(token, str) and token.startswith("token_id:"):
        try:
            return int(token[9:])
        except ValueError:
            return None
    return None


def token_triple(chat: dict[str, Any]) -> tuple[list[int], list[int], list[float]] | None:
    """(prompt_token_ids, generation_token_ids, generation_log_probs) from a vLLM chat answer, or None.

    Sources, first present wins: a complete bundle already on the message; top-level
    `prompt_token_ids` with `choices[0].token_ids`; generation ids parsed from the logprob entries
    (`token_id:<n>` tokens, as `return_tokens_as_token_ids` makes them). Log probs always come from
    `choices[0].logprobs.content`. None when any part is missing or the lengths disagree.
    """
    choices = chat.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    choice = choices[0]
    message = choice.get("message") or {}
    bundle = [message.get(key) for key in _TRAINING_KEYS[:3]]
    if all(isinstance(part, list) for part in bundle):
        prompt_ids, generation_ids, log_probs = bundle
        return (prompt_ids, generation_ids, log_probs) if len(generation_ids) == len(log_probs) else None
    prompt_ids = chat.get("prompt_token_ids")
    entries = (choice.get("logprobs") or {}).get("content")
    if not isinstance(prompt_ids, list) or not isinstance(entries, list):
        return None
    generation_ids = choice.get("token_ids")
    if not isinstance(generation_ids, list):
        parsed = [_parse_token_id(entry) for entry in entries]
        if any(token_id is None for token_id in parsed):
            return None
        generation_ids = parsed
    log_probs: list[float] = []
    for entry in entries:
        value = entry.get("logprob") if isinstance(entry, dict) else None
        if not _is_number(value) or math.isnan(value):
            return None
        log_probs.append(value)
    if len(log_probs) != len(generation_ids):
        return None
    return prompt_ids, generation_ids, log_probs


def _attach_triple(output: list[dict[str, Any]], triple: tuple | None) -> None:
    # Gym's training convention: the ids ride on the last generated item only.
    if triple is not None and output:
        last = output[-1]
        last["prompt_token_ids"], last["generation_token_ids"], last["generation_log_probs"] = triple


def chat_to_response(
    chat: dict[str, Any],
    request: dict[str, Any],
    tool_map: ToolMap | None,
    *,
    response_id: str,
    created_at: int,
    token_ids: bool,
    completed_at: int | None = None,
) -> dict[str, Any]:
    """A full Responses object for a non-stream chat completion.

    Output order: reasoning, message (text and/or refusal), then one function_call per tool call.
    A generation with none of these still gets an empty message, so there is an item to carry
    the token triple. `model` is the upstream's (the routed target).
    """
    tool_map = tool_map or ToolMap()
    base = _id_base(response_id)
    choices = chat.get("choices") or []
    choice = choices[0] if choices and isinstance(choices[0], dict) else {}
    message = choice.get("message") or {}
    status, incomplete = _status_for(choice.get("finish_reason"))

    output: list[dict[str, Any]] = []
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if reasoning:
        output.append(_reasoning_output(_item_id("rs", base, len(output)), reasoning, "completed"))
    tool_calls = message.get("tool_calls") or []
    content = message.get("content")
    refusal = message.get("refusal")
    if content or refusal or (not output and not tool_calls):
        parts: list[dict[str, Any]] = []
        if content or not refusal:
            logprobs: list[dict[str, Any]] = []
            # Chat logprobs cover every generated token; they belong to the text only when the
            # text is all that was generated.
            if _wants_output_logprobs(request) and not reasoning and not tool_calls:
                logprobs = response_logprobs((choice.get("logprobs") or {}).get("content"))
            parts.append(_text_part(content or "", logprobs))
        if refusal:
            parts.append(_refusal_part(refusal))
        output.append(_message_output(_item_id("msg", base, len(output)), parts, "completed"))
    for i, call in enumerate(tool_calls):
        function = call.get("function") or {}
        name, namespace = tool_map.response_name(function.get("name") or "")
        index = len(output)
        output.append(
            _function_call_output(
                _item_id("fc", base, index),
                call.get("id") or f"call_{base}_{i}",
                name,
                namespace,
                function.get("arguments") or "",
                "completed",
            )
        )
    if status == "incomplete":
        output[-1]["status"] = "incomplete"

    triple = token_triple(chat)
    if token_ids:
        _attach_triple(output, triple)
    response = response_base(request, response_id=response_id, created_at=created_at, model=chat.get("model"))
    response["status"] = status
    response["incomplete_details"] = incomplete
    response["completed_at"] = (completed_at or int(time.time())) if status == "completed" else None
    response["output"] = output
    response["usage"] = responses_usage(chat.get("usage"), triple)
    return response


# ---- streaming ----------------------------------------------------------------------------------

_DONE = b"data: [DONE]\n\n"


def response_to_chat(response: dict[str, Any]) -> dict[str, Any]:
    """A Responses object as the chat.completion it stands for (for capture on the passthrough path).

    Keeps what a Responses upstream may carry for training: top-level `prompt_token_ids` and
    `output_token_ids` (vLLM's native Responses extras) and output_text logprobs.
    """
    content: list[str] = []
    reasoning: list[str] = []
    tool_calls: list[dict[str, Any]] = []
    logprobs: list[dict[str, Any]] = []
    for item in response.get("output") or []:
        if not isinstance(item, dict):
            continue
        kind = item.get("type")
        if kind == "message":
            for part in item.get("content") or []:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    content.append(part["text"])
                    logprobs.extend(part.get("logprobs") or [])
        elif kind == "reasoning":
            for part in (item.get("content") or []) + (item.get("summary") or []):
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    reasoning.append(part["text"])
        elif kind == "function_call":
            tool_calls.append(
                {
                    "id": item.get("call_id"),
                    "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments", "")},
                }
            )
    message: dict[str, Any] = {"role": "assistant", "content": "".join(content)}
    if reasoning:
        message["reasoning_content"] = "".join(reasoning)
    if tool_calls:
        message["tool_calls"] = tool_calls
    incomplete = (response.get("incomplete_details") or {}).get("reason")
    finish = "length" if incomplete == "max_output_tokens" else "tool_calls" if tool_calls else "stop"
    choice: dict[str, Any] = {
        "index": 0,
        "message": message,
        "finish_reason": finish,
        "logprobs": {"content": logprobs} if logprobs else None,
    }
    chat: dict[str, Any] = {
        "id": response.get("id"),
        "object": "chat.completion",
        "created": response.get("created_at"),
        "model": response.get("model"),
        "choices": [choice],
    }
    if isinstance(response.get("output_token_ids"), list):
        choice["token_ids"] = response["output_token_ids"]
    if isinstance(response.get("prompt_token_ids"), list):
        chat["prompt_token_ids"] = response["prompt_token_ids"]
    usage = response.get("usage")
    if isinstance(usage, dict):
        chat["usage"] = {
            "prompt_tokens": usage.get("input_tokens"),
            "completion_tokens": usage.get("output_tokens"),
            "total_tokens": usage.get("total_tokens"),
        }
    return chat


class _StreamItem:
    """One output item while it streams; text arrives as parts and is joined when it closes."""

    __slots__ = ("kind", "output_index", "item_id", "parts", "logprobs", "call_id", "name", "namespace", "status")

    def __init__(self, kind: str) -> None:
        self.kind = kind  # reasoning | text | refusal | call
        self.output_index: int | None = None  # None: a tool call whose name has not arrived yet
        self.item_id = ""
        self.parts: list[str] = []
        self.logprobs: list[dict[str, Any]] = []
        self.call_id: str | None = None
        self.name = ""
        self.namespace: str | None = None
        self.status: str | None = None  # set when output_item.done has been sent

    def snapshot(self, status: str) -> dict[str, Any]:
        """The item as `output_item.added` shows it (nothing generated yet) or, closed, in full."""
        closing = status != "in_progress"
        text = "".join(self.parts) if closing else ""
        if self.kind == "text":
            return _message_output(self.item_id, [_text_part(text, self.logprobs)] if closing else [], status)
        if self.kind == "refusal":
            return _message_output(self.item_id, [_refusal_part(text)] if closing else [], status)
        if self.kind == "reasoning":
            item = _reasoning_output(self.item_id, text, status)
            if not closing:
                item["content"] = []
            return item
        return _function_call_output(self.item_id, self.call_id or "", self.name, self.namespace, text, status)


_ITEM_PREFIX = {"text": "msg", "refusal": "msg", "reasoning": "rs", "call": "fc"}


class ResponsesStreamWriter:
    """Turns upstream chat chunks into Responses SSE events as they arrive.

    start() -> created + in_progress; feed(chunk) -> the events that chunk causes (b"" if none);
    finish() -> closes the open item, then response.completed / response.incomplete and [DONE];
    fail(message, code) -> an `error` event, response.failed and [DONE]. Any of them starts the
    stream first if start() was not called, and all return b"" once the stream has ended.

    One item is open at a time, in the order the upstream starts them; a new kind of content (or a
    new tool call) closes the open item first. A tool-call delta for a call already closed (an
    upstream interleaving calls) cannot be streamed any more: it is kept in the final response and
    logged. `accumulator` holds the chat-form result for capture; `response` is the final
    Responses object once the stream has ended (the same shape chat_to_response gives).
    """

    def __init__(
        self,
        request: dict[str, Any],
        tool_map: ToolMap | None,
        *,
        response_id: str,
        created_at: int,
        model: str | None,
        token_ids: bool,
    ) -> None:
        self.accumulator = ChatStreamAccumulator()
        self.response: dict[str, Any] | None = None
        self._tool_map = tool_map or ToolMap()
        self._base = response_base(request, response_id=response_id, created_at=created_at, model=model)
        self._id_base = _id_base(response_id)
        self._token_ids = token_ids
        self._want_logprobs = _wants_output_logprobs(request)
        self._sequence = 0
        self._started = False
        self._ended = False
        self._items: list[_StreamItem] = []
        self._open: _StreamItem | None = None
        self._calls: dict[int, _StreamItem] = {}

    # -- framing --

    def _emit(self, out: list[bytes], event: dict[str, Any]) -> None:
        event["sequence_number"] = self._sequence
        self._sequence += 1
        out.append(b"event: " + event["type"].encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n")

    def _lifecycle(self, out: list[bytes], kind: str, response: dict[str, Any]) -> None:
        self._emit(out, {"type": kind, "response": response})

    # -- public API --

    def start(self) -> bytes:
        if self._started:
            return b""
        self._started = True
        out: list[bytes] = []
        self._lifecycle(out, "response.created", dict(self._base))
        self._lifecycle(out, "response.in_progress", dict(self._base))
        return b"".join(out)

    def feed(self, chunk: dict[str, Any]) -> bytes:
        if self._ended:
            return b""
        out: list[bytes] = []
        if not self._started:
            out.append(self.start())
        self.accumulator.feed(chunk)
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta")
            if not delta:
                continue
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            if reasoning:
                self._append(out, "reasoning", reasoning, None)
            content = delta.get("content")
            if content:
                self._append(out, "text", content, choice.get("logprobs"))
            refusal = delta.get("refusal")
            if refusal:
                self._append(out, "refusal", refusal, None)
            tool_calls = delta.get("tool_calls")
            if tool_calls:
                for position, call in enumerate(tool_calls):
                    self._tool_call_delta(out, position, call)
        return b"".join(out)

    def finish(self) -> bytes:
        if self._ended:
            return b""
        out: list[bytes] = []
        if not self._started:
            out.append(self.start())
        self._ended = True
        for item in self._calls.values():
            if item.output_index is None:  # a call whose name never came: still the model's output
                self._open_call(out, item)
        if not self._items:
            self._open_item(out, _StreamItem("text"))
        status, incomplete = _status_for(self.accumulator.finish_reason)
        self._close_open(out, "incomplete" if incomplete else "completed")

        output = [item.snapshot(item.status or "completed") for item in self._items]
        triple = token_triple(self.accumulator.result()) if self._token_ids or not self.accumulator.usage else None
        if self._token_ids:
            _attach_triple(output, triple)
        response = dict(self._base)
        response["status"] = status
        response["incomplete_details"] = incomplete
        response["completed_at"] = int(time.time()) if status == "completed" else None
        response["output"] = output
        response["usage"] = responses_usage(self.accumulator.usage, triple)
        if self.accumulator.model:
            response["model"] = self.accumulator.model
        self.response = response
        self._lifecycle(out, "response.completed" if status == "completed" else "response.incomplete", response)
        out.append(_DONE)
        return b"".join(out)

    def fail(self, message: str, code: str | None = None) -> bytes:
        if self._ended:
            return b""
        out: list[bytes] = []
        if not self._started:
            out.append(self.start())
        self._ended = True
        self._emit(out, {"type": "error", "code": code, "message": message, "param": None})
        # Items still open are left unfinished: a client (Codex) keeps every item it saw
        # completed, and a half-generated tool call must not look like one.
        response = dict(self._base)
        response["status"] = "failed"
        response["error"] = {"code": code if code in _RESPONSE_ERROR_CODES else "server_error", "message": message}
        response["output"] = [item.snapshot(item.status) for item in self._items if item.status is not None]
        response["usage"] = responses_usage(self.accumulator.usage)
        if self.accumulator.model:
            response["model"] = self.accumulator.model
        self.response = response
        self._lifecycle(out, "response.failed", response)
        out.append(_DONE)
        return b"".join(out)

    # -- items --

    def _open_item(self, out: list[bytes], item: _StreamItem) -> None:
        self._close_open(out, "completed")
        index = len(self._items)
        item.output_index = index
        item.item_id = _item_id(_ITEM_PREFIX[item.kind], self._id_base, index)
        self._items.append(item)
        self._open = item
        self._emit(
            out, {"type": "response.output_item.added", "output_index": index, "item": item.snapshot("in_progress")}
        )
        if item.kind == "text":
            part: dict[str, Any] | None = _text_part("", [])
        elif item.kind == "refusal":
            part = _refusal_part("")
        elif item.kind == "reasoning":
            part = {"type": "reasoning_text", "text": ""}
        else:
            part = None
        if part is not None:
            self._emit(
                out,
                {
                    "type": "response.content_part.added",
                    "item_id": item.item_id,
                    "output_index": index,
                    "content_index": 0,
                    "part": part,
                },
            )

    def _close_open(self, out: list[bytes], status: str) -> None:
        item = self._open
        if item is None:
            return
        self._open = None
        item.status = status
        final = item.snapshot(status)
        ids = {"item_id": item.item_id, "output_index": item.output_index}
        if item.kind == "call":
            self._emit(out, {"type": "response.function_call_arguments.done", **ids, "arguments": final["arguments"]})
        else:
            part = final["content"][0]
            if item.kind == "text":
                self._emit(
                    out,
                    {
                        "type": "response.output_text.done",
                        **ids,
                        "content_index": 0,
                        "text": part["text"],
                        "logprobs": item.logprobs,
                    },
                )
            elif item.kind == "refusal":
                self._emit(
                    out, {"type": "response.refusal.done", **ids, "content_index": 0, "refusal": part["refusal"]}
                )
            else:
                self._emit(
                    out, {"type": "response.reasoning_text.done", **ids, "content_index": 0, "text": part["text"]}
                )
            self._emit(out, {"type": "response.content_part.done", **ids, "content_index": 0, "part": part})
        self._emit(out, {"type": "response.output_item.done", "output_index": item.output_index, "item": final})

    def _append(self, out: list[bytes], kind: str, delta: str, chat_logprobs: dict[str, Any] | None) -> None:
        item = self._open
        if item is None or item.kind != kind:
            item = _StreamItem(kind)
            self._open_item(out, item)
        item.parts.append(delta)
        ids = {"item_id": item.item_id, "output_index": item.output_index, "content_index": 0}
        if kind == "text":
            logprobs: list[dict[str, Any]] = []
            if self._want_logprobs and chat_logprobs:
                logprobs = response_logprobs(chat_logprobs.get("content"))
                item.logprobs.extend(logprobs)
            self._emit(out, {"type": "response.output_text.delta", **ids, "delta": delta, "logprobs": logprobs})
        elif kind == "refusal":
            self._emit(out, {"type": "response.refusal.delta", **ids, "delta": delta})
        else:
            self._emit(out, {"type": "response.reasoning_text.delta", **ids, "delta": delta})

    def _open_call(self, out: list[bytes], item: _StreamItem) -> None:
        self._open_item(out, item)
        if item.call_id is None:
            item.call_id = f"call_{self._id_base}_{item.output_index}"
        buffered = "".join(item.parts)
        if buffered:
            item.parts = [buffered]
            self._emit(
                out,
                {
                    "type": "response.function_call_arguments.delta",
                    "item_id": item.item_id,
                    "output_index": item.output_index,
                    "delta": buffered,
                },
            )

    def _tool_call_delta(self, out: list[bytes], position: int, delta: dict[str, Any]) -> None:
        global _warned_late_tool_delta
        index = delta.get("index", position)
        item = self._calls.get(index)
        if item is None:
            item = self._calls[index] = _StreamItem("call")
        if delta.get("id") and item.call_id is None:
            item.call_id = delta["id"]
        function = delta.get("function") or {}
        arguments = function.get("arguments") or ""
        if item.output_index is None:
            name = function.get("name")
            if arguments:
                item.parts.append(arguments)
            if name:
                item.name, item.namespace = self._tool_map.response_name(name)
                self._open_call(out, item)
            return
        if not arguments:
            return
        item.parts.append(arguments)
        if item is self._open:
            self._emit(
                out,
                {
                    "type": "response.function_call_arguments.delta",
                    "item_id": item.item_id,
                    "output_index": item.output_index,
                    "delta": arguments,
                },
            )
        elif not _warned_late_tool_delta:
            _warned_late_tool_delta = True
            log.warning(
                "upstream interleaved tool-call deltas; a closed call's late arguments only reach the final response"
            )
