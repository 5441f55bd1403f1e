"""The `stream_load` section: captured streams under load, against direct Switchyard streaming, in one run.

Two figures, both through a fresh server (capture on, `upstream_max_connections: 2048`):

- **c=64**: 64 keep-alive connections each streaming one call after another (32 tokens, one write
  per request), every call with its own session id, so every stream is captured. The direct
  baseline streams the same calls straight to Switchyard, asking for the same token fields; it is
  measured both over keep-alive connections and with a fresh connection per stream (which avoids
  Switchyard 0.3.0's Nagle stall), and the better of the two is the baseline of each round.
- **1,024 at once**: 1,024 long streams (200 tokens each), one connection each, all open together;
  each paced at 50 ms a chunk (about 10 s a stream, so they overlap); the figure is the chunks
  relayed per second (streams x chunks per stream / wall time of the series): a server that cannot
  keep up with the pace stretches the series. With it, the server's peak RSS and the errors.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import psutil

from bench.calls import CHAT, CHAT_TOKEN_MARK, RESPONSES, RESPONSES_TOKEN_MARK, chat_body, responses_body, template
from bench.harness import Bench
from bench.procs import Server
from bench.stats import cpu_ratio, errors, fmt_ratio, median, pool, ratio_verdict, summary, verdict

SHORT_TOKENS = 32
LONG_TOKENS = 200
PACE_MS = 50


def stream_load(bench: Bench) -> None:
    def streams_server(name: str, capture_dir: Path) -> Server:
        return Server(
            name, bench.mock, bench.log_dir, capture_dir=capture_dir, settings={"upstream_max_connections": 2048}
        )

    server = streams_server("server-streams", bench.log_dir / "captures-streams")
    # The same server with its capture folder in memory: what this disk's file creation costs a stream.
    ram = None
    if bench.ram_dir is not None:
        ram = streams_server("server-streams-ram", bench.ram_dir / "captures-streams")
    try:
        bench.gen.run(_warm_spec(server.port))
        if ram is not None:
            bench.gen.run(_warm_spec(ram.port))
        _c64(bench, server, ram)
        _scale(bench, server)
    finally:
        server.proc.stop()
        if ram is not None:
            ram.proc.stop()


def _warm_spec(port: int) -> dict[str, Any]:
    body = chat_body(f"warm up [[mock:tokens {SHORT_TOKENS}]]", stream=True)
    return {
        "port": port,
        "templates": [template(CHAT, body, [("x-session-id", "bench-sw-{conn}")])],
        "count": 200,
        "concurrency": 8,
        "stream": True,
    }


def _c64(bench: Bench, server: Server, ram: Server | None) -> None:
    rounds, warm, dur = (1, 0.3, 1.5) if bench.quick else (3, 0.5, 3.0)
    content = f"Explain the plan step by step. [[mock:tokens {SHORT_TOKENS}]]"
    corr = [("x-session-id", "bench-s64-{run}-{conn}-{seq}")]
    proxy = server.proxy_port

    def spec(port: int, path: str, body: str, mark: str, headers=None, fresh: bool = False, srv: Server = server):
        return lambda r: (
            {
                "port": port,
                "templates": [template(path, body, headers)],
                "concurrency": 64,
                "duration": dur,
                "warmup": warm,
                "timeout": 60,
                "stream": True,
                "marker": mark,
                "fresh": fresh,
                "vars": {"run": f"{int(time.time())}-{r}"},
            },
            srv,
        )

    direct_body = chat_body(content, stream=True, token_fields=True)
    series = {
        "direct_keepalive": spec(proxy, CHAT, direct_body, CHAT_TOKEN_MARK),
        "direct_fresh": spec(proxy, CHAT, direct_body, CHAT_TOKEN_MARK, fresh=True),
        "chat_captured": spec(server.port, CHAT, chat_body(content, stream=True), CHAT_TOKEN_MARK, corr),
        "chat_uncaptured": spec(server.port, CHAT, chat_body(content, stream=True), CHAT_TOKEN_MARK),
        "responses_captured": spec(
            server.port, RESPONSES, responses_body(content, stream=True), RESPONSES_TOKEN_MARK, corr
        ),
    }
    if ram is not None:
        series["chat_captured_ram"] = spec(
            ram.port, CHAT, chat_body(content, stream=True), CHAT_TOKEN_MARK, corr, srv=ram
        )
    servers = {name: ram if name.endswith("_ram") and ram is not None else server for name in series}

    def settle(name: str, r: int) -> None:  # the next series starts with every record of this one written
        if "captured" in name:
            servers[name].wait_capture_idle()

    res = bench.interleave(rounds, series, after=settle)
    best = [max(k, f, key=lambda x: x["throughput"]) for k, f in zip(res["direct_keepalive"], res["direct_fresh"])]
    bench.data["stream_load_c64"] = {
        name: {**summary(pool(results)), "rounds_rps": [x["throughput"] for x in results]}
        for name, results in res.items()
    }
    for name, label, target in (
        ("chat_captured", "chat streams, captured, c=64", 0.8),
        ("chat_captured_ram", "chat streams, captured, c=64, the capture folder in memory (tmpfs)", None),
        ("responses_captured", "Responses streams, captured, c=64", None),
        ("chat_uncaptured", "chat streams, uncaptured, c=64", None),
    ):
        if name not in res:
            continue
        via = res[name]
        ratios = [v["throughput"] / b["throughput"] for v, b in zip(via, best) if b["throughput"]]
        ratio, cpu = median(ratios), cpu_ratio(best, via)
        spread = f" (rounds {min(ratios):.2f}-{max(ratios):.2f})" if len(ratios) > 1 else ""
        err = errors(pool(via), pool(best))
        bench.row(
            "stream_load",
            f"throughput ratio, {label}",
            f"{median([b['throughput'] for b in best]):.0f} streams/s (best of keep-alive "
            f"{median([x['throughput'] for x in res['direct_keepalive']]):.0f}, fresh "
            f"{median([x['throughput'] for x in res['direct_fresh']]):.0f})",
            f"{median([v['throughput'] for v in via]):.0f} streams/s",
            f"{fmt_ratio(ratio)}{spread}; CPU-based {fmt_ratio(cpu)}",
            ">= 0.8" if target else "(reported)",
            ratio_verdict(ratio, cpu, target, err) if target else err,
        )


class _PeakRss:
    """Samples a server's RSS every 100 ms while the block runs; `.rss` is the peak."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.rss = server.proc.rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.1):
            try:
                self.rss = max(self.rss, self.server.proc.rss())
            except psutil.Error:
                return

    def __enter__(self) -> _PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(2)


def _scale(bench: Bench, server: Server) -> None:
    n = 256 if bench.quick else 1024
    rounds = 1 if bench.quick else 2
    # Paced, so the streams really are open together (unpaced, each is written in one go and over
    # before the next starts): 200 chunks 50 ms apart, about 10 s a stream.
    content = f"Tell the long story. [[mock:tokens {LONG_TOKENS}]] [[mock:slow {PACE_MS}]]"
    chunks_per_stream = LONG_TOKENS  # one content chunk per token (the role and usage chunks not counted)

    def spec(port: int, body: str, headers=None) -> dict[str, Any]:
        return {
            "port": port,
            "templates": [template(CHAT, body, headers)],
            "concurrency": n,
            "count": n,
            "stream": True,
            "fresh": True,
            "timeout": 120,
            "ramp": 1.0,
            "marker": CHAT_TOKEN_MARK,
            "vars": {"run": str(int(time.time()))},
        }

    direct_body = chat_body(content, stream=True, token_fields=True)
    via_body = chat_body(content, stream=True)
    peaks: list[int] = []
    out: dict[str, list[dict[str, Any]]] = {"direct": [], "server": []}
    for r in range(rounds):
        for name in ("direct", "server") if r % 2 == 0 else ("server", "direct"):
            if name == "direct":
                out[name].append(bench.run_one(spec(server.proxy_port, direct_body), server))
                continue
            headers = [("x-session-id", "bench-scale-{run}-" + str(r) + "-{seq}")]
            with _PeakRss(server) as peak:
                out[name].append(bench.run_one(spec(server.port, via_body, headers), server))
            peaks.append(peak.rss)
            server.wait_capture_idle()

    def chunks_per_s(result: dict[str, Any]) -> float:
        return result["ok"] * chunks_per_stream / result["elapsed"] if result["elapsed"] else 0.0

    direct = [chunks_per_s(x) for x in out["direct"]]
    via = [chunks_per_s(x) for x in out["server"]]
    ratios = [v / d for v, d in zip(via, direct) if d]
    ratio = median(ratios)
    errs = sum(x["errors"] for x in out["server"])
    direct_errs = sum(x["errors"] for x in out["direct"])
    peak_rss = max(peaks)
    bench.data["stream_load_scale"] = {
        "streams": n,
        "chunks_per_stream": chunks_per_stream,
        "direct_chunks_per_s": direct,
        "server_chunks_per_s": via,
        "ratios": ratios,
        "server_errors": errs,
        "direct_errors": direct_errs,
        "error_kinds": [x["error_kinds"] for x in out["server"]],
        "peak_rss": peak_rss,
        "peak_open": [x["peak_open"] for x in out["server"]],
        "cpu": {name: [x["cpu"] for x in results] for name, results in out.items()},
    }
    spread = f" (rounds {min(ratios):.2f}-{max(ratios):.2f})" if len(ratios) > 1 else ""
    bench.row(
        "stream_load",
        f"{n} concurrent streams x {chunks_per_stream} chunks, captured: chunks/s ratio",
        f"{median(direct):.0f} chunks/s",
        f"{median(via):.0f} chunks/s",
        f"{fmt_ratio(ratio)}{spread}",
        ">= 0.8",
        verdict(ratio >= 0.8, f"{direct_errs} direct errors" if direct_errs else ""),
    )
    bench.row(
        "stream_load",
        f"{n} concurrent streams x {chunks_per_stream} chunks: errors, peak RSS",
        "",
        f"peak {peak_rss / 2**20:.0f} MiB",
        f"{errs} errors; open at once {max(x['peak_open'] for x in out['server'])}",
        "0 errors, < 1 GiB",
        verdict(errs == 0 and peak_rss < 2**30, ""),
    )
