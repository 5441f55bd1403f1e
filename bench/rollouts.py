"""Section `rollouts`: N concurrent agent loops (Gym-scale), straight to Switchyard and through this server, in rounds.

Each loop is one rollout after another, each of TURNS turns: a streamed chat call paced like an
engine (a prefill wait before the first token, then tokens at a steady pace), then a pause like a
tool call, the conversation one exchange longer at each turn. Every loop opens a fresh connection
per call, as many clients do between turns, so connections track the calls in flight; the pacing
keeps the calls in flight near 37% of the loops (~12 s of call in every 32 s: 2 s to the first token,
then ~10 chunks 1 s apart). From 16,384 loops calls and tool calls are slower (paced 45 s and 100 s):
~6,300-7,000 calls in flight, what one process here may hold under the 20,000 open-file limit on the
direct path (Switchyard: two per call), at ~95 calls/s, a rate the 2-core host's direct path holds.

The server runs its Switchyard in a process of its own (`switchyard_command`), the same Switchyard
the direct rounds call, so both paths meet the same Switchyard and this server's process holds only
its own descriptors. For N = 4,096 the same load also goes through `--workers 2`.

Per N: calls/s against direct, errors, p50/p99 time to first token, the server's peak RSS and per
call in flight, its open descriptors, capture records against calls, and the first limit met;
while the loops run, a probe times `/health` and a fresh streamed call's first token every 0.5 s.
`BENCH_ROLLOUTS_LOOPS=256,1024`, `BENCH_ROLLOUTS_SECONDS=20`, `BENCH_ROLLOUTS_ROUNDS=1` and
`BENCH_ROLLOUTS_WORKERS_AT=256` (the N also run with `--workers 2`) shrink a run while developing.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import psutil

from bench.calls import CHAT, CHAT_TOKEN_MARK, TOKEN_FIELDS, template, words
from bench.harness import Bench
from bench.procs import PY, Server
from bench.stats import median, pct, verdict

TURNS = 4
FULL_LOOPS = (1024, 4096, 16384)
QUICK_LOOPS = (256,)
# (prefill ms, tokens, ms between tokens, pause s): full, about 12 s a call and 20 s a tool call.
FULL_PACE = (2000, 8, 1000, 20.0)
# From GYM_SCALE loops on, calls are paced at 45 s (~60 s as they ran here) and tool calls last
# 100 s: ~7,000 of 16,384 loops in flight at ~95 calls/s, less than FULL_PACE asks of 4,096 loops.
# At FULL_PACE, 16,384 loops asked 512 calls/s of a host that also runs the generator, Switchyard
# and the engine: calls took twice their pace, 12,049 were in flight, and the direct path failed.
GYM_SCALE = 16384
GYM_PACE = (5000, 8, 5000, 100.0)
QUICK_PACE = (500, 4, 250, 3.0)
WORKERS_AT = 4096  # the N also run through `--workers 2`
PROBE_EVERY_S = 0.5
PROBE_TIMEOUT_S = 10.0
PROBE_BODY = {
    "model": "demo",
    "messages": [{"role": "user", "content": "fresh call [[mock:tokens 4]]"}],
    "stream": True,
}


def rollout_turns(pace: tuple[int, int, int, float], token_fields: bool) -> list[str]:
    """One rollout's TURNS chat bodies, each the previous conversation plus one exchange (~120 tokens)."""
    prefill, tokens, slow, _ = pace
    directives = f"[[mock:sleep {prefill}]] [[mock:tokens {tokens}]] [[mock:slow {slow}]]"
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are an agent. " + words(200)},
        {"role": "user", "content": f"Solve the task. {words(60, 3)} {directives}"},
    ]
    bodies = []
    for turn in range(TURNS):
        body: dict[str, Any] = {"model": "demo", "messages": list(messages), "stream": True}
        if token_fields:
            body.update(TOKEN_FIELDS)
        bodies.append(orjson.dumps(body).decode())
        messages.append({"role": "assistant", "content": f"Calling the tool, step {turn}. " + words(40, turn)})
        messages.append({"role": "user", "content": f"Tool result {turn}: {words(80, turn + 7)} {directives}"})
    return bodies


def rollouts(bench: Bench) -> None:
    loops = _env_ints("BENCH_ROLLOUTS_LOOPS") or (QUICK_LOOPS if bench.quick else FULL_LOOPS)
    seconds = float(os.environ.get("BENCH_ROLLOUTS_SECONDS") or (10 if bench.quick else 45))
    rounds = int(os.environ.get("BENCH_ROLLOUTS_ROUNDS") or (1 if bench.quick else 2))
    command = f"{PY} -m server.switchyard.host --config {{deployment}} --port {{port}}"
    out: dict[str, Any] = {"turns": TURNS, "seconds": seconds, "runs": {}}
    bench.data["rollouts"] = out
    workers_at = int(os.environ.get("BENCH_ROLLOUTS_WORKERS_AT") or WORKERS_AT)
    variants = [(n, 1) for n in loops] + [(n, 2) for n in loops if n == workers_at]
    for n, workers in variants:
        label = f"{n} loops" + (", --workers 2" if workers > 1 else "")
        bench.log(f"rollouts: {label}, {rounds} round(s) each way")
        cap_dir = bench.log_dir / f"captures-rollouts-{n}-{workers}"
        server = Server(
            f"server-rollouts-{n}-{workers}",
            bench.mock,
            bench.log_dir,
            capture_dir=cap_dir,
            settings={"switchyard_command": command, "workers": workers},
        )
        try:
            pace = QUICK_PACE if bench.quick else GYM_PACE if n >= GYM_SCALE else FULL_PACE
            # A call counts when it starts and ends in the window: the window outlasts two calls.
            window = max(seconds, 2 * (pace[0] + pace[1] * pace[2]) / 1000)
            result = _run(bench, server, cap_dir, n, pace, window, rounds)
            result.update(pace=pace, window_s=window)
        finally:
            server.proc.stop(timeout=60)
        out["runs"][label] = result
        _rows(bench, label, n, workers, result)


def _env_ints(name: str) -> tuple[int, ...]:
    raw = os.environ.get(name, "").strip()
    return tuple(int(x) for x in raw.split(",") if x.strip()) if raw else ()


def _spec(port: int, bodies: list[str], n: int, pace: tuple[int, int, int, float], seconds: float, headers, run: str):
    prefill, tokens, slow, pause = pace
    call_s = (prefill + tokens * slow) / 1000
    cycle = call_s + pause
    return {
        "port": port,
        "templates": [template(CHAT, body, headers) for body in bodies],
        "concurrency": n,
        "turns": True,
        "pause": pause,
        "duration": seconds,
        "warmup": cycle,  # every loop has started (the ramp) before the window opens
        "ramp": cycle,
        "stream": True,
        "fresh": True,
        "timeout": 15 + call_s * 3,
        "marker": CHAT_TOKEN_MARK,
        "vars": {"run": run},
    }


def _run(bench, server: Server, cap_dir: Path, n: int, pace, seconds: float, rounds: int) -> dict[str, Any]:
    direct_bodies, via_bodies = rollout_turns(pace, True), rollout_turns(pace, False)
    res: dict[str, list[dict[str, Any]]] = {"direct": [], "server": []}
    probes: dict[str, list[dict[str, Any]]] = {"direct": [], "server": []}
    samples: list[dict[str, Any]] = []
    records: list[tuple[int, int]] = []
    idle_rss = _tree(server)["rss"]
    for r in range(rounds):
        for name in ("direct", "server") if r % 2 == 0 else ("server", "direct"):
            run = f"{int(time.time())}-{r}"
            if name == "direct":
                spec = _spec(server.proxy_port, direct_bodies, n, pace, seconds, None, run)
                probe_url = server.proxy_url + "/v1/chat/completions"
            else:
                headers = [("x-session-id", "bench-roll-{run}-{conn}-{roll}")]
                spec = _spec(server.port, via_bodies, n, pace, seconds, headers, run)
                probe_url = server.url + CHAT
            before = _count_records(cap_dir)
            cpu_before = _tree(server)["cpu"]
            with _Probe(server, probe_url, direct=name == "direct", sample=name == "server") as probe:
                result = bench.run_one(spec, server)
            result["cpu"]["server_tree"] = _tree(server)["cpu"] - cpu_before  # its workers too
            res[name].append(result)
            probes[name].append(probe.result())
            if name == "server":
                samples.extend(probe.samples)
                server.wait_capture_idle(timeout=120)
                # Records are written by the workers; the files say how many, whichever worker wrote them.
                # A call refused at admission (503) is never recorded, by design.
                answered = result["ok"] + result["errors"] - result["error_kinds"].get("http_503", 0)
                records.append((_count_records(cap_dir) - before, answered))
    return _summarise(res, probes, samples, records, idle_rss, n)


def _count_records(cap_dir: Path) -> int:
    count = 0
    for _, _, files in os.walk(cap_dir):
        count += sum(1 for f in files if f.endswith(".json") and len(f) == 41)  # <uuid>.json
    return count


def _tree(server: Server) -> dict[str, Any]:
    """The server's processes (workers included, its Switchyard process not): RSS and CPU summed, fds of the busiest."""
    rss = fds = 0
    cpu = 0.0
    try:
        procs = [server.proc.ps, *server.proc.ps.children(recursive=True)]
    except psutil.Error:
        return {"rss": 0, "fds": 0, "cpu": 0.0}
    for proc in procs:
        try:
            if any("server.switchyard.host" in part for part in proc.cmdline()):
                continue
            rss += proc.memory_info().rss
            fds = max(fds, proc.num_fds())
            times = proc.cpu_times()
            cpu += times.user + times.system
        except psutil.Error:
            continue
    return {"rss": rss, "fds": fds, "cpu": cpu}


class _Probe:
    """While a series runs: every PROBE_EVERY_S, `/health`'s latency (server rounds), a fresh streamed
    call's time to first token, and (server rounds) the server's RSS and open descriptors."""

    def __init__(self, server: Server, url: str, *, direct: bool, sample: bool) -> None:
        self.server, self.url, self.direct, self.sample = server, url, direct, sample
        self.health_s: list[float] = []
        self.switchyard_health_s: list[float] = []  # what the server's /health waits for (it asks Switchyard's)
        self.ttft_s: list[float] = []
        self.failed = 0
        self.samples: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self.body = dict(PROBE_BODY, **(TOKEN_FIELDS if direct else {}))
        # A new connection for every probe (none kept alive), from one client: making a client per
        # probe costs tens of milliseconds of this process's CPU (its TLS context), not the server's.
        self.client = httpx.Client(
            timeout=PROBE_TIMEOUT_S, trust_env=False, limits=httpx.Limits(max_keepalive_connections=0)
        )

    def _loop(self) -> None:
        while not self._stop.wait(PROBE_EVERY_S):
            if self.sample:
                self.samples.append({"t": time.monotonic(), **_tree(self.server)})
                self.health_s.append(self._health(self.server.url))
                self.switchyard_health_s.append(self._health(self.server.proxy_url))
            self.ttft_s.append(self._fresh_call())

    def _health(self, root: str) -> float:
        t0 = time.perf_counter()
        try:
            ok = self.client.get(root + "/health").status_code == 200
        except httpx.HTTPError:
            ok = False
        if not ok:
            self.failed += 1
            return PROBE_TIMEOUT_S
        return time.perf_counter() - t0

    def _fresh_call(self) -> float:
        t0 = time.perf_counter()
        try:
            with self.client.stream("POST", self.url, json=self.body) as reply:
                if reply.status_code == 200:
                    for chunk in reply.iter_bytes():
                        if CHAT_TOKEN_MARK.encode() in chunk:
                            return time.perf_counter() - t0
        except httpx.HTTPError:
            pass
        self.failed += 1
        return PROBE_TIMEOUT_S

    def __enter__(self) -> _Probe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(PROBE_TIMEOUT_S * 2 + 5)
        self.client.close()

    def result(self) -> dict[str, Any]:
        return {
            "health_s": self.health_s,
            "switchyard_health_s": self.switchyard_health_s,
            "ttft_s": self.ttft_s,
            "failed": self.failed,
        }


def _summarise(res, probes, samples, records, idle_rss: int, n: int) -> dict[str, Any]:
    def rates(name: str) -> list[float]:
        return [x["throughput"] for x in res[name]]

    direct, via = rates("direct"), rates("server")
    ratios = [v / d for v, d in zip(via, direct) if d]
    pooled = {name: [t for x in res[name] for t in x["marker"]] for name in res}  # pct drops the missing
    fresh = {name: [t for p in probes[name] for t in p["ttft_s"]] for name in probes}
    health = [t for p in probes["server"] for t in p["health_s"]]
    switchyard_health = [t for p in probes["server"] for t in p["switchyard_health_s"]]
    peak_rss = max((s["rss"] for s in samples), default=idle_rss)
    peak_fds = max((s["fds"] for s in samples), default=0)
    in_flight = max((x["peak_in_flight"] for x in res["server"]), default=0)
    direct_in_flight = max((x["peak_in_flight"] for x in res["direct"]), default=0)
    errors = {name: sum(x["errors"] for x in res[name]) for name in res}
    kinds: dict[str, int] = {}
    for x in res["server"]:
        for kind, count in x["error_kinds"].items():
            kinds[kind] = kinds.get(kind, 0) + count
    return {
        "loops": n,
        "direct_calls_per_s": direct,
        "server_calls_per_s": via,
        "ratios": ratios,
        "ratio": median(ratios) if ratios else 0.0,
        "errors": errors,
        "error_kinds": kinds,
        "direct_error_kinds": [x["error_kinds"] for x in res["direct"]],
        "ttft_p50": {name: pct(v, 0.5) for name, v in pooled.items()},
        "ttft_p99": {name: pct(v, 0.99) for name, v in pooled.items()},
        "fresh_ttft_p99": {name: pct(v, 0.99) for name, v in fresh.items()},
        "fresh_failed": {name: sum(p["failed"] for p in probes[name]) for name in probes},
        "health_max_s": max(health, default=0.0),
        "health_p99_s": pct(health, 0.99),
        "switchyard_health_max_s": max(switchyard_health, default=0.0),
        "idle_rss": idle_rss,
        "peak_rss": peak_rss,
        "rss_per_call_kib": (peak_rss - idle_rss) / in_flight / 1024 if in_flight else 0.0,
        "peak_fds": peak_fds,
        "peak_in_flight": in_flight,
        "direct_peak_in_flight": direct_in_flight,
        "records_vs_calls": records,
        "cpu": {name: [x["cpu"] for x in res[name]] for name in res},
        "first_limit": _first_limit(kinds, health, peak_fds, res["server"]),
    }


def _first_limit(kinds: dict[str, int], health: list[float], peak_fds: int, via: list[dict[str, Any]]) -> str:
    """The first bound the server met, as far as the figures show it."""
    if kinds.get("http_503"):
        return f"admission: {kinds['http_503']} calls answered 503 (max_calls_in_flight)"
    if kinds.get("timeout"):
        return f"{kinds['timeout']} calls without an answer in time"
    if kinds:
        return "errors: " + ", ".join(f"{k} {v}" for k, v in kinds.items())
    soft = psutil.Process().rlimit(psutil.RLIMIT_NOFILE)[0]
    if peak_fds > 0.9 * soft:
        return f"open files: {peak_fds} of {soft}"
    wall = sum(x["elapsed"] for x in via) or 1.0
    cores = sum(x["cpu"].get("server_tree", 0.0) for x in via) / wall
    if any(t > 1.0 for t in health):
        return f"/health over 1 s (server CPU {cores:.2f} cores)"
    return f"none met (server CPU {cores:.2f} cores over the windows)"


def _rows(bench: Bench, label: str, n: int, workers: int, r: dict[str, Any]) -> None:
    sec = "rollouts"
    err_via, err_direct = r["errors"]["server"], r["errors"]["direct"]
    spread = f" (rounds {min(r['ratios']):.2f}-{max(r['ratios']):.2f})" if len(r["ratios"]) > 1 else ""
    throughput_target = n == WORKERS_AT or workers > 1
    bench.row(
        sec,
        f"{label}: calls/s, in flight at peak",
        f"{median(r['direct_calls_per_s']):.0f} calls/s, {r['direct_peak_in_flight']} in flight",
        f"{median(r['server_calls_per_s']):.0f} calls/s, {r['peak_in_flight']} in flight",
        f"{r['ratio']:.2f}{spread}",
        ">= 0.8" if throughput_target else "(reported)",
        verdict(r["ratio"] >= 0.8, "") if throughput_target else "",
    )
    fresh_ratio = (
        r["fresh_ttft_p99"]["server"] / r["fresh_ttft_p99"]["direct"] if r["fresh_ttft_p99"]["direct"] else 0.0
    )
    big = n >= 16384
    bench.row(
        sec,
        f"{label}: errors; time to first token p50 / p99",
        f"{err_direct} errors; {r['ttft_p50']['direct']:.2f} / {r['ttft_p99']['direct']:.2f} s",
        f"{err_via} errors {r['error_kinds'] or ''}; {r['ttft_p50']['server']:.2f} / {r['ttft_p99']['server']:.2f} s",
        f"first limit met: {r['first_limit']}",
        "0 errors" if big else "(reported)",
        verdict(err_via == 0, "") if big else "",
    )
    bench.row(
        sec,
        f"{label}: /health max; a fresh call's first token p99",
        f"fresh {r['fresh_ttft_p99']['direct'] * 1000:.0f} ms",
        f"/health max {r['health_max_s'] * 1000:.0f} ms (Switchyard's own "
        f"{r['switchyard_health_max_s'] * 1000:.0f} ms); fresh {r['fresh_ttft_p99']['server'] * 1000:.0f} ms",
        f"fresh p99 {fresh_ratio:.2f}x direct",
        "/health <= 1 s, fresh <= 2x" if big else "(reported)",
        verdict(r["health_max_s"] <= 1.0 and 0 < fresh_ratio <= 2.0, "") if big else "",
    )
    records_ok = all(rec == calls for rec, calls in r["records_vs_calls"])
    bench.row(
        sec,
        f"{label}: server RSS peak, per call in flight; open files; records == calls",
        f"idle {r['idle_rss'] / 2**20:.0f} MiB",
        f"peak {r['peak_rss'] / 2**20:.0f} MiB, {r['rss_per_call_kib']:.0f} KiB/call; {r['peak_fds']} fds",
        "records/calls " + ", ".join(f"{rec}/{calls}" for rec, calls in r["records_vs_calls"]),
        "every call captured, RSS <= 2 GiB" if big else "every call captured",
        verdict(records_ok and (not big or r["peak_rss"] <= 2 * 2**30), ""),
    )
