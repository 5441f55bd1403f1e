"""Section `twins`: each newer path against its plain twin, same server and run: Gym training capture, Messages, chains.

- Gym training capture: `/ng-rollout/<id>/training-token-capture/v1/responses` on a server with Gym's
  token store configured (every call also goes into that store) against `/ng-rollout/<id>/v1/responses`
  on the same server; one rollout id per template, 64 of them, so the calls spread over 64 rollouts.
- Messages: `/v1/messages` against `/v1/chat/completions`, the same prompt and answer length.
- Chains: `GET /v1/sessions/{id}/chains` against `GET /v1/sessions/{id}/rollout` of one 200-call
  agent session written into a capture folder (bench/recon.py's synthetic session), the rollout
  cache off so each read rebuilds; the reads alternate, one at a time.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from bench import recon
from bench.calls import CHAT, RESPONSES, SMALL, chat_body, responses_body, template
from bench.harness import Bench
from bench.procs import Server
from bench.reads import _write, fetch_status
from bench.stats import cpu_ratio, errors, fmt_ratio, median, pool, ratio_verdict, summary, verdict

MESSAGES = "/v1/messages"
TRAINING = "training-token-capture"
ROLLOUTS = 64  # rollout ids per Gym series (one template each; the load generator cycles through them)
CHAINS_SESSION = "bench-twins-chains"


def messages_body(content: str) -> str:
    """The Messages twin of `chat_body(content)`: the same one user turn (the mock answers it alike)."""
    return orjson.dumps(
        {"model": "demo", "max_tokens": 256, "messages": [{"role": "user", "content": content}]}
    ).decode()


def twins(bench: Bench) -> None:
    bench.log("twins: Gym training capture vs plain /ng-rollout, Messages vs chat, chains vs rollout")
    rounds, warm, dur = (1, 0.3, 1.2) if bench.quick else (3, 0.7, 3.0)
    gym = Server(
        "server-gym",
        bench.mock,
        bench.log_dir,
        capture_dir=bench.log_dir / "captures-gym",
        settings={"gym": {"token_id_capture": {"enabled": True, "dir": str(bench.log_dir / "gym-tokens")}}},
    )
    bench.procs.append(gym.proc)  # its CPU is this run's, not another tenant's (the header's figure)
    try:
        serving(bench, gym, rounds, warm, dur)
    finally:
        gym.proc.stop()
    chains_read(bench, reads=3 if bench.quick else 9)


def serving(bench: Bench, gym: Server, rounds: int, warm: float, dur: float) -> None:
    body = responses_body(SMALL)

    def rollouts(prefix: str, training: bool) -> list[dict[str, Any]]:
        middle = f"/{TRAINING}" if training else ""
        return [template(f"/ng-rollout/{prefix}-{k}{middle}{RESPONSES}", body) for k in range(ROLLOUTS)]

    def spec(server: Server, templates: list[dict[str, Any]]):
        return lambda r: (
            {
                "port": server.port,
                "templates": templates,
                "concurrency": 64,
                "duration": dur,
                "warmup": warm,
                "timeout": 60,
                "vars": {"run": str(r)},
            },
            server,
        )

    series = {
        "gym_plain": spec(gym, rollouts("bench-plain", training=False)),
        "gym_training": spec(gym, rollouts("bench-train", training=True)),
        "chat": spec(bench.cap, [template(CHAT, chat_body(SMALL))]),
        "messages": spec(bench.cap, [template(MESSAGES, messages_body(SMALL))]),
    }
    # A first burst on the new server (lazy imports, Gym's store opening, first connections).
    for name in ("gym_plain", "gym_training", "messages"):
        first, server = series[name](0)
        bench.gen.run({**first, "duration": None, "warmup": 0, "count": 200, "concurrency": 8})
    res = bench.interleave(rounds, series, after=lambda name, r: gym.wait_capture_idle() if "gym" in name else None)
    bench.data["twins"] = {
        name: {**summary(pool(results)), "rounds_rps": [x["throughput"] for x in results]}
        for name, results in res.items()
    }
    for via_name, base_name, label in (
        ("gym_training", "gym_plain", "Gym training capture on / plain /ng-rollout, Responses, c=64"),
        ("messages", "chat", "/v1/messages / /v1/chat/completions, c=64"),
    ):
        via, base = res[via_name], res[base_name]
        ratios = [v["throughput"] / b["throughput"] for v, b in zip(via, base) if b["throughput"]]
        ratio = median(ratios)
        spread = f" (rounds {min(ratios):.2f}-{max(ratios):.2f})" if len(ratios) > 1 else ""
        bench.row(
            "twins",
            f"throughput ratio, {label}",
            f"{median([b['throughput'] for b in base]):.0f} req/s",
            f"{median([v['throughput'] for v in via]):.0f} req/s",
            f"{fmt_ratio(ratio)}{spread}; CPU-based {fmt_ratio(cpu_ratio(base, via))}",
            ">= 0.9",
            ratio_verdict(ratio, cpu_ratio(base, via), 0.9, errors(pool(via), pool(base))),
        )


def chains_read(bench: Bench, reads: int) -> None:
    """The 200-call session's chains and rollout, each read `reads` times, alternating; median seconds."""
    capture_dir = bench.log_dir / "captures-twins-chains"
    session = recon.synthetic_session(
        CHAINS_SESSION, calls=200, system_tokens=65536 - 199 * 300, gen_tokens=100, tool_tokens=200, seed=5
    )
    for raw in session:
        _write(capture_dir / "sessions", CHAINS_SESSION, orjson.loads(raw)["uuid"], raw)
    server = Server(
        "server-twins-chains", bench.mock, bench.log_dir, capture_dir=capture_dir, settings={"rollout_cache_mb": 0}
    )
    bench.procs.append(server.proc)
    took: dict[str, list[float]] = {"rollout": [], "chains": []}
    statuses: set[int] = set()
    try:
        for r in range(reads + 1):  # the first pair warms the index and imports; not counted
            for kind in ("rollout", "chains") if r % 2 == 0 else ("chains", "rollout"):
                t0 = time.perf_counter()
                statuses.add(fetch_status(f"{server.url}/v1/sessions/{CHAINS_SESSION}/{kind}"))
                if r:
                    took[kind].append(time.perf_counter() - t0)
    finally:
        server.proc.stop()
    bench.data.setdefault("twins", {})["chains_read_s"] = took
    rollout_s, chains_s = median(took["rollout"]), median(took["chains"])
    ratio = chains_s / rollout_s
    bench.row(
        "twins",
        "GET /chains / GET /rollout, one 200-call session (64k context), rebuilt each read",
        f"{rollout_s * 1000:.0f} ms",
        f"{chains_s * 1000:.0f} ms",
        f"{ratio:.2f}x (chains {min(took['chains']) * 1000:.0f}-{max(took['chains']) * 1000:.0f} ms)",
        "<= 2x",
        verdict(ratio <= 2 and statuses == {200}, "" if statuses == {200} else f"statuses {sorted(statuses)}"),
    )
