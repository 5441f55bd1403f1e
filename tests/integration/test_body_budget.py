"""Request bodies held at once are bounded in bytes (`max_body_bytes_in_flight`), through a real server.

Bodies just under `max_body_bytes` (1 MiB here), with a budget of two: the calls the server takes
sleep in the mock upstream for a few seconds, so they hold their bytes while the others arrive.
Those get a fast 503 in the OpenAI shape with `Retry-After`, bodies sent chunked (no length) too;
the calls taken complete, and once they are over the budget is whole again. The memory figure
itself (peak RSS against the bytes in flight) is measured in bench/bodies.py, not here.
"""

from __future__ import annotations

import threading

import httpx
import orjson
import pytest

from tests.support.procs import start_attached

MAX_BODY = 1024 * 1024
HOLD_MS = 6000  # how long each taken call stays in flight (the mock sleeps)


def body_of(size: int, sleep_ms: int = HOLD_MS) -> bytes:
    """A chat body of about `size` bytes whose call sleeps `sleep_ms` in the mock upstream."""
    text = f"[[mock:sleep {sleep_ms}]] "
    shell = orjson.dumps({"model": "x", "messages": [{"role": "user", "content": text}]})
    return orjson.dumps({"model": "x", "messages": [{"role": "user", "content": text + "w" * (size - len(shell))}]})


def serve(tmp_path, mock_upstream: str, budget: int):
    return start_attached(tmp_path, mock_upstream, max_body_bytes=MAX_BODY, max_body_bytes_in_flight=budget)


def post_all(url: str, bodies: list[bytes | object]) -> list[httpx.Response]:
    """Each body POSTed at once, from its own thread and connection."""
    replies: list[httpx.Response | None] = [None] * len(bodies)
    barrier = threading.Barrier(len(bodies))

    def one(i: int) -> None:
        with httpx.Client(timeout=120) as client:
            barrier.wait()
            replies[i] = client.post(
                url + "/v1/chat/completions",
                content=bodies[i],  # type: ignore[arg-type]
                headers={"content-type": "application/json", "x-session-id": f"budget-{i}"},
            )

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(bodies))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(reply is not None for reply in replies)
    return replies  # type: ignore[return-value]


def chunked(body: bytes):
    """The body as an iterator: httpx sends it chunked, with no Content-Length."""
    for start in range(0, len(body), 64 * 1024):
        yield body[start : start + 64 * 1024]


def test_bodies_beyond_the_budget_get_a_fast_503_and_the_taken_ones_complete(mock_upstream, tmp_path):
    size = MAX_BODY - 4096
    proc, url = serve(tmp_path, mock_upstream, budget=2 * MAX_BODY)
    try:
        replies = post_all(url, [body_of(size) for _ in range(4)])
        statuses = sorted(reply.status_code for reply in replies)
        assert statuses == [200, 200, 503, 503], [r.text[:200] for r in replies]
        for reply in replies:
            if reply.status_code == 503:
                assert reply.headers["retry-after"] == "1"
                error = reply.json()["error"]
                assert error["code"] == "request_bodies_busy" and error["type"] == "service_unavailable"
                assert "max_body_bytes_in_flight" in error["message"]
            else:
                assert reply.json()["choices"][0]["message"]["role"] == "assistant"
        # A body sent chunked (no length) is counted as it arrives: refused while two are held.
        replies = post_all(url, [body_of(size), body_of(size), chunked(body_of(size, 0))])
        assert sorted(r.status_code for r in replies) == [200, 200, 503], [r.text[:200] for r in replies]
        # Every hold was given back: two bodies fit again, a chunked one too when there is room.
        replies = post_all(url, [body_of(size, 0), chunked(body_of(size, 0))])
        assert [r.status_code for r in replies] == [200, 200], [r.text[:200] for r in replies]
    finally:
        proc.stop()


@pytest.mark.parametrize("count", [4])
def test_negative_control_a_budget_with_room_takes_them_all(mock_upstream, tmp_path, count):
    """The same four calls with room for all of them: the 503s above come from the budget."""
    proc, url = serve(tmp_path, mock_upstream, budget=count * MAX_BODY)
    try:
        replies = post_all(url, [body_of(MAX_BODY - 4096, 1000) for _ in range(count)])
        assert [r.status_code for r in replies] == [200] * count, [r.text[:200] for r in replies]
    finally:
        proc.stop()


def test_a_lone_body_always_fits_even_past_a_small_budget(mock_upstream, tmp_path):
    """One request on an idle server is never refused for want of room (the 413 limit is its bound)."""
    proc, url = serve(tmp_path, mock_upstream, budget=64 * 1024)
    try:
        reply = httpx.post(
            url + "/v1/chat/completions",
            content=body_of(MAX_BODY - 4096, 0),
            headers={"content-type": "application/json"},
            timeout=60,
        )
        assert reply.status_code == 200, reply.text[:300]
    finally:
        proc.stop()
