"""Lean HTTP/1.1 load generator on raw asyncio sockets; runs in its own process, driven by JSON lines on stdin.

Why not httpx: on a 2-core box the client must cost far less CPU per request than the stack it
measures. A hand-rolled protocol (no per-request objects beyond a future, no header dicts, no
URL parsing) costs a few tens of microseconds per request under uvloop, and `bench/run.py`
measures that ceiling against a canned responder before it measures anything else.

Protocol (one JSON object per line each way):
  -> {"host", "port", "templates": [{"method", "path", "headers": [[k, v]], "body"}],
      "concurrency", "count" | "duration" (+ "warmup" count or seconds), "fresh", "stream",
      "marker", "expect_tail", "timeout", "ramp", "vars": {...}, "turns", "pause"}
  <- {"ok", "errors", "error_kinds", "window", "throughput", "lat", "first", "marker", "peak_open",
      "peak_in_flight", ...}
Header values may use {conn} (the worker's index), {seq} (the request's number), {roll} (with
"turns": the worker's rollout number) and any "vars".
"turns": true makes each worker an agent loop: it walks the templates in order (one rollout's
turns, the conversation growing), then starts its next rollout; "pause" seconds after each call
(a tool call's time) before the next.
"""

from __future__ import annotations

import asyncio
import resource
import sys
import time
from typing import Any

import orjson

_HEAD, _BODY, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_END, _TRAILER, _UNTIL_EOF = range(7)
_TAIL_BYTES = 64
_clock = time.perf_counter


class Counters:
    """Streams currently between their response headers and their last byte, and the peak of that."""

    __slots__ = ("open_now", "peak_open", "in_flight", "peak_in_flight")

    def __init__(self) -> None:
        self.open_now = 0
        self.peak_open = 0
        self.in_flight = 0  # requests sent and not yet over (waiting for headers included)
        self.peak_in_flight = 0


class Conn(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection: write a request, parse the response incrementally."""

    def __init__(self, counters: Counters) -> None:
        self.counters = counters
        self.transport: asyncio.Transport | None = None
        self.future: asyncio.Future | None = None
        self.lost = False
        self.buf = bytearray()
        self.marker: bytes | None = None
        self.timeout_state: dict[str, Any] | None = None
        self.keep_body = False  # bench/floor.py reads the body; the load generator never does
        self.body = bytearray()
        self._reset()

    def _reset(self) -> None:
        self.state = _HEAD
        self.status = 0
        self.remaining = 0
        self.close_after = False
        self.t_first = 0.0
        self.t_marker = 0.0
        self.body_len = 0
        self.tail = b""
        self.counted_open = False
        if self.keep_body:
            self.body = bytearray()

    # -- asyncio.Protocol ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.state == _UNTIL_EOF and self.future is not None and not self.future.done():
            self._finish()
            return
        self._fail(ConnectionError(f"connection lost ({exc or 'EOF'})"))

    def data_received(self, data: bytes) -> None:
        if self.future is None or self.future.done():
            return  # nothing asked for: a stray byte after a finished response
        self.buf += data
        try:
            self._parse()
        except (ValueError, IndexError) as exc:
            self._fail(ValueError(f"bad response: {exc}"))
            self.abort()

    # -- requests --------------------------------------------------------------------------
    def request(self, data: bytes, marker: bytes | None) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        self.future = loop.create_future()
        self._reset()
        self.marker = marker
        self.transport.write(data)  # type: ignore[union-attr]
        return self.future

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def timed_out(self) -> None:
        """The per-request deadline passed: say where the response stood, then drop the connection."""
        self.timeout_state = {
            "state": self.state,
            "status": self.status,
            "body_bytes": self.body_len,
            "tail": self.tail[-48:].decode("latin-1"),
            "unparsed": bytes(self.buf[-48:]).decode("latin-1"),
        }
        self.abort()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def _fail(self, exc: BaseException) -> None:
        self._close_open_count()
        if self.future is not None and not self.future.done():
            self.future.set_exception(exc)

    def _close_open_count(self) -> None:
        if self.counted_open:
            self.counted_open = False
            self.counters.open_now -= 1

    def _finish(self) -> None:
        self._close_open_count()
        future = self.future
        if future is not None and not future.done():
            future.set_result(
                (self.status, self.t_first, self.t_marker, _clock(), self.body_len, self.tail, self.close_after)
            )

    def _payload(self, data: bytes | bytearray) -> None:
        if not self.t_first:
            self.t_first = _clock()
        self.body_len += len(data)
        if self.keep_body:
            self.body += data
        joined = self.tail + bytes(data)
        if self.marker is not None and not self.t_marker and self.marker in joined:
            self.t_marker = _clock()
        self.tail = joined[-_TAIL_BYTES:]

    def _parse(self) -> None:
        buf = self.buf
        while True:
            state = self.state
            if state == _HEAD:
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    return
                head = bytes(buf[:end]).lower()
                del buf[: end + 4]
                self.status = int(head[9:12])
                self.close_after = b"\r\nconnection: close" in head
                if self.status >= 200:
                    c = self.counters
                    c.open_now += 1
                    c.peak_open = max(c.peak_open, c.open_now)
                    self.counted_open = True
                if b"\r\ntransfer-encoding: chunked" in head:
                    self.state = _CHUNK_SIZE
                    continue
                at = head.find(b"\r\ncontent-length:")
                if at >= 0:
                    stop = head.find(b"\r\n", at + 2)
                    self.remaining = int(head[at + 17 : stop if stop >= 0 else None])
                    if self.remaining == 0:
                        self._finish()
                        return
                    self.state = _BODY
                    continue
                if self.status in (204, 304):
                    self._finish()
                    return
                self.state = _UNTIL_EOF
                continue
            if state in (_BODY, _CHUNK_DATA):
                if not buf:
                    return
                n = min(len(buf), self.remaining)
                self._payload(buf[:n])
                del buf[:n]
                self.remaining -= n
                if self.remaining:
                    return
                if state == _BODY:
                    self._finish()
                    return
                self.state = _CHUNK_END
                continue
            if state == _CHUNK_END:
                if len(buf) < 2:
                    return
                del buf[:2]
                self.state = _CHUNK_SIZE
                continue
            if state == _CHUNK_SIZE:
                end = buf.find(b"\r\n")
                if end < 0:
                    return
                size = int(bytes(buf[:end]).split(b";", 1)[0], 16)
                del buf[: end + 2]
                if size == 0:
                    self.state = _TRAILER
                else:
                    self.remaining = size
                    self.state = _CHUNK_DATA
                continue
            if state == _TRAILER:
                end = buf.find(b"\r\n")
                if end < 0:
                    return
                del buf[: end + 2]
                if end == 0:
                    self._finish()
                    return
                continue
            if state == _UNTIL_EOF:
                if buf:
                    self._payload(buf)
                    buf.clear()
                return


class Template:
    """A request, pre-encoded: only headers with placeholders are formatted per request."""

    def __init__(self, spec: dict[str, Any], host: str, port: int, variables: dict[str, str]) -> None:
        body = spec.get("body", "")
        self.body = body.encode() if isinstance(body, str) else bytes(body)
        fixed = [f"{spec.get('method', 'POST')} {spec['path']} HTTP/1.1", f"host: {host}:{port}"]
        if self.body or spec.get("method", "POST") == "POST":
            fixed += ["content-type: application/json", f"content-length: {len(self.body)}"]
        self.dynamic: list[tuple[str, str]] = []
        for name, value in spec.get("headers", []):
            value = value.replace("{run}", variables.get("run", ""))
            if "{" in value:
                self.dynamic.append((name, value))
            else:
                fixed.append(f"{name}: {value}")
        self.prefix = ("\r\n".join(fixed) + "\r\n").encode()
        self.whole = None if self.dynamic else self.prefix + b"\r\n" + self.body

    def render(self, conn: int, seq: int, roll: int = 0) -> bytes:
        if self.whole is not None:
            return self.whole
        extra = "".join(f"{name}: {value.format(conn=conn, seq=seq, roll=roll)}\r\n" for name, value in self.dynamic)
        return self.prefix + extra.encode() + b"\r\n" + self.body


async def run_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """Drive one series and return its raw samples; every loop is bounded by count and by time."""
    loop = asyncio.get_running_loop()
    host, port = spec.get("host", "127.0.0.1"), int(spec["port"])
    templates = [Template(t, host, port, spec.get("vars", {})) for t in spec["templates"]]
    concurrency = int(spec.get("concurrency", 1))
    count = spec.get("count")
    duration = spec.get("duration")
    warmup = spec.get("warmup", 0)
    fresh = bool(spec.get("fresh", False))
    stream = bool(spec.get("stream", False))
    marker = spec["marker"].encode() if spec.get("marker") else None
    expect_tail = (spec.get("expect_tail") or ("[DONE]" if stream else "")).encode()
    timeout = float(spec.get("timeout", 30.0))
    ramp = float(spec.get("ramp", 0.0))
    turns = bool(spec.get("turns", False))
    pause = float(spec.get("pause", 0.0))
    hard_limit = float(spec.get("hard_limit", (duration or 0) + (warmup if duration else 0) + 120.0))
    counters = Counters()

    started = _clock()
    if duration is not None:
        window_start = started + float(warmup)
        window_end = window_start + float(duration)
        total = None
        warm_count = 0
    else:
        window_start, window_end = started, started + hard_limit
        total = int(count)
        warm_count = int(warmup)
    stop_at = min(window_end, started + hard_limit)
    next_seq = 0
    lat: list[float] = []
    first: list[float] = []
    marks: list[float] = []
    ok = errors = in_window = 0
    error_kinds: dict[str, int] = {}
    error_details: list[dict[str, Any]] = []
    body_bytes = 0

    def error(kind: str) -> None:
        nonlocal errors
        errors += 1
        error_kinds[kind] = error_kinds.get(kind, 0) + 1

    async def connect() -> Conn:
        _, conn = await asyncio.wait_for(loop.create_connection(lambda: Conn(counters), host, port), timeout)
        return conn  # type: ignore[return-value]

    async def worker(index: int) -> None:
        nonlocal next_seq, ok, in_window, body_bytes
        if ramp:
            await asyncio.sleep(ramp * index / concurrency)
        conn: Conn | None = None
        mine = 0  # this worker's own calls so far (an agent loop's turn counter)
        while True:
            now = _clock()
            if now >= stop_at or (total is not None and next_seq >= total):
                break
            if turns and mine:
                await asyncio.sleep(min(pause, max(0.0, stop_at - now)))  # the tool call between turns
                if _clock() >= stop_at:
                    break
            seq = next_seq
            next_seq += 1
            if turns:
                data = templates[mine % len(templates)].render(index, seq, mine // len(templates))
            else:
                data = templates[seq % len(templates)].render(index, seq)
            mine += 1
            t0 = _clock()
            timer = None
            counters.in_flight += 1
            counters.peak_in_flight = max(counters.peak_in_flight, counters.in_flight)
            try:
                if conn is None or conn.lost:
                    conn = await connect()
                future = conn.request(data, marker)
                timer = loop.call_later(timeout, conn.timed_out)
                status, t_first, t_marker, t_end, size, tail, close_after = await future
            except (TimeoutError, OSError, ValueError) as exc:
                if conn is not None and conn.timeout_state is not None:
                    error("timeout")
                    if len(error_details) < 5:
                        error_details.append({"seq": seq, "after_s": round(_clock() - t0, 3), **conn.timeout_state})
                else:
                    error(type(exc).__name__ if not isinstance(exc, ConnectionError) else "ConnectionError")
                if conn is not None:
                    conn.abort()
                conn = None
                continue
            finally:
                counters.in_flight -= 1
                if timer is not None:
                    timer.cancel()
            if fresh or close_after:
                conn.close()
                conn = None
            if status != 200:
                error(f"http_{status}")
                continue
            if expect_tail and expect_tail not in tail:
                error("incomplete_stream")
                continue
            ok += 1
            body_bytes += size
            if t_end <= window_end and t_end >= window_start:
                in_window += 1
            counted = seq >= warm_count if total is not None else (t0 >= window_start and t_end <= window_end)
            if counted:
                lat.append(t_end - t0)
                if stream:
                    first.append(t_first - t0)
                    marks.append((t_marker - t0) if t_marker else float("nan"))
        if conn is not None:
            conn.close()

    usage_before = resource.getrusage(resource.RUSAGE_SELF)
    await asyncio.gather(*(worker(i) for i in range(concurrency)))
    finished = _clock()
    usage_after = resource.getrusage(resource.RUSAGE_SELF)
    if duration is not None:
        window = float(duration)
        completed = in_window
    else:
        window = finished - started
        completed = ok
    cpu = (usage_after.ru_utime - usage_before.ru_utime) + (usage_after.ru_stime - usage_before.ru_stime)
    return {
        "ok": ok,
        "errors": errors,
        "error_kinds": error_kinds,
        "error_details": error_details,
        "window": window,
        "completed_in_window": completed,
        "throughput": completed / window if window > 0 else 0.0,
        "elapsed": finished - started,
        "lat": lat,
        "first": first,
        "marker": marks,
        "peak_open": counters.peak_open,
        "peak_in_flight": counters.peak_in_flight,
        "body_bytes": body_bytes,
        "cpu_s": cpu,
        "requests_sent": next_seq,
    }


def raise_fd_limit() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else 65536
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:
        return asyncio.new_event_loop()


def main() -> int:
    raise_fd_limit()
    loop = new_loop()
    asyncio.set_event_loop(loop)
    out = sys.stdout.buffer
    for line in sys.stdin.buffer:
        if not line.strip():
            continue
        try:
            result = loop.run_until_complete(run_spec(orjson.loads(line)))
        except Exception as exc:  # report, keep serving: the driver decides what a failure means
            result = {"fatal": f"{type(exc).__name__}: {exc}"}
        out.write(orjson.dumps(result, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
