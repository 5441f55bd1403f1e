"""Scale-out figures: one per-rollout server's memory and time to ready; 1 vs 2 workers at c=64 vs direct Switchyard.

Usage: python bench/scale.py [--quick] [--json PATH]

- per-rollout server: `LocalServer(deployment="demo")` started N times in a row; time from
  `start()` to ready (the port file written after the lifespan), and the child's RSS and USS (memory
  only it holds; RSS also counts shared libraries) idle after start and after a rollout of 8 captured
  calls.
- workers: `serve --workers 1` (Switchyard hosted in the process) and `serve --workers 2` (one
  Switchyard process shared by both workers), each compared with direct calls to its own Switchyard,
  small captured chat calls at concurrency 64, interleaved in rounds (order flipped each round).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # `python bench/scale.py` puts bench/, not the repo, on sys.path

import httpx  # noqa: E402
import orjson  # noqa: E402
import psutil  # noqa: E402

from bench.procs import PY, LoadGen, Mock, Proc, free_port, make_log_dir  # noqa: E402
from server.spawn import LocalServer  # noqa: E402

SEED_MB_PER_PROXY = 94  # what the seed measured per dedicated proxy
SMALL_CHAT = orjson.dumps({"model": "demo", "messages": [{"role": "user", "content": "hi there"}]}).decode()


def log(message: str) -> None:
    print(f"[scale] {message}", file=sys.stderr, flush=True)


def mb(n: float) -> str:
    return f"{n / 2**20:.0f} MB"


def per_rollout_server(mock: Mock, log_dir: Path, runs: int) -> dict[str, Any]:
    ready_s, rss_idle, uss_idle, rss_used, uss_used = [], [], [], [], []
    for i in range(runs):
        server = LocalServer(deployment="demo", capture_dir=log_dir / f"local-{i}", env={"MOCK_UPSTREAM_URL": mock.v1})
        started = time.monotonic()
        with server:
            ready_s.append(time.monotonic() - started)
            ps = psutil.Process(server.pid)
            info = ps.memory_full_info()
            rss_idle.append(info.rss)
            uss_idle.append(info.uss)
            messages: list[dict] = [{"role": "user", "content": "step"}]
            for _ in range(8):  # one rollout's worth of captured calls
                reply = httpx.post(
                    server.base_url + "/chat/completions",
                    json={"model": "demo", "messages": messages},
                    headers={"x-session-id": f"bench-rollout-{i}"},
                    trust_env=False,
                    timeout=60,
                ).json()
                messages += [reply["choices"][0]["message"], {"role": "user", "content": "next"}]
            info = ps.memory_full_info()
            rss_used.append(info.rss)
            uss_used.append(info.uss)
        result = server.collect()
        assert not result["errors"] and len(result["rollouts"]) == 1, result["errors"]
    return {
        "runs": runs,
        "ready_s": ready_s,
        "rss_idle": rss_idle,
        "uss_idle": uss_idle,
        "rss_after_rollout": rss_used,
        "uss_after_rollout": uss_used,
    }


class WorkersServer:
    """`serve --workers N --deployment demo` on a free port, capture on."""

    def __init__(self, workers: int, mock: Mock, log_dir: Path) -> None:
        self.port = free_port()
        argv = [PY, "-m", "server.cli", "serve", "--deployment", "demo", "--port", str(self.port)]
        argv += ["--workers", str(workers), "--capture-dir", str(log_dir / f"captures-w{workers}")]
        self.proc = Proc(f"server-w{workers}", argv, log_dir, env={"MOCK_UPSTREAM_URL": mock.v1})
        self.url = f"http://127.0.0.1:{self.port}"
        health = self.proc.wait_http(self.url + "/health", timeout=180) or {}
        self.proxy_port = int(health["proxy"]["url"].rsplit(":", 1)[1])
        if workers > 1:
            self._wait_all_workers(workers)

    def _wait_all_workers(self, workers: int, timeout: float = 180) -> None:
        """Until `workers` distinct workers answer /health (the first to be ready answers first)."""
        seen: set[str] = set()
        deadline = time.monotonic() + timeout
        while len(seen) < workers and time.monotonic() < deadline:
            response = httpx.get(self.url + "/health", headers={"connection": "close"}, trust_env=False)
            if response.status_code == 200:
                seen.add(response.headers.get("x-switchyard-model-worker", ""))
            time.sleep(0.05)

    def cpu_s(self) -> float:
        total = 0.0
        for ps in [self.proc.ps, *self.proc.ps.children(recursive=True)]:
            try:
                times = ps.cpu_times()
                total += times.user + times.system
            except psutil.Error:
                pass
        return total


def workers_throughput(mock: Mock, gen: LoadGen, log_dir: Path, rounds: int, duration: float) -> dict[str, Any]:
    servers = {1: WorkersServer(1, mock, log_dir), 2: WorkersServer(2, mock, log_dir)}
    try:
        headers = [["x-session-id", "bench-w-{conn}"]]

        def spec(port: int, with_session: bool) -> dict[str, Any]:
            return {
                "port": port,
                "templates": [
                    {
                        "method": "POST",
                        "path": "/v1/chat/completions",
                        "headers": headers if with_session else [],
                        "body": SMALL_CHAT,
                    }
                ],
                "concurrency": 64,
                "duration": duration,
                "warmup": min(0.7, duration / 3),
                "timeout": 60,
            }

        series = {
            "direct_w1": lambda: spec(servers[1].proxy_port, False),
            "server_w1": lambda: spec(servers[1].port, True),
            "direct_w2": lambda: spec(servers[2].proxy_port, False),
            "server_w2": lambda: spec(servers[2].port, True),
        }
        for server in servers.values():  # warm: imports, first connections
            gen.run({**spec(server.port, True), "duration": 1.0, "warmup": 0.3})
        out: dict[str, list[float]] = {name: [] for name in series}
        errors: dict[str, int] = {name: 0 for name in series}
        for r in range(rounds):
            names = list(series) if r % 2 == 0 else list(reversed(series))
            for name in names:
                result = gen.run(series[name]())
                out[name].append(result["throughput"])
                errors[name] += result["errors"]
                log(f"round {r + 1}: {name} {result['throughput']:.0f} req/s ({result['errors']} errors)")
        return {"rps": out, "errors": errors}
    finally:
        for server in servers.values():
            server.proc.stop()


def report(local: dict[str, Any], workers: dict[str, Any]) -> list[tuple[str, str, str]]:
    med = statistics.median
    rows = [
        (
            "per-rollout server: time to ready",
            f"{med(local['ready_s']):.2f} s median",
            f"range {min(local['ready_s']):.2f}-{max(local['ready_s']):.2f} s over {local['runs']} starts",
        ),
        (
            "per-rollout server: RSS idle / after an 8-call rollout",
            f"{mb(med(local['rss_idle']))} / {mb(med(local['rss_after_rollout']))}",
            f"aim < {SEED_MB_PER_PROXY} MB (the seed's per proxy); range {mb(min(local['rss_after_rollout']))}-"
            f"{mb(max(local['rss_after_rollout']))}",
        ),
        (
            "per-rollout server: USS idle / after the rollout",
            f"{mb(med(local['uss_idle']))} / {mb(med(local['uss_after_rollout']))}",
            "memory only this process holds (shared libraries counted once per machine)",
        ),
    ]
    rps = workers["rps"]
    for n in (1, 2):
        ratios = [v / b for v, b in zip(rps[f"server_w{n}"], rps[f"direct_w{n}"]) if b]
        rows.append(
            (
                f"{n} worker{'s' if n > 1 else ''}, captured chat, c=64",
                f"{med(rps[f'server_w{n}']):.0f} req/s vs direct {med(rps[f'direct_w{n}']):.0f}",
                f"ratio {med(ratios):.2f} (rounds {min(ratios):.2f}-{max(ratios):.2f}); "
                f"errors {workers['errors'][f'server_w{n}']}",
            )
        )
    gain = [b / a for a, b in zip(rps["server_w1"], rps["server_w2"]) if a]
    rows.append(("2 workers / 1 worker", f"{med(gain):.2f}x", f"rounds {min(gain):.2f}-{max(gain):.2f}"))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer starts and rounds, shorter series")
    parser.add_argument("--json", help="write the raw figures here")
    args = parser.parse_args(argv)
    runs, rounds, duration = (2, 1, 1.5) if args.quick else (5, 3, 4.0)
    log_dir = make_log_dir()
    log(f"logs in {log_dir}")
    mock = Mock(log_dir)
    gen = LoadGen(log_dir)
    try:
        local = per_rollout_server(mock, log_dir, runs)
        log("per-rollout server measured")
        workers = workers_throughput(mock, gen, log_dir, rounds, duration)
    except BaseException:
        log(f"failed; process logs kept in {log_dir}")
        raise
    finally:
        gen.stop()
        mock.proc.stop()
    shutil.rmtree(log_dir, ignore_errors=True)  # as bench/run.py: logs (and ~90 MB of captures) kept only on failure
    rows = report(local, workers)
    width = max(len(r[0]) for r in rows)
    for figure, value, note in rows:
        print(f"{figure:<{width}}  {value:<28}  {note}")
    if args.json:
        Path(args.json).write_bytes(orjson.dumps({"local": local, "workers": workers}, option=orjson.OPT_INDENT_2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
