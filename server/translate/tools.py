"""Responses tools and tool_choice as chat function tools, and the ToolMap that maps tool calls back.

Function tools pass through, namespaces are flattened, freeform (`custom`) tools become functions
with one string argument (server.translate.custom_tools). Pure: tools a chat upstream cannot serve
(hosted ones) are dropped and reported to the caller, never logged here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from server.translate.checks import invalid, unsupported, wrong_type
from server.translate.custom_tools import custom_function_tool

# A namespaced tool `{type: namespace, name: NS, tools: [{name: N}]}` becomes the chat function
# `NS__N`. Chat has no namespaces, and a double underscore is a legal function-name character in
# every tool-call parser we know. If `NS__N` is already taken (a real top-level tool, or another
# namespace flattening to the same string), `_2`, `_3`, ... is appended until it is free; the
# ToolMap remembers the pairing, so the reverse direction never parses the string.
NAMESPACE_SEPARATOR = "__"

_TOOL_CHOICE_MODES = frozenset({"auto", "none", "required"})
# Tool kinds that become chat functions; a tool_choice may name either kind.
_CALLABLE_KINDS = ("function", "custom")


@dataclass
class ToolMap:
    """How chat tool names relate to the Responses tools they came from."""

    # flattened chat name -> (namespace, name inside the namespace)
    namespaced: dict[str, tuple[str, str]] = field(default_factory=dict)
    # (namespace, inner name) -> flattened chat name
    flattened: dict[tuple[str, str], str] = field(default_factory=dict)
    # names of the top-level function and custom tools, unchanged on the chat side
    functions: set[str] = field(default_factory=set)
    # chat names of the functions that stand for custom tools: their calls go back as custom_tool_call
    custom: set[str] = field(default_factory=set)

    def is_custom(self, chat_name: str) -> bool:
        return chat_name in self.custom

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


def _function_tool(tool: dict[str, Any], param: str, name: str) -> dict[str, Any]:
    function: dict[str, Any] = {"name": name}
    description = tool.get("description")
    if description is not None:
        function["description"] = description
    parameters = tool.get("parameters")
    if parameters is not None:
        if not isinstance(parameters, dict):
            raise wrong_type(f"{param}.parameters", "a JSON Schema object")
        function["parameters"] = parameters
    strict = tool.get("strict")
    if strict is not None:
        function["strict"] = strict
    return {"type": "function", "function": function}


def _tool_name(tool: dict[str, Any], param: str) -> str:
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise invalid(f"`{param}.name` must be a non-empty string", f"{param}.name")
    return name


def translate_tools(tools: Any) -> tuple[list[dict[str, Any]], ToolMap, list[str]]:
    if tools is None:
        return [], ToolMap(), []
    if not isinstance(tools, list):
        raise wrong_type("tools", "an array of tools")
    tool_map = ToolMap()
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or not isinstance(tool.get("type"), str):
            raise invalid(f"`tools[{i}]` must be an object with a string `type`", f"tools[{i}]")
        if tool["type"] in _CALLABLE_KINDS:
            tool_map.functions.add(_tool_name(tool, f"tools[{i}]"))
    taken = set(tool_map.functions)
    chat_tools: list[dict[str, Any]] = []
    dropped: list[str] = []
    for i, tool in enumerate(tools):
        kind = tool["type"]
        if kind == "function":
            chat_tools.append(_function_tool(tool, f"tools[{i}]", tool["name"]))
        elif kind == "custom":
            tool_map.custom.add(tool["name"])
            chat_tools.append(custom_function_tool(tool, f"tools[{i}]", tool["name"]))
        elif kind == "namespace":
            namespace = _tool_name(tool, f"tools[{i}]")
            inner_tools = tool.get("tools")
            if not isinstance(inner_tools, list):
                raise wrong_type(f"tools[{i}].tools", "an array of tools")
            for j, inner in enumerate(inner_tools):
                param = f"tools[{i}].tools[{j}]"
                if not isinstance(inner, dict) or not isinstance(inner.get("type"), str):
                    raise invalid(f"`{param}` must be an object with a string `type`", param)
                if inner["type"] not in _CALLABLE_KINDS:
                    dropped.append(f"namespace/{inner['type']}")
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
                if inner["type"] == "custom":
                    tool_map.custom.add(flat)
                    chat_tools.append(custom_function_tool(inner, param, flat))
                else:
                    chat_tools.append(_function_tool(inner, param, flat))
        else:
            dropped.append(kind)
    return chat_tools, tool_map, dropped


def _chat_tool_name(choice: dict[str, Any], tool_map: ToolMap, chat_names: set[str], param: str) -> str:
    """The chat name of the tool a tool_choice entry names; 400 unless it is offered and of that kind."""
    name = choice.get("name")
    if not isinstance(name, str):
        raise invalid(f"`{param}.name` must be a string", f"{param}.name")
    namespace = choice.get("namespace")
    if namespace is not None:
        flat = tool_map.chat_name(name, namespace)
    elif name in tool_map.functions:
        flat = name
    else:
        # A bare inner name is accepted when exactly one namespace offers it.
        matches = [flat for (_, inner), flat in tool_map.flattened.items() if inner == name]
        flat = matches[0] if len(matches) == 1 else name
    kind = choice.get("type")
    if flat not in chat_names or (kind == "custom") != tool_map.is_custom(flat):
        raise invalid(f"tool_choice names `{name}`, which is not among the {kind} tools", param)
    return flat


def translate_tool_choice(
    choice: Any, tool_map: ToolMap, chat_tools: list[dict[str, Any]]
) -> tuple[Any, list[dict[str, Any]]]:
    """The chat tool_choice (None = leave it out) and the tool list, which `allowed_tools` narrows."""
    if choice is None:
        return None, chat_tools
    chat_names = {tool["function"]["name"] for tool in chat_tools}
    if isinstance(choice, str):
        if choice not in _TOOL_CHOICE_MODES:
            raise invalid(f"`tool_choice` must be one of auto, none, required (got {choice!r})", "tool_choice")
        if choice == "required" and not chat_tools:
            raise invalid("tool_choice is `required` but no function tools are available", "tool_choice")
        return choice, chat_tools
    if not isinstance(choice, dict):
        raise wrong_type("tool_choice", "a string or an object")
    kind = choice.get("type")
    if kind in _CALLABLE_KINDS:
        flat = _chat_tool_name(choice, tool_map, chat_names, "tool_choice")
        return {"type": "function", "function": {"name": flat}}, chat_tools
    if kind == "allowed_tools":
        mode = choice.get("mode", "auto")
        if mode not in ("auto", "required"):
            raise invalid("`tool_choice.mode` must be auto or required", "tool_choice.mode")
        allowed = choice.get("tools")
        if not isinstance(allowed, list):
            raise wrong_type("tool_choice.tools", "an array of tools")
        keep: set[str] = set()
        for j, entry in enumerate(allowed):
            param = f"tool_choice.tools[{j}]"
            if not isinstance(entry, dict) or entry.get("type") not in _CALLABLE_KINDS:
                raise unsupported(f"`{param}`: only function and custom tools can be allowed here", param)
            keep.add(_chat_tool_name(entry, tool_map, chat_names, param))
        narrowed = [tool for tool in chat_tools if tool["function"]["name"] in keep]
        return mode, narrowed
    raise unsupported(f"tool_choice of type {kind!r} cannot be served by a chat completions upstream", "tool_choice")
