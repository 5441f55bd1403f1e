"""No request, or flood of requests, from one key exhausts the server for the others.

Background runs are bounded per key and in all (a 429 beyond), so a flood of them neither fills the
upstream pool nor slows a foreground call. The server runs attached to the mock upstream.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import orjson

from server.capture.store import CaptureStore
from tests.support.captures import captured_call, chat_response, records_in, submit_all
from tests.support.memory import TreePeak
from tests.support.procs import Proc, start_attached, wait_for

KEY_A, KEY_B = "key-a-0123456789", "key-b-0123456789"
A = {"authorization": f"Bearer {KEY_A}"}
B = {"authorization": f"Bearer {KEY_B}"}


def serve(tmp_path, mock_upstream, **settings) -> tuple[Proc, str]:
    return start_attached(tmp_path, mock_upstream, **{"api_keys": [KEY_A, KEY_B], **settings})


def background(url: str, headers: dict, text: str = "slow [[mock:sleep 4000]]") -> httpx.Response:
    return httpx.post(
        url + "/v1/responses",
        json={"model": "x", "input": text, "background": True},
        headers=headers,
        timeout=30,
    )


def foreground_ms(url: str) -> float:
    started = time.perf_counter()
    # The flood's runs each hold an upstream connection for 60 s: a call queued behind them for a
    # connection would outlast this timeout, so an answer within it means the pool was not all taken.
    reply = httpx.post(
        url + "/v1/chat/completions",
        json={"model": "x", "messages": [{"role": "user", "content": "quick"}]},
        headers=B,
        timeout=20,
    )
    assert reply.status_code == 200, reply.text
    return (time.perf_counter() - started) * 1000


def test_background_runs_are_bounded_per_key_and_in_all(mock_upstream, tmp_path):
    proc, url = serve(tmp_path, mock_upstream, background_max_runs=5, background_max_runs_per_key=3)
    try:
        by_a = [background(url, A) for _ in range(4)]
        assert [r.status_code for r in by_a] == [200, 200, 200, 429]
        refused = by_a[-1]
        assert refused.json()["error"]["code"] == "too_many_background_responses"
        assert refused.headers.get("retry-after")
        by_b = [background(url, B) for _ in range(3)]
        assert [r.status_code for r in by_b] == [200, 200, 429]  # five in all
        # Places come back when runs end: cancelling one of A's lets A start another.
        cancelled = httpx.post(f"{url}/v1/responses/{by_a[0].json()['id']}/cancel", headers=A, timeout=30)
        assert cancelled.status_code == 200
        # The place comes back once the cancelled run has ended, which the cancel does not wait for.
        assert wait_for(lambda: background(url, A).status_code == 200, timeout=10, interval=0.2)
    finally:
        proc.stop()


def test_a_flood_of_background_runs_leaves_foreground_calls_fast(mock_upstream, tmp_path):
    """At the defaults: 200 background runs sent at once by one key, then a foreground call by another."""
    proc, url = serve(tmp_path, mock_upstream, upstream_max_connections=64)
    try:
        quiet = min(foreground_ms(url) for _ in range(3))
        with ThreadPoolExecutor(32) as pool:
            codes = list(pool.map(lambda _: background(url, A, "[[mock:sleep 60000]]").status_code, range(200)))
        loaded = min(foreground_ms(url) for _ in range(3))
        print(f"foreground call: {quiet:.0f} ms quiet, {loaded:.0f} ms under the flood; {codes.count(200)} runs taken")
        assert codes.count(200) <= 16 and codes.count(429) == 200 - codes.count(200), codes
    finally:
        proc.stop()


def respond(url: str, headers: dict, text: str, **fields) -> httpx.Response:
    return httpx.post(
        url + "/v1/responses",
        json={"model": "x", "input": text, **fields},
        headers=headers,
        timeout=30,
    )


def test_one_key_cannot_evict_another_keys_stored_state(mock_upstream, tmp_path):
    proc, url = serve(tmp_path, mock_upstream, response_store_max_count=5, conversation_store_max_count=3)
    try:

        def conversation(headers: dict) -> str:
            return httpx.post(url + "/v1/conversations", json={}, headers=headers).json()["id"]

        conversations_of_a = [conversation(A) for _ in range(2)]
        for _ in range(4):
            conversation(B)
        for conversation_id in conversations_of_a:
            reply = httpx.get(f"{url}/v1/conversations/{conversation_id}", headers=A)
            assert reply.status_code == 200

        kept_by_a = [respond(url, A, f"A's {i}").json()["id"] for i in range(2)]
        by_b = [respond(url, B, f"B's {i}").json() for i in range(5)]
        for response_id in kept_by_a:
            assert httpx.get(f"{url}/v1/responses/{response_id}", headers=A).status_code == 200
        # B made room by dropping its own oldest: its latest ones are there, the store within its bound.
        assert httpx.get(f"{url}/v1/responses/{by_b[-1]['id']}", headers=B).status_code == 200
        assert httpx.get(f"{url}/v1/responses/{by_b[0]['id']}", headers=B).status_code == 404
    finally:
        proc.stop()


def test_metadata_is_bounded(mock_upstream, tmp_path):
    proc, url = serve(tmp_path, mock_upstream)
    try:
        for metadata in ({"blob": "x" * 1_000_000}, {f"k{i}": "v" for i in range(17)}, {"k" * 65: "v"}):
            refused = respond(url, A, "hi", metadata=metadata)
            assert refused.status_code == 400, refused.text[:300]
            assert refused.json()["error"]["param"] == "metadata"
        assert respond(url, A, "hi", metadata={"run": "7", "task": "t" * 512}).status_code == 200
    finally:
        proc.stop()


def test_a_huge_list_is_refused_with_memory_proportional_to_the_body(mock_upstream, tmp_path):
    """400,000 input items in an 11 MiB body, four at once (before: +1.35 GiB peak, +442 MiB held after)."""
    proc, url = serve(tmp_path, mock_upstream)
    body = orjson.dumps({"model": "x", "input": [{"role": "user", "content": "hi"}] * 400_000})
    try:
        tree = TreePeak(proc.pid)
        baseline = tree.rss()
        with tree, ThreadPoolExecutor(4) as pool:
            replies = list(
                pool.map(
                    lambda _: httpx.post(
                        url + "/v1/responses",
                        content=body,
                        headers={**A, "content-type": "application/json"},
                        timeout=120,
                    ),
                    range(4),
                )
            )
        held = tree.rss() - baseline
        print(f"body {len(body) >> 20} MiB x4: peak +{(tree.peak - baseline) >> 20} MiB, held +{held >> 20} MiB")
        assert tree.peak - baseline < 700 * 1024 * 1024
        assert held < 300 * 1024 * 1024
        for reply in replies:
            assert reply.status_code == 400, reply.text[:300]
            assert reply.json()["error"]["param"] == "input"
    finally:
        proc.stop()


def test_one_call_of_a_long_session_is_read_outside_the_serving_process(mock_upstream, tmp_path):
    """40 reads of one call of a long session (30 calls of 60,000 prompt ids each): the interpreter that
    serves calls never parses the session (before: +190 MiB at the peak)."""
    store = CaptureStore(tmp_path / "cap")
    store.start()
    calls = (
        captured_call(
            "long",
            messages=[{"role": "user", "content": f"turn {i}"}],
            response=chat_response(prompt=range(1000, 61000), generation=(7, 8)),
        )
        for i in range(30)
    )
    submit_all(store, *calls)
    store.close()
    uuids = [record["uuid"] for record in records_in(tmp_path / "cap")[0]]
    proc, url = serve(tmp_path, mock_upstream, api_keys=[])
    try:
        serving = TreePeak(proc.pid, children=False)
        baseline = serving.rss()
        with serving, ThreadPoolExecutor(8) as pool:
            codes = list(
                pool.map(
                    lambda i: (
                        httpx.get(
                            f"{url}/v1/sessions/long/completions/{uuids[i % len(uuids)]}", timeout=120
                        ).status_code
                    ),
                    range(40),
                )
            )
        growth = serving.peak - baseline
        print(f"serving process: +{growth >> 20} MiB at the peak")
        assert codes == [200] * 40
        assert growth < 100 * 1024 * 1024
    finally:
        proc.stop()
