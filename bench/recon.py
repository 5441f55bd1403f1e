"""Rollout reconstruction speed on synthetic sessions: records built with build_record, timed in-process.

Each record goes through an orjson round trip before it is timed, so its lists and dicts are
separate objects as when the store reads files (nothing is shared between records by identity,
which would make list comparisons artificially cheap). Only the reconstruction calls are timed.
Tokens per second counts every token id the reconstruction was handed: the sum over records of
len(prompt_token_ids) + len(generation_token_ids).
"""

from __future__ import annotations

import gc
import random
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson

from bench.harness import Bench
from bench.stats import verdict
from server.capture.rollout import reconstruct_session, reconstruct_tree
from server.capture.write.record import build_record

_WORDS = (
    "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa "
    "quebec romeo sierra tango uniform victor whiskey xray yankee zulu"
).split()
_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "run",
            "description": "run a shell command",
            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
        },
    }
]


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(words))


def synthetic_session(
    session_id: str,
    *,
    calls: int,
    system_tokens: int,
    gen_tokens: int,
    tool_tokens: int,
    seed: int = 0,
    parent: str | None = None,
) -> list[bytes]:
    """A tool-calling agent session as serialized records: call k's prompt is call k-1's prompt +
    generation + a tool result, so every call extends the one before (the happy path, all checks run)."""
    rng = random.Random(seed)
    ids = lambda n: [rng.randrange(1000, 101000) for _ in range(n)]  # noqa: E731
    prompt = ids(system_tokens)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": _text(rng, system_tokens // 2)},
        {"role": "user", "content": "fix the failing test"},
    ]
    start = datetime(2026, 1, 1, tzinfo=UTC)
    out = []
    for k in range(calls):
        generation = ids(gen_tokens)
        call_id = f"call_{k:04d}"
        reply = {
            "role": "assistant",
            "content": _text(rng, gen_tokens // 2),
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": "run", "arguments": orjson.dumps({"cmd": f"step {k}"}).decode()},
                }
            ],
        }
        response = {
            "id": f"chatcmpl-{k}",
            "model": "policy",
            "prompt_token_ids": list(prompt),
            "choices": [
                {
                    "index": 0,
                    "message": reply,
                    "finish_reason": "tool_calls",
                    "token_ids": generation,
                    "logprobs": {"content": [{"logprob": -((t % 997) + 1) / 1000.0} for t in generation]},
                }
            ],
            "usage": {
                "prompt_tokens": len(prompt),
                "completion_tokens": gen_tokens,
                "total_tokens": len(prompt) + gen_tokens,
            },
        }
        record = build_record(
            session_id=session_id,
            parent_session_id=parent,
            rollout_id=None,
            request_id=f"req_{session_id}_{k}",
            chat_request={"messages": list(messages), "tools": _TOOLS},
            chat_response=response,
            route="policy",
            api="responses",
            stream=False,
            latency_ms=1.0,
            captured_at=(start + timedelta(seconds=k)).isoformat(timespec="microseconds"),
            record_uuid=str(uuid.UUID(int=rng.getrandbits(128))),
        )
        out.append(orjson.dumps(record))
        messages.append(reply)
        messages.append({"role": "tool", "tool_call_id": call_id, "content": _text(rng, tool_tokens // 2)})
        prompt = prompt + generation + ids(tool_tokens)
    return out


def _tokens(records: list[dict]) -> int:
    return sum(len(r["prompt_token_ids"]) + len(r["generation_token_ids"]) for r in records)


def bench_long_session(calls: int = 200, context: int = 65536, gen_tokens: int = 100, tool_tokens: int = 200) -> dict:
    """One long session whose last prompt is `context` tokens."""
    system = max(1, context - (calls - 1) * (gen_tokens + tool_tokens))
    raw = synthetic_session(
        "long-session", calls=calls, system_tokens=system, gen_tokens=gen_tokens, tool_tokens=tool_tokens, seed=1
    )
    records = [orjson.loads(r) for r in raw]
    tokens = _tokens(records)
    gc.collect()
    t0, c0 = time.perf_counter(), time.process_time()
    rollout = reconstruct_session("long-session", records)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    assert rollout["partial_reason"] is None and len(rollout["record_uuids"]) == calls, rollout["partial_reason"]
    return {
        "calls": calls,
        "last_prompt_tokens": len(records[-1]["prompt_token_ids"]),
        "tokens": tokens,
        "seconds": seconds,
        "cpu_seconds": cpu,
        "tokens_per_s": tokens / seconds,
    }


def bench_many_sessions(
    sessions: int = 1000,
    calls: int = 20,
    system_tokens: int = 1000,
    gen_tokens: int = 100,
    tool_tokens: int = 100,
    tree_size: int = 20,
    batch: int = 100,
) -> dict:
    """`sessions` sessions of `calls` calls, as trees of `tree_size` (a root and its sub-agents),
    reconstructed with reconstruct_tree; built and loaded in batches so memory stays bounded."""
    template = synthetic_session(
        "template", calls=calls, system_tokens=system_tokens, gen_tokens=gen_tokens, tool_tokens=tool_tokens, seed=2
    )
    seconds = cpu = 0.0
    tokens = 0
    done = 0
    while done < sessions:
        n = min(batch, sessions - done)
        store: dict[str, list[dict]] = {}
        children: dict[str, list[str]] = {}
        roots = []
        for j in range(done, done + n):
            session_id = f"s{j:05d}"
            root = f"s{j - j % tree_size:05d}"
            parent = None if session_id == root else root
            records = [orjson.loads(r) for r in template]
            for k, record in enumerate(records):
                record["session_id"] = session_id
                record["parent_session_id"] = parent
                record["uuid"] = f"{j:08x}-0000-4000-8000-{k:012x}"
            store[session_id] = records
            tokens += _tokens(records)
            if parent is None:
                roots.append(session_id)
            else:
                children.setdefault(parent, []).append(session_id)
        gc.collect()
        t0, c0 = time.perf_counter(), time.process_time()
        for root in roots:
            rollout = reconstruct_tree(root, store.__getitem__, lambda s, children=children: children.get(s, []))
            assert not rollout["mask_sample"], rollout["partial_reason"]
        seconds += time.perf_counter() - t0
        cpu += time.process_time() - c0
        done += n
    return {
        "sessions": sessions,
        "calls": calls,
        "last_prompt_tokens": system_tokens + (calls - 1) * (gen_tokens + tool_tokens),
        "tokens": tokens,
        "seconds": seconds,
        "cpu_seconds": cpu,
        "tokens_per_s": tokens / seconds,
    }


def independent_session(session_id: str, calls: int, *, seed: int = 3) -> list[dict]:
    """`calls` calls that share a system prompt and nothing else (no call continues another), as
    records through an orjson round trip: the shape that made the anchor search quadratic."""
    rng = random.Random(seed)
    system = [rng.randrange(1000, 101000) for _ in range(500)]
    start = datetime(2026, 1, 1, tzinfo=UTC)
    out = []
    for k in range(calls):
        prompt = system + [rng.randrange(1000, 101000) for _ in range(rng.randrange(20, 200))]
        generation = [rng.randrange(1000, 101000) for _ in range(50)]
        response = {
            "id": f"chatcmpl-{k}",
            "model": "policy",
            "prompt_token_ids": prompt,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": _text(rng, 25)},
                    "finish_reason": "stop",
                    "token_ids": generation,
                    "logprobs": {"content": [{"logprob": -0.5} for _ in generation]},
                }
            ],
        }
        record = build_record(
            session_id=session_id,
            parent_session_id=None,
            rollout_id=None,
            request_id=f"req_{k}",
            chat_request={"messages": [{"role": "user", "content": _text(rng, 20)}], "tools": _TOOLS},
            chat_response=response,
            route="policy",
            api="chat",
            stream=False,
            latency_ms=1.0,
            captured_at=(start + timedelta(seconds=k)).isoformat(timespec="microseconds"),
            record_uuid=str(uuid.UUID(int=rng.getrandbits(128))),
        )
        out.append(orjson.loads(orjson.dumps(record)))
    return out


def bench_independent_scaling(small: int = 500, large: int = 4000, rounds: int = 5) -> dict:
    """Rebuild time of `large` independent calls over `small`, with the continuation index and with
    the reference scan of every later record (`indexed=False`; side by side in the first round).

    Each size's time is the fastest of `rounds`: on a shared machine noise only ever adds time, and
    the 500-call rebuild takes tens of milliseconds, where one scheduler hiccup doubles a sample."""
    from server.capture.rollout import reconstruct
    from server.capture.rollout.continuation import ContinuationIndex

    sessions = {n: independent_session("independent", n) for n in (small, large)}
    times: dict[tuple[str, int], list[float]] = {}
    original = reconstruct.ContinuationIndex
    try:
        for r in range(rounds):
            # The reference scan takes seconds at 4,000 calls: it runs in the first round only.
            modes = ("indexed", "scan") if r == 0 else ("indexed",)
            for mode in modes:
                reconstruct.ContinuationIndex = (  # type: ignore[misc]
                    original if mode == "indexed" else (lambda prompts: ContinuationIndex(prompts, indexed=False))
                )
                for n, records in sessions.items():
                    gc.collect()
                    t0 = time.perf_counter()
                    reconstruct_session("independent", records)
                    times.setdefault((mode, n), []).append(time.perf_counter() - t0)
    finally:
        reconstruct.ContinuationIndex = original  # type: ignore[misc]

    out: dict[str, Any] = {"small": small, "large": large, "rounds": rounds}
    for mode in ("indexed", "scan"):
        out[mode] = {
            "small_s": min(times[(mode, small)]),
            "large_s": min(times[(mode, large)]),
            "ratio": min(times[(mode, large)]) / min(times[(mode, small)]),
            "ratios": [b / a for a, b in zip(times[(mode, small)], times[(mode, large)], strict=True)],
        }
    return out


if __name__ == "__main__":
    print(bench_independent_scaling())
    print(bench_long_session())
    print(bench_many_sessions())


# The bench section


def reconstruction(bench: Bench) -> None:
    bench.log("reconstruction: synthetic sessions, in-process")
    long = bench_long_session(calls=200, context=65536)
    many = bench_many_sessions(sessions=100 if bench.quick else 1000, calls=20)
    bench.data["reconstruction"] = {"long": long, "many": many}
    for label, r in (
        (f"1 session x {long['calls']} calls, contexts to {long['last_prompt_tokens'] // 1024}k", long),
        (f"{many['sessions']} sessions x {many['calls']} calls (trees of 20)", many),
    ):
        tps = r["tokens_per_s"]
        bench.row(
            "reconstruction",
            label,
            f"{r['tokens'] / 1e6:.1f} M tokens",
            f"{r['seconds']:.2f} s",
            f"{tps / 1e6:.1f} M tokens/s (CPU {r['tokens'] / r['cpu_seconds'] / 1e6:.1f})",
            ">= 5 M tokens/s",
            verdict(tps >= 5e6, ""),
        )
    scaling = bench_independent_scaling(rounds=2 if bench.quick else 5)
    bench.data["reconstruction"]["independent"] = scaling
    new, old = scaling["indexed"], scaling["scan"]
    spread = f" (per round {min(new['ratios']):.1f}-{max(new['ratios']):.1f})" if len(new["ratios"]) > 1 else ""
    bench.row(
        "reconstruction",
        f"{scaling['large']} vs {scaling['small']} independent calls: time ratio (fastest of {scaling['rounds']})",
        f"{new['small_s'] * 1000:.0f} / {new['large_s'] * 1000:.0f} ms",
        f"{new['ratio']:.1f}x{spread}",
        f"former scan of every later record: {old['ratio']:.1f}x ({old['large_s']:.2f} s)",
        "<= 10x",
        verdict(new["ratio"] <= 10, ""),
    )
