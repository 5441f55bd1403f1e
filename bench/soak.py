"""Bounded soak: the real chain under a faulty mixed load; checks records, memory, fds; exits 1 on a breach.

Usage: python bench/soak.py [--minutes M | --quick] [--concurrency 32] [--seed 1] [--json PATH] [--keep]

It starts the mock upstream and `switchyard-model serve --deployment demo` (hosted Switchyard) as
processes on 127.0.0.1, warms them up, then drives a mix of stream / non-stream, chat / Responses,
correlated / uncorrelated calls with scripted upstream faults and client disconnects from this
process's event loop. Afterwards it drains, stops the server with SIGTERM (which writes out the
capture queue) and compares the record files on disk with the calls that must have produced one.
Every process it started is stopped by its pid on exit, Ctrl-C included. See bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import math
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # `python bench/soak.py` puts bench/, not the repo, on sys.path

import httpx  # noqa: E402
import orjson  # noqa: E402
import psutil  # noqa: E402

from server.capture.delta import DELTA_SUFFIX  # noqa: E402
from server.capture.delta_read import DeltaFileError, parse_delta_file  # noqa: E402
from server.capture.store import read_session_records  # noqa: E402

PY = sys.executable
MiB = 1024 * 1024

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
# Processes
# ---------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Child:
    """A process we started, with its output in a log file; stopped only by its own pid."""

    def __init__(self, name: str, argv: list[str], log_dir: Path, env: dict[str, str]) -> None:
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self._log = open(self.log_path, "wb")
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        full_env.update(
            {"NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost", "PYTHONUNBUFFERED": "1", **env}
        )
        # Own session: a Ctrl-C at the terminal reaches only this script, which then stops us in order.
        self.popen = subprocess.Popen(
            argv,
            cwd=str(REPO),
            env=full_env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.pid = self.popen.pid
        self.ps = psutil.Process(self.pid)

    def tail(self, n: int = 2000) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-n:]

    def wait_http(self, url: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with {self.popen.returncode} before it was ready:\n{self.tail()}"
                )
            try:
                if httpx.get(url, timeout=2.0, trust_env=False).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"{self.name}: {url} not ready after {timeout:.0f}s:\n{self.tail()}")

    def terminate(self, timeout: float) -> tuple[int | None, float]:
        """SIGTERM, wait up to `timeout`, then SIGKILL. Returns (exit code, seconds it took)."""
        started = time.monotonic()
        if self.popen.poll() is None:
            try:
                os.kill(self.pid, signal.SIGTERM)
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, signal.SIGKILL)
                self.popen.wait(10)
            except ProcessLookupError:
                pass
        if not self._log.closed:
            self._log.close()
        return self.popen.returncode, time.monotonic() - started


def start_server(name: str, port: int, capture_dir: Path, config: Path, workdir: Path, mock_url: str) -> Child:
    argv = [PY, "-m", "server.cli", "serve", "--deployment", "demo", "--port", str(port)]
    argv += ["--capture-dir", str(capture_dir), "--config", str(config)]
    # Switchyard logs two lines per call at info; keep its warnings and errors.
    return Child(name, argv, workdir, {"MOCK_UPSTREAM_URL": mock_url + "/v1", "RUST_LOG": "warn"})


def memory_for_the_data(capture_dir: Path, config: Path, workdir: Path, mock_url: str) -> dict[str, int]:
    """What holding this capture directory costs a server: the RSS of a new server on it, against one on
    an empty directory, each once it has indexed the directory and listed every session.

    The session index grows with the sessions recorded (each keeps its entry); that is not a leak,
    so the RSS check allows it, as measured here, on top of its tolerance.
    """
    rss = {}
    for label, directory in (("empty", workdir / "captures-empty"), ("data", capture_dir)):
        port = free_port()
        server = start_server(f"server-{label}", port, directory, config, workdir, mock_url)
        try:
            url = f"http://127.0.0.1:{port}"
            server.wait_http(url + "/health", 120)
            deadline = time.monotonic() + 120
            while not httpx.get(url + "/health", timeout=30, trust_env=False).json().get("capture", {}).get("indexed"):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"server-{label} did not index {directory} within 120 s")
                time.sleep(0.2)
            list_all_sessions(url)
            time.sleep(1.0)
            rss[label] = server.ps.memory_info().rss
        finally:
            server.terminate(30.0)
    shutil.rmtree(workdir / "captures-empty", ignore_errors=True)
    return {**rss, "held": max(0, rss["data"] - rss["empty"])}


def resources(proc: psutil.Process) -> dict[str, Any]:
    conns = proc.net_connections(kind="tcp")
    return {
        "rss": proc.memory_info().rss,
        "fds": proc.num_fds(),
        "tcp": len(conns),
        "tcp_by_state": dict(Counter(c.status for c in conns)),
        "threads": proc.num_threads(),
    }


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

    def __init__(self, opts: Options, mock_url: str, server_url: str, server: Child) -> None:
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


# ---------------------------------------------------------------------------------------------
# Checks and report
# ---------------------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))  # nearest rank
    return ordered[min(rank, len(ordered)) - 1]


def scan_records(capture_dir: Path) -> dict[str, Any]:
    """Every record file on disk: request id -> (status, session id), plus anything that should not be there."""
    by_request: dict[str, list[tuple[str, str]]] = {}
    bad_files: list[str] = []
    stray: list[str] = []
    wrong_dir: list[str] = []
    sessions_dir = capture_dir / "sessions"
    files = 0
    if sessions_dir.is_dir():
        for directory in sorted(sessions_dir.iterdir()):
            if not directory.is_dir():
                continue  # the change journal (`.changes`) lives beside the session directories
            sessions: set[str] = set()
            for path in sorted(directory.iterdir()):
                if path.suffix not in (".json", DELTA_SUFFIX):
                    stray.append(str(path))  # a temp file left behind
                    continue
                files += 1
                try:
                    # A delta file's own fields (its body decompressed, so a torn one shows here).
                    data = path.read_bytes()
                    record = parse_delta_file(data).header if path.suffix == DELTA_SUFFIX else orjson.loads(data)
                except (orjson.JSONDecodeError, DeltaFileError):
                    bad_files.append(str(path))
                    continue
                sid = record.get("session_id") or ""
                sessions.add(sid)
                if hashlib.sha256(sid.encode()).hexdigest() != directory.name:
                    wrong_dir.append(str(path))
                by_request.setdefault(record.get("request_id") or "", []).append((record.get("status"), sid))
            # Every delta must rebuild against its base: one that cannot is served invalid, never whole.
            for sid in sessions:
                if hashlib.sha256(sid.encode()).hexdigest() == directory.name:
                    records, _ = read_session_records(sessions_dir, sid)
                    bad_files += [
                        f"{directory}/{r['uuid']}{DELTA_SUFFIX}: {r['invalid_reason']}"
                        for r in records
                        if (r.get("invalid_reason") or "").startswith("delta record")
                    ]
    return {"files": files, "by_request": by_request, "bad_files": bad_files, "stray": stray, "wrong_dir": wrong_dir}


def check_records(results: list[CallResult], disk: dict[str, Any]) -> dict[str, Any]:
    """What must match, exactly: the request ids of the record files on disk, and the calls that must have one.

    A call must have a record when it was correlated and the client saw it reach the server's handler
    and end in a known way: a whole answer ("completed"), an in-band stream error ("failed"), or our own
    disconnect mid-stream ("partial"). A correlated call answered with an HTTP error before its stream
    started, an uncorrelated call, and our abort before the first byte must have none. Calls whose end
    the client could not see (client timeout, transport error) may go either way and are listed apart.
    """
    by_request = disk["by_request"]
    expected = {r.request_id: r.expected_record for r in results if r.expected_record is not None}
    uncertain = {r.request_id for r in results if r.session_id is not None and r.outcome in UNCERTAIN}
    missing = sorted(set(expected) - set(by_request))
    extra = sorted(set(by_request) - set(expected) - uncertain)
    duplicates = sorted(rid for rid, found in by_request.items() if len(found) > 1)
    status_mismatch = sorted(
        rid for rid, want in expected.items() if rid in by_request and by_request[rid][0][0] != want
    )
    uncorrelated_ids = {r.request_id for r in results if r.session_id is None}
    return {
        "expected": len(expected),
        "expected_by_status": dict(Counter(expected.values())),
        "files_on_disk": disk["files"],
        "found_by_status": dict(Counter(found[0][0] for found in by_request.values())),
        "missing": missing[:20],
        "missing_count": len(missing),
        "extra": extra[:20],
        "extra_count": len(extra),
        "duplicates": len(duplicates),
        "status_mismatch": status_mismatch[:20],
        "status_mismatch_count": len(status_mismatch),
        "uncorrelated_recorded": len(uncorrelated_ids & set(by_request)),
        "uncertain_calls": len(uncertain),
        "uncertain_recorded": len(uncertain & set(by_request)),
        "unparseable_files": len(disk["bad_files"]),
        "stray_files": len(disk["stray"]),
        "wrong_session_dir": len(disk["wrong_dir"]),
    }


def summarise(results: list[CallResult]) -> dict[str, Any]:
    by_kind = Counter(
        f"{r.api}/{'stream' if r.stream else 'plain'}/{'corr' if r.session_id else 'uncorr'}" for r in results
    )
    by_fault: dict[str, dict[str, Any]] = {}
    for r in results:
        entry = by_fault.setdefault(r.fault, {"calls": 0, "outcomes": Counter(), "unexpected": Counter(), "lat": []})
        entry["calls"] += 1
        entry["outcomes"][r.outcome] += 1
        entry["lat"].append(r.latency_s)
        if r.outcome != r.expected:
            entry["unexpected"][f"{r.expected}->{r.outcome}"] += 1
    errors = Counter(r.outcome for r in results if r.outcome != OK)
    clean: dict[str, list[float]] = {}
    first: dict[str, list[float]] = {}
    for r in results:
        if r.fault == "none" and r.outcome == OK:
            key = f"{r.api}/{'stream' if r.stream else 'plain'}"
            clean.setdefault(key, []).append(r.latency_s)
            if r.first_byte_s is not None:
                first.setdefault(key, []).append(r.first_byte_s)
    all_lat = [r.latency_s for r in results]
    clean_all = [v for vs in clean.values() for v in vs]
    return {
        "calls": len(results),
        "calls_by_kind": dict(sorted(by_kind.items())),
        "by_fault": {
            name: {
                "calls": e["calls"],
                "outcomes": dict(e["outcomes"]),
                "unexpected": dict(e["unexpected"]),
                "p50_ms": _ms(percentile(e["lat"], 0.5)),
                "p99_ms": _ms(percentile(e["lat"], 0.99)),
            }
            for name, e in sorted(by_fault.items())
        },
        "errors_by_kind": dict(sorted(errors.items())),
        "unexpected": sum(sum(e["unexpected"].values()) for e in by_fault.values()),
        "latency_ms": {
            "clean": {
                key: {
                    "n": len(v),
                    "p50": _ms(percentile(v, 0.5)),
                    "p99": _ms(percentile(v, 0.99)),
                    "max": _ms(max(v)),
                    "first_byte_p50": _ms(percentile(first.get(key, []), 0.5)),
                    "first_byte_p99": _ms(percentile(first.get(key, []), 0.99)),
                }
                for key, v in sorted(clean.items())
            },
            "clean_all": {
                "n": len(clean_all),
                "p50": _ms(percentile(clean_all, 0.5)),
                "p99": _ms(percentile(clean_all, 0.99)),
            },
            "all_calls": {
                "n": len(all_lat),
                "p50": _ms(percentile(all_lat, 0.5)),
                "p99": _ms(percentile(all_lat, 0.99)),
            },
        },
    }


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000, 1)


def slope_mib_per_min(samples: list[dict[str, Any]]) -> float | None:
    """Least-squares RSS trend over the second half of the samples (the first half still warms caches)."""
    half = samples[len(samples) // 2 :]
    if len(half) < 3:
        return None
    xs = [s["t"] for s in half]
    ys = [s["rss"] / MiB for s in half]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    if var == 0:
        return None
    return round(sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var * 60.0, 2)


def print_report(summary: dict[str, Any]) -> None:
    out = print
    cfg = summary["config"]
    calls = summary["calls"]
    out("")
    out(
        f"Soak: {cfg['load_s']:.0f} s at concurrency {cfg['concurrency']} after a {cfg['warmup_s']:.0f} s warm-up, "
        f"seed {cfg['seed']}, upstream_timeout_s {cfg['upstream_timeout_s']:g}; "
        f"{calls['calls']} calls, {summary['throughput_rps']:.0f} calls/s in the load phase"
    )
    out(
        f"CPU seconds over {summary['wall_s']:.0f} s wall on {cfg['cpus']} CPUs: "
        + ", ".join(f"{k} {v}" for k, v in summary["cpu_s"].items())
    )
    out("")
    out("Calls by kind (api/stream/correlation)")
    for kind, n in calls["calls_by_kind"].items():
        out(f"  {kind:<28} {n:>7}")
    out("")
    out(f"  {'fault':<18} {'calls':>6}  {'p50 ms':>7} {'p99 ms':>7}  outcomes                          unexpected")
    for name, e in calls["by_fault"].items():
        outcomes = ", ".join(f"{k} {v}" for k, v in sorted(e["outcomes"].items()))
        unexpected = ", ".join(f"{k} {v}" for k, v in e["unexpected"].items()) or "0"
        out(f"  {name:<18} {e['calls']:>6}  {_fmt(e['p50_ms']):>7} {_fmt(e['p99_ms']):>7}  {outcomes:<33} {unexpected}")
    out("")
    errors = ", ".join(f"{k} {v}" for k, v in calls["errors_by_kind"].items())
    out("Errors by kind (client view): " + (errors or "none"))
    out("")
    out(
        f"  {'latency, no fault':<22} {'n':>7} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7} "
        f"{'1st byte p50':>13} {'p99':>6}"
    )
    for key, v in calls["latency_ms"]["clean"].items():
        out(
            f"  {key:<22} {v['n']:>7} {_fmt(v['p50']):>7} {_fmt(v['p99']):>7} {_fmt(v['max']):>7} "
            f"{_fmt(v['first_byte_p50']):>13} {_fmt(v['first_byte_p99']):>6}"
        )
    ca, aa = calls["latency_ms"]["clean_all"], calls["latency_ms"]["all_calls"]
    out(f"  {'all without fault':<22} {ca['n']:>7} {_fmt(ca['p50']):>7} {_fmt(ca['p99']):>7}")
    out(f"  {'all calls':<22} {aa['n']:>7} {_fmt(aa['p50']):>7} {_fmt(aa['p99']):>7}")
    rec = summary["records"]
    out("")
    out(
        f"Records: expected {rec['expected']} {rec['expected_by_status']}; on disk {rec['files_on_disk']} "
        f"{rec['found_by_status']}; missing {rec['missing_count']}, extra {rec['extra_count']}, duplicates "
        f"{rec['duplicates']}, wrong status {rec['status_mismatch_count']}, uncorrelated recorded "
        f"{rec['uncorrelated_recorded']}"
    )
    cap = summary["capture_health"]
    out(
        f"  /health capture before SIGTERM: written {cap.get('written')}, failed {cap.get('failed')}, dropped "
        f"{cap.get('dropped')}, queue_depth {cap.get('queue_depth')}, sessions {cap.get('sessions')}"
    )
    out(
        f"  reads during load: {dict(summary['reads'])}, GET completions p50/p99 "
        f"{_fmt(summary['read_latency_ms']['p50'])}/{_fmt(summary['read_latency_ms']['p99'])} ms, GET /v1/sessions "
        f"max {_fmt(summary['list_latency_ms']['max'])} ms"
    )
    res = summary["resources"]
    s, e = res["start"], res["end"]
    out("")
    out("Server process (this server + hosted Switchyard), each figure taken idle, after the keep-alive expiry:")
    out(
        f"  RSS {s['rss'] / MiB:.1f} -> {e['rss'] / MiB:.1f} MiB ({res['rss_change_pct']:+.1f} %, limit "
        f"+{cfg['rss_tolerance'] * 100:.0f} % + {res['rss_allowed_for_data'] / MiB:.1f} MiB for the "
        f"{s['sessions']} -> {summary['sessions_api']['sessions']} sessions held); peak under load "
        f"{res['rss_peak_mib']:.1f} MiB; trend over the second half {res['rss_slope_mib_per_min']} MiB/min"
    )
    f = res["fresh"]
    out(
        f"  fds {f['fds']} before any load, {s['fds']} after the warm-up, {e['fds']} at the end (limit: before "
        f"+{cfg['fd_slack']})"
    )
    out(
        f"  TCP {f['tcp']} before any load, {s['tcp']} after the warm-up, {e['tcp']} at the end (limit: before "
        f"+{cfg['tcp_slack']}) {e['tcp_by_state']}; threads {s['threads']} -> {e['threads']}"
    )
    out("")
    out(f"  {'t s':>6} {'RSS MiB':>8} {'fds':>5} {'tcp':>5} {'threads':>7} {'calls':>7} {'queue':>6}")
    for sample in summary["samples"]:
        out(
            f"  {sample['t']:>6.0f} {sample['rss'] / MiB:>8.1f} {sample['fds']:>5} {sample['tcp']:>5} "
            f"{sample['threads']:>7} {sample['calls']:>7} {_fmt(sample.get('queue_depth')):>6}"
        )
    out("")
    out(
        f"Shutdown: SIGTERM -> exit {summary['server_exit']['code']} in {summary['server_exit']['seconds']:.1f} s; "
        f"mock after drain {summary['mock_stats']}"
    )
    out("")
    for inv in summary["invariants"]:
        out(f"  {'PASS' if inv['ok'] else 'FAIL'}  {inv['name']}: {inv['detail']}")
    out("")
    out("RESULT: " + ("PASS" if summary["passed"] else "FAIL"))


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.0f}" if value >= 10 else f"{value:.1f}"
    return str(value)


def invariants(summary: dict[str, Any], opts: Options) -> list[dict[str, Any]]:
    calls, rec, res, cap = summary["calls"], summary["records"], summary["resources"], summary["capture_health"]
    checks: list[tuple[str, bool, str]] = []
    exercised = {name for name, e in calls["by_fault"].items() if e["calls"] > 0}
    wanted = {f.name for f in fault_table(opts.fault_scale)} | {"none"}
    checks.append(
        (
            "every fault kind was exercised",
            wanted <= exercised,
            f"missing {sorted(wanted - exercised)}" if wanted - exercised else f"{len(wanted)} kinds",
        )
    )
    checks.append(
        (
            "every call ended as its fault predicts",
            calls["unexpected"] == 0,
            f"{calls['unexpected']} unexpected outcomes",
        )
    )
    exact = (
        rec["missing_count"] == 0
        and rec["extra_count"] == 0
        and rec["duplicates"] == 0
        and rec["files_on_disk"] == rec["expected"] + rec["uncertain_recorded"]
    )
    checks.append(
        (
            "record files == correlated calls that must be recorded",
            exact,
            f"expected {rec['expected']}, files {rec['files_on_disk']}, missing {rec['missing_count']}, "
            f"extra {rec['extra_count']}, duplicates {rec['duplicates']}",
        )
    )
    checks.append(
        (
            "each record has the status its call implies",
            rec["status_mismatch_count"] == 0,
            f"{rec['status_mismatch_count']} mismatches",
        )
    )
    checks.append(
        ("no record for an uncorrelated call", rec["uncorrelated_recorded"] == 0, f"{rec['uncorrelated_recorded']}")
    )
    checks.append(
        (
            "every file is a whole record in its session's directory, no temp files left",
            rec["unparseable_files"] == 0 and rec["stray_files"] == 0 and rec["wrong_session_dir"] == 0,
            f"unparseable {rec['unparseable_files']}, stray {rec['stray_files']}, misplaced {rec['wrong_session_dir']}",
        )
    )
    counters_ok = (
        cap.get("written") == rec["files_on_disk"]
        and cap.get("failed") == 0
        and cap.get("dropped") == 0
        and cap.get("queue_depth") == 0
    )
    checks.append(
        (
            "capture counters agree with the disk",
            counters_ok,
            f"written {cap.get('written')} vs files {rec['files_on_disk']}, failed {cap.get('failed')}, "
            f"dropped {cap.get('dropped')}, queue {cap.get('queue_depth')}",
        )
    )
    sessions_ok = (
        summary["sessions_api"]["sessions"] == summary["sessions_api"]["expected_sessions"]
        and summary["sessions_api"]["record_count_sum"] == rec["files_on_disk"]
    )
    checks.append(
        ("GET /v1/sessions lists every recorded session and record", sessions_ok, f"{summary['sessions_api']}")
    )
    reads = summary["reads"]
    bad_reads = sum(n for k, n in reads.items() if k not in ("read_match", "list_ok"))
    checks.append(("reads during the load answered and matched", bad_reads == 0, f"{dict(reads)}"))
    data = res["data_memory"]
    checks.append(
        (
            f"RSS end <= start + {opts.rss_tolerance * 100:.0f} % + what the sessions recorded meanwhile take",
            res["end"]["rss"] <= res["start"]["rss"] * (1 + opts.rss_tolerance) + res["rss_allowed_for_data"],
            f"{res['start']['rss'] / MiB:.1f} -> {res['end']['rss'] / MiB:.1f} MiB, allowed "
            f"{(res['start']['rss'] * (1 + opts.rss_tolerance) + res['rss_allowed_for_data']) / MiB:.1f} MiB (a new "
            f"server holding these sessions: {data['data'] / MiB:.1f} MiB, on an empty directory {data['empty'] / MiB:.1f})",
        )
    )
    # fds and connections go back to what they were before any load: compare with the fresh baseline.
    f, e = res["fresh"], res["end"]
    checks.append(
        (
            f"open fds idle after the load <= before any load + {opts.fd_slack}",
            e["fds"] <= f["fds"] + opts.fd_slack,
            f"{f['fds']} before, {res['start']['fds']} after warm-up, {e['fds']} at the end",
        )
    )
    checks.append(
        (
            f"TCP connections idle after the load <= before any load + {opts.tcp_slack}",
            e["tcp"] <= f["tcp"] + opts.tcp_slack,
            f"{f['tcp']} before, {res['start']['tcp']} after warm-up, {e['tcp']} at the end",
        )
    )
    checks.append(
        (
            "no upstream call left in flight after the drain",
            summary["mock_stats"].get("in_flight") == 0,
            f"in_flight {summary['mock_stats'].get('in_flight')}",
        )
    )
    # uvicorn re-raises the signal after its graceful shutdown, so -SIGTERM is the clean end too;
    # a server that needed SIGKILL shows -9.
    checks.append(
        (
            "SIGTERM: graceful exit, no SIGKILL needed",
            summary["server_exit"]["code"] in (0, -signal.SIGTERM),
            f"exit {summary['server_exit']['code']} in {summary['server_exit']['seconds']:.1f} s",
        )
    )
    checks.append(
        ("server logged no unhandled exception", summary["server_log"]["tracebacks"] == 0, f"{summary['server_log']}")
    )
    return [{"name": n, "ok": ok, "detail": d} for n, ok, d in checks]


# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> tuple[Options, argparse.Namespace]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=3.0, help="length of the load phase (default 3)")
    p.add_argument("--quick", action="store_true", help="30 s of load after a 5 s warm-up")
    p.add_argument("--warmup", type=float, default=None, help="warm-up seconds (default 20; 5 with --quick)")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--upstream-timeout", type=float, default=2.0, help="the server's upstream_timeout_s")
    p.add_argument("--client-timeout", type=float, default=30.0, help="per-call client timeout (a breach is an error)")
    p.add_argument("--fault-scale", type=float, default=1.0, help="multiply every fault rate (default rates: 1-3 %%)")
    p.add_argument("--correlated", type=float, default=0.75, help="share of sessions that send x-session-id")
    p.add_argument("--sample-every", type=float, default=5.0, help="seconds between resource samples")
    p.add_argument(
        "--settle",
        type=float,
        default=7.0,
        help="idle seconds before the start and end measurements (past the 5 s keep-alive expiry)",
    )
    p.add_argument("--rss-tolerance", type=float, default=0.10, help="allowed RSS growth, start to end (0.10 = 10 %%)")
    p.add_argument("--fd-slack", type=int, default=8)
    p.add_argument("--tcp-slack", type=int, default=8)
    p.add_argument("--max-calls", type=int, default=2_000_000, help="hard cap on calls, whatever the time")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra server setting for the YAML config (value parsed as YAML), repeatable",
    )
    p.add_argument("--json", help="write the summary here")
    p.add_argument("--workdir", help="where logs and captures go (default: a new temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the capture dir (it is removed after a pass)")
    args = p.parse_args(argv)
    import yaml

    extra: dict[str, Any] = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            p.error(f"--set wants KEY=VALUE, got {item!r}")
        extra[key.strip()] = yaml.safe_load(value)
    if args.upstream_timeout <= 0.5:
        p.error("--upstream-timeout must exceed the 0.5 s client abort")
    minutes = 0.5 if args.quick else args.minutes
    warmup = args.warmup if args.warmup is not None else (5.0 if args.quick else 20.0)
    opts = Options(
        minutes=minutes,
        warmup_s=warmup,
        concurrency=args.concurrency,
        seed=args.seed,
        upstream_timeout_s=args.upstream_timeout,
        client_timeout_s=args.client_timeout,
        fault_scale=args.fault_scale,
        correlated_share=args.correlated,
        sample_every_s=args.sample_every,
        settle_s=args.settle,
        rss_tolerance=args.rss_tolerance,
        fd_slack=args.fd_slack,
        tcp_slack=args.tcp_slack,
        max_calls=args.max_calls,
        server_settings=extra,
    )
    return opts, args


def list_all_sessions(server_url: str, page_size: int = 1000, max_pages: int = 10_000) -> list[dict[str, Any]]:
    """Every session GET /v1/sessions knows, following its `after` cursor (bounded in pages)."""
    sessions: list[dict[str, Any]] = []
    params: dict[str, Any] = {"limit": page_size}
    for _ in range(max_pages):
        page = httpx.get(server_url + "/v1/sessions", params=params, timeout=120, trust_env=False).json()
        sessions += page["sessions"]
        if not page.get("has_more"):
            return sessions
        params["after"] = page["next_after"]
    raise RuntimeError(f"GET /v1/sessions still had more after {max_pages} pages")


def _terminate_on_sigterm(signum, frame) -> None:
    raise KeyboardInterrupt  # take the same clean-up path as Ctrl-C


def run(opts: Options, args: argparse.Namespace) -> int:
    own_workdir = not args.workdir
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="switchyard-soak-"))
    workdir.mkdir(parents=True, exist_ok=True)
    capture_dir = workdir / "captures"
    if capture_dir.exists():
        shutil.rmtree(capture_dir)  # the invariants count every file: start empty
    config = workdir / "soak-config.yaml"
    settings = {"upstream_timeout_s": opts.upstream_timeout_s, **opts.server_settings}
    config.write_text("".join(f"{k}: {orjson.dumps(v).decode()}\n" for k, v in settings.items()))
    children: list[Child] = []
    server_exit: dict[str, Any] = {"code": None, "seconds": 0.0}
    passed = False
    try:
        mock_port = free_port()
        mock = Child(
            "mock", [PY, "-m", "server.dev.mock_upstream", "--host", "127.0.0.1", "--port", str(mock_port)], workdir, {}
        )
        children.append(mock)
        mock_url = f"http://127.0.0.1:{mock_port}"
        mock.wait_http(mock_url + "/health", 60)
        port = free_port()
        server = start_server("server", port, capture_dir, config, workdir, mock_url)
        children.append(server)
        server_url = f"http://127.0.0.1:{port}"
        server.wait_http(server_url + "/health", 120)
        print(f"soak: mock pid {mock.pid}, server pid {server.pid}, logs and captures in {workdir}", flush=True)

        soak = Soak(opts, mock_url, server_url, server)
        # Before any load: the fd and connection baseline. A leak that fills the upstream pool during
        # the warm-up would otherwise hide in the post-warm-up baseline. One read of an unknown
        # session first: it starts the rollout worker process, whose pipes (about 11 fds) the server
        # opens once, at its first whole-session read, and keeps.
        httpx.get(server_url + "/v1/sessions/soak-before-any-load/completions", timeout=60.0, trust_env=False)
        soak.wait_idle()
        fresh = resources(server.ps)
        t0 = time.monotonic()
        me = psutil.Process()
        cpu0 = {c.name: sum(c.ps.cpu_times()[:2]) for c in children}
        cpu0["load_generator"] = sum(me.cpu_times()[:2])
        print(f"soak: warm-up {opts.warmup_s:.0f} s ...", flush=True)
        asyncio.run(soak.run_phase("warmup", opts.warmup_s, sample=False, t0=t0))
        warm_calls = len(soak.results)
        soak.wait_idle()
        start = resources(server.ps)
        start_health = httpx.get(server_url + "/health", timeout=30, trust_env=False).json().get("capture", {})
        start["sessions"] = start_health.get("sessions", 0)
        print(
            f"soak: load {opts.minutes * 60:.0f} s at concurrency {opts.concurrency} (start RSS "
            f"{start['rss'] / MiB:.1f} MiB, fds {start['fds']}, tcp {start['tcp']}) ...",
            flush=True,
        )
        load_s = asyncio.run(soak.run_phase("load", opts.minutes * 60.0, sample=True, t0=t0))
        load_calls = len(soak.results) - warm_calls
        idle = soak.wait_idle()
        end = resources(server.ps)
        cpu = {c.name: round(sum(c.ps.cpu_times()[:2]) - cpu0[c.name], 1) for c in children}
        cpu["load_generator"] = round(sum(me.cpu_times()[:2]) - cpu0["load_generator"], 1)
        wall = round(time.monotonic() - t0, 1)
        capture_health = httpx.get(server_url + "/health", timeout=30, trust_env=False).json().get("capture", {})
        listed = list_all_sessions(server_url)
        expected_sessions = {sid for sid, n in soak.records_due.items() if n > 0}
        sessions_api = {
            "sessions": len(listed),
            "expected_sessions": len(expected_sessions),
            "record_count_sum": sum(s.get("record_count", 0) for s in listed),
        }
        print("soak: SIGTERM to the server, then counting the files on disk ...", flush=True)
        code, seconds = server.terminate(60.0)
        server_exit = {"code": code, "seconds": seconds}
        log_text = server.log_path.read_text(errors="replace")
        server_log = {
            "tracebacks": log_text.count("Traceback"),
            "unhandled": log_text.count("unhandled error"),
            "error_lines": sum(1 for line in log_text.splitlines() if " ERROR " in line),
        }
        disk = scan_records(capture_dir)
        print("soak: what holding these sessions costs a new server ...", flush=True)
        data_memory = memory_for_the_data(capture_dir, config, workdir, mock_url)

        samples = soak.samples
        peak = max([s["rss"] for s in samples] + [start["rss"], end["rss"]])
        summary: dict[str, Any] = {
            "config": {
                "load_s": opts.minutes * 60.0,
                "warmup_s": opts.warmup_s,
                "concurrency": opts.concurrency,
                "seed": opts.seed,
                "upstream_timeout_s": opts.upstream_timeout_s,
                "client_timeout_s": opts.client_timeout_s,
                "fault_rates": {f.name: f.rate for f in soak.faults},
                "correlated_share": opts.correlated_share,
                "rss_tolerance": opts.rss_tolerance,
                "fd_slack": opts.fd_slack,
                "tcp_slack": opts.tcp_slack,
                "server_settings": settings,
                "cpus": os.cpu_count(),
                "python": sys.version.split()[0],
            },
            "calls": summarise(soak.results),
            "warmup_calls": warm_calls,
            "load_calls": load_calls,
            "throughput_rps": load_calls / load_s if load_s else 0.0,
            "cpu_s": cpu,
            "wall_s": wall,
            "records": check_records(soak.results, disk),
            "capture_health": capture_health,
            "sessions_api": sessions_api,
            "reads": dict(soak.reads),
            "read_latency_ms": {
                "p50": _ms(percentile(soak.read_latency, 0.5)),
                "p99": _ms(percentile(soak.read_latency, 0.99)),
            },
            "list_latency_ms": {"n": len(soak.list_latency), "max": _ms(max(soak.list_latency, default=None))},
            "resources": {
                "fresh": fresh,
                "start": start,
                "end": end,
                "rss_change_pct": (end["rss"] / start["rss"] - 1) * 100,
                "rss_peak_mib": peak / MiB,
                "rss_slope_mib_per_min": slope_mib_per_min(samples),
                "data_memory": data_memory,
                # The sessions recorded during the load: the share of `held` the end RSS may add.
                "rss_allowed_for_data": data_memory["held"]
                * max(0, len(listed) - start["sessions"])
                / max(1, len(listed)),
            },
            "samples": samples,
            "mock_stats": idle["mock"],
            "server_exit": server_exit,
            "server_log": server_log,
            "workdir": str(workdir),
        }
        summary["invariants"] = invariants(summary, opts)
        summary["passed"] = passed = all(i["ok"] for i in summary["invariants"])
        print_report(summary)
        if args.json:
            Path(args.json).write_bytes(orjson.dumps(summary, option=orjson.OPT_INDENT_2))
            print(f"summary written to {args.json}")
        if not passed or args.keep:
            print(f"logs and captures kept in {workdir}")
        return 0 if passed else 1
    finally:
        # Reverse order: the server first (it holds connections to the mock), each by its own pid.
        for child in reversed(children):
            child.terminate(30.0)
        # A passing run leaves nothing behind; a failing or interrupted one keeps its logs and records.
        if passed and not args.keep:
            shutil.rmtree(capture_dir, ignore_errors=True)
            if own_workdir:
                shutil.rmtree(workdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    opts, args = parse_args(argv)
    # Ctrl-C must reach the clean-up even when started from a shell that ignores SIGINT (`cmd &`).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _terminate_on_sigterm)
    signal.signal(signal.SIGHUP, _terminate_on_sigterm)
    try:
        return run(opts, args)
    except KeyboardInterrupt:
        print("\nsoak: interrupted; every process it started has been stopped", file=sys.stderr)
        return 130
    except (RuntimeError, TimeoutError) as exc:
        print(f"soak: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
