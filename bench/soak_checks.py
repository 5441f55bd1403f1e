"""The soak's verdict: the record files against the calls that must have left one, the summary, the report and the invariants."""

from __future__ import annotations

import hashlib
import math
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import orjson

from bench.soak_load import OK, UNCERTAIN, CallResult, Options, fault_table
from server.capture.read.diff_read import DiffFileError, parse_diff_file
from server.capture.store import read_session_records
from server.capture.write.diff import DIFF_SUFFIX

MiB = 1024 * 1024

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
                if path.suffix not in (".json", DIFF_SUFFIX):
                    stray.append(str(path))  # a temp file left behind
                    continue
                files += 1
                try:
                    # A delta file's own fields (its body decompressed, so a torn one shows here).
                    data = path.read_bytes()
                    record = parse_diff_file(data).header if path.suffix == DIFF_SUFFIX else orjson.loads(data)
                except (orjson.JSONDecodeError, DiffFileError):
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
                        f"{directory}/{r['uuid']}{DIFF_SUFFIX}: {r['invalid_reason']}"
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
                "p50_ms": ms(percentile(e["lat"], 0.5)),
                "p99_ms": ms(percentile(e["lat"], 0.99)),
            }
            for name, e in sorted(by_fault.items())
        },
        "errors_by_kind": dict(sorted(errors.items())),
        "unexpected": sum(sum(e["unexpected"].values()) for e in by_fault.values()),
        "latency_ms": {
            "clean": {
                key: {
                    "n": len(v),
                    "p50": ms(percentile(v, 0.5)),
                    "p99": ms(percentile(v, 0.99)),
                    "max": ms(max(v)),
                    "first_byte_p50": ms(percentile(first.get(key, []), 0.5)),
                    "first_byte_p99": ms(percentile(first.get(key, []), 0.99)),
                }
                for key, v in sorted(clean.items())
            },
            "clean_all": {
                "n": len(clean_all),
                "p50": ms(percentile(clean_all, 0.5)),
                "p99": ms(percentile(clean_all, 0.99)),
            },
            "all_calls": {
                "n": len(all_lat),
                "p50": ms(percentile(all_lat, 0.5)),
                "p99": ms(percentile(all_lat, 0.99)),
            },
        },
    }


def ms(value: float | None) -> float | None:
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
