"""The upstream's streamed tool calls, handled once for both stream translators (Responses, Messages).

A call's deltas carry its index; its arguments are kept until its name arrives (then its item or
block opens), and stream while it is the open one. A delta for a call already closed (an upstream
interleaving calls) cannot be streamed any more: it is counted in `late_tool_deltas`.
"""

from __future__ import annotations

from typing import Any, Generic, Protocol, TypeVar


class StreamedCall(Protocol):
    """What the shared handling reads and writes of a translator's tool-call item."""

    call_id: str | None
    parts: list[str]  # the arguments that arrived (streamed or not)

    @property
    def started(self) -> bool:
        """Its item (or block) has gone out."""
        ...


CallT = TypeVar("CallT", bound=StreamedCall)


class ToolCallDeltas(Generic[CallT]):
    """Mixed into a stream translator, which sets `_calls`, `_open` and `late_tool_deltas` and says
    how a call item is made (`_new_call`), named and opened (`_name_arrived`) and streamed (`_arguments_delta`)."""

    _calls: dict[int, CallT]
    _open: Any  # the translator's open item: a call or any other kind
    late_tool_deltas: int

    def _new_call(self) -> CallT:
        raise NotImplementedError

    def _name_arrived(self, out: list[dict[str, Any]], call: CallT, name: str) -> None:
        raise NotImplementedError

    def _arguments_delta(self, out: list[dict[str, Any]], call: CallT, arguments: str) -> None:
        raise NotImplementedError

    def _tool_call_delta(self, out: list[dict[str, Any]], position: int, delta: dict[str, Any]) -> None:
        index = delta.get("index", position)
        call = self._calls.get(index)
        if call is None:
            call = self._calls[index] = self._new_call()
        if delta.get("id") and call.call_id is None:
            call.call_id = delta["id"]
        function = delta.get("function") or {}
        arguments = function.get("arguments") or ""
        if not call.started:
            name = function.get("name")
            if arguments:
                call.parts.append(arguments)
            if name:
                self._name_arrived(out, call, name)
            return
        if not arguments:
            return
        call.parts.append(arguments)
        if call is self._open:
            self._arguments_delta(out, call, arguments)
        else:
            self.late_tool_deltas += 1
