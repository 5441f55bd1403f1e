"""One bench run: the shared stack of processes, series run in interleaved rounds, the table's rows.

A section is a function `section(bench: Bench) -> None` (bench/run.py lists them in order). It sends
load with `bench.run_one` or `bench.interleave`, adds rows with `bench.row` and raw numbers to
`bench.data[name]`. The servers started here are shared by several sections; a section that needs a
server of its own starts it itself (`Server(...)`) and stops it when done.
"""

from __future__ import annotations

import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

from bench.calls import CHAT, RESPONSES, SMALL, chat_body, responses_body, template
from bench.procs import REPO, Floor, LoadGen, Mock, Proc, Server, Stub, make_log_dir, make_ram_dir
from server.switchyard.runtime import switchyard_threads

Section = Callable[["Bench"], None]


class Bench:
    """The stack every section shares, the rows of the table and the raw numbers of one run."""

    def __init__(
        self, quick: bool, only: set[str], mock_tree: str | None = None, injection_trees: list[str] | None = None
    ) -> None:
        self.quick = quick
        self.only = only  # the sections that will run: they decide which shared servers start
        # A/B runs: the mock, and extra injection servers, from other source trees (NAME=PATH).
        self.mock_tree = mock_tree
        self.injection_trees = injection_trees or []
        self.started = time.monotonic()
        self.log_dir = make_log_dir()
        # Capture folders on a RAM filesystem, beside the default ones: what the disk's file creation costs.
        self.ram_dir = make_ram_dir() if self.only & {"capture", "stream_load"} else None
        self.rows: list[tuple[str, str, str, str, str, str, str]] = []
        self.data: dict[str, Any] = {
            "quick": self.quick,
            "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "machine": machine(),
        }
        self.procs: list[Any] = []
        self._gone_cpu: dict[int, float] = {}
        self.failed = False

    # -- plumbing ------------------------------------------------------------------------
    def log(self, message: str) -> None:
        print(f"[{time.monotonic() - self.started:6.1f}s] {message}", file=sys.stderr, flush=True)

    def row(self, section: str, figure: str, direct: str, via: str, result: str, target: str, verdict: str) -> None:
        self.rows.append((section, figure, direct, via, result, target, verdict))

    def start(self) -> None:
        self.log(f"logs in {self.log_dir}")
        self.gen = LoadGen(self.log_dir)
        self.procs.append(self.gen.proc)
        self.mock = Mock(self.log_dir, tree=Path(self.mock_tree) if self.mock_tree else None)
        self.procs.append(self.mock.proc)
        self.cap_dir = self.log_dir / "captures"
        self.cap = Server("server-capture", self.mock, self.log_dir, capture_dir=self.cap_dir)
        self.procs.append(self.cap.proc)
        if self.only & {"sequential", "concurrency"}:
            self.floor = Floor(self.cap.proxy_port, self.log_dir)
            self.procs.append(self.floor.proc)
        if self.only & {"sequential", "concurrency"}:
            # The other HTTP server under the same app (docs/benchmarks.md: uvicorn against granian).
            self.alt_impl = "uvicorn" if self.cap.health().get("http_server") == "granian" else "granian"
            self.alt = Server(
                f"server-{self.alt_impl}",
                self.mock,
                self.log_dir,
                capture_dir=self.log_dir / "captures-alt",
                settings={"http_server": self.alt_impl},
            )
            self.procs.append(self.alt.proc)
        if "concurrency" in self.only:
            # Responses with the response store off, beside the default (stored): what storing costs.
            self.nostore = Server(
                "server-nostore",
                self.mock,
                self.log_dir,
                capture_dir=self.log_dir / "captures-nostore",
                settings={"response_store": False},
            )
            self.procs.append(self.nostore.proc)
        if self.only & {"capture", "telemetry"}:
            self.nocap = Server("server-nocapture", self.mock, self.log_dir, capture_dir=None)
            self.procs.append(self.nocap.proc)
        if "telemetry" in self.only:
            self.sink = Stub("otlp-sink", "empty", self.log_dir)
            self.procs.append(self.sink.proc)
            # A 5 s metric interval (the SDK default is 60 s) so metric exports happen inside the series.
            self.otel = Server(
                "server-otel",
                self.mock,
                self.log_dir,
                capture_dir=None,
                env={"OTEL_EXPORTER_OTLP_ENDPOINT": self.sink.url, "OTEL_METRIC_EXPORT_INTERVAL": "5000"},
            )
            self.procs.append(self.otel.proc)
            # The same variables turn on the hosted Switchyard's Rust exporter too; these two servers
            # export from one side only (bench/otel_side.py), each to its own sink, to split the cost.
            self.side_sinks: dict[str, Stub] = {}
            self.side_servers: dict[str, Server] = {}
            for side in ("python", "switchyard"):
                sink = Stub(f"otlp-sink-{side}", "empty", self.log_dir)
                self.procs.append(sink.proc)
                server = Server(
                    f"server-otel-{side}",
                    self.mock,
                    self.log_dir,
                    capture_dir=None,
                    env={"OTEL_EXPORTER_OTLP_ENDPOINT": sink.url, "OTEL_METRIC_EXPORT_INTERVAL": "5000"},
                    launcher=["-m", "bench.otel_side", "--side", side, "--"],
                )
                self.procs.append(server.proc)
                self.side_sinks[side], self.side_servers[side] = sink, server
            # No exporter configured (server-nocapture) is compared with telemetry switched off entirely.
            self.tel_disabled = Server(
                "server-otel-disabled", self.mock, self.log_dir, capture_dir=None, env={"OTEL_SDK_DISABLED": "true"}
            )
            self.procs.append(self.tel_disabled.proc)
        if "ceiling" in self.only:
            self.stub = Stub("stub-chat", "chat", self.log_dir)
            self.procs.append(self.stub.proc)
        self.log(f"stack up: server {self.cap.url}, its Switchyard {self.cap.proxy_url}, mock :{self.mock.port}")
        self.warm_up()

    def warm_up(self) -> None:
        """A first burst through every server, so lazy imports and first connections are not measured."""
        small = chat_body(SMALL)
        for server in (
            self.cap,
            getattr(self, "alt", None),
            getattr(self, "nostore", None),
            getattr(self, "nocap", None),
            getattr(self, "otel", None),
            *getattr(self, "side_servers", {}).values(),
            getattr(self, "tel_disabled", None),
        ):
            if server is not None:
                self.gen.run(
                    {
                        "port": server.port,
                        "templates": [
                            template(CHAT, small, [("x-session-id", "bench-warm")]),
                            template(RESPONSES, responses_body(SMALL)),
                        ],
                        "concurrency": 8,
                        "count": 200,
                    }
                )
        if hasattr(self, "otel"):
            # The span exporter (and its protobuf/HTTP imports) first runs one batch delay (5 s) after the first span.
            deadline = time.monotonic() + 8.0
            sinks = [self.sink, self.side_sinks["python"]]
            while not all(python_exports(sink.stats()) for sink in sinks) and time.monotonic() < deadline:
                time.sleep(0.25)

    def background_cpu(self) -> tuple[float, float]:
        """CPU seconds the machine spent outside this run's processes so far, and steal time.

        The box is shared: this says roughly how much other tenants ran during each section (it also
        includes kernel packet processing not charged to any process, part of it this run's own)."""
        times = psutil.cpu_times()
        # Kernel network work (softirq) is counted: it cannot be split between tenants, and leaving it
        # out makes the figure negative when softirq runs in our processes' context.
        busy = sum(getattr(times, f, 0.0) for f in ("user", "nice", "system", "irq", "softirq"))
        ours = 0.0
        for proc in [*self.procs, psutil.Process()]:
            try:
                ps = proc.ps if isinstance(proc, Proc) else proc
                t = ps.cpu_times()
                ours += t.user + t.system + t.children_user + t.children_system
            except psutil.Error:
                ours += self._gone_cpu.get(id(proc), 0.0)
                continue
            self._gone_cpu[id(proc)] = t.user + t.system + t.children_user + t.children_system
        return busy - ours, getattr(times, "steal", 0.0)

    def stop(self) -> None:
        for proc in reversed(self.procs):
            try:
                if proc is self.gen.proc:
                    self.gen.stop()
                else:
                    proc.stop()
            except Exception as exc:  # keep stopping the others
                self.log(f"stopping {proc.name}: {exc}")
        if self.ram_dir is not None:  # memory, not logs: never kept
            shutil.rmtree(self.ram_dir, ignore_errors=True)

    def run_one(self, spec: dict[str, Any], server: Server | None = None) -> dict[str, Any]:
        """One series, with the CPU each process spent on it."""
        watched: dict[str, Proc] = {"loadgen": self.gen.proc, "mock": self.mock.proc}
        if server is not None:
            watched["server"] = server.proc
        if spec["port"] == getattr(getattr(self, "floor", None), "port", None):
            watched["floor"] = self.floor.proc
        before = {name: p.cpu_s() for name, p in watched.items()}
        main_before = server.proc.main_thread_cpu_s() if server is not None else 0.0
        result = self.gen.run(spec)
        cpu = {name: p.cpu_s() - before[name] for name, p in watched.items()}
        if server is not None:
            cpu["server_event_loop"] = server.proc.main_thread_cpu_s() - main_before
        result["cpu"] = cpu
        return result

    def interleave(
        self,
        rounds: int,
        series: dict[str, Callable[[int], tuple[dict[str, Any], Server | None]]],
        after: Callable[[str, int], None] | None = None,
    ) -> dict[str, list[dict[str, Any]]]:
        """Every series once per round; the order flips each round so drift hits all of them alike."""
        names = list(series)
        out: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
        for r in range(rounds):
            for name in names if r % 2 == 0 else list(reversed(names)):
                spec, server = series[name](r)
                out[name].append(self.run_one(spec, server))
                if after is not None:
                    after(name, r)
        return out

    def run(self, sections: dict[str, Section]) -> None:
        """Start the stack, run each section of `sections` named in `only`, in order; stop the stack."""
        self.start()
        try:
            for section, run_section in sections.items():
                if section in self.only:
                    t0 = time.monotonic()
                    busy0 = self.background_cpu()
                    try:
                        run_section(self)
                    except Exception as exc:  # one broken series must not hide the others
                        self.failed = True
                        self.log(f"{section} FAILED: {type(exc).__name__}: {exc}")
                        self.row(
                            section, "(section failed)", "", "", f"{type(exc).__name__}: {str(exc)[:120]}", "", "FAILED"
                        )
                    self.data.setdefault("section_seconds", {})[section] = round(time.monotonic() - t0, 1)
                    busy1 = self.background_cpu()
                    self.data.setdefault("background_cores", {})[section] = round(
                        (busy1[0] - busy0[0]) / (time.monotonic() - t0), 2
                    )
                    self.data.setdefault("steal_cores", {})[section] = round(
                        (busy1[1] - busy0[1]) / (time.monotonic() - t0), 2
                    )
        finally:
            self.data["rss"] = {p.name: _safe_rss(p) for p in self.procs}
            self.stop()
        self.data["total_seconds"] = round(time.monotonic() - self.started, 1)


def _safe_rss(proc: Proc) -> int | None:
    try:
        return proc.rss()
    except psutil.Error:
        return None


def python_exports(stats: dict[str, int]) -> int:
    return sum(v for k, v in stats.items() if k.startswith("agent:") and "python" in k)


# ---------------------------------------------------------------------------------------------
# Pooling and formatting
# ---------------------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10
        ).stdout.strip()
        dirty = bool(
            subprocess.run(
                ["git", "status", "--porcelain", "--untracked-files=no"],
                cwd=REPO,
                capture_output=True,
                text=True,
                timeout=10,
            ).stdout.strip()
        )
    except (OSError, subprocess.SubprocessError):
        commit, dirty = "unknown", False
    return {
        "commit": commit + (" + uncommitted changes" if dirty else ""),
        "cpus": psutil.cpu_count(),
        "cpu": cpu,
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "kernel": platform.release(),
        "load_avg_at_start": [round(x, 2) for x in psutil.getloadavg()],
        # Every server here hosts its Switchyard with this many worker threads (the default on this host).
        "switchyard_threads": switchyard_threads(None, hosted=True),
    }


def print_table(rows: Sequence[tuple[str, ...]]) -> None:
    header = ("section", "figure", "direct", "via server", "result", "target", "verdict")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = "| " + " | ".join(h.ljust(w) for h, w in zip(header, widths)) + " |"
    print(line)
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print("| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths)) + " |")
