"""Sections `ceiling`, `sequential`, `concurrency`, `streams`: added latency and throughput against direct Switchyard."""

from __future__ import annotations

import subprocess
import sys
import time

from bench.calls import (
    CHAT,
    CHAT_TOKEN_MARK,
    RESPONSES,
    RESPONSES_TOKEN_MARK,
    SMALL,
    STREAM,
    chat_body,
    responses_body,
    template,
)
from bench.harness import Bench
from bench.procs import Server
from bench.stats import (
    added,
    cpu_ratio,
    errors,
    fmt_delta,
    fmt_lat,
    fmt_ms,
    fmt_ratio,
    median,
    pct,
    pool,
    ratio_verdict,
    summary,
    verdict,
)


# -- sections ------------------------------------------------------------------------
def ceiling(bench: Bench) -> None:
    bench.log("ceiling: the load generator alone")
    d = 2.0 if not bench.quick else 1.0
    small = [template(CHAT, chat_body(SMALL))]
    stub = bench.run_one({"port": bench.stub.port, "templates": small, "concurrency": 64, "duration": d, "warmup": 0.5})
    stub_seq = bench.run_one(
        {"port": bench.stub.port, "templates": small, "concurrency": 1, "count": 2000, "warmup": 100}
    )
    mock = bench.run_one({"port": bench.mock.port, "templates": small, "concurrency": 64, "duration": d, "warmup": 0.5})
    gen_us = stub["cpu"]["loadgen"] / max(1, stub["ok"]) * 1e6
    bench.data["ceiling"] = {
        "stub_c64_rps": stub["throughput"],
        "stub_seq_p50_ms": median(stub_seq["lat"]) * 1000,
        "stub_seq_p99_ms": pct(stub_seq["lat"], 0.99) * 1000,
        "loadgen_cpu_us_per_request": gen_us,
        "mock_c64_rps": mock["throughput"],
        "errors": stub["errors"] + mock["errors"] + stub_seq["errors"],
    }
    bench.row(
        "generator",
        "load generator -> canned stub, c=64",
        "",
        "",
        f"{stub['throughput']:.0f} req/s",
        "far above chain",
        f"{gen_us:.0f} us CPU/req",
    )
    bench.row(
        "generator",
        "load generator -> canned stub, sequential",
        "",
        "",
        f"p50 {fmt_ms(median(stub_seq['lat']))}, p99 {fmt_ms(pct(stub_seq['lat'], 0.99))}",
        "",
        "",
    )
    bench.row(
        "generator",
        "load generator -> mock upstream alone, c=64",
        "",
        "",
        f"{mock['throughput']:.0f} req/s",
        "",
        "upstream ceiling",
    )
    wake, local = loopback_send_cost()
    bench.data["ceiling"].update({"loopback_send_waking_peer_cpu_us": wake, "loopback_send_recv_same_thread_us": local})
    bench.row(
        "machine",
        "CPU of one loopback TCP send that wakes a sleeping peer process",
        "",
        "",
        f"{wake:.0f} us",
        "",
        f"same-thread send+recv: {local:.0f} us",
    )


def sequential(bench: Bench) -> None:
    bench.log("sequential non-stream: direct vs server, chat and Responses")
    rounds, n, warm = (2, 100, 20) if bench.quick else (5, 300, 30)
    proxy, server, mock_port = bench.cap.proxy_port, bench.cap.port, bench.mock.port
    corr = [("x-session-id", "bench-seq-{run}-{conn}")]

    def spec(port: int, path: str, body: str, headers=None, srv=None):
        return lambda r: (
            {
                "port": port,
                "templates": [template(path, body, headers)],
                "concurrency": 1,
                "count": n + warm,
                "warmup": warm,
                "vars": {"run": str(r)},
            },
            srv,
        )

    res = bench.interleave(
        rounds,
        {
            "mock": spec(mock_port, CHAT, chat_body(SMALL)),
            "direct": spec(proxy, CHAT, chat_body(SMALL), srv=bench.cap),
            "server_chat": spec(server, CHAT, chat_body(SMALL), srv=bench.cap),
            "server_responses": spec(server, RESPONSES, responses_body(SMALL), srv=bench.cap),
            "floor_proxy": spec(bench.floor.port, CHAT, chat_body(SMALL), srv=bench.cap),
            "direct_token_fields": spec(proxy, CHAT, chat_body(SMALL, token_fields=True), srv=bench.cap),
            "server_chat_captured": spec(server, CHAT, chat_body(SMALL), corr, srv=bench.cap),
            "server_responses_captured": spec(server, RESPONSES, responses_body(SMALL), corr, srv=bench.cap),
            "alt_chat": spec(bench.alt.port, CHAT, chat_body(SMALL), srv=bench.alt),
            "alt_responses": spec(bench.alt.port, RESPONSES, responses_body(SMALL), srv=bench.alt),
            "alt_chat_captured": spec(bench.alt.port, CHAT, chat_body(SMALL), corr, srv=bench.alt),
        },
    )
    bench.cap.wait_capture_idle()
    pooled = {name: pool(results) for name, results in res.items()}
    bench.data["sequential"] = {name: summary(p) for name, p in pooled.items()}
    d, dt = pooled["direct"], pooled["direct_token_fields"]
    m = pooled["mock"]
    bench.row(
        "sequential",
        "Switchyard itself (direct vs mock alone), chat",
        fmt_lat(m["lat"]),
        fmt_lat(d["lat"]),
        added(m["lat"], d["lat"]),
        "(context)",
        "",
    )
    f = pooled["floor_proxy"]
    bench.row(
        "sequential",
        "floor: minimal Python hop (bench/floor.py), chat",
        fmt_lat(d["lat"]),
        fmt_lat(f["lat"]),
        added(d["lat"], f["lat"]),
        "(context)",
        errors(f) or "",
    )
    for name, label, base in (
        ("server_chat", "chat", d),
        ("server_responses", "Responses", d),
        ("server_chat_captured", "chat, correlated + captured", dt),
        ("server_responses_captured", "Responses, correlated + captured", dt),
        ("alt_chat", f"chat, under {bench.alt_impl}", d),
        ("alt_responses", f"Responses, under {bench.alt_impl}", d),
        ("alt_chat_captured", f"chat, correlated + captured, under {bench.alt_impl}", dt),
    ):
        via = pooled[name]
        a50 = median(via["lat"]) - median(base["lat"])
        a99 = pct(via["lat"], 0.99) - pct(base["lat"], 0.99)
        met = a50 <= 0.001 and a99 <= 0.003
        alt = name.startswith("alt_")  # the default server's rows carry the verdict
        bench.row(
            "sequential",
            f"added latency, {label}",
            fmt_lat(base["lat"]),
            fmt_lat(via["lat"]),
            added(base["lat"], via["lat"]),
            "(reported)" if alt else "p50 <= 1 ms, p99 <= 3 ms",
            "" if alt else verdict(met, errors(via, base)),
        )


def concurrency(bench: Bench) -> None:
    bench.log("concurrency 64 and 256: throughput and latency, direct vs server")
    rounds, warm, dur = (1, 0.3, 1.2) if bench.quick else (3, 0.7, 3.0)
    proxy, server = bench.cap.proxy_port, bench.cap.port
    corr = [("x-session-id", "bench-c64-{run}-{conn}")]

    def spec(port: int, path: str, body: str, c: int, headers=None, srv: Server | None = None):
        return lambda r: (
            {
                "port": port,
                "templates": [template(path, body, headers)],
                "concurrency": c,
                "duration": dur,
                "warmup": warm,
                "timeout": 60,
                "vars": {"run": str(r)},
            },
            srv or bench.cap,
        )

    alt = bench.alt.port

    series = {
        "direct_64": spec(proxy, CHAT, chat_body(SMALL), 64),
        "server_chat_64": spec(server, CHAT, chat_body(SMALL), 64),
        "server_responses_64": spec(server, RESPONSES, responses_body(SMALL), 64),
        "server_responses_nostore_64": spec(
            bench.nostore.port, RESPONSES, responses_body(SMALL), 64, srv=bench.nostore
        ),
        "alt_chat_64": spec(alt, CHAT, chat_body(SMALL), 64, srv=bench.alt),
        "alt_responses_64": spec(alt, RESPONSES, responses_body(SMALL), 64, srv=bench.alt),
        "floor_proxy_64": spec(bench.floor.port, CHAT, chat_body(SMALL), 64),
        "direct_token_fields_64": spec(proxy, CHAT, chat_body(SMALL, token_fields=True), 64),
        "server_responses_captured_64": spec(server, RESPONSES, responses_body(SMALL), 64, corr),
        "direct_256": spec(proxy, CHAT, chat_body(SMALL), 256),
        "server_chat_256": spec(server, CHAT, chat_body(SMALL), 256),
    }
    res = bench.interleave(
        rounds, series, after=lambda name, r: bench.cap.wait_capture_idle() if "captured" in name else None
    )
    bench.data["concurrency"] = {
        name: {**summary(pool(results)), "rounds_rps": [x["throughput"] for x in results]}
        for name, results in res.items()
    }
    for via_name, base_name, label, target in (
        ("server_chat_64", "direct_64", "chat, c=64", 0.8),
        ("server_responses_64", "direct_64", "Responses, c=64", 0.8),
        # Responses (stored, the default) against chat through the same server: what the Responses path adds.
        ("server_responses_64", "server_chat_64", "Responses (stored) / chat, both via server, c=64", 0.9),
        ("server_responses_nostore_64", "direct_64", "Responses, c=64, response_store: false", None),
        (
            "server_responses_64",
            "server_responses_nostore_64",
            "Responses, c=64, stored / response_store: false",
            None,
        ),
        ("alt_chat_64", "direct_64", f"chat, c=64, under {bench.alt_impl}", None),
        ("alt_responses_64", "direct_64", f"Responses, c=64, under {bench.alt_impl}", None),
        ("floor_proxy_64", "direct_64", "floor (bench/floor.py), c=64", None),
        ("server_responses_captured_64", "direct_token_fields_64", "Responses captured, c=64", None),
        ("server_chat_256", "direct_256", "chat, c=256", None),
    ):
        via, base = res[via_name], res[base_name]
        ratios = [v["throughput"] / b["throughput"] for v, b in zip(via, base) if b["throughput"]]
        ratio = median(ratios)
        pv, pb = pool(via), pool(base)
        spread = f" (rounds {min(ratios):.2f}-{max(ratios):.2f})" if len(ratios) > 1 else ""
        bench.row(
            "concurrency",
            f"throughput ratio, {label}",
            f"{median([b['throughput'] for b in base]):.0f} req/s",
            f"{median([v['throughput'] for v in via]):.0f} req/s",
            f"{fmt_ratio(ratio)}{spread}; CPU-based {fmt_ratio(cpu_ratio(base, via))}",
            f">= {target}" if target else "(reported)",
            ratio_verdict(ratio, cpu_ratio(base, via), target, errors(pv, pb)) if target else errors(pv, pb) or "",
        )
        bench.row(
            "concurrency",
            f"added p99, {label}",
            f"p99 {fmt_ms(pct(pb['lat'], 0.99))}",
            f"p99 {fmt_ms(pct(pv['lat'], 0.99))}",
            f"{fmt_delta(pct(pv['lat'], 0.99) - pct(pb['lat'], 0.99))}",
            "(reported)",
            "",
        )


def streams(bench: Bench) -> None:
    bench.log("streams: time to first event / first token / last event")
    rounds, n, warm = (1, 15, 3) if bench.quick else (4, 50, 5)
    proxy, server = bench.cap.proxy_port, bench.cap.port
    conns_before = bench.cap.upstream_connections()

    def spec(port: int, path: str, body: str, mark: str, fresh: bool):
        return lambda r: (
            {
                "port": port,
                "templates": [template(path, body)],
                "concurrency": 1,
                "count": n + warm,
                "warmup": warm,
                "stream": True,
                "marker": mark,
                "fresh": fresh,
            },
            bench.cap,
        )

    res = bench.interleave(
        rounds,
        {
            "direct_keepalive": spec(proxy, CHAT, chat_body(STREAM, stream=True), CHAT_TOKEN_MARK, False),
            "direct_fresh": spec(proxy, CHAT, chat_body(STREAM, stream=True), CHAT_TOKEN_MARK, True),
            "server_responses": spec(
                server, RESPONSES, responses_body(STREAM, stream=True), RESPONSES_TOKEN_MARK, False
            ),
            "server_chat": spec(server, CHAT, chat_body(STREAM, stream=True), CHAT_TOKEN_MARK, False),
        },
    )
    pooled = {name: pool(results) for name, results in res.items()}
    bench.data["streams"] = {name: summary(p) for name, p in pooled.items()}
    for via_name, base_name, label in (
        ("server_responses", "direct_fresh", "Responses vs direct chat, fresh conn"),
        ("server_responses", "direct_keepalive", "Responses vs direct chat, keep-alive"),
        ("server_chat", "direct_fresh", "chat vs direct chat, fresh conn"),
    ):
        via, base = pooled[via_name], pooled[base_name]
        for key, what in (("first", "first event"), ("marker", "first token"), ("lat", "last event")):
            bench.row(
                "streams",
                f"added time to {what}, {label}",
                fmt_lat(base[key]),
                fmt_lat(via[key]),
                added(base[key], via[key]),
                "(reported)",
                errors(via, base) or "",
            )
    time.sleep(1.0)
    through_server = pooled["server_responses"]["ok"] + pooled["server_chat"]["ok"]
    # Earlier sections may leave idle pooled connections that expire meanwhile: fewer after is fine.
    conns_after = bench.cap.upstream_connections()
    left = conns_after - conns_before
    bench.data["streams"]["upstream_connections_left_open"] = left
    bench.row(
        "streams",
        f"server->Switchyard connections still open after {through_server} streams",
        "",
        "",
        f"{conns_after} (before the streams: {conns_before})",
        "<= 2 (the keep-alive pool's idle ones; a leak grows with the streams)",
        "ok" if left <= 2 else "LEAK: the stream pool (upstream_max_connections) fills, then streams hang",
    )


def loopback_send_cost(n: int = 1000) -> tuple[float, float]:
    """CPU µs per 300-byte loopback send when the reader is another (sleeping) process, and per
    send+recv pair inside one thread. Every hop of the request path pays the first one per message."""
    import socket

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        reader = subprocess.Popen(
            [
                sys.executable,
                "-c",
                (f"import socket,sys\ns=socket.create_connection(('127.0.0.1',{port}))\nwhile s.recv(65536): pass\n"),
            ]
        )
        conn, _ = listener.accept()
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            data = b"x" * 300
            spent = 0.0
            for _ in range(n):
                time.sleep(0.0005)  # let the reader go back to sleep in recv()
                c0 = time.process_time()
                conn.send(data)
                spent += time.process_time() - c0
        reader.wait(10)
        a = socket.create_connection(("127.0.0.1", port))
        b, _ = listener.accept()
        with a, b:
            a.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            c0 = time.process_time()
            for _ in range(n):
                a.send(data)
                b.recv(65536)
            local = time.process_time() - c0
    return spent / n * 1e6, local / n * 1e6
