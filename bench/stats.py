"""Statistics and formatting of the bench's series: percentiles, pooled rounds, ratios, verdicts."""

from __future__ import annotations

import math
from typing import Any


def pct(values: list[float], q: float) -> float:
    """Linear-interpolated percentile; NaN for no samples (failed marker matches are dropped)."""
    xs = sorted(v for v in values if v is not None and not math.isnan(v))
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * q
    lo = math.floor(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def median(values: list[float]) -> float:
    return pct(values, 0.5)


def fmt_ms(seconds: float) -> str:
    return "n/a" if math.isnan(seconds) else f"{seconds * 1000:.2f} ms"


def fmt_ratio(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:.2f}"


# ---------------------------------------------------------------------------------------------
# The run


def pool(results: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"lat": [], "first": [], "marker": [], "ok": 0, "errors": 0, "error_kinds": {}, "cpu": {}}
    for r in results:
        for key in ("lat", "first", "marker"):
            out[key] += [x if x is not None else float("nan") for x in r.get(key, [])]
        out["ok"] += r["ok"]
        out["errors"] += r["errors"]
        for kind, count in r["error_kinds"].items():
            out["error_kinds"][kind] = out["error_kinds"].get(kind, 0) + count
        for name, seconds in r.get("cpu", {}).items():
            out["cpu"][name] = out["cpu"].get(name, 0.0) + seconds
    return out


def summary(p: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "ok": p["ok"],
        "errors": p["errors"],
        "error_kinds": p["error_kinds"],
        "samples": len(p["lat"]),
    }
    for key in ("lat", "first", "marker"):
        if p[key]:
            out[f"{key}_p50_ms"] = round(median(p[key]) * 1000, 3)
            out[f"{key}_p99_ms"] = round(pct(p[key], 0.99) * 1000, 3)
    if p["ok"]:
        out["cpu_ms_per_request"] = {k: round(v / p["ok"] * 1000, 3) for k, v in p["cpu"].items()}
    return out


def cpu_per_request(results: list[dict[str, Any]]) -> float:
    """CPU seconds per completed call, summed over every process of the stack (generator included).

    On a CPU-bound box throughput is about cores / this, and unlike wall-clock throughput it hardly
    moves when other tenants load the machine, so its ratio is the steadier estimate."""
    seconds = sum(v for r in results for k, v in r.get("cpu", {}).items() if k != "server_event_loop")
    calls = sum(r["ok"] for r in results)
    return seconds / calls if calls else float("nan")


def loop_cpu_per_request(results: list[dict[str, Any]]) -> float:
    """CPU seconds per completed call on the server's event-loop thread."""
    seconds = sum(r.get("cpu", {}).get("server_event_loop", 0.0) for r in results)
    calls = sum(r["ok"] for r in results)
    return seconds / calls if calls else float("nan")


def cpu_ratio(base: list[dict[str, Any]], via: list[dict[str, Any]]) -> float:
    return cpu_per_request(base) / cpu_per_request(via)


def fmt_lat(values: list[float]) -> str:
    return f"{fmt_ms(median(values))} / {fmt_ms(pct(values, 0.99))}"


def fmt_delta(seconds: float) -> str:
    return "n/a" if math.isnan(seconds) else f"{seconds * 1000:+.2f} ms"


def added(base: list[float], via: list[float]) -> str:
    return f"p50 {fmt_delta(median(via) - median(base))}, p99 {fmt_delta(pct(via, 0.99) - pct(base, 0.99))}"


def errors(*pooled: dict[str, Any]) -> str:
    total = sum(p["errors"] for p in pooled)
    return f"{total} errors" if total else ""


def ratio_verdict(wall: float, cpu: float, target: float, error_note: str) -> str:
    """Judged on wall-clock throughput, as asked; says so when the steadier CPU-based ratio disagrees."""
    text = verdict(wall >= target, error_note)
    if (cpu >= target) != (wall >= target):
        text += f" (CPU-based: {'met' if cpu >= target else 'NOT met'})"
    return text


def verdict(met: bool, error_note: str) -> str:
    return ("met" if met else "NOT met") + (f"; {error_note}" if error_note else "")
