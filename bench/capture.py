"""Sections `capture` (capture on against off, 8k-token prompts at c=64) and `hold` (1,024 captured streams open at once)."""

from __future__ import annotations

import threading
import time

import psutil

from bench.calls import CHAT, RESPONSES, RESPONSES_TOKEN_MARK, capture_bodies, responses_body, template
from bench.harness import Bench
from bench.procs import Server, file_create_cost
from bench.stats import cpu_ratio, errors, fmt_ratio, median, pool, ratio_verdict, summary, verdict


def capture(bench: Bench) -> None:
    bench.log("capture on vs off: 8k-token prompts, 200-token generations")
    rounds, warm, dur, c = (1, 0.3, 1.5, 64) if bench.quick else (4, 0.7, 3.0, 64)
    bodies = capture_bodies()
    corr = [("x-session-id", "bench-cap-{run}-{conn}")]

    def spec(srv: Server):
        return lambda r: (
            {
                "port": srv.port,
                "templates": [template(CHAT, b, corr) for b in bodies],
                "concurrency": c,
                "duration": dur,
                "warmup": warm,
                "timeout": 60,
                "vars": {"run": f"{srv.name}-{r}"},
            },
            srv,
        )

    lag: list[int] = []
    # File creation on this disk right now: on ext4 without a journal it costs ten times more for a
    # few minutes after many deletions (docs/benchmarks.md), so the row says what state the series met.
    disk_before_us = file_create_cost(bench.log_dir / "file-probe-before")
    # The same captured calls written as delta records (`capture_encoding: delta`), side by side:
    # what delta records cost or save the writer under load, against the default whole records.
    delta = Server(
        "server-capture-delta",
        bench.mock,
        bench.log_dir,
        capture_dir=bench.log_dir / "captures-delta",
        settings={"capture_encoding": "delta"},
    )
    series = {"capture_on": spec(bench.cap), "capture_off": spec(bench.nocap), "capture_on_delta": spec(delta)}
    # The same again with the capture folder in memory: what this disk's file creation costs.
    ram, ram_dir = None, bench.ram_dir
    if ram_dir is not None:
        ram = Server("server-capture-ram", bench.mock, bench.log_dir, capture_dir=ram_dir / "captures")
        series["capture_on_ram"] = spec(ram)
    try:
        res = bench.interleave(
            rounds,
            series,
            after=lambda name, r: lag.append(bench.cap.wait_capture_idle()) if name == "capture_on" else None,
        )
    finally:
        delta.proc.stop()
        if ram is not None:
            ram.proc.stop()
    on, off, on_delta = res["capture_on"], res["capture_off"], res["capture_on_delta"]
    delta_ratios = [a["throughput"] / b["throughput"] for a, b in zip(on_delta, off) if b["throughput"]]
    delta_vs_full = [a["throughput"] / b["throughput"] for a, b in zip(on_delta, on) if b["throughput"]]
    ratios = [a["throughput"] / b["throughput"] for a, b in zip(on, off) if b["throughput"]]
    ratio = median(ratios)
    health = bench.cap.health().get("capture", {})
    bench.data["capture"] = {
        "on": summary(pool(on)),
        "off": summary(pool(off)),
        "ratio": ratio,
        "round_ratios": ratios,
        "writer_queue_after_rounds": lag,
        "store": health,
        "on_delta": summary(pool(on_delta)),
        "delta_ratio": median(delta_ratios),
        "delta_vs_full_round_ratios": delta_vs_full,
    }
    spread = f" (rounds {min(ratios):.2f}-{max(ratios):.2f})" if len(ratios) > 1 else ""
    bench.data["capture"]["cpu_ratio"] = cpu_ratio(off, on)
    bench.row(
        "capture",
        f"throughput, capture on / off (c={c})",
        f"off {median([b['throughput'] for b in off]):.0f} req/s",
        f"on {median([a['throughput'] for a in on]):.0f} req/s",
        f"{fmt_ratio(ratio)}{spread}; CPU-based {fmt_ratio(cpu_ratio(off, on))}",
        ">= 0.9",
        ratio_verdict(ratio, cpu_ratio(off, on), 0.9, errors(pool(on), pool(off))),
    )
    bench.row(
        "capture",
        f"throughput, delta records (capture_encoding: delta) / whole records (default), c={c}",
        f"full {median([b['throughput'] for b in on]):.0f} req/s",
        f"delta {median([a['throughput'] for a in on_delta]):.0f} req/s",
        f"{fmt_ratio(median(delta_vs_full))}"
        + (f" (rounds {min(delta_vs_full):.2f}-{max(delta_vs_full):.2f})" if len(delta_vs_full) > 1 else "")
        + f"; CPU-based {fmt_ratio(cpu_ratio(on, on_delta))}; delta records on / off {fmt_ratio(median(delta_ratios))}"
        f" (CPU-based {fmt_ratio(cpu_ratio(off, on_delta))})",
        "(context)",
        errors(pool(on_delta), pool(on)),
    )
    if ram is not None and ram_dir is not None:
        on_ram = res["capture_on_ram"]
        ram_ratios = [a["throughput"] / b["throughput"] for a, b in zip(on_ram, off) if b["throughput"]]
        disk_us, ram_us = (
            file_create_cost(bench.log_dir / "file-probe"),
            file_create_cost(ram_dir / "file-probe"),
        )
        bench.data["capture"].update(
            {
                "on_ram": summary(pool(on_ram)),
                "ram_ratio": median(ram_ratios),
                "ram_cpu_ratio": cpu_ratio(off, on_ram),
                "file_create_us": {
                    "disk": round(disk_us, 1),
                    "disk_before": round(disk_before_us, 1),
                    "ram": round(ram_us, 1),
                },
            }
        )
        bench.row(
            "capture",
            f"throughput, capture on / off (c={c}), the capture folder in memory (tmpfs)",
            f"off {median([b['throughput'] for b in off]):.0f} req/s",
            f"on {median([a['throughput'] for a in on_ram]):.0f} req/s",
            f"{fmt_ratio(median(ram_ratios))}"
            + (f" (rounds {min(ram_ratios):.2f}-{max(ram_ratios):.2f})" if len(ram_ratios) > 1 else "")
            + f"; CPU-based {fmt_ratio(cpu_ratio(off, on_ram))}",
            "(context)",
            errors(pool(on_ram), pool(off)),
        )
        bench.row(
            "capture",
            "CPU to put one 3 KB record file in place (new file, write, rename), before / after the series",
            f"capture folder's disk {disk_before_us:.0f} / {disk_us:.0f} µs",
            f"tmpfs {ram_us:.0f} µs",
            "",
            "(context)",
            "",
        )
    bench.row(
        "capture",
        "writer backlog left after each capture-on round",
        "",
        "",
        f"max {max(lag) if lag else 0} records",
        "(reported)",
        f"dropped {health.get('dropped', 0)}, failed {health.get('failed', 0)}",
    )


def hold(bench: Bench) -> None:
    # Streams last ~9 pacing steps; long enough that the first is still open when the last starts.
    n, slow, tokens = (256, 600, 6) if bench.quick else (1024, 2000, 6)
    bench.log(f"hold: {n} concurrent streaming sessions through a fresh server")
    # The default upstream_max_connections (512) would queue half of 1,024 streams inside the
    # server; the target is 1,024 held open at once, so this server allows 2,048.
    holder = Server(
        "server-hold",
        bench.mock,
        bench.log_dir,
        capture_dir=bench.log_dir / "captures-hold",
        settings={"upstream_max_connections": 2048},
    )
    try:
        _hold(bench, holder, n, slow, tokens)
    finally:
        holder.proc.stop()


def _hold(bench: Bench, holder: Server, n: int, slow: int, tokens: int) -> None:
    body = responses_body(f"[[mock:slow {slow}]] [[mock:tokens {tokens}]] hold the line", stream=True)
    headers = [("x-session-id", "bench-hold-{run}-{seq}")]
    spec = {
        "port": holder.port,
        "templates": [template(RESPONSES, body, headers)],
        "concurrency": n,
        "count": n,
        "stream": True,
        "fresh": True,
        "ramp": 3.0 if not bench.quick else 1.5,
        "timeout": 45,
        "marker": RESPONSES_TOKEN_MARK,
        "vars": {"run": str(int(time.time()))},
    }
    server = holder.proc
    baseline = server.rss()
    peak = {"rss": baseline, "fds": server.ps.num_fds()}
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.1):
            try:
                peak["rss"] = max(peak["rss"], server.rss())
                peak["fds"] = max(peak["fds"], server.ps.num_fds())
            except psutil.Error:
                return

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        result = bench.run_one(spec, holder)
    finally:
        stop.set()
        sampler.join(2)
    backlog = holder.wait_capture_idle(timeout=30)
    bench.data["hold"] = {
        "streams": n,
        "ok": result["ok"],
        "errors": result["errors"],
        "error_kinds": result["error_kinds"],
        "error_details": result.get("error_details"),
        "peak_open": result["peak_open"],
        "baseline_rss": baseline,
        "peak_rss": peak["rss"],
        "peak_fds": peak["fds"],
        "seconds": result["elapsed"],
        "last_event_p50_s": median(result["lat"]),
        "capture_backlog_after": backlog,
        "cpu": result["cpu"],
    }
    gib = peak["rss"] / 2**30
    bench.row(
        "hold",
        f"{n} concurrent streams: peak RSS of the server process",
        f"idle {baseline / 2**20:.0f} MiB",
        f"peak {peak['rss'] / 2**20:.0f} MiB",
        f"{result['peak_open']} open at once, {peak['fds']} fds",
        "< 1 GiB",
        verdict(gib < 1.0, ""),
    )
    bench.row(
        "hold",
        f"{n} concurrent streams: errors",
        "",
        "",
        f"{result['errors']} {result['error_kinds'] or ''}".strip(),
        "0",
        verdict(result["errors"] == 0, ""),
    )


# -- driver ----------------------------------------------------------------------------
