"""The `reads` section's helpers: a capture directory with a long session and many small ones, and the readers that load a server.

`populate` writes records straight into the layout the store reads (`sessions/<sha256(id)>/<uuid>.json`),
built by `build_record`: one 200-call agent session (contexts to 64k tokens, about 50 MB) under
LONG_COPIES ids, and
`sessions` small sessions of `records_per_session` records of about `record_kib` KiB each.
`Readers` runs in a thread of the bench process: it rebuilds the long session's rollout and pages
through `GET /v1/sessions` in a loop until stopped, counting what it did.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson
import psutil

from bench import recon
from bench.calls import CHAT, CHAT_TOKEN_MARK, chat_body, template
from bench.harness import Bench
from bench.procs import Server
from bench.stats import errors, fmt_lat, median, pct, pool, summary, verdict
from server.capture.write.record import build_record

# The reads section's streams: paced like a model's tokens (the first one comes after one pace).
READS_STREAM = "Explain the plan step by step. [[mock:tokens 20]] [[mock:slow 100]]"
READS_STREAM_S = 2.0
LONG_SESSION = "bench-reads-long"
LONG_COPIES = 8  # the long session under 8 ids, so 8 rebuilds at once are 8 different ones


def long_id(copy: int) -> str:
    return LONG_SESSION if copy == 0 else f"{LONG_SESSION}-{copy}"


def _write(sessions_dir: Path, session_id: str, uuid: str, data: bytes) -> None:
    directory = sessions_dir / hashlib.sha256(session_id.encode()).hexdigest()
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    (directory / f"{uuid}.json").write_bytes(data)


def populate(
    capture_dir: Path, *, sessions: int = 10_000, records_per_session: int = 2, record_kib: int = 16
) -> dict[str, Any]:
    sessions_dir = capture_dir / "sessions"
    sessions_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    total_bytes = 0
    long = recon.synthetic_session(
        LONG_SESSION, calls=200, system_tokens=65536 - 199 * 300, gen_tokens=100, tool_tokens=200, seed=5
    )
    for raw in long:
        record = orjson.loads(raw)
        for copy in range(LONG_COPIES):
            record["session_id"] = long_id(copy)
            data = orjson.dumps(record)
            _write(sessions_dir, record["session_id"], record["uuid"], data)
            total_bytes += len(data)
    filler = "lorem ipsum dolor sit amet " * (record_kib * 1024 // 27)
    template = build_record(
        session_id="template",
        parent_session_id=None,
        rollout_id=None,
        request_id="req",
        chat_request={"messages": [{"role": "user", "content": filler}]},
        chat_response={
            "id": "c",
            "model": "policy",
            "prompt_token_ids": list(range(1000, 1200)),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "ok"},
                    "finish_reason": "stop",
                    "token_ids": [5, 6],
                    "logprobs": {"content": [{"logprob": -0.1}, {"logprob": -0.2}]},
                }
            ],
        },
        route="policy",
        api="chat",
        stream=False,
        latency_ms=1.0,
    )
    for s in range(sessions):
        session_id = f"bench-reads-{s:05d}"
        for k in range(records_per_session):
            record = {
                **template,
                "uuid": f"{s:08x}-0000-4000-8000-{k:012x}",
                "session_id": session_id,
                "captured_at": f"2026-01-01T00:{k // 60:02d}:{k % 60:02d}.{s:06d}+00:00",
                "parent_session_id": f"bench-reads-{s - s % 10:05d}" if s % 10 else None,
            }
            data = orjson.dumps(record)
            _write(sessions_dir, session_id, record["uuid"], data)
            total_bytes += len(data)
    return {
        "records": LONG_COPIES * len(long) + sessions * records_per_session,
        "sessions": sessions + LONG_COPIES,
        "bytes": total_bytes,
    }


def fetch_status(url: str, timeout: float = 120.0) -> int:
    """GET `url`, read the whole body into one reused buffer and drop it; the status.

    A lean reader, because on two cores its CPU is taken from the server being measured: httpx
    spends about 250 ms of CPU taking in a 43 MB rollout, `readinto` about 27 ms.
    """
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=timeout)
    try:
        conn.request("GET", parts.path + (f"?{parts.query}" if parts.query else ""))
        response = conn.getresponse()
        buffer = memoryview(bytearray(1 << 20))
        while response.readinto(buffer):
            pass
        return response.status
    finally:
        conn.close()


READ_ERRORS = (OSError, http.client.HTTPException)


def page_through_sessions(base_url: str) -> list[float]:
    """Every page of GET /v1/sessions (default limit); the seconds each request took, from sending it
    to its last byte. One client (one kept-alive connection) for all pages: a new httpx client per
    request costs the bench about 25 ms of CPU (its TLS context), which is not the server's."""
    took, after = [], None
    with httpx.Client(timeout=120.0, trust_env=False) as client:
        while True:
            t0 = time.perf_counter()
            response = client.get(base_url + "/v1/sessions", params={"after": after} if after else None)
            data = response.content
            took.append(time.perf_counter() - t0)
            body = orjson.loads(data)
            if not body.get("has_more"):
                return took
            after = body["next_after"]


class Readers:
    """Rebuilds the long session's rollout and pages through the session list, in a loop, in a thread."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.rebuilds: list[float] = []
        self.pages: list[float] = []
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-readers", daemon=True)

    def __enter__(self) -> Readers:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(180)

    def _run(self) -> None:
        while not self._stop.is_set():
            t0 = time.perf_counter()
            try:
                ok = fetch_status(f"{self.base_url}/v1/sessions/{LONG_SESSION}/rollout") == 200
                self.rebuilds.append(time.perf_counter() - t0)
                self.errors += not ok
                self.pages += page_through_sessions(self.base_url)
            except (httpx.HTTPError, *READ_ERRORS):
                self.errors += 1


# A process that only spins, under the lowest CPU priority, as the rebuild worker runs: what any
# background work costs the streams on this host, whatever it does.
_SPINNER = """
import os
if hasattr(os, "SCHED_IDLE"):
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
else:
    os.nice(19)
while True:
    pass
"""


@contextlib.contextmanager
def idle_spinner() -> Iterator[None]:
    """A CPU spinner at the lowest priority (SCHED_IDLE) for the duration; stopped by its pid."""
    spinner = subprocess.Popen([sys.executable, "-c", _SPINNER])
    try:
        yield
    finally:
        os.kill(spinner.pid, signal.SIGKILL)
        spinner.wait(10)


def tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process and its descendants so far."""
    total = 0.0
    root = psutil.Process(pid)
    for proc in [root, *root.children(recursive=True)]:
        try:
            times = proc.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


def tree_rss(pid: int) -> int:
    """RSS of a process and its children (the rebuild workers)."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for proc in procs:
        try:
            total += proc.memory_info().rss
        except psutil.Error:
            pass
    return total


def peak_rss_during(pid: int, requests: int, base_url: str) -> dict[str, Any]:
    """Rebuild `requests` copies of the long session at once; the process tree's RSS before and at peak."""
    before = tree_rss(pid)
    peak = before
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, tree_rss(pid))
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    statuses: list[int] = []

    def one(copy: int) -> None:
        try:
            statuses.append(fetch_status(f"{base_url}/v1/sessions/{long_id(copy)}/rollout"))
        except READ_ERRORS:
            statuses.append(0)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=one, args=(copy,)) for copy in range(requests)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    seconds = time.perf_counter() - t0
    done.set()
    sampler.join(5)
    return {
        "requests": requests,
        "rss_before": before,
        "rss_peak": peak,
        "seconds": seconds,
        "ok": sum(1 for s in statuses if s == 200),
    }


def dir_bytes(path: Path) -> int:
    return sum(os.path.getsize(os.path.join(root, name)) for root, _, names in os.walk(path) for name in names)


# The bench section


def reads(bench: Bench) -> None:
    """Reads (rollout rebuilds, the session list) beside streaming calls."""
    bench.log("reads: rollout rebuilds and session listing beside streams; startup on a full directory")
    sessions = 1000 if bench.quick else 10_000
    full_dir, empty_dir = bench.log_dir / "captures-reads", bench.log_dir / "captures-empty"
    t0 = time.perf_counter()
    made = populate(full_dir, sessions=sessions)
    bench.log(
        f"  populated {made['records']} records, {made['bytes'] / 2**20:.0f} MiB in {time.perf_counter() - t0:.0f} s"
    )
    out: dict[str, Any] = {"populated": made}

    # Startup: time until /health answers, on an empty directory and on the full one, alternated;
    # then until the session list answers (it waits for the index, built in the background).
    ready: dict[str, list[float]] = {"empty": [], "full": []}
    listed: dict[str, list[float]] = {"empty": [], "full": []}
    for r in range(1 if bench.quick else 3):
        for kind in ("empty", "full") if r % 2 == 0 else ("full", "empty"):
            t0 = time.perf_counter()
            started = Server(
                f"server-ready-{kind}",
                bench.mock,
                bench.log_dir,
                capture_dir=full_dir if kind == "full" else empty_dir,
            )
            ready[kind].append(time.perf_counter() - t0)
            httpx.get(started.url + "/v1/sessions?limit=1", trust_env=False, timeout=120).raise_for_status()
            listed[kind].append(time.perf_counter() - t0)
            started.proc.stop()
    out["ready_s"], out["sessions_listed_s"] = ready, listed
    ratio = median(ready["full"]) / median(ready["empty"])
    bench.row(
        "reads",
        f"ready on {made['records']} records ({made['bytes'] / 2**20:.0f} MiB) vs an empty directory",
        f"{median(ready['empty']):.2f} s",
        f"{median(ready['full']):.2f} s",
        f"{ratio:.2f}x (full {min(ready['full']):.2f}-{max(ready['full']):.2f} s); the session list answers "
        f"after {median(listed['full']):.2f} s ({median(listed['empty']):.2f} s empty), once indexed",
        "<= 2x",
        verdict(ratio <= 2, ""),
    )

    cache_off = {"rollout_cache_mb": 0}  # every rebuild below is a real one
    worker = Server("server-reads", bench.mock, bench.log_dir, capture_dir=full_dir, settings=cache_off)
    thread = Server(
        "server-reads-thread",
        bench.mock,
        bench.log_dir,
        capture_dir=full_dir,
        settings={**cache_off, "rollout_workers": 0},
    )
    try:
        # The session list side by side: the change journal (default) against a server that
        # revalidates every session directory on every read (`capture_index_rescan_s: 0`, the
        # former index), the order flipped each round; CPU of each server's process tree per page.
        scan = Server(
            "server-reads-scan",
            bench.mock,
            bench.log_dir,
            capture_dir=full_dir,
            settings={**cache_off, "capture_index_rescan_s": 0},
        )
        try:
            for server in (worker, thread, scan):  # each one's index built (in the background) before any figure
                httpx.get(server.url + "/v1/sessions?limit=1", trust_env=False, timeout=120).raise_for_status()
            listing = {"journal": (worker, [], [0.0]), "scan": (scan, [], [0.0])}
            for r in range(2 if bench.quick else 6):
                for name in ("journal", "scan") if r % 2 == 0 else ("scan", "journal"):
                    server, took, cpu = listing[name]
                    before = tree_cpu_s(server.proc.pid)
                    took += page_through_sessions(server.url)
                    cpu[0] += tree_cpu_s(server.proc.pid) - before
        finally:
            scan.proc.stop()
        out["list_page_s"] = {name: took for name, (_, took, _) in listing.items()}
        out["list_page_cpu_s"] = {name: cpu[0] / len(took) for name, (_, took, cpu) in listing.items()}
        pages, scanned = listing["journal"][1], listing["scan"][1]
        cpu_page = out["list_page_cpu_s"]
        bench.row(
            "reads",
            f"GET /v1/sessions, {made['sessions']} sessions, default page (p50 / p99): "
            "change journal vs every directory stat-ed per read",
            fmt_lat(scanned),
            fmt_lat(pages),
            f"p50 {median(scanned) / median(pages):.1f}x faster; server CPU per page "
            f"{cpu_page['journal'] * 1000:.1f} vs {cpu_page['scan'] * 1000:.1f} ms; {len(pages)} requests each",
            "<= 50 ms p50",
            verdict(median(pages) <= 0.05, ""),
        )

        # Agent-like streams that leave the machine room (about 1.1 of 2 cores when quiet), so the
        # time to first token measures stalls rather than a queue: 256 open at once, each 20
        # tokens paced 100 ms apart, the connections' starts spread over one stream's length.
        streams = 128 if bench.quick else 256
        spec = {
            "templates": [template(CHAT, chat_body(READS_STREAM, stream=True))],
            "concurrency": streams,
            "count": streams * (3 if bench.quick else 5),
            "warmup": streams,
            "ramp": READS_STREAM_S,
            "stream": True,
            "marker": CHAT_TOKEN_MARK,
        }
        # One series on each server first, not counted: the first one after a start opened every
        # connection and once read 505 ms at p99 where the rounds after it read 120-130.
        for server in (worker, thread):
            bench.run_one({**spec, "port": server.port, "count": streams, "warmup": 0}, server)
        results: dict[str, list[dict[str, Any]]] = {}
        readers_seen: dict[str, dict[str, Any]] = {}
        for r in range(1 if bench.quick else 3):
            order = [
                ("quiet", worker),
                ("reading", worker),
                ("spinner", worker),
                ("reading-thread", thread),
                ("quiet-thread", thread),
            ]
            for name, server in order if r % 2 == 0 else list(reversed(order)):
                if name.startswith("quiet"):
                    results.setdefault(name, []).append(bench.run_one({**spec, "port": server.port}, server))
                    continue
                if name == "spinner":
                    with idle_spinner():
                        results.setdefault(name, []).append(bench.run_one({**spec, "port": server.port}, server))
                    continue
                with Readers(server.url) as readers:
                    time.sleep(0.5)  # a rebuild is under way when the streams start
                    results.setdefault(name, []).append(bench.run_one({**spec, "port": server.port}, server))
                seen = readers_seen.setdefault(name, {"rebuilds": [], "pages": [], "errors": 0})
                seen["rebuilds"] += readers.rebuilds
                seen["pages"] += readers.pages
                seen["errors"] += readers.errors
        pooled = {name: pool(rs) for name, rs in results.items()}
        out["ttft"] = {name: summary(p) for name, p in pooled.items()}
        round_p99 = {n: [pct([x for x in r["marker"] if x is not None], 0.99) for r in rs] for n, rs in results.items()}
        out["ttft_round_p99_s"] = round_p99
        out["readers"] = readers_seen
        for label, quiet, busy in (
            ("rebuilds in a worker process (default)", "quiet", "reading"),
            ("rebuilds in a server thread (rollout_workers: 0)", "quiet-thread", "reading-thread"),
        ):
            q, b = pooled[quiet]["marker"], pooled[busy]["marker"]
            rise = pct(b, 0.99) - pct(q, 0.99)
            seen = readers_seen.get(busy, {"rebuilds": [], "pages": [], "errors": 0})
            bench.row(
                "reads",
                f"{streams} paced streams, time to first token, quiet vs while reading: {label}",
                fmt_lat(q),
                fmt_lat(b),
                f"p99 {rise * 1000:+.1f} ms, p50 {(median(b) - median(q)) * 1000:+.1f} ms; "
                f"{len(seen['rebuilds'])} rebuilds (p50 {median(seen['rebuilds']) if seen['rebuilds'] else float('nan'):.2f} s), "
                f"{len(seen['pages'])} list pages; p99 by round: quiet "
                + "/".join(f"{x * 1000:.0f}" for x in round_p99[quiet])
                + ", reading "
                + "/".join(f"{x * 1000:.0f}" for x in round_p99[busy])
                + " ms"
                + (f", {seen['errors']} reader errors" if seen["errors"] else ""),
                "p99 rise <= 20 ms" if busy == "reading" else "(control)",
                verdict(rise <= 0.02, errors(pooled[quiet], pooled[busy])) if busy == "reading" else "",
            )
        # The floor: what any process busy at the lowest priority beside the streams costs them on
        # this host, with no read at all (a loop doing nothing but spin, under SCHED_IDLE).
        q, b = pooled["quiet"]["marker"], pooled["spinner"]["marker"]
        bench.row(
            "reads",
            f"{streams} paced streams, time to first token, quiet vs beside an idle-class CPU spinner (no reads)",
            fmt_lat(q),
            fmt_lat(b),
            f"p99 {(pct(b, 0.99) - pct(q, 0.99)) * 1000:+.1f} ms, p50 {(median(b) - median(q)) * 1000:+.1f} ms; "
            "p99 by round: " + "/".join(f"{x * 1000:.0f}" for x in round_p99["spinner"]) + " ms",
            "(control: the host's floor)",
            "",
        )

        # Memory: one rebuild, then eight at once, on each server (process tree RSS).
        memory = {}
        for name, server in (("worker", worker), ("thread", thread)):
            memory[name] = {str(k): peak_rss_during(server.proc.pid, k, server.url) for k in (1, 8)}
        out["memory"] = memory
        for name, label in (("worker", "worker process"), ("thread", "server thread (control)")):
            one, eight = memory[name]["1"], memory[name]["8"]
            grow1 = (one["rss_peak"] - one["rss_before"]) / 2**20
            grow8 = (eight["rss_peak"] - eight["rss_before"]) / 2**20
            bench.row(
                "reads",
                f"rebuild memory (RSS rise of server + workers), 1 vs 8 at once: {label}",
                f"+{grow1:.0f} MiB",
                f"+{grow8:.0f} MiB",
                f"8 at once / 1: {grow8 / max(grow1, 1):.1f}x; peak {eight['rss_peak'] / 2**20:.0f} MiB, "
                f"{eight['ok']}/8 ok in {eight['seconds']:.1f} s",
                "bounded by one session" if name == "worker" else "(control)",
                verdict(grow8 <= 1.5 * max(grow1, 1) and eight["ok"] == 8, "") if name == "worker" else "",
            )
    finally:
        worker.proc.stop()
        thread.proc.stop()
    bench.data["reads"] = out
