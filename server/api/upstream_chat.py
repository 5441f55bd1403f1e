"""The upstream's chat answer as the model endpoints read it: a stream's data events up to `[DONE]`, a non-stream JSON body.

Every API translates from these (server.api.call relays them): an in-band error or a stream cut short
becomes an OpenAI error, so the client gets an error event, never a silent cut.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import TYPE_CHECKING, Any

import orjson

from server.errors import OpenAIError
from server.http import sse
from server.upstream.client import BufferedStream, UpstreamStream

if TYPE_CHECKING:
    from server.telemetry.spans import CallSpan


async def chat_event_batches(
    stream: UpstreamStream | BufferedStream, span: CallSpan
) -> AsyncIterator[tuple[list[tuple[sse.Event, bytes]], bool]]:
    """The data events of an upstream chat stream with their data (one chunk's JSON each), up to `[DONE]`.

    One list per upstream read, so a relay can send what arrived together as one write, with True
    for the read that held `[DONE]` (the last list; it may be empty), so the relay can send its
    events together with its own end. An in-band error (Switchyard's `data: {"error": ...}`) or a
    stream that ends without `[DONE]` raises, after the events before it, so the client gets an
    error event, never a silent cut.
    """
    first = True
    done = False
    # aclosing: the generators below must be closed here, not whenever they are collected, or the
    # upstream connection under them stays checked out.
    async with aclosing(stream.event_batches()) as batches:
        async for events in batches:
            if first:
                span.first_chunk()
                first = False
            if done:
                continue  # read to the end, so the connection is released cleanly
            out: list[tuple[sse.Event, bytes]] = []
            for event in events:
                data = event.data
                if data is None:
                    continue
                if data == sse.DONE_DATA:
                    done = True
                    break
                if data.startswith(b'{"error"'):
                    if out:
                        yield out, False
                    raise _in_band_error(orjson.loads(data))
                out.append((event, data))
            if out or done:
                yield out, done
    if not done:
        raise OpenAIError(502, "the upstream's stream ended early, before its final [DONE]", code="upstream_stream_cut")


# How Switchyard reports, in-band, a model server whose stream broke off mid-answer (a cut
# connection, a truncated chunk): "upstream transport error: error decoding response body". Said as
# it is, that reads as malformed data; what happened is that the engine's stream ended early.
_SWITCHYARD_TRANSPORT_ERROR = "upstream transport error"


def _in_band_error(chunk: dict[str, Any]) -> OpenAIError:
    err = chunk.get("error")
    message = err.get("message") if isinstance(err, dict) else str(err)
    if isinstance(message, str) and message.startswith(_SWITCHYARD_TRANSPORT_ERROR):
        return OpenAIError(
            502,
            f"the engine's stream ended early: the model server's answer broke off mid-stream (Switchyard: {message})",
            code="upstream_stream_cut",
        )
    return OpenAIError(502, message or "upstream stream failed", code="upstream_stream_error")


def parse_reply(raw: bytes) -> dict[str, Any]:
    """A non-stream upstream answer as a chat completion dict; 502 when it is not one."""
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise OpenAIError(502, f"the upstream answered with invalid JSON: {exc}", code="upstream_invalid_json") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("choices"), list):
        raise OpenAIError(502, "the upstream answer is not a chat completion", code="upstream_invalid_response")
    return doc


def parse_json(raw: bytes | None) -> dict[str, Any] | None:
    """A JSON object, or None for anything else (absent, invalid, or not an object)."""
    try:
        doc = orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError:
        return None
    return doc if isinstance(doc, dict) else None
