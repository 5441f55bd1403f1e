"""A Responses request body as a Chat Completions request body (pure; a 400 naming the field when it cannot be)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from server.translate.checks import check_metadata, invalid, is_int, is_number, text_of, unsupported, wrong_type
from server.translate.custom_tools import encode_input
from server.translate.tools import ToolMap, translate_tool_choice, translate_tools

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
_MESSAGE_ROLES = frozenset({"user", "system", "developer", "assistant"})
_OUTPUT_LOGPROBS_INCLUDE = "message.output_text.logprobs"


@dataclass
class ChatRequest:
    """A translated Responses request: the chat body (no `model`/`stream`) and what maps the answer back."""

    body: dict[str, Any]
    tool_map: ToolMap
    dropped_tool_types: list[str] = field(default_factory=list)
    # Indices into `body["messages"]` of the messages the client sent as `developer` (sent as
    # `system`): the record keeps them, so a rollout gives the client's role back.
    developer_messages: list[int] = field(default_factory=list)


# ---- input items --------------------------------------------------------------------------------


def _image_part(part: dict[str, Any], param: str) -> dict[str, Any]:
    url = part.get("image_url")
    if not isinstance(url, str):
        if part.get("file_id") is not None:
            raise unsupported("input_image by `file_id` needs a file store; send `image_url` instead", param)
        raise invalid(f"`{param}.image_url` must be a string", f"{param}.image_url")
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
            raise wrong_type(part_param, "a content part object")
        kind = part.get("type")
        if kind in ("input_text", "output_text", "text"):
            parts.append({"type": "text", "text": text_of(part, part_param)})
        elif kind == "input_image":
            parts.append(_image_part(part, part_param))
        elif kind == "refusal" and allow_refusal:
            refusal = part.get("refusal")
            if not isinstance(refusal, str):
                raise wrong_type(f"{part_param}.refusal", "a string")
            refusals.append(refusal)
        elif kind == "input_file":
            raise unsupported("input_file parts cannot be sent to a chat completions upstream", f"{part_param}.type")
        else:
            raise invalid(f"unsupported content part type {kind!r}", f"{part_param}.type")
    return parts, refusals


def _simplify(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    # One text part is exactly a string to a chat template; anything richer stays a list and
    # the upstream applies its own joining rule.
    if not parts:
        return ""
    if len(parts) == 1 and parts[0]["type"] == "text":
        text: str = parts[0]["text"]
        return text
    return parts


class _History:
    """Builds the chat message list, merging what Responses splits into separate items."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        # The messages the client sent as `developer`, by identity (their index is known at the end).
        self.developer: list[dict[str, Any]] = []
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
        raise invalid(
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
                raise invalid("assistant content may only hold text and refusal parts", f"{param}.content")
            # The model produced one string; split output_text parts are pieces of it.
            chat_content = "".join(part["text"] for part in parts)
        else:
            chat_content = _simplify(parts)
    else:
        raise wrong_type(f"{param}.content", "a string or an array of content parts")
    if role == "assistant":
        history.assistant(chat_content, "".join(refusals) if refusals else None)
    else:
        message = {"role": developer_role if role == "developer" else role, "content": chat_content}
        if role == "developer" and developer_role != "developer":
            history.developer.append(message)
        history.other(message)


def _tool_call_item(item: dict[str, Any], param: str, history: _History, tool_map: ToolMap) -> None:
    """A function_call, or a custom_tool_call (its raw `input` as the one-string-argument call)."""
    custom = item.get("type") == "custom_tool_call"
    for key in ("call_id", "name", "input" if custom else "arguments"):
        if not isinstance(item.get(key), str):
            raise wrong_type(f"{param}.{key}", "a string")
    namespace = item.get("namespace")
    if namespace is not None and not isinstance(namespace, str):
        raise wrong_type(f"{param}.namespace", "a string")
    arguments = encode_input(item["input"]) if custom else item["arguments"]
    history.function_call(
        {
            "id": item["call_id"],
            "type": "function",
            "function": {"name": tool_map.chat_name(item["name"], namespace), "arguments": arguments},
        }
    )


def _function_call_output_item(item: dict[str, Any], param: str, history: _History) -> None:
    call_id = item.get("call_id")
    if not isinstance(call_id, str):
        raise wrong_type(f"{param}.call_id", "a string")
    output = item.get("output")
    if isinstance(output, str):
        content: Any = output
    elif isinstance(output, list):
        parts, _ = _chat_parts(output, f"{param}.output", allow_refusal=False)
        content = _simplify(parts)
    else:
        raise wrong_type(f"{param}.output", "a string or an array of content parts")
    history.other({"role": "tool", "tool_call_id": call_id, "content": content})


def _reasoning_item(item: dict[str, Any], param: str, history: _History) -> None:
    # Raw reasoning text (what we emit) is preferred; a summary is the best a client may have.
    content = item.get("content")
    if isinstance(content, list) and content:
        texts = [text_of(part, f"{param}.content[{k}]") for k, part in enumerate(content) if isinstance(part, dict)]
        text = "".join(texts)
    else:
        summary = item.get("summary") or []
        if not isinstance(summary, list):
            raise wrong_type(f"{param}.summary", "an array")
        texts = [text_of(part, f"{param}.summary[{k}]") for k, part in enumerate(summary) if isinstance(part, dict)]
        text = "\n\n".join(texts)
    # An item with only encrypted_content carries nothing a chat upstream could use.
    if text:
        history.reasoning(text)


def _input_messages(value: Any, tool_map: ToolMap, developer_role: str) -> _History:
    if isinstance(value, str):
        history = _History()
        history.other({"role": "user", "content": value})
        return history
    if not isinstance(value, list):
        raise wrong_type("input", "a string or an array of input items")
    history = _History()
    for i, item in enumerate(value):
        param = f"input[{i}]"
        if not isinstance(item, dict):
            raise wrong_type(param, "an input item object")
        kind = item.get("type")
        if kind is None and "role" in item:
            kind = "message"  # the "easy input message" form
        if kind == "message":
            _message_item(item, param, history, developer_role)
        elif kind in ("function_call", "custom_tool_call"):
            _tool_call_item(item, param, history, tool_map)
        elif kind in ("function_call_output", "custom_tool_call_output"):
            _function_call_output_item(item, param, history)
        elif kind == "reasoning":
            _reasoning_item(item, param, history)
        else:
            raise unsupported(
                f"input items of type {kind!r} cannot be sent to a chat completions upstream", f"{param}.type"
            )
    history.finish()
    return history


# ---- the request --------------------------------------------------------------------------------


def _check_conditional_fields(body: dict[str, Any]) -> None:
    if body.get("previous_response_id") is not None:
        raise unsupported(
            "previous_response_id is not supported: this server stores no responses; resend the full input",
            "previous_response_id",
        )
    if body.get("background"):
        raise unsupported("background responses are not supported", "background")
    if body.get("conversation") is not None:
        raise unsupported("conversations are not supported: this server stores no responses", "conversation")
    if body.get("prompt") is not None:
        raise unsupported("stored prompt templates are not supported", "prompt")
    include = body.get("include")
    if include is not None and (not isinstance(include, list) or not all(isinstance(x, str) for x in include)):
        raise wrong_type("include", "an array of strings")
    for key in ("user", "prompt_cache_key", "safety_identifier"):
        value = body.get(key)
        if value is not None and not isinstance(value, str):
            raise wrong_type(key, "a string")


def _response_format(text: Any) -> dict[str, Any] | None:
    if text is None:
        return None
    if not isinstance(text, dict):
        raise wrong_type("text", "an object")
    fmt = text.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise wrong_type("text.format", "an object")
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        schema = fmt.get("schema")
        if not isinstance(schema, dict):
            raise wrong_type("text.format.schema", "a JSON Schema object")
        json_schema: dict[str, Any] = {"name": fmt.get("name") or "response", "schema": schema}
        for key in ("strict", "description"):
            if fmt.get(key) is not None:
                json_schema[key] = fmt[key]
        return {"type": "json_schema", "json_schema": json_schema}
    raise invalid(f"`text.format.type` must be text, json_object or json_schema (got {kind!r})", "text.format.type")


def wants_output_logprobs(request: dict[str, Any]) -> bool:
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
        raise wrong_type("body", "a JSON object")
    for key in body:
        if key not in RESPONSES_FIELDS:
            raise unsupported(f"unsupported parameter: {key}", key)
    for key in ("stream", "parallel_tool_calls"):
        if body.get(key) is not None and not isinstance(body[key], bool):
            raise wrong_type(key, "a boolean")
    if body.get("model") is not None and not isinstance(body["model"], str):
        raise wrong_type("model", "a string")
    _check_conditional_fields(body)
    if "input" not in body or body["input"] is None:
        raise invalid("`input` is required", "input", code="missing_required_parameter")

    chat_tools, tool_map, dropped = translate_tools(body.get("tools"))
    history = _input_messages(body["input"], tool_map, developer_role)
    messages = history.messages
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise wrong_type("instructions", "a string")
        messages.insert(0, {"role": "system", "content": instructions})
    if not messages:
        raise invalid("`input` must contain at least one item", "input")

    chat: dict[str, Any] = {"messages": messages}
    tool_choice, chat_tools = translate_tool_choice(body.get("tool_choice"), tool_map, chat_tools)
    if chat_tools:
        chat["tools"] = chat_tools
        if tool_choice is not None:
            chat["tool_choice"] = tool_choice
        if body.get("parallel_tool_calls") is not None:
            chat["parallel_tool_calls"] = body["parallel_tool_calls"]

    max_output_tokens = body.get("max_output_tokens")
    if max_output_tokens is not None:
        if not is_int(max_output_tokens) or max_output_tokens < 1:
            raise wrong_type("max_output_tokens", "a positive integer")
        chat["max_tokens"] = max_output_tokens
    for key in ("temperature", "top_p"):
        value = body.get(key)
        if value is not None:
            if not is_number(value):
                raise wrong_type(key, "a number")
            chat[key] = value

    response_format = _response_format(body.get("text"))
    if response_format is not None:
        chat["response_format"] = response_format

    reasoning = body.get("reasoning")
    if reasoning is not None:
        if not isinstance(reasoning, dict):
            raise wrong_type("reasoning", "an object")
        effort = reasoning.get("effort")
        if effort is not None:
            if not isinstance(effort, str):
                raise wrong_type("reasoning.effort", "a string")
            chat["reasoning_effort"] = effort

    check_metadata(body.get("metadata"))
    if body.get("user") is not None:
        chat["user"] = body["user"]

    top_logprobs = body.get("top_logprobs")
    if top_logprobs is not None:
        if not is_int(top_logprobs) or not 0 <= top_logprobs <= 20:
            raise wrong_type("top_logprobs", "an integer between 0 and 20")
        chat["logprobs"] = True
        chat["top_logprobs"] = top_logprobs
    elif wants_output_logprobs(body):
        chat["logprobs"] = True
        chat["top_logprobs"] = 0

    for key in VLLM_PASSTHROUGH_FIELDS:
        if body.get(key) is not None:
            check_passthrough_type(key, body[key])
            chat[key] = body[key]
    sent_as_developer = {id(message) for message in history.developer}
    developer = [i for i, message in enumerate(messages) if id(message) in sent_as_developer]
    return ChatRequest(chat, tool_map, dropped, developer)


def check_passthrough_type(key: str, value: Any) -> None:
    """The vLLM sampling fields are forwarded as given, so at least their types are checked here."""
    if key == "stop":
        if not (isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, str) for v in value))):
            raise wrong_type(key, "a string or an array of strings")
    elif key == "chat_template_kwargs":
        if not isinstance(value, dict):
            raise wrong_type(key, "an object")
    elif key in ("seed", "top_k"):
        if not is_int(value):
            raise wrong_type(key, "an integer")
    elif not is_number(value):
        raise wrong_type(key, "a number")
