"""Server memory under maximum-size request bodies: peak and held RSS against the body bytes in flight.

Usage: python bench/bodies.py [--quick] [--counts 1,4,8] [--json PATH]

The stack: the mock upstream, and `serve --deployment demo` (Switchyard hosted in the server's
process, capture on). For each N, N clients at once each send one chat body of 19,999 messages just
under `max_body_bytes` (32 MiB), on one session each (so each call is captured); `--api responses`
sends the same as 19,999 Responses input items (stored: the response store keeps each), `--api
messages` as an Anthropic Messages body. The server's RSS
(its process and its children) is sampled every 10 ms from before the first byte until every call
has answered; "held" is its RSS once they all answered and the server went idle for a moment.

The figures, per N: how many calls the server took (the rest got the fast 503 of the body budget,
`max_body_bytes_in_flight`), the bytes of those bodies, and `peak / in flight`: the server's RSS
peak above its idle RSS, divided by the bytes of the bodies it took at once. The target is at most 3.
Each message is one long word, so the mock's token ids (one per word) stay small beside the body:
the figure is about the request, not about a long prompt's token ids coming back.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # `python bench/bodies.py` puts bench/, not the repo, on sys.path

import httpx  # noqa: E402
import orjson  # noqa: E402
import psutil  # noqa: E402

from bench.procs import PY, Proc, free_port, make_log_dir  # noqa: E402

MAX_BODY_BYTES = 32 * 1024 * 1024
MESSAGES = 19_999


class BigMock:
    """The mock upstream with a context long enough to take a maximum-size body (a real engine
    refuses one with a 400, which costs this server the same up to the answer)."""

    def __init__(self, log_dir: Path) -> None:
        self.port = free_port()
        argv = [PY, "-m", "server.dev.mock_upstream", "--host", "127.0.0.1", "--port", str(self.port)]
        self.proc = Proc("mock", [*argv, "--max-model-len", "100000000"], log_dir)
        self.proc.wait_http(f"http://127.0.0.1:{self.port}/health")
        self.v1 = f"http://127.0.0.1:{self.port}/v1"


class Switchyard:
    """Switchyard's native server in a process of its own (what `--attached` attaches to)."""

    def __init__(self, mock: BigMock, log_dir: Path) -> None:
        self.port = free_port()
        argv = [PY, "-m", "server.switchyard.host", "--config", "demo", "--port", str(self.port)]
        self.proc = Proc("switchyard", argv, log_dir, env={"MOCK_UPSTREAM_URL": mock.v1})
        self.proc.wait_http(f"http://127.0.0.1:{self.port}/health")
        self.v1 = f"http://127.0.0.1:{self.port}/v1"


def log(message: str) -> None:
    print(f"[bodies] {message}", file=sys.stderr, flush=True)


# The path of each API, the field its list of messages (or input items) goes in, and the other fields it needs.
APIS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "chat": ("/v1/chat/completions", "messages", {}),
    "responses": ("/v1/responses", "input", {}),
    "messages": ("/v1/messages", "messages", {"max_tokens": 16}),
}


def max_body(
    limit: int = MAX_BODY_BYTES, messages: int = MESSAGES, field: str = "messages", extra: dict[str, Any] | None = None
) -> bytes:
    """A body of `messages` messages (or input items), as close under `limit` bytes as one word each allows."""
    fields = {"model": "demo", **(extra or {})}
    shell = orjson.dumps({**fields, field: [{"role": "user", "content": ""}] * messages})
    word = (limit - len(shell) - 64) // messages
    body = orjson.dumps({**fields, field: [{"role": "user", "content": "w" * word}] * messages})
    assert len(body) <= limit, len(body)
    return body


def tree_rss(process: psutil.Process) -> int:
    total = 0
    for each in [process, *process.children(recursive=True)]:
        try:
            total += each.memory_info().rss
        except psutil.Error:
            pass
    return total


class Peak:
    """The highest RSS of a process tree, sampled every 10 ms on a thread of its own."""

    def __init__(self, process: psutil.Process) -> None:
        self.process = process
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, tree_rss(self.process))
            time.sleep(0.01)

    def __enter__(self) -> Peak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def settle(process: psutil.Process, seconds: float = 3.0) -> int:
    """The tree's RSS once it has stopped falling for a moment (the writer finishing, arenas trimmed)."""
    time.sleep(seconds)
    return tree_rss(process)


class Stack:
    """This server (hosted Switchyard, or attached to `switchyard`), capture on, on a fresh port."""

    def __init__(
        self, name: str, mock: BigMock, log_dir: Path, settings: dict[str, Any], sy: Switchyard | None
    ) -> None:
        self.port = free_port()
        values = {"capture_dir": str(log_dir / f"cap-{name}"), **settings}
        args = ["-m", "server.cli", "serve", "--port", str(self.port)]
        if sy is None:
            args += ["--deployment", "demo"]
        else:
            values |= {"switchyard_base_url": sy.v1, "switchyard_model": "demo"}
        config = log_dir / f"{name}.yaml"
        config.write_text("".join(f"{key}: {orjson.dumps(value).decode()}\n" for key, value in values.items()))
        self.proc = Proc(name, [PY, *args, "--config", str(config)], log_dir, env={"MOCK_UPSTREAM_URL": mock.v1})
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc.wait_http(self.url + "/health", timeout=90.0)

    def wait_capture_idle(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            health = httpx.get(self.url + "/health", timeout=10.0, trust_env=False).json()
            if int(health.get("capture", {}).get("queue_depth", 0)) == 0:
                return
            time.sleep(0.1)


def round_of(stack: Stack, body: bytes, n: int, sy: Switchyard | None, path: str) -> dict[str, Any]:
    process = psutil.Process(stack.proc.pid)
    sy_process = psutil.Process(sy.proc.pid) if sy is not None else None
    # One small call first: what the first call loads (lazy imports, pools) is not the bodies' cost.
    small = orjson.dumps({"model": "demo", "messages": [{"role": "user", "content": "warm up"}]})
    httpx.post(
        stack.url + "/v1/chat/completions",
        content=small,
        headers={"content-type": "application/json", "x-session-id": "warm-up"},
        trust_env=False,
        timeout=60,
    ).raise_for_status()
    stack.wait_capture_idle()
    idle = settle(process, 1.0)
    sy_idle = tree_rss(sy_process) if sy_process is not None else 0
    statuses: list[int] = [0] * n
    barrier = threading.Barrier(n)

    def one(i: int) -> None:
        with httpx.Client(trust_env=False, timeout=300) as client:
            barrier.wait()
            reply = client.post(
                stack.url + path,
                content=body,
                headers={"content-type": "application/json", "x-session-id": f"bodies-{n}-{i}"},
            )
            statuses[i] = reply.status_code

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    sy_peak = Peak(sy_process) if sy_process is not None else None
    with Peak(process) as peak:
        if sy_peak is not None:
            sy_peak.__enter__()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if sy_peak is not None:
            sy_peak.__exit__()
    stack.wait_capture_idle()
    held = settle(process)
    taken = statuses.count(200)
    in_flight = taken * len(body)
    return {
        "n": n,
        "mode": "hosted" if sy is None else "attached",
        "taken": taken,
        "refused": statuses.count(503),
        "other": [s for s in statuses if s not in (200, 503)],
        "body_bytes": len(body),
        "in_flight_bytes": in_flight,
        "idle_rss": idle,
        "peak_rss": peak.peak,
        "held_rss": held,
        "peak_ratio": (peak.peak - idle) / in_flight if in_flight else None,
        "held_ratio": (held - idle) / in_flight if in_flight else None,
        "switchyard_peak_above_idle": (sy_peak.peak - sy_idle) if sy_peak is not None else None,
    }


def mib(n: float) -> str:
    return f"{n / 2**20:.0f} MiB"


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="N = 1 and 4 only")
    parser.add_argument("--counts", default="1,4,8", help="the concurrent calls of each round")
    parser.add_argument(
        "--attached",
        action="store_true",
        help="Switchyard in a process of its own: the server's figure without Switchyard's share",
    )
    parser.add_argument("--api", choices=sorted(APIS), default="chat", help="the endpoint the bodies go to")
    parser.add_argument("--json", help="write the rounds here as JSON")
    parser.add_argument("--setting", action="append", default=[], help="KEY=JSON, a server setting (repeatable)")
    args = parser.parse_args()
    counts = [1, 4] if args.quick else [int(c) for c in args.counts.split(",")]
    settings = {key: orjson.loads(value) for key, _, value in (s.partition("=") for s in args.setting)}
    log_dir = make_log_dir()
    path, field, extra = APIS[args.api]
    body = max_body(field=field, extra=extra)
    log(f"{path} body: {MESSAGES} {field}, {len(body):,} bytes; logs in {log_dir}")
    mock = BigMock(log_dir)
    rounds = []
    try:
        for n in counts:
            # A fresh stack per round: each starts from the same idle heap.
            sy = Switchyard(mock, log_dir) if args.attached else None
            stack = Stack(f"server-{n}", mock, log_dir, settings, sy)
            try:
                rounds.append(round_of(stack, body, n, sy, path))
            finally:
                stack.proc.stop()
                if sy is not None:
                    sy.proc.stop()
    finally:
        mock.proc.stop()
    mode = "attached (server process only)" if args.attached else "hosted (server and Switchyard, one process)"
    print(f"server memory under {len(body):,}-byte {path} bodies, {mode}")
    print(
        f"{'N':>3} {'taken':>5} {'503':>4} {'in flight':>10} {'idle':>9} {'peak':>9} {'held':>9}  peak/in flight  held/in flight"
    )
    for r in rounds:
        ratio = f"{r['peak_ratio']:.2f}" if r["peak_ratio"] is not None else "-"
        held = f"{r['held_ratio']:.2f}" if r["held_ratio"] is not None else "-"
        line = (
            f"{r['n']:>3} {r['taken']:>5} {r['refused']:>4} {mib(r['in_flight_bytes']):>10} {mib(r['idle_rss']):>9} "
            f"{mib(r['peak_rss']):>9} {mib(r['held_rss']):>9}  {ratio:>14}  {held:>14}"
        )
        if r["switchyard_peak_above_idle"] is not None:
            line += f"  (Switchyard's own process: peak +{mib(r['switchyard_peak_above_idle'])})"
        print(line + (f"  other: {r['other']}" if r["other"] else ""))
    if args.json:
        Path(args.json).write_text(orjson.dumps(rounds, option=orjson.OPT_INDENT_2).decode())
    return 0 if all(not r["other"] for r in rounds) else 1


if __name__ == "__main__":
    sys.exit(main())
