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
from server.capture.record import build_record

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
