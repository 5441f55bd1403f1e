"""Reading an upstream chat stream read by read: what arrived together stays together, `[DONE]` is flagged."""

from __future__ import annotations

import asyncio

import pytest

from server.api.upstream_chat import chat_event_batches
from server.errors import OpenAIError
from server.http import sse


class FakeStream:
    """An upstream stream whose reads decode to the given SSE bytes, one list of events per read."""

    def __init__(self, *reads: bytes) -> None:
        decoder = sse.Decoder()
        self.reads = [decoder.feed(read) for read in reads]

    async def event_batches(self):
        for events in self.reads:
            if events:
                yield events


class Span:
    def __init__(self) -> None:
        self.first = 0

    def first_chunk(self) -> None:
        self.first += 1


def batches(*reads: bytes) -> list[tuple[list[bytes], bool]]:
    async def collect():
        span = Span()
        out = [
            ([data for _, data in batch], done) async for batch, done in chat_event_batches(FakeStream(*reads), span)
        ]
        assert span.first == 1
        return out

    return asyncio.run(collect())


def chunk(text: str) -> bytes:
    return sse.encode(b'{"choices":[{"delta":{"content":"' + text.encode() + b'"}}]}')


def data(text: str) -> bytes:
    return chunk(text)[6:-2]


def test_each_read_is_one_batch_and_the_read_with_done_is_flagged():
    assert batches(chunk("a") + chunk("b"), chunk("c") + sse.DONE) == [
        ([data("a"), data("b")], False),
        ([data("c")], True),
    ]


def test_done_alone_in_its_read_is_flagged_with_no_events():
    assert batches(chunk("a"), sse.DONE) == [([data("a")], False), ([], True)]


def test_what_follows_done_is_read_but_not_relayed():
    assert batches(chunk("a") + sse.DONE + chunk("late")) == [([data("a")], True)]


def test_an_in_band_error_raises_after_the_events_before_it():
    seen = []

    async def run():
        stream = FakeStream(chunk("a") + sse.encode(b'{"error": {"message": "boom"}}') + chunk("never"))
        async for batch, done in chat_event_batches(stream, Span()):
            seen.append(([d for _, d in batch], done))

    with pytest.raises(OpenAIError, match="boom"):
        asyncio.run(run())
    assert seen == [([data("a")], False)]


def test_a_stream_without_done_is_cut_loudly():
    with pytest.raises(OpenAIError) as caught:
        batches(chunk("a"))
    assert caught.value.code == "upstream_stream_cut"
