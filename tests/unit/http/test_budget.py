"""The request-body budget: what a request holds, when it is refused, and that every hold goes back."""

from __future__ import annotations

import asyncio

import pytest

from server.errors import OpenAIError
from server.http.asgi import read_body
from server.http.budget import NO_BODY, TRIM_AFTER_BYTES, BodyBudget


def scope(length: int | None = None, method: str = "POST", chunked: bool = False) -> dict:
    headers = [(b"content-type", b"application/json")]
    if length is not None:
        headers.append((b"content-length", str(length).encode()))
    if chunked:
        headers.append((b"transfer-encoding", b"chunked"))
    return {"type": "http", "method": method, "path": "/v1/chat/completions", "headers": headers}


def pieces(*chunks: bytes):
    messages = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]

    async def receive() -> dict:
        return messages.pop(0)

    return receive


def test_declared_lengths_are_held_until_released_and_refused_beyond_the_limit():
    budget = BodyBudget(100, 1000, trim=False)
    first, second = budget.hold(scope(60)), budget.hold(scope(40))
    assert first is not None and second is not None and budget.held == 100
    assert budget.hold(scope(1)) is None and budget.refused == 1  # full: refused before any byte is read
    first.release()
    first.release()  # twice gives back once
    assert budget.held == 40
    assert budget.hold(scope(60)) is not None and budget.held == 100


def test_one_request_always_fits_an_idle_budget_and_holds_at_most_the_largest_body():
    budget = BodyBudget(10, 50, trim=False)
    hold = budget.hold(scope(10_000))  # a length past max_body_bytes: its read is refused (413) at 50 bytes
    assert hold is not None and budget.held == 50
    assert budget.hold(scope(5)) is None
    hold.release()
    assert budget.held == 0


def test_requests_without_a_body_hold_nothing():
    budget = BodyBudget(10, 50, trim=False)
    assert budget.hold(scope(None, method="GET")) is NO_BODY
    assert budget.hold(scope(0)) is NO_BODY
    assert budget.held == 0


def test_a_body_without_a_length_is_counted_as_it_arrives():
    async def main() -> None:
        budget = BodyBudget(100, 1000, trim=False)
        other = budget.hold(scope(60))
        hold = budget.hold(scope(None, chunked=True))
        assert other is not None and hold is not None and budget.held == 60
        receive = hold.receive(pieces(b"x" * 30, b"y" * 30))
        with pytest.raises(OpenAIError) as refused:
            await read_body(receive, 1000)
        assert refused.value.status == 503 and refused.value.headers["retry-after"] == "1"
        assert refused.value.code == "request_bodies_busy"
        hold.release()
        other.release()
        assert budget.held == 0
        # Alone, the same body goes through whatever its size: nothing else is held.
        alone = budget.hold(scope(None, chunked=True))
        assert alone is not None
        body = await read_body(alone.receive(pieces(b"x" * 80, b"y" * 80)), 1000)
        assert bytes(body) == b"x" * 80 + b"y" * 80 and budget.held == 160
        alone.release()
        assert budget.held == 0

    asyncio.run(main())


def test_a_post_without_length_or_chunking_is_counted_too():
    """HTTP/2 may send a body with neither header: it is counted as it arrives, not waved through."""
    budget = BodyBudget(100, 1000, trim=False)
    hold = budget.hold(scope(None))
    assert hold is not None and hold is not NO_BODY


def test_read_body_grows_one_buffer_and_keeps_a_single_piece_as_it_came():
    async def main() -> None:
        one = b'{"a": 1}'
        assert await read_body(pieces(one), 100) is one
        many = await read_body(pieces(b'{"a"', b": ", b"1}"), 100)
        assert isinstance(many, bytearray) and bytes(many) == b'{"a": 1}'
        with pytest.raises(OpenAIError) as too_big:
            await read_body(pieces(b"x" * 60, b"y" * 60), 100)
        assert too_big.value.status == 413

    asyncio.run(main())


def test_a_large_release_trims_the_heap_once_a_moment_later():
    async def main() -> None:
        budget = BodyBudget(10 * TRIM_AFTER_BYTES, 10 * TRIM_AFTER_BYTES, trim=False)
        calls: list[int] = []
        budget._malloc_trim = lambda pad: calls.append(pad) or 1
        small = budget.hold(scope(1024))
        assert small is not None
        small.release()
        large = [budget.hold(scope(TRIM_AFTER_BYTES)) for _ in range(3)]
        for hold in large:
            assert hold is not None
            hold.release()
        assert calls == []  # not at once: the request's last buffers are freed just after its hold
        await asyncio.sleep(1.5)
        assert calls == [0]  # three large releases close together: one trim

    asyncio.run(main())
