"""Both HTTP servers under the same app (`http_server`): streaming, graceful shutdown, startup failure.

The rest of the suite runs under the default server; these run the behaviours that depend on the
server itself under each of them.
"""

from __future__ import annotations

import http.client
import signal
import threading
import time

import httpx
import orjson
import pytest

from server.capture.read.rebuilds import rollout_json
from server.capture.store import CaptureStore
from server.capture.write.record import RecordInput
from tests.support.procs import start_server, wait_for
from tests.support.tcp import NaglingStreamServer, delayed_acks

SERVERS = ["uvicorn", "granian"]
PACED = "[[mock:tokens 12]] [[mock:slow 150]] go"  # about 1.8 s of stream, a chunk every 150 ms


def _serve(mock_upstream: str, impl: str, *extra: str):
    return start_server(
        "--deployment",
        "demo",
        "--no-capture",
        "--http-server",
        impl,
        *extra,
        env={"MOCK_UPSTREAM_URL": mock_upstream + "/v1"},
    )


def _paced_stream(base: str, seen: dict) -> None:
    body = {"model": "x", "stream": True, "messages": [{"role": "user", "content": PACED}]}
    with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=30) as response:
        seen["status"] = response.status_code
        chunks = []
        for chunk in response.iter_raw():
            chunks.append((time.monotonic(), chunk))
            seen.setdefault("first_chunk_at", time.monotonic())
        seen["last_chunk_at"] = time.monotonic()
        seen["body"] = b"".join(c for _, c in chunks)


@pytest.mark.parametrize("impl", SERVERS)
def test_streams_arrive_as_they_are_made_and_sigterm_lets_them_finish(mock_upstream, impl):
    proc, base = _serve(mock_upstream, impl)
    try:
        health = httpx.get(base + "/health", timeout=10).json()
        assert health["http_server"] == impl
        seen: dict = {}
        client = threading.Thread(target=_paced_stream, args=(base, seen))
        client.start()
        assert wait_for(lambda: "first_chunk_at" in seen, 20, interval=0.02), "no byte of the stream arrived"
        proc.popen.send_signal(signal.SIGTERM)  # mid-stream: the stream must still finish whole
        client.join(30)
        # uvicorn re-raises the signal once its graceful shutdown is done (the process ends by it);
        # granian's embedded server returns, and the process exits 0.
        assert proc.popen.wait(30) == (-signal.SIGTERM if impl == "uvicorn" else 0)
    finally:
        proc.stop()
    assert seen["status"] == 200
    assert seen["body"].rstrip().endswith(b"data: [DONE]")
    assert seen["body"].count(b'"delta":{"content"') == 12
    # Relayed as made, not buffered: the first bytes came well before the last (11 pauses of 150 ms).
    assert seen["last_chunk_at"] - seen["first_chunk_at"] > 0.8


@pytest.mark.parametrize("impl", SERVERS)
def test_sigint_shuts_down_cleanly(mock_upstream, impl):
    proc, base = _serve(mock_upstream, impl)
    try:
        assert httpx.get(base + "/health", timeout=10).status_code == 200
        proc.popen.send_signal(signal.SIGINT)
        code = proc.popen.wait(30)
    finally:
        proc.stop()
    # Either server: a graceful stop, exit 0, no traceback, no hang (tests/integration/test_cli_interrupt.py
    # covers Ctrl-C sent to the whole process group, as a terminal does).
    assert code == 0
    assert "Traceback" not in proc.output()


@pytest.mark.parametrize("impl", SERVERS)
def test_a_failed_startup_exits_2_with_one_line(tmp_path, impl):
    bad = tmp_path / "bad.toml"
    bad.write_text("schema_version = 1\n[routes.broken]\n")
    proc, _ = start_server("--deployment", str(bad), "--http-server", impl, wait=False)
    try:
        assert proc.popen.wait(60) == 2
    finally:
        proc.stop()
    out = proc.output()
    assert "startup failed" in out and "Traceback" not in out


@pytest.mark.parametrize("impl", SERVERS)
def test_a_large_rollout_arrives_whole_from_its_spool_file(tmp_path, mock_upstream, impl):
    """Over 1 MiB a rollout is sent from the file the worker wrote: by granian itself (pathsend),
    which opens it after the response's last message, so the file must outlive the response; with
    the cache off nothing else keeps it (removed at once, granian answered 404 with no body)."""
    capture = CaptureStore(tmp_path / "captures")
    capture.start()
    prompt = list(range(1000, 121_000))
    first = [{"role": "user", "content": "go on"}]
    second = [*first, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "and on"}]
    # The second turn continues the first, which made [5]: both turns' ids are in the rollout.
    for turn_prompt, messages in ((prompt, first), ([*prompt, 5, 7], second)):
        assert capture.submit_call(RecordInput(**_call("big", turn_prompt, messages)))
    assert capture.flush(10)
    expected = rollout_json(str(capture.sessions_dir), "big", {"big": []}, True)
    capture.close()
    assert len(expected) > 1 << 20 and orjson.loads(expected)["partial_reason"] is None
    config = tmp_path / "settings.yaml"
    config.write_text("rollout_cache_mb: 0\n")
    proc, base = start_server(
        "--deployment",
        "demo",
        "--http-server",
        impl,
        "--capture-dir",
        str(tmp_path / "captures"),
        "--config",
        str(config),
        env={"MOCK_UPSTREAM_URL": mock_upstream + "/v1"},
    )
    try:
        for _ in range(3):
            response = httpx.get(base + "/v1/sessions/big/rollout", timeout=60)
            assert response.status_code == 200
            assert response.headers["content-length"] == str(len(expected))
            assert response.content == expected
    finally:
        proc.stop()


def _call(session_id: str, prompt: list[int], messages: list[dict]) -> dict:
    return dict(
        session_id=session_id,
        parent_session_id=None,
        rollout_id=None,
        request_id=None,
        chat_request={"messages": messages},
        chat_response={
            "id": "c",
            "model": "policy",
            "prompt_token_ids": prompt,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "ok"},
                    "finish_reason": "stop",
                    "token_ids": [5],
                    "logprobs": {"content": [{"logprob": -0.1}]},
                }
            ],
        },
        route="policy",
        api="chat",
        stream=False,
        latency_ms=1.0,
    )


def _delayed_acks_over_keep_alive_streams(port: int, path: str, body: bytes, streams: int) -> int:
    """Sequential streams on one kept-alive connection from a client that acknowledges as Linux does
    by default (delayed); how many ACKs the kernel delayed meanwhile, counted from the second stream."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        for n in range(streams + 1):
            if n == 1:  # the first stream opened the connection
                before = delayed_acks()
            connection.request("POST", path, body=body, headers={"content-type": "application/json"})
            response = connection.getresponse()
            assert response.status == 200 and response.read()
        return delayed_acks() - before
    finally:
        connection.close()


@pytest.mark.skipif(delayed_acks() is None, reason="Linux's TCP counters")
@pytest.mark.parametrize("impl", SERVERS)
def test_a_kept_alive_client_gets_each_stream_without_waiting_for_a_delayed_ack(mock_upstream, impl):
    """No Nagle on the connections the server accepts: a stream's later writes leave at once.

    Timing-free: the kernel counts the ACKs it delays. granian leaves Nagle on unless the listening
    socket has TCP_NODELAY; with it on, each stream here waited ~40 ms for one (the control below).
    """
    streams = 10
    proc, base = _serve(mock_upstream, impl)
    try:
        body = b'{"model": "x", "stream": true, "messages": [{"role": "user", "content": "[[mock:tokens 8]] go"}]}'
        port = int(base.rsplit(":", 1)[1])
        delayed = _delayed_acks_over_keep_alive_streams(port, "/v1/chat/completions", body, streams)
    finally:
        proc.stop()
    assert delayed < streams // 3, delayed


@pytest.mark.skipif(delayed_acks() is None, reason="Linux's TCP counters")
def test_the_delayed_ack_count_sees_a_server_that_leaves_nagle_on():
    """The control for the test above: the same client against a server with Nagle on."""
    with NaglingStreamServer() as server:
        delayed = _delayed_acks_over_keep_alive_streams(server.port, "/x", b"{}", 10)
    assert delayed >= 5, delayed
