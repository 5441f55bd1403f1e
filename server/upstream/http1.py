"""A lean HTTP/1.1 client for the hot hop to Switchyard: LIFO keep-alive pool, one write, httptools.

httpx costs about 1 ms of event-loop CPU per call here and its pool walks every connection on every
request (measured in docs/benchmarks.md), which made this server 10x slower than one Python hop
needs to be. This client does only what that hop needs: POST a body, read a fixed-length or
chunked answer (whole, or chunk by chunk for streams), keep idle connections newest-first and close
those left idle longer than `keepalive_expiry` (an idle pool must not hold sockets for ever).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator
from typing import cast
from urllib.parse import urlsplit

import httptools

# Linux only; elsewhere delayed ACKs stay as the system has them.
_QUICKACK: int | None = getattr(socket, "TCP_QUICKACK", None)


# A request as sent: one piece (one write), or its head and a large body (a write of each, no copy).
Payload = bytes | tuple[bytes, bytes]
# Bodies from this size on are written after the head rather than copied behind it.
_SEPARATE_BODY_BYTES = 256 * 1024


class HTTPError(Exception):
    """The base of this module's failures."""


class ConnectError(HTTPError):
    """The connection could not be made (refused, unreachable, or it took too long)."""


class TimeoutError_(HTTPError):
    """The upstream stayed silent longer than the read timeout."""


class ProtocolError(HTTPError):
    """The connection closed early, or the answer was not valid HTTP/1.1."""


class _Connection(asyncio.Protocol):
    """One TCP connection; carries one request at a time."""

    # Set by connection_made (the transport) and start (the rest) before any other method runs.
    transport: asyncio.Transport
    _head_done: asyncio.Future[int]

    def __init__(self) -> None:
        self.lost = False
        self.reused = False
        self.expiry: asyncio.TimerHandle | None = None  # set while the connection waits in the idle pool
        self._parser: httptools.HttpResponseParser | None = None
        self._headers: dict[str, str] = {}
        self._chunks: deque[bytes] = deque()
        self._waiter: asyncio.Future[None] | None = None  # woken by body bytes, the end, or a failure
        self._complete = False
        self._keep_alive = False
        self._error: HTTPError | None = None
        self._bytes_seen = 0
        self._socket: socket.socket | None = None
        self._whole = False  # fetch(): the waiter is woken once, when the answer is complete
        self._ack_each_read = False  # a stream's connection acknowledges every read at once

    # ---- asyncio.Protocol ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's TCPTransport is not an asyncio.Transport subclass (no isinstance check here): a cast.
        self.transport = cast(asyncio.Transport, transport)
        self._socket = transport.get_extra_info("socket")
        if self._socket is not None:  # said here rather than trusting each event loop's default
            with contextlib.suppress(OSError):
                self._socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _ack_now(self) -> None:
        """Acknowledge what arrived at once, not after the kernel's delayed-ACK timer (40 ms on Linux).

        A server that leaves Nagle's algorithm on (Switchyard 0.3.0 does) holds each small write
        until the previous one is acknowledged, so on a reused connection a stream's second write
        waited for our delayed ACK: ~40 ms per stream. TCP_QUICKACK is not sticky, so it is set
        again after every read (one setsockopt: about 3 µs through uvloop's transport socket).
        """
        if _QUICKACK is not None and self._socket is not None:
            try:
                self._socket.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1)
            except OSError:  # the connection is going away; its loss is reported elsewhere
                pass

    def data_received(self, data: bytes) -> None:
        if self._ack_each_read:
            self._ack_now()
        self._bytes_seen += len(data)
        if self._parser is None:  # bytes while idle: the server is not speaking HTTP to us
            self._fail(ProtocolError("unexpected data on an idle connection"))
            self.transport.close()
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(ProtocolError(f"invalid HTTP response: {exc}"))
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self._parser is not None and not self._complete:
            self._fail(ProtocolError("the upstream closed the connection before the answer was complete"))

    # ---- httptools callbacks ---------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        # Read now: httptools forgets it once the message is complete.
        parser = self._parser
        assert parser is not None  # callbacks come only from the parser start() created
        self._keep_alive = parser.should_keep_alive()
        if not self._head_done.done():
            self._head_done.set_result(parser.get_status_code())

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
        if not self._whole:
            self._wake()

    def on_message_complete(self) -> None:
        self._complete = True
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    # ---- used by the pool ------------------------------------------------------------------
    def _fail(self, error: HTTPError) -> None:
        self._error = error
        if hasattr(self, "_head_done") and not self._head_done.done():
            self._head_done.set_exception(error)
        self._wake()

    def start(self, payload: Payload, *, ack_each_read: bool = False) -> None:
        """Send a request. `ack_each_read` for a stream: an answer in many writes (see `_ack_now`)."""
        self._ack_each_read = ack_each_read
        self._parser = httptools.HttpResponseParser(self)
        self._headers = {}
        self._head_done = asyncio.get_running_loop().create_future()
        self._chunks.clear()
        self._waiter = None
        self._complete = False
        self._error = None
        self._bytes_seen = 0
        if isinstance(payload, bytes):
            self.transport.write(payload)
        else:
            self.transport.writelines(payload)
        if ack_each_read:
            self._ack_now()  # out of "interactive" mode before the answer's first segment comes in

    async def whole_answer(
        self, payload: Payload, deadline: float, timeout: float
    ) -> tuple[int, dict[str, str], bytes]:
        """Send `payload` and wait for the whole answer, by `deadline` (the loop's clock; `timeout` names it)."""
        loop = asyncio.get_running_loop()
        self.start(payload)
        self._whole = True
        done = self._waiter = loop.create_future()
        timer = loop.call_at(deadline, self._wake)
        head = self._head_done  # nobody awaits it here: a failure set on it must not go unretrieved
        try:
            await done
        finally:
            timer.cancel()
            self._whole = False
            if not head.done():
                head.cancel()  # (a timeout or a cancelled caller; the connection is closed next)
        if self._error is not None:
            if not head.cancelled():
                head.exception()
            raise self._error
        if not self._complete:
            raise TimeoutError_(f"no whole answer within {timeout:g}s")
        return head.result(), self._headers, b"".join(self._chunks)

    async def head(self, timeout: float) -> tuple[int, dict[str, str]]:
        try:
            status = await asyncio.wait_for(self._head_done, timeout)
        except TimeoutError:
            raise TimeoutError_(f"no answer within {timeout:g}s") from None
        return status, self._headers

    async def body_chunks(self, timeout: float) -> AsyncIterator[bytes]:
        chunks = self._chunks
        while True:
            if chunks:
                # Everything that arrived since the last look, as one piece: a stream's events that
                # came in one read (or while the reader was busy) are then relayed as one write.
                data = chunks.popleft() if len(chunks) == 1 else b"".join(chunks)
                chunks.clear()
                yield data
                continue
            if self._error is not None:
                raise self._error
            if self._complete:
                return
            # A bare future, not Event.wait(): wait_for would wrap a coroutine in a task per chunk.
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await asyncio.wait_for(self._waiter, timeout)
            except TimeoutError:
                raise TimeoutError_(f"the upstream was silent for {timeout:g}s") from None

    @property
    def failed_before_answer(self) -> bool:
        return self._error is not None and self._bytes_seen == 0

    def reusable(self) -> bool:
        return self._complete and not self.lost and self._keep_alive

    def close(self) -> None:
        self.lost = True
        if self.transport is not None:
            self.transport.close()


class Response:
    """An answer whose head has arrived; read its body whole (`read`) or chunk by chunk (`iter_raw`)."""

    def __init__(self, pool: Pool, connection: _Connection, status: int, headers: dict[str, str]) -> None:
        self._pool = pool
        self._connection = connection
        self.status_code = status
        self.headers = headers
        self._keep = True  # back to the pool once read to its end, unless reading it failed
        self._closed = False

    async def read(self) -> bytes:
        parts = [chunk async for chunk in self.iter_raw()]
        return b"".join(parts)

    async def iter_raw(self) -> AsyncGenerator[bytes, None]:
        try:
            async for chunk in self._connection.body_chunks(self._pool.read_timeout):
                yield chunk
        except BaseException:
            self._keep = False
            raise
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._pool.release(self._connection, self._keep and self._connection.reusable())


class Pool:
    """Connections to one origin: idle ones newest first, at most `max_connections` busy at once."""

    def __init__(
        self,
        base_url: str,
        *,
        connect_timeout: float,
        read_timeout: float,
        max_connections: int,
        headers: dict[str, str],
        keepalive_expiry: float = 5.0,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"{base_url!r}: the upstream must be a plain http:// URL")
        self.host = parts.hostname
        self.port = parts.port or 80
        self.prefix = parts.path.rstrip("/")
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.keepalive_expiry = keepalive_expiry
        self._idle: list[_Connection] = []
        self._busy = asyncio.Semaphore(max_connections)
        fixed = {"host": f"{self.host}:{self.port}", **{k.lower(): v for k, v in headers.items()}}
        # Rendered (and checked) once; a bad configured header fails here, not on the first call.
        self._fixed_lines = {name: _header_lines({name: value}) for name, value in fixed.items()}
        self._fixed_head = b"".join(self._fixed_lines.values())

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            _, connection = await asyncio.wait_for(
                loop.create_connection(_Connection, self.host, self.port), self.connect_timeout
            )
        except TimeoutError:
            raise ConnectError(f"connecting to {self.host}:{self.port} took over {self.connect_timeout:g}s") from None
        except OSError as exc:
            raise ConnectError(f"cannot connect to {self.host}:{self.port}: {exc.strerror or exc}") from exc
        return connection

    def _idle_connection(self) -> _Connection | None:
        while self._idle:
            connection = self._idle.pop()
            if connection.expiry is not None:
                connection.expiry.cancel()
                connection.expiry = None
            if not connection.lost:
                connection.reused = True
                return connection
        return None

    async def fetch(
        self, path: str, body: bytes, headers: dict[str, str], timeout: float
    ) -> tuple[int, dict[str, str], bytes]:
        """POST `body` and read the whole answer (status, headers, body) within `timeout` seconds of
        getting a connection slot (a new connection's connect within the pool's connect timeout too);
        as with request(), waiting for a slot is not bounded here.

        For whole answers on the hot path (non-stream model calls, the engine's /tokenize): one
        future, woken once when the answer is complete, and one timer for the exchange, instead of
        request() and read()'s per-phase waits; about 20-40 µs less event-loop CPU per call
        (docs/benchmarks.md). The connection is pooled as with request().
        """
        payload = self._payload(path, body, headers)
        await self._busy.acquire()
        deadline = asyncio.get_running_loop().time() + timeout
        for attempt in (1, 2):
            connection = None
            try:
                connection = self._idle_connection()
                if connection is None:
                    connection = await self._connect()
                answer = await connection.whole_answer(payload, deadline, timeout)
            except BaseException as exc:
                if connection is not None:
                    connection.close()
                    # As in request(): a kept-alive connection closed under us before any answer.
                    if isinstance(exc, ProtocolError) and attempt == 1 and connection.reused:
                        if connection.failed_before_answer:
                            continue
                self._busy.release()
                raise
            self.release(connection, connection.reusable())
            return answer
        raise AssertionError("unreachable")  # pragma: no cover

    def _payload(self, path: str, body: bytes, headers: dict[str, str]) -> Payload:
        """The request as one piece; a large body stays a piece of its own, not copied behind the head."""
        fixed = self._fixed_head
        if not self._fixed_lines.keys().isdisjoint(headers):
            # A per-call header (lower-case name) overrides a fixed one, e.g. a forwarded authorization.
            fixed = b"".join(line for name, line in self._fixed_lines.items() if name not in headers)
        head = (
            f"POST {self.prefix}{path} HTTP/1.1\r\n".encode("latin-1")
            + fixed
            + _header_lines(headers)
            + b"content-length: "
            + str(len(body)).encode()
            + b"\r\n\r\n"
        )
        return head + body if len(body) < _SEPARATE_BODY_BYTES else (head, body)

    async def request(self, path: str, body: bytes, headers: dict[str, str], *, stream: bool = False) -> Response:
        """POST `body` on an idle connection (or a new one); returns once the answer's head is in.

        `stream`: the answer comes in many small writes, each acknowledged at once (`_ack_now`); a
        whole answer is one write, and needs no quick ACK."""
        payload = self._payload(path, body, headers)
        await self._busy.acquire()
        try:
            for attempt in (1, 2):
                connection = self._idle_connection()
                if connection is None:
                    connection = await self._connect()
                try:
                    connection.start(payload, ack_each_read=stream)
                    status, response_headers = await connection.head(self.read_timeout)
                except ProtocolError:
                    connection.close()
                    # A kept-alive connection the server closed just as we reused it: the request
                    # never reached a handler (nothing came back), so one retry on a new one is safe.
                    if attempt == 1 and connection.reused and connection.failed_before_answer:
                        continue
                    raise
                except BaseException:
                    connection.close()
                    raise
                return Response(self, connection, status, response_headers)
        except BaseException:
            self._busy.release()
            raise
        raise AssertionError("unreachable")  # pragma: no cover

    def release(self, connection: _Connection, reusable: bool) -> None:
        if reusable:
            self._idle.append(connection)
            # One timer per idle connection (about 1 µs); cancelled when it is taken again.
            connection.expiry = asyncio.get_running_loop().call_later(self.keepalive_expiry, self._expire, connection)
        else:
            connection.close()
        self._busy.release()

    def _expire(self, connection: _Connection) -> None:
        connection.expiry = None
        if connection in self._idle:
            self._idle.remove(connection)
            connection.close()

    def close(self) -> None:
        for connection in self._idle:
            if connection.expiry is not None:
                connection.expiry.cancel()
            connection.close()
        self._idle.clear()


def _header_lines(headers: dict[str, str]) -> bytes:
    lines = []
    for name, value in headers.items():
        text = name + value
        if "\r" in text or "\n" in text or "\0" in text:
            raise ValueError(f"header {name!r} has a line break or NUL in it")
        lines.append(f"{name}: {value}\r\n")
    return "".join(lines).encode("latin-1")
