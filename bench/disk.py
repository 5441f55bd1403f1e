"""Capture disk use: record files against 4 bytes per unique token, for each `capture_encoding`, and what
the encoding costs to read back (rollout rebuilds) and to write (the writer thread's CPU per record).

Records are read through the store's own loader (a `.delta` file is only a record together with its
base); sizes are those of the files on disk.
"""

from __future__ import annotations

import itertools
import os
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench.calls import CHAT, words
from bench.harness import Bench
from bench.procs import Server
from bench.stats import median, verdict
from server.capture.catalog.sessions import build_rollout
from server.capture.store import CaptureStore, read_session_records, session_dir_name
from server.capture.write.diff import DiffEncoder


def _files(capture_dir: Path, session_id: str) -> dict[str, int]:
    """File size by record uuid (the file name up to its first dot)."""
    directory = capture_dir / "sessions" / session_dir_name(session_id)
    return {p.name.split(".", 1)[0]: p.stat().st_size for p in directory.iterdir() if not p.name.startswith(".")}


def session_disk(capture_dir: Path, session_id: str) -> dict[str, Any]:
    """A conversation's files: per record against the tokens it adds; all of them against its unique tokens."""
    records, skipped = read_session_records(capture_dir / "sessions", session_id)
    if skipped or not records:
        raise RuntimeError(f"{session_id}: {len(records)} records, {skipped} unreadable in {capture_dir}")
    sizes = _files(capture_dir, session_id)
    rows = []
    prev = 0
    for record in records:
        prompt, gen = len(record["prompt_token_ids"]), len(record["generation_token_ids"])
        new = prompt - prev + gen if rows else prompt + gen
        size = sizes[record["uuid"]]
        rows.append(
            {"file_bytes": size, "prompt": prompt, "generation": gen, "new_tokens": new, "ratio": size / (4 * new)}
        )
        prev = prompt + gen
    total = sum(r["file_bytes"] for r in rows)
    unique = rows[-1]["prompt"] + rows[-1]["generation"]
    return {
        "records": len(rows),
        "total_bytes": total,
        "unique_tokens": unique,
        "ratio": total / (4 * unique),
        # What is left over the 3x budget, spread over the calls: the "constant per call" it would take.
        "over_3x_per_call_bytes": max(0.0, (total - 3 * 4 * unique) / len(rows)),
        "last_file_bytes": rows[-1]["file_bytes"],
        "last_new_tokens": rows[-1]["new_tokens"],
        "last_ratio": rows[-1]["ratio"],
        "per_record": rows,
    }


def single_calls_disk(capture_dir: Path, session_ids: list[str]) -> dict[str, Any]:
    """Calls that each stand alone (one record per session): mean file size against their tokens."""
    sizes, tokens = [], []
    for session_id in session_ids:
        [record], _ = read_session_records(capture_dir / "sessions", session_id)
        sizes.append(_files(capture_dir, session_id)[record["uuid"]])
        tokens.append(len(record["prompt_token_ids"] or []) + len(record["generation_token_ids"] or []))
    size, unique = sum(sizes) / len(sizes), sum(tokens) / len(tokens)
    return {"records": len(sizes), "file_bytes": size, "unique_tokens": unique, "ratio": size / (4 * unique)}


def rebuild_times(dirs: dict[str, Path], session_id: dict[str, str], rounds: int) -> dict[str, Any]:
    """Rollout rebuild (read every record, reconstruct) of the same conversation from each directory,
    in this process, alternating the order each round; seconds per rebuild and per read of the records."""
    out: dict[str, dict[str, list[float]]] = {name: {"rollout_s": [], "read_s": []} for name in dirs}
    stores = {name: CaptureStore.open_read_only(directory) for name, directory in dirs.items()}
    names = list(dirs)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            t0 = time.perf_counter()
            stores[name].read_completions(session_id[name])
            t1 = time.perf_counter()
            rollout = build_rollout(stores[name], session_id[name])
            t2 = time.perf_counter()
            out[name]["read_s"].append(t1 - t0)
            out[name]["rollout_s"].append(t2 - t1 + (t1 - t0))  # a rebuild reads, then reconstructs
            assert rollout["partial_reason"] is None, rollout["partial_reason"]
    return {name: {**times, "rollout_median_s": statistics.median(times["rollout_s"])} for name, times in out.items()}


def writer_cpu(capture_dir: Path, session_id: str, rounds: int = 3) -> dict[str, float]:
    """Writer-thread CPU per record to turn the session's records into file bytes: whole (orjson) vs delta.

    The delta encoder is fed the records in order, as the writer feeds it; each encoded file is put
    in a scratch directory (outside the timing) so it can serve as the next record's base.
    """
    records, _ = read_session_records(capture_dir / "sessions", session_id)
    full, delta = [], []
    for _ in range(rounds):
        t0 = time.process_time()
        for record in records:
            orjson.dumps(record)
        full.append((time.process_time() - t0) / len(records))
        encoder, spent = DiffEncoder(), 0.0
        with tempfile.TemporaryDirectory() as scratch:
            for record in records:
                t0 = time.process_time()
                encoded = encoder.encode(record)
                spent += time.process_time() - t0
                path = os.path.join(scratch, record["uuid"])
                with open(path, "wb") as handle:
                    handle.write(encoded.data)
                encoded.commit(path)
        delta.append(spent / len(records))
    return {"full_ms": statistics.median(full) * 1000, "delta_ms": statistics.median(delta) * 1000}


class ZipfText:
    """Pseudo-words drawn with Zipf weights (rank r has weight 1/r) from a generated vocabulary.

    The mock's own text cycles through 20 words, which gzip squeezes far better than real text. This
    draws from 30,000 made-up lowercase words, about 10.5 bits per word, near English's word
    unigram entropy. Each word is still one mock token. Seeded, so every server gets the same text.
    """

    def __init__(self, seed: int = 20261129, vocabulary: int = 30_000) -> None:
        self.rng = random.Random(seed)
        letters = "abcdefghijklmnopqrstuvwxyz"
        vocab: set[str] = set()
        while len(vocab) < vocabulary:
            vocab.add("".join(self.rng.choices(letters, k=self.rng.randint(2, 10))))
        self.vocab = sorted(vocab)
        self.rng.shuffle(self.vocab)  # so rank does not follow spelling
        self.cum_weights = list(itertools.accumulate(1.0 / rank for rank in range(1, vocabulary + 1)))

    def words(self, n: int) -> str:
        return " ".join(self.rng.choices(self.vocab, cum_weights=self.cum_weights, k=n))


# The bench section


def disk(bench: Bench) -> None:
    """Disk that grows with the tokens, not the turns (`capture_encoding`)."""
    bench.log("capture disk bytes vs unique tokens: full records (.json, .json.gz) and delta records (.delta)")
    turns, long_turns, singles = (8, 40, 3) if bench.quick else (20, 200, 8)
    servers: dict[str, tuple[Server, Path]] = {}
    try:
        for encoding, settings in (
            ("plain", {"capture_encoding": "full"}),
            ("gzip", {"capture_encoding": "full", "capture_compress": True}),
            ("delta", {"capture_encoding": "delta"}),
        ):
            directory = bench.log_dir / f"captures-disk-{encoding}"
            servers[encoding] = (
                Server(f"server-disk-{encoding}", bench.mock, bench.log_dir, capture_dir=directory, settings=settings),
                directory,
            )
        stamp = int(time.time())
        out: dict[str, Any] = {}
        # Every encoding gets the very same calls (the same seed), so only the files differ.
        for encoding, (server, directory) in servers.items():
            long = long_turns if encoding != "gzip" else 0
            out[encoding] = _disk_workload(
                bench, server, directory, f"bench-disk-{encoding}-{stamp}", turns, singles, long
            )
    finally:
        for server, _ in servers.values():
            server.proc.stop()
    plain, packed, delta = out["plain"], out["gzip"], out["delta"]
    dirs = {"full": servers["plain"][1], "delta": servers["delta"][1]}
    long_ids = {"full": plain["long_session_id"], "delta": delta["long_session_id"]}
    rebuild = rebuild_times(dirs, long_ids, rounds=3 if bench.quick else 7)
    cpu_long = writer_cpu(dirs["full"], long_ids["full"])
    cpu_single = writer_cpu(dirs["full"], plain["single_ids"][0])
    bench.data["disk"] = {
        **out,
        "rebuild": rebuild,
        "writer_cpu": {"long_session": cpu_long, "single_call": cpu_single},
        "text": "Zipf over a generated 30,000-word vocabulary (ZipfText); low_entropy: the mock's 20 cycled words",
    }
    encodings = (("plain", plain), ("gzip", packed), ("delta", delta))

    def ratios(key: str, digits: int, names=("plain", "gzip", "delta")) -> str:
        return ", ".join(f"{n} {r[key]['ratio']:.{digits}f}x" for n, r in encodings if n in names)

    def kib(key: str, field: str = "file_bytes", names=("plain", "gzip", "delta")) -> str:
        return " / ".join(f"{r[key][field] / 1024:.0f}" for n, r in encodings if n in names) + " KiB"

    def delta_verdict(key: str) -> str:
        # Target: 3x (4 B x unique tokens) plus a constant per call. The constant taken
        # here is 1 KiB, about a record's fixed fields (ids, times, usage, counts: line 1 of a .delta).
        extra = delta[key].get("over_3x_per_call_bytes", 0.0)
        return verdict(extra <= 1024, "") + (f" (3x + {extra:.0f} B a call)" if extra else "")

    bench.row(
        "disk",
        "8k-prompt single call: file / (4 B x unique tokens)  [plain / gzip / delta]",
        f"{plain['single']['unique_tokens']:.0f} tokens",
        kib("single"),
        ratios("single", 1),
        "<= 3x + 1 KiB/call (delta)",
        delta_verdict("single"),
    )
    bench.row(
        "disk",
        f"{turns}-turn session, last record: file / (4 B x its new tokens)",
        f"{plain['session']['last_new_tokens']} new tokens",
        kib("last"),
        ratios("last", 1),
        "(context)",
        "",
    )
    bench.row(
        "disk",
        f"{turns}-turn session, all files / (4 B x session's unique tokens)",
        f"{plain['session']['unique_tokens']} tokens",
        kib("session", "total_bytes"),
        ratios("session", 1),
        "<= 3x + 1 KiB/call (delta)",
        delta_verdict("session"),
    )
    bench.row(
        "disk",
        f"{long_turns}-turn session, all files / (4 B x session's unique tokens)  [plain / delta]",
        f"{plain['long']['unique_tokens']} tokens",
        kib("long", "total_bytes", ("plain", "delta")),
        ratios("long", 1, ("plain", "delta")),
        "<= 3x + 1 KiB/call (delta)",
        delta_verdict("long"),
    )
    bench.row(
        "disk",
        "8k-prompt single call, the mock's 20-word text (how low entropy flatters compression)",
        f"{plain['low_entropy']['unique_tokens']:.0f} tokens",
        kib("low_entropy"),
        ratios("low_entropy", 1),
        "(context)",
        "",
    )
    full_s, delta_s = rebuild["full"]["rollout_s"], rebuild["delta"]["rollout_s"]
    ratio = rebuild["delta"]["rollout_median_s"] / rebuild["full"]["rollout_median_s"]
    bench.row(
        "disk",
        f"{long_turns}-turn session rollout rebuild (read + reconstruct, in process): full vs delta",
        f"{rebuild['full']['rollout_median_s'] * 1000:.0f} ms ({min(full_s) * 1000:.0f}-{max(full_s) * 1000:.0f})",
        f"{rebuild['delta']['rollout_median_s'] * 1000:.0f} ms ({min(delta_s) * 1000:.0f}-{max(delta_s) * 1000:.0f})",
        f"delta / full {ratio:.2f}x; reading the records alone "
        f"{median(rebuild['delta']['read_s']) / median(rebuild['full']['read_s']):.2f}x",
        "<= 1x",
        verdict(ratio <= 1.0, ""),
    )
    bench.row(
        "disk",
        "writer CPU per record, whole (orjson) vs delta (match + compress): "
        f"{long_turns}-turn session / 8k single call",
        f"{cpu_long['full_ms']:.2f} / {cpu_single['full_ms']:.2f} ms",
        f"{cpu_long['delta_ms']:.2f} / {cpu_single['delta_ms']:.2f} ms",
        f"delta - full: {cpu_long['delta_ms'] - cpu_long['full_ms']:+.2f} / "
        f"{cpu_single['delta_ms'] - cpu_single['full_ms']:+.2f} ms",
        "(context)",
        "",
    )


def _disk_workload(
    bench, server: Server, directory: Path, prefix: str, turns: int, singles: int, long_turns: int
) -> dict[str, Any]:
    """Single 8k-prompt calls and multi-turn sessions, captured by `server`; their files measured."""
    text = ZipfText()
    single_ids = [f"{prefix}-single-{k}" for k in range(singles)]
    low_ids = [f"{prefix}-low-{k}" for k in range(3)]
    session_id, long_id = f"{prefix}-session", f"{prefix}-long"
    with httpx.Client(base_url=server.url, timeout=120.0, trust_env=False) as client:

        def call(session: str, history: list[dict[str, Any]]) -> dict[str, Any]:
            reply = client.post(CHAT, json={"model": "demo", "messages": history}, headers={"x-session-id": session})
            reply.raise_for_status()
            return reply.json()["choices"][0]["message"]

        def conversation(session: str, n: int, user_words: int, generated: int) -> None:
            messages: list[dict[str, Any]] = [{"role": "system", "content": text.words(500)}]
            for _ in range(n):
                messages.append({"role": "user", "content": text.words(user_words) + f" [[mock:tokens {generated}]]"})
                messages.append({"role": "assistant", "content": call(session, messages)["content"]})

        for sid in single_ids:
            call(sid, [{"role": "user", "content": text.words(8000) + " [[mock:tokens 200]]"}])
        for k, sid in enumerate(low_ids):
            call(sid, [{"role": "user", "content": words(8000, offset=k) + " [[mock:tokens 200]]"}])
        conversation(session_id, turns, 300, 100)
        if long_turns:
            # A 200-call agent session, kept inside the mock's 32k context: ~140 new tokens a
            # turn, 29k tokens at the end.
            conversation(long_id, long_turns, 100, 40)
    server.wait_capture_idle()
    session = session_disk(directory, session_id)
    return {
        "single": single_calls_disk(directory, single_ids),
        "single_ids": single_ids,
        "low_entropy": single_calls_disk(directory, low_ids),
        "session": session,
        "last": {"file_bytes": session["last_file_bytes"], "ratio": session["last_ratio"]},
        **({"long": session_disk(directory, long_id), "long_session_id": long_id} if long_turns else {}),
    }
