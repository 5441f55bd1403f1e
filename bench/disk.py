"""Capture disk use: record files against 4 bytes per unique token, for each `capture_encoding`, and what
the encoding costs to read back (rollout rebuilds) and to write (the writer thread's CPU per record).

Records are read through the store's own loader (a `.delta` file is only a record together with its
base); sizes are those of the files on disk.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from server.capture.delta import DeltaEncoder
from server.capture.sessions import build_rollout
from server.capture.store import CaptureStore, read_session_records, session_dir_name


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
        encoder, spent = DeltaEncoder(), 0.0
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
