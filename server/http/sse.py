"""The server-sent-events wire format: framing our events, `[DONE]`, in-band errors, and decoding upstream streams.

Decoding follows the HTML living standard's event-stream rules: lines end in CR, LF or CRLF (a CRLF
may be split across two network chunks), a blank line ends an event, `data` lines join with LF, a
leading space after the colon is dropped, `:` starts a comment, a leading BOM is ignored. Two
deliberate departures, both for relaying: an event made only of comments (a keep-alive) is still
reported, with `data` None, so a relay can pass it on; and a last event the upstream never
terminated with a blank line is dispatched at the end instead of dropped.

The decoder looks at every byte once: a line still arriving is kept as a list of pieces and joined
once it is complete, so a multi-megabyte event (a passthrough `response.completed`) costs linear time.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from server.errors import OpenAIError, error_body

DONE = b"data: [DONE]\n\n"

# The chat stream's terminal payload (OpenAI's convention, not part of SSE itself).
DONE_DATA = b"[DONE]"

# A line ends at CRLF, a lone CR or a lone LF. Module-level so a test can count the bytes it scans.
_LINE_END = re.compile(rb"\r\n|\r|\n")
_BOM = b"\xef\xbb\xbf"


# ---- encoding ---------------------------------------------------------------------------------


def encode(data: bytes, event: str | None = None) -> bytes:
    """One event: an optional `event:` line, one `data:` line per line of `data`, and the blank line."""
    head = b"event: " + event.encode() + b"\n" if event is not None else b""
    if b"\n" in data or b"\r" in data:
        lines = _LINE_END.split(data)
        return head + b"".join(b"data: " + line + b"\n" for line in lines) + b"\n"
    return head + b"data: " + data + b"\n\n"


def encode_json(doc: Any) -> bytes:
    """A data-only event holding `doc` as compact JSON, which never holds a line break."""
    return b"data: " + orjson.dumps(doc) + b"\n\n"


def encode_responses_event(event: dict[str, Any]) -> bytes:
    """A Responses stream event, named by its `type` as the Responses API frames them."""
    return encode(orjson.dumps(event), event["type"])


def encode_responses_events(events: list[dict[str, Any]]) -> bytes:
    return b"".join(encode_responses_event(event) for event in events)


def chat_error(error: OpenAIError) -> bytes:
    """The in-band error of a chat stream whose status line is already sent (Switchyard's `data: {"error": ...}`)."""
    return encode(error_body(error))


def responses_error_event(message: str, code: str | None) -> dict[str, Any]:
    """The Responses API's in-band `error` event (the stream writer numbers it; the passthrough does not)."""
    return {"type": "error", "code": code, "message": message, "param": None}


def responses_error(error: OpenAIError) -> bytes:
    return encode_responses_event(responses_error_event(error.message, error.code))


# ---- decoding ---------------------------------------------------------------------------------


class Event:
    """One decoded event: its `data` (None when it had no data line), its `event` name, and its raw lines."""

    __slots__ = ("data", "event", "lines")

    def __init__(self, data: bytes | None, event: str | None, lines: list[bytes]) -> None:
        self.data = data
        self.event = event
        self.lines = lines  # without line endings; comments and unknown fields included

    @classmethod
    def of_data(cls, data: bytes) -> Event:
        return cls(data, None, [b"data: " + data])

    def wire(self) -> bytes:
        """The event as it arrived (line endings normalised to LF), ready to relay."""
        if len(self.lines) == 1:
            return self.lines[0] + b"\n\n"
        return b"\n".join(self.lines) + b"\n\n"

    def __repr__(self) -> str:
        return f"Event(event={self.event!r}, data={self.data!r})"


class Decoder:
    """Feed network chunks with `feed`; each call returns the events those bytes completed.

    `close()` at the end of the stream returns the last, unterminated event if there is one.
    """

    def __init__(self) -> None:
        self._partial: list[bytes] = []  # pieces of a line whose end has not arrived yet
        self._after_cr = False  # the last chunk ended in CR: an LF starting the next one ends nothing
        self._first_line = True
        self._lines: list[bytes] = []
        self._data: list[bytes] = []
        self._event: str | None = None

    def feed(self, chunk: bytes) -> list[Event]:
        # Between events, with LF endings only (what vLLM and Switchyard write), whole events can be
        # cut out at C speed; anything else (CR, a line or event still arriving, a BOM) goes line by line.
        if self._first_line and not self._partial and chunk[:1] not in (b"", _BOM[:1]):
            self._first_line = False  # the stream's first line starts here, and not with a BOM
        if not self._partial and not self._lines and not self._after_cr and not self._first_line and b"\r" not in chunk:
            return self._feed_lf(chunk)
        return self._feed_lines(chunk)

    def _feed_lf(self, chunk: bytes) -> list[Event]:
        """`feed` for LF-only bytes arriving between events: one split on the blank lines."""
        events: list[Event] = []
        parts = chunk.split(b"\n\n")
        tail = parts.pop()  # after the last blank line: the start of an event still arriving
        for part in parts:
            if part.startswith(b"data: ") and b"\n" not in part:  # the common event: one data line
                events.append(Event(part[6:], None, [part]))
            else:
                for line in part.split(b"\n"):
                    self._line(line, events)
                self._line(b"", events)
        if tail:
            lines = tail.split(b"\n")
            last = lines.pop()
            for line in lines:
                self._line(line, events)
            if last:
                self._partial.append(last)
        return events

    def _feed_lines(self, chunk: bytes) -> list[Event]:
        events: list[Event] = []
        start = 0
        if self._after_cr and chunk[:1] == b"\n":
            start = 1
        if chunk:
            self._after_cr = False
        for match in _LINE_END.finditer(chunk, start):
            piece = chunk[start : match.start()]
            if self._partial:
                self._partial.append(piece)
                piece = b"".join(self._partial)
                self._partial = []
            self._line(piece, events)
            start = match.end()
            if start == len(chunk) and match.group() == b"\r":
                self._after_cr = True
        if start < len(chunk):
            self._partial.append(chunk[start:])
        return events

    def close(self) -> list[Event]:
        events: list[Event] = []
        if self._partial:
            line = b"".join(self._partial)
            self._partial = []
            self._line(line, events)
        if self._lines:
            events.append(self._dispatch())
        return events

    def _line(self, line: bytes, events: list[Event]) -> None:
        if self._first_line:
            self._first_line = False
            if line.startswith(_BOM):
                line = line[len(_BOM) :]
        if not line:
            if self._lines:
                events.append(self._dispatch())
            return
        self._lines.append(line)
        if line[:1] == b":":
            return  # a comment
        colon = line.find(b":")
        if colon < 0:
            name, value = line, b""
        else:
            name, value = line[:colon], line[colon + 1 :]
            if value[:1] == b" ":
                value = value[1:]
        if name == b"data":
            self._data.append(value)
        elif name == b"event":
            self._event = value.decode("utf-8", "replace")

    def _dispatch(self) -> Event:
        data = self._data
        joined = None if not data else data[0] if len(data) == 1 else b"\n".join(data)
        event = Event(joined, self._event, self._lines)
        self._lines, self._data, self._event = [], [], None
        return event
