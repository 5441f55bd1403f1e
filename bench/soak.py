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
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # `python bench/soak.py` puts bench/, not the repo, on sys.path

import httpx  # noqa: E402
import orjson  # noqa: E402
import psutil  # noqa: E402

from bench.procs import PY, Proc, free_port  # noqa: E402
from bench.soak_checks import (  # noqa: E402
    check_records,
    invariants,
    ms,
    percentile,
    print_report,
    scan_records,
    slope_mib_per_min,
    summarise,
)
from bench.soak_load import Options, Soak, resources  # noqa: E402

MiB = 1024 * 1024

# ---------------------------------------------------------------------------------------------
# Processes
# ---------------------------------------------------------------------------------------------


def start_server(name: str, port: int, capture_dir: Path, config: Path, workdir: Path, mock_url: str) -> Proc:
    argv = [PY, "-m", "server.cli", "serve", "--deployment", "demo", "--port", str(port)]
    argv += ["--capture-dir", str(capture_dir), "--config", str(config)]
    # Switchyard logs two lines per call at info; keep its warnings and errors.
    return Proc(name, argv, workdir, {"MOCK_UPSTREAM_URL": mock_url + "/v1", "RUST_LOG": "warn"})


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
            server.stop(30.0)
    shutil.rmtree(workdir / "captures-empty", ignore_errors=True)
    return {**rss, "held": max(0, rss["data"] - rss["empty"])}


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
    # Its uncorrelated calls must stay unrecorded (a check below): no inferred sessions.
    settings = {"upstream_timeout_s": opts.upstream_timeout_s, "session_inference": False, **opts.server_settings}
    config.write_text("".join(f"{k}: {orjson.dumps(v).decode()}\n" for k, v in settings.items()))
    children: list[Proc] = []
    server_exit: dict[str, Any] = {"code": None, "seconds": 0.0}
    passed = False
    try:
        mock_port = free_port()
        mock = Proc(
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
        code, seconds = server.stop(60.0)
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
                "p50": ms(percentile(soak.read_latency, 0.5)),
                "p99": ms(percentile(soak.read_latency, 0.99)),
            },
            "list_latency_ms": {"n": len(soak.list_latency), "max": ms(max(soak.list_latency, default=None))},
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
            child.stop(30.0)
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
