"""Section `telemetry`: OTLP exporter on against off at c=64, split by side, and telemetry disabled."""

from __future__ import annotations

import time
from typing import Any

import httpx

from bench.calls import CHAT, SMALL, chat_body, template
from bench.harness import Bench, python_exports
from bench.procs import Server
from bench.stats import (
    cpu_per_request,
    cpu_ratio,
    errors,
    fmt_ratio,
    loop_cpu_per_request,
    median,
    pool,
    ratio_verdict,
    summary,
)

# The telemetry target is set at concurrency 64: enough streams that the per-call span work shows in
# the throughput ratio.
TELEMETRY_CONCURRENCY = 64


def telemetry(bench: Bench) -> None:
    bench.log("telemetry exporter on vs off")
    rounds, warm, dur = (1, 0.3, 1.5) if bench.quick else (4, 0.5, 3.0)
    body = chat_body(SMALL)
    corr = [("x-session-id", "bench-tel-{conn}")]

    def spec(srv: Server):
        return lambda r: (
            {
                "port": srv.port,
                "templates": [template(CHAT, body, corr)],
                "concurrency": TELEMETRY_CONCURRENCY,
                "duration": dur,
                "warmup": warm,
                "timeout": 60,
            },
            srv,
        )

    before = bench.sink.stats()
    res = bench.interleave(
        rounds,
        {
            "exporter_on": spec(bench.otel),
            "exporter_off": spec(bench.nocap),
            "python_only": spec(bench.side_servers["python"]),
            "switchyard_only": spec(bench.side_servers["switchyard"]),
            "sdk_disabled": spec(bench.tel_disabled),
        },
    )
    stats = bench.sink.stats()
    deadline = time.monotonic() + 7.0  # a span batch goes out at most every 5 s
    while not python_exports(stats) and time.monotonic() < deadline:
        time.sleep(0.5)
        stats = bench.sink.stats()
    on, off = res["exporter_on"], res["exporter_off"]
    ratios = [a["throughput"] / b["throughput"] for a, b in zip(on, off) if b["throughput"]]
    ratio = median(ratios)
    wired = python_exports(stats) > python_exports(before)
    bench.data["telemetry"] = {
        "on": summary(pool(on)),
        "off": summary(pool(off)),
        "ratio": ratio,
        "round_ratios": ratios,
        "sink": stats,
        "python_exporter_seen": wired,
    }
    spread = f" (rounds {min(ratios):.2f}-{max(ratios):.2f})" if len(ratios) > 1 else ""
    result = f"{fmt_ratio(ratio)}{spread}; CPU-based {fmt_ratio(cpu_ratio(off, on))}"
    bench.data["telemetry"]["cpu_ratio"] = cpu_ratio(off, on)
    bench.row(
        "telemetry",
        f"throughput, OTLP exporter on / off (c={TELEMETRY_CONCURRENCY})",
        f"off {median([b['throughput'] for b in off]):.0f} req/s",
        f"on {median([a['throughput'] for a in on]):.0f} req/s",
        result if wired else f"pending ({result} measured, but no span reached the sink)",
        ">= 0.9",
        ratio_verdict(ratio, cpu_ratio(off, on), 0.9, errors(pool(on), pool(off))) if wired else "pending",
    )
    bench.row(
        "telemetry",
        "exports received by the sink",
        "",
        "",
        ", ".join(
            f"{k.split(':', 1)[1]} {v}"
            for k, v in sorted(stats.items())
            if k.startswith("path:/v1/") or k.startswith("agent:otel")
        ),
        "",
        "",
    )
    _telemetry_sides(bench, res["exporter_off"], res)
    _telemetry_idle(bench, res["exporter_off"], res["sdk_disabled"])


def _telemetry_sides(bench: Bench, off: list[dict[str, Any]], res: dict[str, list[dict[str, Any]]]) -> None:
    """The exporter cost split: this server's Python exporter alone, the hosted Switchyard's alone."""
    split = {}
    for side, name, label in (
        ("python", "python_only", "this server's Python exporter only"),
        ("switchyard", "switchyard_only", "hosted Switchyard's Rust exporter only"),
    ):
        on = res[name]
        ratios = [a["throughput"] / b["throughput"] for a, b in zip(on, off) if b["throughput"]]
        stats = bench.side_sinks[side].stats()
        agents = {k.split(":", 1)[1]: v for k, v in stats.items() if k.startswith("agent:otel")}
        # Each side-only server must reach its sink from its own exporter and never from the other.
        own, other = ("python", "rust") if side == "python" else ("rust", "python")
        clean = any(own in agent for agent in agents) and not any(other in agent for agent in agents)
        split[side] = {
            "on": summary(pool(on)),
            "ratio": median(ratios),
            "round_ratios": ratios,
            "cpu_ratio": cpu_ratio(off, on),
            "sink": stats,
            "split_clean": clean,
        }
        spread = f" (rounds {min(ratios):.2f}-{max(ratios):.2f})" if len(ratios) > 1 else ""
        bench.row(
            "telemetry",
            f"throughput, {label} / off (c={TELEMETRY_CONCURRENCY})",
            f"off {median([b['throughput'] for b in off]):.0f} req/s",
            f"on {median([a['throughput'] for a in on]):.0f} req/s",
            f"{fmt_ratio(median(ratios))}{spread}; CPU-based {fmt_ratio(cpu_ratio(off, on))}",
            "(reported)",
            ("sink got: " + ", ".join(f"{k} {v}" for k, v in sorted(agents.items())))
            if clean
            else f"SPLIT FAILED, sink got: {agents}",
        )
    bench.data["telemetry"]["sides"] = split


def _telemetry_idle(bench: Bench, idle: list[dict[str, Any]], disabled: list[dict[str, Any]]) -> None:
    """What telemetry costs with no exporter configured (metrics still kept for /metrics) against
    OTEL_SDK_DISABLED=true, where calls get the do-nothing CallSpan."""
    ratios = [a["throughput"] / b["throughput"] for a, b in zip(idle, disabled) if b["throughput"]]
    added_us = (cpu_per_request(idle) - cpu_per_request(disabled)) * 1e6
    added_loop_us = (loop_cpu_per_request(idle) - loop_cpu_per_request(disabled)) * 1e6
    # The disabled server must really have no telemetry: its /metrics is then empty.
    try:
        scraped = httpx.get(bench.tel_disabled.url + "/metrics", timeout=5.0, trust_env=False).text
    except httpx.HTTPError as exc:
        scraped = f"(no answer: {exc})"
    really_off = not scraped.strip()
    bench.data["telemetry"]["no_exporter_vs_disabled"] = {
        "disabled": summary(pool(disabled)),
        "ratio": median(ratios),
        "round_ratios": ratios,
        "cpu_ratio": cpu_ratio(disabled, idle),
        "added_cpu_us_per_call": added_us,
        "added_event_loop_cpu_us_per_call": added_loop_us,
        "disabled_metrics_empty": really_off,
    }
    spread = f" (rounds {min(ratios):.2f}-{max(ratios):.2f})" if len(ratios) > 1 else ""
    bench.row(
        "telemetry",
        f"throughput, no exporter configured / telemetry disabled (c={TELEMETRY_CONCURRENCY})",
        f"disabled {median([b['throughput'] for b in disabled]):.0f} req/s",
        f"no exporter {median([a['throughput'] for a in idle]):.0f} req/s",
        f"{fmt_ratio(median(ratios))}{spread}; CPU-based {fmt_ratio(cpu_ratio(disabled, idle))}",
        "(reported)",
        (
            f"{added_us:+.0f} us CPU/call, event loop {added_loop_us:+.0f} us"
            if really_off
            else "NOT DISABLED: /metrics of the disabled server is not empty"
        )
        + (f"; {errors(pool(idle), pool(disabled))}" if errors(pool(idle), pool(disabled)) else ""),
    )
