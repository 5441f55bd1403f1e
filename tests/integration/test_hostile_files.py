"""No file in the capture directory hangs the server or exhausts its memory.

A compression bomb in a `.delta` and in a `.json.gz` record, a sparse `.json` of a gigabyte, and a
FIFO named `*.json`, all in session folders of a capture directory a real server then serves:
every session request answers, the server's process tree (psutil) never grows by more than a
fraction of those sizes, and SIGTERM still stops it within the promised 30 s.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import time
import zlib

import httpx
import orjson
import yaml
import zstandard

from tests.support.memory import TreePeak
from tests.support.procs import start_server

BOMB_BYTES = 1 << 30  # each hostile file holds (or claims) 1 GiB
GROWTH_LIMIT = 400 * 1024 * 1024  # the tree may grow this much at most while serving them


def session_dir(capture_dir, session_id: str):
    path = capture_dir / "sessions" / hashlib.sha256(session_id.encode()).hexdigest()
    path.mkdir(parents=True, mode=0o700)
    return path


def head_line(session_id: str) -> bytes:
    return orjson.dumps(
        {
            "schema_version": 1,
            "uuid": f"{session_id}-1",
            "session_id": session_id,
            "parent_session_id": None,
            "captured_at": "2026-01-01T00:00:00.000000Z",
            "server_run": None,
        }
    )


def zeros(total: int, chunk: int = 1 << 24):
    left = total
    while left > 0:
        yield b"\0" * min(chunk, left)
        left -= chunk


def plant_bombs(capture_dir) -> None:
    """Three hostile files, each the only record of a session of its own, and an ordinary session."""
    with open(session_dir(capture_dir, "bomb-delta") / "bomb-delta-1.delta", "wb") as out:
        out.write(head_line("bomb-delta") + b"\n" + b'{"base":null}' + b"\n")
        writer = zstandard.ZstdCompressor(level=1).stream_writer(out, size=BOMB_BYTES, closefd=False)
        for piece in zeros(BOMB_BYTES):
            writer.write(piece)
        writer.close()
    with open(session_dir(capture_dir, "bomb-gz") / "bomb-gz-1.json.gz", "wb") as out:
        packer = zlib.compressobj(1, zlib.DEFLATED, 31)
        out.write(packer.compress(b'{"schema_version":1,"uuid":"bomb-gz-1","pad":"'))
        for piece in zeros(BOMB_BYTES):
            out.write(packer.compress(piece))
        out.write(packer.flush())
    with open(session_dir(capture_dir, "sparse") / "sparse-1.json", "wb") as out:
        out.write(head_line("sparse")[:-1] + b',"pad":"')
        out.truncate(BOMB_BYTES)
    ordinary = session_dir(capture_dir, "ordinary")
    (ordinary / "x.json.gz").write_bytes(gzip.compress(b"{}"))


def serve_dir(mock_upstream, tmp_path, capture_dir):
    config = tmp_path / "cfg.yaml"
    config.write_text(
        yaml.safe_dump(
            {"switchyard_base_url": mock_upstream + "/v1", "switchyard_model": "m", "capture_dir": str(capture_dir)}
        )
    )
    proc, url = start_server("--config", str(config), wait=False)
    try:
        proc.wait_http(url + "/health", timeout=60)
    except (RuntimeError, TimeoutError):
        proc.stop()
        raise
    return proc, url


def stop_timed(proc) -> float:
    started = time.monotonic()
    proc.stop(timeout=40)
    return time.monotonic() - started


def test_compression_bombs_and_sparse_files_do_not_exhaust_the_server(mock_upstream, tmp_path):
    capture_dir = tmp_path / "cap"
    plant_bombs(capture_dir)
    proc, url = serve_dir(mock_upstream, tmp_path, capture_dir)
    try:
        baseline = TreePeak(proc.pid).rss()
        with TreePeak(proc.pid) as tree:
            listed = httpx.get(url + "/v1/sessions", timeout=60)
            assert listed.status_code == 200, listed.text
            for session_id in ("bomb-delta", "bomb-gz", "sparse", "ordinary"):
                for suffix in ("/completions", "/timeline", "/rollout", "/tree"):
                    reply = httpx.get(f"{url}/v1/sessions/{session_id}{suffix}", timeout=60)
                    assert reply.status_code in (200, 404, 422), (session_id, suffix, reply.text)
        growth = tree.peak - baseline
        print(f"process tree: baseline {baseline >> 20} MiB, peak {tree.peak >> 20} MiB")
        assert growth < GROWTH_LIMIT, f"the server's tree grew by {growth >> 20} MiB"
    finally:
        proc.stop()


def test_a_fifo_in_a_session_folder_neither_hangs_reads_nor_shutdown(mock_upstream, tmp_path):
    capture_dir = tmp_path / "cap"
    os.mkfifo(session_dir(capture_dir, "fifo") / "fifo-1.json")
    (session_dir(capture_dir, "ordinary") / "x.json.gz").write_bytes(gzip.compress(b"{}"))
    proc, url = serve_dir(mock_upstream, tmp_path, capture_dir)
    try:
        # The index is built in the background: the list waits for it, so a blocked scan hangs it.
        listed = httpx.get(url + "/v1/sessions", timeout=20)
        assert listed.status_code == 200, listed.text
        reply = httpx.get(url + "/v1/sessions/fifo/completions", timeout=20)
        assert reply.status_code == 404
    finally:
        stopped_in = stop_timed(proc)
    assert stopped_in < 30, f"SIGTERM took {stopped_in:.1f} s"
