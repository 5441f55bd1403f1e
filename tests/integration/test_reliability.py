"""Faults survived: client disconnects, graceful shutdown, kill -9 during capture, unwritable capture dir."""

from __future__ import annotations

import hashlib
import os
import signal
import threading

import httpx
import psutil
import pytest

from tests.support.captures import records_in
from tests.support.procs import wait_for
from tests.support.stack import launch_stack


def completions(chain, session_id: str) -> dict:
    return httpx.get(f"{chain.url}/v1/sessions/{session_id}/completions", timeout=30).json()


def stream_body(content: str) -> dict:
    return {"model": "x", "stream": True, "messages": [{"role": "user", "content": content}]}


def test_disconnect_mid_stream_cancels_upstream_and_records_a_partial_call(chain):
    before = chain.mock_stats()["cancelled"]
    with httpx.Client(timeout=30) as client:
        with client.stream(
            "POST",
            chain.v1 + "/chat/completions",
            headers={"x-session-id": "gone-mid-stream"},
            json=stream_body("[[mock:tokens 200]] [[mock:slow 50]]"),
        ) as response:
            lines = response.iter_lines()
            received = [next(lines) for _ in range(6)]
            assert any(line.startswith("data: ") for line in received)
        # leaving the block closes the connection mid-stream
    assert wait_for(lambda: chain.mock_stats()["cancelled"] > before), "the upstream call was not cancelled"
    records = wait_for(lambda: completions(chain, "gone-mid-stream").get("completions"))
    assert records and records[0]["status"] == "partial"
    assert records[0]["is_valid"] is False or records[0]["finish_reason"] in (None, "")


def test_disconnect_before_the_first_byte_cancels_upstream(chain):
    before = chain.mock_stats()["cancelled"]
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            chain.v1 + "/chat/completions",
            timeout=0.5,
            json={"model": "x", "messages": [{"role": "user", "content": "[[mock:hang 20]] hi"}]},
        )
    assert wait_for(lambda: chain.mock_stats()["cancelled"] > before, timeout=10)
    assert chain.mock_stats()["in_flight"] == 0


def test_sigterm_lets_an_inflight_stream_finish_and_loses_no_record(mock_upstream, tmp_path):
    stack = launch_stack(mock_upstream, tmp_path)
    result: dict = {}

    def slow_stream():
        with httpx.stream(
            "POST",
            stack.v1 + "/chat/completions",
            headers={"x-session-id": "shutdown-1"},
            timeout=60,
            json=stream_body("[[mock:tokens 30]] [[mock:slow 40]]"),
        ) as response:
            result["lines"] = [line for line in response.iter_lines() if line]

    worker = threading.Thread(target=slow_stream)
    worker.start()
    assert wait_for(lambda: stack.mock_stats()["in_flight"] > 0)
    os.kill(stack.proc.pid, signal.SIGTERM)

    def refused() -> bool:
        try:
            httpx.get(stack.url + "/health", timeout=2)
        except httpx.ConnectError:
            return True
        return False

    assert wait_for(refused, timeout=10), "still accepting connections after SIGTERM"
    worker.join(60)
    assert result["lines"][-1] == "data: [DONE]"  # the in-flight stream finished
    assert stack.proc.popen.wait(30) in (0, -signal.SIGTERM)
    stack.proc.stop()
    [record], skipped = records_in(tmp_path)
    assert skipped == 0
    assert record["session_id"] == "shutdown-1" and record["status"] == "completed"


def test_kill_9_during_heavy_capture_leaves_no_torn_record(mock_upstream, tmp_path):
    # Delta records: a kill must not leave one whose base never reached the disk.
    config = tmp_path / "delta.yaml"
    config.write_text("capture_encoding: delta\n")
    stack = launch_stack(mock_upstream, tmp_path, "--config", str(config))
    stop = threading.Event()
    acknowledged = []

    def load(worker: int):
        with httpx.Client(timeout=30) as client:
            for i in range(10_000):
                if stop.is_set():
                    return
                try:
                    r = client.post(
                        stack.v1 + "/chat/completions",
                        headers={"x-session-id": f"heavy-{worker}"},
                        json={"model": "x", "messages": [{"role": "user", "content": f"call {i}"}]},
                    )
                except httpx.HTTPError:
                    return
                if r.status_code == 200:
                    acknowledged.append((worker, i))

    workers = [threading.Thread(target=load, args=(w,)) for w in range(8)]
    for w in workers:
        w.start()
    assert wait_for(lambda: len(acknowledged) > 150, timeout=60)
    # What the server has reported written must survive the kill; what was still queued may not.
    written = httpx.get(stack.url + "/health").json()["capture"]["written"]
    os.kill(stack.proc.pid, signal.SIGKILL)
    stop.set()
    for w in workers:
        w.join(30)
    stack.proc.stop()
    # Every file a reader can see is a whole record (temp files are hidden), and every delta has its base.
    records, skipped = records_in(tmp_path)
    assert skipped == 0 and not [r for r in records if (r["invalid_reason"] or "").startswith("delta record")]
    assert written > 0 and len(records) >= written
    assert len(records) <= len(acknowledged) + 8  # at most one call in flight per worker beyond those answered
    # The next server on the same directory serves them all.
    after = launch_stack(mock_upstream, tmp_path)
    try:
        served = sum(len(completions(after, f"heavy-{w}").get("completions", [])) for w in range(8))
        assert served == len(records)
    finally:
        after.proc.stop()


def test_unwritable_capture_dir_degrades_to_counted_failures(mock_upstream, tmp_path):
    capture = tmp_path / "cap"
    capture.mkdir()
    stack = launch_stack(mock_upstream, capture)
    try:
        os.chmod(capture, 0o500)
        if os.access(capture, os.W_OK):  # root ignores permission bits: put a file where the dir must go
            os.chmod(capture, 0o700)
            (capture / "sessions").mkdir(exist_ok=True)
            (capture / "sessions" / hashlib.sha256(b"blocked").hexdigest()).write_text("")
        for i in range(3):
            r = httpx.post(
                stack.v1 + "/chat/completions",
                headers={"x-session-id": "blocked"},
                timeout=30,
                json={"model": "x", "messages": [{"role": "user", "content": f"hi {i}"}]},
            )
            assert r.status_code == 200

        def health():
            return httpx.get(stack.url + "/health").json()

        assert wait_for(lambda: health()["capture"]["failed"] >= 3)
        assert health()["status"] == "ok"
    finally:
        os.chmod(capture, 0o700)
        stack.proc.stop()


def test_fault_storm_leaks_no_connections_or_fds(chain):
    """A leak grows with every storm; pools (ours, and the hosted Switchyard's to the model server,
    which live in the same process) plateau. So: one storm to fill the pools, count, then more."""
    server = psutil.Process(chain.proc.pid)
    port = int(chain.url.rsplit(":", 1)[1])
    faults = [
        "[[mock:error 500]]",
        "[[mock:error 400]]",
        "[[mock:badjson]]",
        "[[mock:tokens 20]] [[mock:streamcut 3]]",
        "[[mock:error 429 0]]",
    ]

    def storm(rounds: int) -> None:
        with httpx.Client(timeout=30) as client:
            for _ in range(rounds):
                for fault in faults:
                    client.post(
                        chain.v1 + "/chat/completions",
                        json={"model": "x", "messages": [{"role": "user", "content": fault}]},
                    )
                    with client.stream("POST", chain.v1 + "/chat/completions", json=stream_body(fault)) as r:
                        for _line in r.iter_lines():
                            pass
                with pytest.raises(httpx.ReadTimeout):
                    client.post(
                        chain.v1 + "/chat/completions",
                        timeout=0.3,
                        json={"model": "x", "messages": [{"role": "user", "content": "[[mock:hang 5]]"}]},
                    )
        assert wait_for(lambda: chain.mock_stats()["in_flight"] == 0, timeout=15)
        # The storm's client has closed its connections: count once the server has let go of its ends.
        assert wait_for(lambda: not client_connections(), timeout=15), client_connections()

    def client_connections() -> list:
        return [
            c
            for c in server.net_connections(kind="tcp")
            if c.laddr and c.laddr.port == port and c.status != psutil.CONN_LISTEN
        ]

    storm(2)
    fds_before, conns_before = server.num_fds(), len(server.net_connections(kind="tcp"))
    storm(6)
    fds_after, conns_after = server.num_fds(), len(server.net_connections(kind="tcp"))
    assert fds_after <= fds_before + 4, (fds_before, fds_after)
    assert conns_after <= conns_before + 4, (conns_before, conns_after)


def test_a_restarted_server_serves_what_the_previous_one_recorded(mock_upstream, tmp_path):
    first = launch_stack(mock_upstream, tmp_path)
    try:
        for turn in range(2):
            r = httpx.post(
                first.v1 + "/chat/completions",
                headers={"x-session-id": "restart-1"},
                timeout=30,
                json={"model": "x", "messages": [{"role": "user", "content": f"turn {turn}"}]},
            )
            assert r.status_code == 200
        before = completions(first, "restart-1")
    finally:
        first.proc.stop()
    second = launch_stack(mock_upstream, tmp_path)
    try:
        assert completions(second, "restart-1") == before and len(before["completions"]) == 2
        sessions = httpx.get(second.url + "/v1/sessions").json()["sessions"]
        assert [s["session_id"] for s in sessions] == ["restart-1"]
    finally:
        second.proc.stop()
