"""The soak's load: the fault mix, agent-like sessions, each call judged from the client's side, and the workers, reader and sampler."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
import psutil

from bench.procs import Proc

# Client-side outcomes of one call.
OK = "ok"  # 200 and the whole answer: JSON body, or a stream that ended normally
STREAM_ERROR = "stream_error"  # 200, then an in-band error event (the status line was already sent)
CLIENT_DISCONNECT = "client_disconnect"  # we closed the stream on purpose after a few deltas
CLIENT_ABORT = "client_abort"  # we gave up on purpose before the first byte
CLIENT_TIMEOUT = "client_timeout"  # the generous per-call client timeout fired: never expected
TRANSPORT_ERROR = "transport_error"  # connection refused/reset/closed without a proper end
INCOMPLETE = "incomplete"  # 200 but the body was not a whole answer and carried no error either

# The record status each client outcome implies for a correlated call; other outcomes leave no record.
RECORD_STATUS = {OK: "completed", STREAM_ERROR: "failed", CLIENT_DISCONNECT: "partial"}
# Outcomes that say nothing certain about whether the server recorded the call.
UNCERTAIN = frozenset({CLIENT_TIMEOUT, TRANSPORT_ERROR, INCOMPLETE})

_WORDS = (
    "apple river stone cloud maple tiger orbit lemon piano candle forest harbor velvet rocket "
    "meadow silver thunder garden copper lantern"
).split()


# ---------------------------------------------------------------------------------------------
# The load mix
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fault:
    """One injected fault: its share of the calls it applies to, its directive, what the client must see."""

    name: str
    rate: float
    streams_only: bool
    directive: str  # {hang} is replaced by a hang longer than upstream_timeout_s
    expect_plain: str | None  # outcome of a non-stream call (None: streams only)
    expect_stream: str
    disconnect: bool = False  # the client closes the stream after a few deltas
    abort_s: float | None = None  # the client gives up before the first byte after this long


def fault_table(rate_scale: float) -> list[Fault]:
    s = rate_scale
    return [
        Fault("error_500", 0.02 * s, False, "[[mock:error 500]]", "http_500", "http_500"),
        # Retry-After 0: Switchyard would otherwise sleep through its retries past upstream_timeout_s.
        Fault("error_429", 0.02 * s, False, "[[mock:error 429 0]]", "http_429", "http_429"),
        Fault("bad_json", 0.02 * s, False, "[[mock:badjson]]", "http_502", STREAM_ERROR),
        Fault("hang_timeout", 0.01 * s, False, "[[mock:hang {hang}]]", "http_504", "http_504"),
        Fault("stream_cut", 0.03 * s, True, "[[mock:tokens 40]] [[mock:streamcut 4]]", None, STREAM_ERROR),
        # Paced to last 8 s: a loaded load generator can take 2-3 s to read its first deltas, and a stream
        # that has already ended in its socket buffer when it hangs up is rightly recorded "completed".
        Fault(
            "client_disconnect",
            0.03 * s,
            True,
            "[[mock:tokens 80]] [[mock:slow 100]]",
            None,
            CLIENT_DISCONNECT,
            disconnect=True,
        ),
        Fault("client_abort", 0.01 * s, False, "[[mock:hang {hang}]]", CLIENT_ABORT, CLIENT_ABORT, abort_s=0.5),
    ]


NO_FAULT = Fault("none", 0.0, False, "", OK, OK)


def draw_fault(rng: random.Random, faults: list[Fault], stream: bool) -> Fault:
    roll = rng.random()
    for fault in faults:
        if fault.streams_only and not stream:
            continue
        if roll < fault.rate:
            return fault
        roll -= fault.rate
    return NO_FAULT


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(n))


@dataclass
class Session:
    """A conversation one worker runs: the same API, a growing history, correlated or not."""

    session_id: str | None
    api: str  # "chat" | "responses"
    turns: int
    system: str
    history: list[tuple[str, str]] = field(default_factory=list)  # (user, assistant) pairs so far


def chat_body(session: Session, user: str, stream: bool) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": session.system}] if session.system else []
    for past_user, past_assistant in session.history:
        messages += [{"role": "user", "content": past_user}, {"role": "assistant", "content": past_assistant}]
    messages.append({"role": "user", "content": user})
    body: dict[str, Any] = {"model": "demo", "messages": messages}
    if stream:
        body["stream"] = True
    return body


def responses_body(session: Session, user: str, stream: bool) -> dict[str, Any]:
    items: list[dict[str, Any]] = []
    for past_user, past_assistant in session.history:
        items += [{"role": "user", "content": past_user}, {"role": "assistant", "content": past_assistant}]
    items.append({"role": "user", "content": user})
    body: dict[str, Any] = {"model": "demo", "input": items}
    if session.system:
        body["instructions"] = session.system
    if stream:
        body["stream"] = True
    return body


@dataclass(slots=True)
class CallResult:
    seq: int
    request_id: str
    session_id: str | None
    api: str
    stream: bool
    fault: str
    expected: str
    outcome: str
    latency_s: float
    first_byte_s: float | None
    phase: str

    @property
    def expected_record(self) -> str | None:
        if self.session_id is None or self.outcome in UNCERTAIN:
            return None
        return RECORD_STATUS.get(self.outcome)


# ---------------------------------------------------------------------------------------------
# One call, classified from the client's side
# ---------------------------------------------------------------------------------------------


def classify_plain(api: str, status: int, body: bytes) -> str:
    if status != 200:
        return f"http_{status}"
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return INCOMPLETE
    if api == "chat":
        return OK if isinstance(doc, dict) and doc.get("choices") else INCOMPLETE
    return OK if isinstance(doc, dict) and doc.get("status") == "completed" else INCOMPLETE


class StreamState:
    """What a stream showed so far: enough to tell a normal end from an in-band error or a cut."""

    __slots__ = ("api", "deltas", "done", "error", "completed")

    def __init__(self, api: str) -> None:
        self.api = api
        self.deltas = 0
        self.done = False
        self.error = False
        self.completed = False

    def feed(self, line: str) -> None:
        if line == "data: [DONE]":
            self.done = True
        elif self.api == "chat":
            if line.startswith('data: {"error"'):
                self.error = True
            elif line.startswith("data: ") and '"delta"' in line:
                self.deltas += 1
        elif line.startswith("event: "):
            kind = line[7:]
            if kind in ("error", "response.failed"):
                self.error = True
            elif kind == "response.completed":
                self.completed = True
            elif kind == "response.output_text.delta":
                self.deltas += 1

    def outcome(self) -> str:
        if self.error:
            return STREAM_ERROR
        if self.done and (self.api == "chat" or self.completed):
            return OK
        return INCOMPLETE


async def one_call(
    client: httpx.AsyncClient,
    base: str,
    session: Session,
    body: dict[str, Any],
    stream: bool,
    fault: Fault,
    request_id: str,
) -> tuple[str, float | None]:
    """Send one call; returns (outcome, seconds to the first body byte or None)."""
    path = "/v1/chat/completions" if session.api == "chat" else "/v1/responses"
    headers = {"x-request-id": request_id}
    if session.session_id:
        headers["x-session-id"] = session.session_id
    timeout = httpx.Timeout(fault.abort_s) if fault.abort_s else httpx.USE_CLIENT_DEFAULT
    started = time.perf_counter()
    try:
        if not stream:
            response = await client.post(base + path, content=orjson.dumps(body), headers=headers, timeout=timeout)
            return classify_plain(session.api, response.status_code, response.content), None
        state = StreamState(session.api)
        first = None
        async with client.stream(
            "POST", base + path, content=orjson.dumps(body), headers=headers, timeout=timeout
        ) as response:
            if response.status_code != 200:
                await response.aread()
                return f"http_{response.status_code}", None
            # Bounded: the mock's longest scripted stream is a few hundred lines.
            async for line in response.aiter_lines():
                if first is None:
                    first = time.perf_counter() - started
                if line:
                    state.feed(line)
                if fault.disconnect and state.deltas >= 3:
                    return CLIENT_DISCONNECT, first  # leaving the block closes the connection mid-stream
        return state.outcome(), first
    except httpx.TimeoutException:
        return (CLIENT_ABORT if fault.abort_s else CLIENT_TIMEOUT), None
    except httpx.TransportError:
        return TRANSPORT_ERROR, None


# ---------------------------------------------------------------------------------------------
# The soak
# ---------------------------------------------------------------------------------------------


@dataclass
class Options:
    minutes: float
    warmup_s: float
    concurrency: int
    seed: int
    upstream_timeout_s: float
    client_timeout_s: float
    fault_scale: float
    correlated_share: float
    sample_every_s: float
    settle_s: float
    rss_tolerance: float
    fd_slack: int
    tcp_slack: int
    max_calls: int
    server_settings: dict[str, Any]


class Soak:
    """The load, the trainer-like reader and the resource sampler, and everything they saw."""

    def __init__(self, opts: Options, mock_url: str, server_url: str, server: Proc) -> None:
        self.opts = opts
        self.mock_url = mock_url
        self.base = server_url
        self.server = server
        self.faults = fault_table(opts.fault_scale)
        self.hang_s = opts.upstream_timeout_s + 2.0
        self.run_id = f"{random.Random(opts.seed).getrandbits(32):08x}"
        self.results: list[CallResult] = []
        self.seq = 0
        self.sessions_done: list[str] = []  # correlated sessions whose calls have all finished
        self.records_due: Counter[str] = Counter()  # session id -> calls that must have left a record
        self.uncertain_sessions: set[str] = set()  # sessions with a call whose recording is unknowable
        self.reads: Counter[str] = Counter()
        self.read_latency: list[float] = []
        self.list_latency: list[float] = []
        self.samples: list[dict[str, Any]] = []

    # ---- load -------------------------------------------------------------------------------
    def new_session(self, rng: random.Random, phase: str, worker: int, n: int) -> Session:
        correlated = rng.random() < self.opts.correlated_share
        sid = f"soak-{self.run_id}-{phase}-w{worker}-s{n}" if correlated else None
        system = words(rng, rng.choice((0, 0, 40, 300)))
        return Session(sid, rng.choice(("chat", "responses")), rng.randint(1, 8), system)

    async def worker(self, client: httpx.AsyncClient, index: int, phase: str, until: float) -> None:
        rng = random.Random(f"{self.opts.seed}-{phase}-{index}")
        session_count = 0
        session = None
        while time.monotonic() < until and self.seq < self.opts.max_calls:
            if session is None or len(session.history) >= session.turns:
                if session is not None and session.session_id:
                    self.sessions_done.append(session.session_id)
                session = self.new_session(rng, phase, index, session_count)
                session_count += 1
            stream = rng.random() < 0.5
            fault = draw_fault(rng, self.faults, stream)
            seq = self.seq
            self.seq += 1
            directive = fault.directive.format(hang=f"{self.hang_s:g}") or f"[[mock:tokens {rng.randint(8, 64)}]]"
            user = f"turn {len(session.history)}: {words(rng, rng.randint(3, 30))} {directive}"
            body = chat_body(session, user, stream) if session.api == "chat" else responses_body(session, user, stream)
            request_id = f"soak-{self.run_id}-{seq}"
            started = time.perf_counter()
            outcome, first = await one_call(client, self.base, session, body, stream, fault, request_id)
            latency = time.perf_counter() - started
            expected = fault.expect_stream if stream else fault.expect_plain
            result = CallResult(
                seq,
                request_id,
                session.session_id,
                session.api,
                stream,
                fault.name,
                expected or OK,
                outcome,
                latency,
                first,
                phase,
            )
            self.results.append(result)
            if result.expected_record is not None:
                self.records_due[session.session_id] += 1
            if session.session_id and outcome in UNCERTAIN:
                self.uncertain_sessions.add(session.session_id)
            # The next turn carries a short assistant reply whatever happened: the mock does not care.
            session.history.append((user, f"reply {len(session.history)}: {words(rng, 6)}"))
        if session is not None and session.session_id:
            self.sessions_done.append(session.session_id)

    async def reader(self, client: httpx.AsyncClient, until: float) -> None:
        """A trainer reading finished sessions while the load runs; also lists all sessions now and then."""
        rng = random.Random(self.opts.seed)
        last_list = time.monotonic()
        while time.monotonic() < until:
            await asyncio.sleep(1.0)
            if time.monotonic() - last_list >= 20.0:
                last_list = time.monotonic()
                started = time.perf_counter()
                try:
                    response = await client.get(self.base + "/v1/sessions", timeout=60.0)
                    self.reads["list_ok" if response.status_code == 200 else f"list_http_{response.status_code}"] += 1
                except httpx.HTTPError as exc:
                    self.reads[f"list_{type(exc).__name__}"] += 1
                self.list_latency.append(time.perf_counter() - started)
            if not self.sessions_done:
                continue
            sid = rng.choice(self.sessions_done[-200:])
            if sid in self.uncertain_sessions:
                continue
            want = self.records_due[sid]
            got = None
            # The last record of a session may still be queued for the disk: look again briefly.
            for _ in range(10):
                started = time.perf_counter()
                try:
                    response = await client.get(f"{self.base}/v1/sessions/{sid}/completions", timeout=30.0)
                except httpx.HTTPError as exc:
                    self.reads[f"read_{type(exc).__name__}"] += 1
                    break
                self.read_latency.append(time.perf_counter() - started)
                if response.status_code == 404:
                    got = 0  # no record written yet (or none due: every call of it failed before streaming)
                elif response.status_code != 200:
                    self.reads[f"read_http_{response.status_code}"] += 1
                    break
                else:
                    got = len(response.json()["completions"])
                if got == want:
                    break
                await asyncio.sleep(0.3)
            if got is not None:
                self.reads["read_match" if got == want else "read_mismatch"] += 1

    async def sampler(self, client: httpx.AsyncClient, until: float, t0: float) -> None:
        while time.monotonic() < until:
            sample = {"t": round(time.monotonic() - t0, 1), **resources(self.server.ps), "calls": len(self.results)}
            try:
                capture = (await client.get(self.base + "/health", timeout=10.0)).json().get("capture", {})
                sample["queue_depth"] = capture.get("queue_depth")
                sample["written"] = capture.get("written")
            except (httpx.HTTPError, ValueError):
                sample["queue_depth"] = None
            self.samples.append(sample)
            await asyncio.sleep(max(0.0, min(self.opts.sample_every_s, until - time.monotonic())))

    async def run_phase(self, phase: str, seconds: float, *, sample: bool, t0: float) -> float:
        until = time.monotonic() + seconds
        # keepalive_expiry under uvicorn's 5 s keep-alive timeout: otherwise a request sent on a
        # connection the server is closing at that instant fails with a ReadError, a client artefact.
        limits = httpx.Limits(
            max_connections=self.opts.concurrency + 4,
            max_keepalive_connections=self.opts.concurrency,
            keepalive_expiry=2.0,
        )
        started = time.monotonic()
        async with (
            httpx.AsyncClient(trust_env=False, timeout=self.opts.client_timeout_s, limits=limits) as client,
            httpx.AsyncClient(trust_env=False, timeout=30.0, limits=httpx.Limits(keepalive_expiry=2.0)) as side,
        ):
            tasks = [asyncio.create_task(self.worker(client, i, phase, until)) for i in range(self.opts.concurrency)]
            helpers = [asyncio.create_task(self.reader(side, until))]
            if sample:
                helpers.append(asyncio.create_task(self.sampler(side, until, t0)))
            # Each worker stops at `until`; its last call is bounded by the client timeout.
            grace = self.opts.client_timeout_s + 30.0
            try:
                done, pending = await asyncio.wait(tasks + helpers, timeout=seconds + grace)
            finally:
                # Also on Ctrl-C: no task may outlive the clients it uses.
                for task in tasks + helpers:
                    task.cancel()
                await asyncio.gather(*tasks, *helpers, return_exceptions=True)
            for task in done:
                if not task.cancelled() and task.exception() is not None:
                    raise task.exception()  # a bug in this script: stop rather than report nonsense
            if pending:
                raise RuntimeError(f"{len(pending)} load tasks still running {grace:.0f}s after the deadline")
        return time.monotonic() - started

    # ---- between phases ---------------------------------------------------------------------
    def wait_idle(self, timeout: float = 60.0) -> dict[str, Any]:
        """Until the mock has no call in flight and the capture queue is empty; then let pools settle."""
        deadline = time.monotonic() + timeout
        mock_stats: dict[str, Any] = {}
        capture: dict[str, Any] = {}
        while time.monotonic() < deadline:
            mock_stats = httpx.get(self.mock_url + "/mock/stats", timeout=10.0, trust_env=False).json()
            capture = httpx.get(self.base + "/health", timeout=10.0, trust_env=False).json().get("capture", {})
            if mock_stats.get("in_flight") == 0 and capture.get("queue_depth") == 0:
                break
            time.sleep(0.2)
        # Idle keep-alive connections close after ~5 s (uvicorn's keep-alive timeout on the mock, httpx's
        # keepalive_expiry in the server, which prunes them on its next request: the /health below
        # makes one). What is still open after that is held by something, which is what we compare.
        time.sleep(self.opts.settle_s)
        httpx.get(self.base + "/health", timeout=10.0, trust_env=False)
        time.sleep(0.5)
        return {"mock": mock_stats, "capture": capture}


def resources(proc: psutil.Process) -> dict[str, Any]:
    conns = proc.net_connections(kind="tcp")
    return {
        "rss": proc.memory_info().rss,
        "fds": proc.num_fds(),
        "tcp": len(conns),
        "tcp_by_state": dict(Counter(c.status for c in conns)),
        "threads": proc.num_threads(),
    }
