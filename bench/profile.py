"""`bench/run.py --profile DIR`: py-spy on the server under fixed loads; the event loop's hot spots per load."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench.calls import CHAT, CHAT_TOKEN_MARK, RESPONSES, SMALL, chat_body, responses_body, template, words
from bench.harness import Bench


def profile(args: argparse.Namespace) -> int:
    """py-spy each load against a fresh chain; print event-loop hot spots; keep the raw stacks in DIR."""
    out_dir = Path(args.profile)
    out_dir.mkdir(parents=True, exist_ok=True)
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(py_spy).exists():
        raise SystemExit("py-spy not found: .venv/bin/pip install py-spy")
    bench = Bench(quick=True, only={"sequential", "capture", "telemetry"})  # those start the servers profiled
    bench.start()
    seconds = 12 if not args.quick else 5
    corr = [("x-session-id", "bench-prof-{conn}")]
    big = chat_body(words(8000) + " [[mock:tokens 200]]", token_fields=True)
    stream = chat_body("Explain the plan step by step. [[mock:tokens 32]]", stream=True)
    stream_corr = [("x-session-id", "bench-prof-{conn}-{seq}")]
    sse = {"stream": True, "marker": CHAT_TOKEN_MARK}
    loads = [
        (
            "sequential",
            bench.cap,
            {
                "concurrency": 1,
                "templates": [template(CHAT, chat_body(SMALL)), template(RESPONSES, responses_body(SMALL))],
            },
        ),
        ("c64", bench.cap, {"concurrency": 64, "templates": [template(CHAT, chat_body(SMALL))]}),
        ("c64_responses", bench.cap, {"concurrency": 64, "templates": [template(RESPONSES, responses_body(SMALL))]}),
        (
            "c64_responses_captured",
            bench.cap,
            {"concurrency": 64, "templates": [template(RESPONSES, responses_body(SMALL), corr)]},
        ),
        ("c16_8k_captured", bench.cap, {"concurrency": 16, "templates": [template(CHAT, big, corr)]}),
        ("c32_exporter_on", bench.otel, {"concurrency": 32, "templates": [template(CHAT, chat_body(SMALL), corr)]}),
        ("c32_exporter_off", bench.nocap, {"concurrency": 32, "templates": [template(CHAT, chat_body(SMALL), corr)]}),
        # The stream_load section's c=64 chat streams (32 tokens), captured and not.
        (
            "c64_stream_captured",
            bench.cap,
            {"concurrency": 64, "templates": [template(CHAT, stream, stream_corr)], **sse},
        ),
        ("c64_stream_uncaptured", bench.cap, {"concurrency": 64, "templates": [template(CHAT, stream)], **sse}),
    ]
    if args.only:  # with --profile, --only names the loads above
        wanted = set(args.only.split(","))
        loads = [load for load in loads if load[0] in wanted]
    try:
        for name, server, load in loads:
            raw = out_dir / f"{name}.txt"
            spy = subprocess.Popen(
                [
                    py_spy,
                    "record",
                    "--pid",
                    str(server.proc.pid),
                    "--duration",
                    str(seconds),
                    "--rate",
                    "200",
                    "--format",
                    "raw",
                    "--threads",
                    "--output",
                    str(raw),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            time.sleep(0.5)
            result = bench.gen.run(
                {"port": server.port, "duration": seconds - 1.5, "warmup": 0.2, "timeout": 60, **load}
            )
            try:
                spy.wait(seconds + 30)
            except subprocess.TimeoutExpired:
                spy.kill()  # our own child, by its handle
                spy.wait(5)
            bench.log(f"profile {name}: {result['throughput']:.0f} req/s, {result['errors']} errors -> {raw}")
            print(f"\n## {name} ({result['throughput']:.0f} req/s, {result['ok']} calls)\n")
            print(hot_spots(raw))
    finally:
        bench.stop()
    shutil.rmtree(bench.log_dir, ignore_errors=True)
    return 0


def hot_spots(raw: Path, top: int = 15) -> str:
    """Self and inclusive share of samples per function, from py-spy's collapsed stacks (`--threads`).

    Shares are of the event-loop thread's non-idle samples (wall time: a thread preempted in a
    syscall still counts), which is what bounds the server. Other threads (the capture writer,
    exporters) are listed by their share of all samples; py-spy counts a thread blocked in fsync as
    active.
    """
    own: dict[str, int] = {}
    inclusive: dict[str, int] = {}
    threads: dict[str, int] = {}
    loop_total = total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        raw_frames = stack.split(";")
        thread = raw_frames.pop(0) if raw_frames[0].startswith("thread (") else "thread (?)"
        frames = [_frame(f) for f in raw_frames]
        # The thread label decides, not the frames: a stack py-spy could not read whole may lack run_serve.
        is_loop = "MainThread" in thread if thread != "thread (?)" else any(f.startswith("run_serve ") for f in frames)
        name = "event loop" if is_loop else _thread_name(frames)
        threads[name] = threads.get(name, 0) + n
        if not is_loop or not frames:
            continue
        loop_total += n
        own[frames[-1]] = own.get(frames[-1], 0) + n
        for frame in set(frames):
            inclusive[frame] = inclusive.get(frame, 0) + n
    if not loop_total:
        return "(no samples)"
    lines = [
        "threads (share of all samples): "
        + ", ".join(f"{name} {n / total:.0%}" for name, n in sorted(threads.items(), key=lambda kv: -kv[1])),
        "",
        "| self | inclusive | function (event-loop thread) |",
        "|---|---|---|",
    ]
    for frame, n in sorted(own.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"| {n / loop_total:.1%} | {inclusive[frame] / loop_total:.1%} | `{frame}` |")
    lines += ["", "| inclusive | function (ours, event-loop thread) |", "|---|---|"]
    ours = [(f, n) for f, n in inclusive.items() if "(server/" in f or "(middleware/" in f]
    for frame, n in sorted(ours, key=lambda kv: -kv[1])[:top]:
        if not frame.startswith(("<module>", "main (", "run_serve")):
            lines.append(f"| {n / loop_total:.1%} | `{frame}` |")
    return "\n".join(lines)


def _thread_name(frames: list[str]) -> str:
    for frame in frames:
        if "capture/write/writer.py" in frame or "capture/write/durable.py" in frame:
            return "capture writer"
        if "opentelemetry" in frame:
            return "telemetry export"
    return "other threads"


def _frame(frame: str) -> str:
    """`func (path/file.py:123)` -> `func (path/file.py)`: the line is dropped so a function is one entry."""
    name, sep, where = frame.partition(" (")
    if not sep:
        return frame
    return f"{name} ({where.rstrip(')').rsplit(':', 1)[0]})"
