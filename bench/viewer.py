"""How fast the rollout viewer renders in headless chromium: the list over 10,000 sessions, a 200-call session.

    .venv/bin/python bench/viewer.py [--sessions 10000] [--calls 200] [--repeat 5] [--keep DIR]

Writes a capture directory with the store's own writer (the mock upstream in-process gives the token
ids, texts and log probs), serves it with `switchyard-model sessions view`, and times, in Debian's
chromium driven by Playwright, a fresh page from navigation until the page says it is ready
(`body[data-ready=true]`: the API answered and the DOM is built). "cold" is the first load after the
server started (summaries and the timeline are computed then); "warm" is the median of the
following loads (the server's caches are hot; the browser's are not: each load is a new context).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from playwright.sync_api import sync_playwright  # noqa: E402

from bench.procs import Proc, make_log_dir  # noqa: E402
from tests.integration.test_viewer import CHROMIUM, CHROMIUM_ARGS  # noqa: E402
from tests.support.viewer_data import Writer  # noqa: E402

TARGETS = {"list": 1.0, "session": 2.0}


def write_data(capture_dir: Path, sessions: int, calls: int) -> None:
    with Writer(capture_dir) as writer:
        # One long agent session: `calls` tool steps, each adding a tool result of ~80 words.
        steps = " [[mock:next]] ".join(['[[mock:tool bash {"command": "make test"}]]'] * (calls - 1))
        task = f"fix everything {steps} [[mock:next]] [[mock:say done]]"
        writer.agent("long-session", task, max_steps=calls, tool_output_words=80)
        for i in range(sessions - 1):
            messages = [{"role": "user", "content": f"question {i} [[mock:tokens {5 + i % 9}]]"}]
            writer.call(f"s{i:05d}", messages, model=f"model-{i % 3}", route=f"route-{i % 2}")


def time_load(browser, url: str) -> float:
    context = browser.new_context(viewport={"width": 1200, "height": 800})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    started = time.perf_counter()
    page.goto(url)
    page.wait_for_selector("body[data-ready=true]", timeout=120_000)
    elapsed = time.perf_counter() - started
    if errors or page.locator(".error").count():
        raise RuntimeError(f"{url}: {errors or page.text_content('.error')}")
    context.close()
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--keep", help="write (or reuse) the capture directory here instead of a temporary one")
    args = parser.parse_args()

    capture_dir = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="viewer-bench-"))
    if not (capture_dir / "sessions").is_dir():
        started = time.perf_counter()
        write_data(capture_dir, args.sessions, args.calls)
        print(
            f"wrote {args.sessions} sessions ({args.calls}-call long-session) in {time.perf_counter() - started:.1f} s"
        )
    size = sum(p.stat().st_size for p in (capture_dir / "sessions").rglob("*.json"))
    print(f"capture dir {capture_dir}: {size / 1e6:.1f} MB")

    log_dir = make_log_dir()
    argv = [sys.executable, "-m", "server.cli", "sessions", "view", "--capture-dir", str(capture_dir)]
    proc = Proc("sessions-view", argv, log_dir)
    started = time.perf_counter()
    try:
        while not (match := re.search(r"(http://127\.0\.0\.1:\d+/ui/)", proc.tail(100_000))):
            if proc.popen.poll() is not None:
                raise RuntimeError(proc.tail(100_000))
            time.sleep(0.05)
        url = match.group(1)
        print(f"sessions view ready in {time.perf_counter() - started:.2f} s (index of the whole directory)")
        results = {}
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            pages = {
                "list": url + "#/",
                "session": url + "#/s/long-session",
                "list, status=partial (scans every session once)": url + "#/?status=partial",
            }
            for name, page_url in pages.items():
                times = [time_load(browser, page_url) for _ in range(args.repeat)]
                results[name] = {
                    "cold_s": times[0],
                    "warm_median_s": statistics.median(times[1:]) if len(times) > 1 else None,
                }
            browser.close()
        # Where the time goes: the API answer alone (server caches warm), and an empty page in the browser.
        api = {
            "list": "/v1/sessions?summary=true&limit=50",
            "session": "/v1/sessions/long-session/timeline",
            "list, status=partial (scans every session once)": "/v1/sessions?summary=true&limit=50&status=partial",
        }
        root = url.removesuffix("ui/")
        for name, path in api.items():
            times = []
            for _ in range(args.repeat):
                started = time.perf_counter()
                httpx.get(root + path.lstrip("/"), trust_env=False, timeout=120).raise_for_status()
                times.append(time.perf_counter() - started)
            results[name]["api_warm_median_s"] = statistics.median(times)
    finally:
        proc.stop()
        shutil.rmtree(log_dir, ignore_errors=True)
        if not args.keep:
            shutil.rmtree(capture_dir, ignore_errors=True)

    print(f"{'page':<50} {'cold':>8} {'warm p50':>9} {'API p50':>8}  target")
    for name, r in results.items():
        target = TARGETS.get(name)
        warm = f"{r['warm_median_s']:.3f}" if r["warm_median_s"] is not None else "-"
        verdict = "" if target is None else f"< {target:.0f} s: {'met' if r['cold_s'] < target else 'NOT met'}"
        print(f"{name:<50} {r['cold_s']:>8.3f} {warm:>9} {r['api_warm_median_s']:>8.3f}  {verdict}")
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
