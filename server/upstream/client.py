"""The clients to Switchyard: the pooled HTTP/1.1 client for model calls, httpx for the occasional GET; failures raise OpenAIError."""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from server.errors import OpenAIError
from server.http import sse
from server.upstream import http1
from server.upstream.errors import error_from_exception, error_from_httpx, error_from_reply

log = logging.getLogger("switchyard_model.upstream")

# Switchyard's word on which target answered (on every successful answer, stream or not).
SELECTED_MODEL = "x-model-router-selected-model"
# Headers of Switchyard's (or the model server's) answer worth relaying to the client.
_RELAYED_RESPONSE_HEADERS = (SELECTED_MODEL, "x-request-id", "openai-processing-ms")


@dataclass(slots=True)
class UpstreamReply:
    status: int
    body: bytes
    headers: dict[str, str]  # lower-case names


def relayed_headers(headers: dict[str, str]) -> list[tuple[bytes, bytes]]:
    out = []
    for name in _RELAYED_RESPONSE_HEADERS:
        value = headers.get(name)
        if value is not None:
            out.append((name.encode(), value.encode("latin-1")))
    return out


class UpstreamStream:
    """An open streamed answer: yields its SSE events (server.http.sse.Event) as they arrive."""

    def __init__(self, response: http1.Response, target: str) -> None:
        self.response = response
        self.target = target
        self.headers = response.headers
        self._reader: AsyncGenerator[list[sse.Event], None] | None = None

    def event_batches(self) -> AsyncGenerator[list[sse.Event], None]:
        """Whole SSE events, however the network split them: one list per read that completed any.

        A relay sends each list on as one write: what arrived together leaves together.
        """
        self._reader = self._read_batches()
        return self._reader

    async def _read_batches(self) -> AsyncGenerator[list[sse.Event], None]:
        decoder = sse.Decoder()
        try:
            async with aclosing(self.response.iter_raw()) as chunks:
                async for chunk in chunks:
                    events = decoder.feed(chunk)
                    if events:
                        yield events
        except http1.HTTPError as exc:
            raise error_from_exception(exc, self.target) from exc
        events = decoder.close()
        if events:
            yield events

    async def aclose(self) -> None:
        # The reader generator first: while it is suspended inside the response body, closing the
        # response alone would leave the connection checked out.
        if self._reader is not None:
            await self._reader.aclose()
        await self.response.aclose()


class BufferedStream:
    """A non-stream upstream answer presented as a stream (for upstreams that do not stream token ids)."""

    def __init__(self, reply: UpstreamReply, chunks: list[dict[str, Any]]) -> None:
        self.headers = reply.headers
        self._events = [sse.Event.of_data(orjson.dumps(chunk)) for chunk in chunks]
        self._events.append(sse.Event.of_data(sse.DONE_DATA))

    async def event_batches(self) -> AsyncGenerator[list[sse.Event], None]:
        yield self._events  # the whole answer arrived at once

    async def aclose(self) -> None:
        return None


class Upstream:
    """The hop to Switchyard's /v1: a lean pooled client for model calls, httpx for the occasional GET."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str,
        default_headers: dict[str, str],
        timeout_s: float,
        connect_timeout_s: float,
        max_connections: int,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        headers = {"authorization": f"Bearer {api_key}", "content-type": "application/json"}
        headers.update({k.lower(): v for k, v in default_headers.items()})
        self._pool = http1.Pool(
            self.base_url,
            connect_timeout=connect_timeout_s,
            read_timeout=timeout_s,
            max_connections=max_connections,
            headers=headers,
        )
        # trust_env=False: HTTP_PROXY must never capture loopback traffic to Switchyard.
        self._client = httpx.AsyncClient(
            headers=headers, timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s), trust_env=False
        )

    async def _request(
        self, path: str, body: bytes, headers: dict[str, str], *, stream: bool = False
    ) -> http1.Response:
        try:
            return await self._pool.request(path, body, headers, stream=stream)
        except http1.HTTPError as exc:
            raise error_from_exception(exc, self.base_url) from exc

    async def post(self, path: str, body: bytes, headers: dict[str, str]) -> UpstreamReply:
        # The pool's whole-answer path: one wake-up when the answer is in, not one per phase. A
        # non-stream answer's head comes when the answer is ready, so the one deadline for the
        # whole exchange is the read timeout the head alone had before.
        try:
            status, response_headers, content = await self._pool.fetch(path, body, headers, self._pool.read_timeout)
        except http1.HTTPError as exc:
            raise error_from_exception(exc, self.base_url) from exc
        if status >= 400:
            raise error_from_reply(status, content, response_headers)
        return UpstreamReply(status, content, response_headers)

    async def open_stream(self, path: str, body: bytes, headers: dict[str, str]) -> UpstreamStream:
        # On the same keep-alive pool, acknowledging every read at once: that keeps Switchyard 0.3.0's
        # Nagle from stalling a stream on a reused connection (docs/architecture.md).
        response = await self._request(path, body, headers, stream=True)
        if response.status_code >= 400:
            try:
                content = await response.read()
            except http1.HTTPError:
                content = b""
            raise error_from_reply(response.status_code, content, response.headers)
        return UpstreamStream(response, self.base_url)

    async def get_json(self, path: str, timeout_s: float = 5.0) -> dict[str, Any]:
        """GET a JSON object from Switchyard's /v1; every failure is an OpenAIError, as for `post`."""
        try:
            response = await self._client.get(self.base_url + path, timeout=timeout_s)
        except httpx.HTTPError as exc:
            raise error_from_httpx(exc, self.base_url) from exc
        if response.status_code >= 400:
            raise error_from_reply(response.status_code, response.content, response.headers)
        try:
            body = orjson.loads(response.content)
        except orjson.JSONDecodeError:
            body = None
        if not isinstance(body, dict):
            raise OpenAIError(
                502, f"the upstream ({self.base_url}) answered {path} without a JSON object", code="upstream_error"
            )
        return body

    async def healthy(self, root_url: str) -> bool:
        try:
            response = await self._client.get(root_url + "/health", timeout=2.0)
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    async def aclose(self) -> None:
        self._pool.close()
        await self._client.aclose()
