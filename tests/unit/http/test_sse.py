"""The SSE wire format: encoding, and decoding to the spec across line endings and chunk boundaries, in linear work."""

from __future__ import annotations

import re

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from server.errors import OpenAIError
from server.http import sse


def decode(*chunks: bytes) -> list[tuple[str | None, bytes | None]]:
    decoder = sse.Decoder()
    events = [event for chunk in chunks for event in decoder.feed(chunk)]
    events += decoder.close()
    return [(event.event, event.data) for event in events]


STREAM = (
    b'data: {"a": 1}\n\n'
    b": keep-alive\n\n"
    b"event: response.completed\ndata: line one\ndata: line two\n\n"
    b"data:no-space\ndata:  two spaces\n\n"
    b"id: 7\nretry: 100\nunknown\ndata\n\n"
    b"data: [DONE]\n\n"
)
EXPECTED = [
    (None, b'{"a": 1}'),
    (None, None),  # a comment-only event is reported (for relays) with no data
    ("response.completed", b"line one\nline two"),
    (None, b"no-space\n two spaces"),  # exactly one leading space is dropped
    (None, b""),  # `data` without a colon is an empty data line
    (None, b"[DONE]"),
]


@pytest.mark.parametrize("ending", [b"\n", b"\r\n", b"\r"], ids=["LF", "CRLF", "CR"])
def test_every_line_ending_decodes_the_same(ending):
    assert decode(STREAM.replace(b"\n", ending)) == EXPECTED


def test_mixed_line_endings_and_a_bom():
    mixed = b"\xef\xbb\xbfdata: a\r\ndata: b\rdata: c\n\r\ndata: d\r\r"
    assert decode(mixed) == [(None, b"a\nb\nc"), (None, b"d")]


def test_a_crlf_split_between_chunks_is_one_line_end():
    # CR at the end of one chunk, LF at the start of the next: one line end, not an extra blank line.
    assert decode(b"data: a\r", b"\ndata: b\r\n\r\n") == [(None, b"a\nb")]
    assert decode(b"data: a\r", b"\n", b"\r", b"\ndata: b\r\n\r\n") == [(None, b"a"), (None, b"b")]


def test_blank_lines_alone_dispatch_nothing():
    assert decode(b"\n\n\r\n\r\r") == []


def test_an_unterminated_last_event_is_dispatched_at_close():
    # Deliberately lenient: an upstream that drops the final blank line still ends its stream.
    assert decode(b"data: a\n\ndata: [DONE]") == [(None, b"a"), (None, b"[DONE]")]
    assert decode(b"data: a\n\ndata: [DONE]\n") == [(None, b"a"), (None, b"[DONE]")]


def test_wire_relays_an_event_as_it_came_with_lf_endings():
    decoder = sse.Decoder()
    events = decoder.feed(b": ping\r\n\r\nevent: x\r\nid: 3\r\ndata: {}\r\n\r\n")
    assert [event.wire() for event in events] == [b": ping\n\n", b"event: x\nid: 3\ndata: {}\n\n"]


@st.composite
def streams(draw):
    """Events encoded with one line ending per line, as any upstream might mix them."""
    events = draw(
        st.lists(
            st.tuples(
                st.one_of(st.none(), st.sampled_from(["response.created", "error", "x"])),
                st.binary(max_size=40).map(lambda b: b.replace(b"\r", b"").replace(b"\n", b"")),
                st.integers(1, 3),
            ),
            max_size=6,
        )
    )
    out = b""
    expected = []
    for name, payload, n_lines in events:
        lines = ([b"event: " + name.encode()] if name else []) + [b"data: " + payload] * n_lines
        for line in [*lines, b""]:
            ending = draw(st.sampled_from([b"\n", b"\r", b"\r\n"]))
            if not line and out.endswith(b"\r") and ending == b"\n":
                ending = b"\r"  # CR then LF would be one CRLF: the blank line must be its own
            out += line + ending
        expected.append((name, b"\n".join([payload] * n_lines)))
    return out, expected


@given(streams(), st.data())
def test_any_chunking_decodes_the_same(stream, data):
    raw, expected = stream
    cuts = sorted(data.draw(st.lists(st.integers(0, len(raw)), max_size=8)))
    chunks = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)])]
    assert decode(*chunks) == expected
    assert decode(*[raw[i : i + 1] for i in range(len(raw))]) == expected  # one byte at a time


# ---- the LF fast path against the line-by-line decoder ------------------------------------------


class LineByLine(sse.Decoder):
    """The decoder with its LF fast path switched off: every byte through the line-by-line rules."""

    def feed(self, chunk: bytes) -> list[sse.Event]:
        return self._feed_lines(chunk)


class CountingFastPath(sse.Decoder):
    """The decoder as is, counting the chunks its fast path took (so a test knows it was exercised)."""

    fast = 0

    def _feed_lf(self, chunk: bytes) -> list[sse.Event]:
        CountingFastPath.fast += 1
        return super()._feed_lf(chunk)


def decode_all(decoder: sse.Decoder, chunks: list[bytes]) -> list[tuple[str | None, bytes | None, list[bytes]]]:
    events = [event for chunk in chunks for event in decoder.feed(chunk)]
    events += decoder.close()
    return [(event.event, event.data, event.lines) for event in events]


_LF_LINES = st.one_of(
    st.builds(lambda b: b"data: " + b, st.binary(max_size=30)),
    st.builds(lambda b: b"data:" + b, st.binary(max_size=8)),
    st.sampled_from([b"data", b"data: ", b"data:  two", b": keep-alive", b":", b"event: response.created", b"id: 7"]),
    st.sampled_from([b"retry: 10", b"unknown", b"data: [DONE]", b'data: {"error": {"message": "x"}}']),
    st.just(b""),  # blank lines: event ends, and extra ones between events
).map(lambda line: line.replace(b"\r", b"").replace(b"\n", b""))


@given(
    st.lists(_LF_LINES, max_size=14),
    st.booleans(),
    st.booleans(),
    st.data(),
)
def test_the_lf_fast_path_decodes_exactly_as_line_by_line(lines, bom, terminated, data):
    raw = (sse._BOM if bom else b"") + b"\n".join(lines) + (b"\n" if terminated else b"")
    cuts = sorted(data.draw(st.lists(st.integers(0, len(raw)), max_size=6)))
    chunks = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)])]
    assert decode_all(sse.Decoder(), chunks) == decode_all(LineByLine(), chunks)


def test_a_vllm_stream_takes_the_fast_path_for_every_read():
    # The control for the property above: the path it compares really is the one streams take.
    chunk = b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\n'
    reads = [chunk * 3, chunk, chunk * 5 + b"data: [DONE]\n\n"]
    CountingFastPath.fast = 0
    decoder = CountingFastPath()
    events = [e for read in reads for e in decoder.feed(read)]
    assert CountingFastPath.fast == len(reads)
    assert [e.data for e in events] == [chunk[6:-2]] * 9 + [sse.DONE_DATA]
    assert [e.wire() for e in events] == [chunk] * 9 + [sse.DONE]
    # A CR anywhere, or a read ending inside an event, sends the next bytes line by line.
    CountingFastPath.fast = 0
    decoder = CountingFastPath()
    decoder.feed(chunk[:10])
    decoder.feed(chunk[10:] + chunk.replace(b"\n", b"\r\n"))
    assert CountingFastPath.fast == 1


@given(
    st.lists(st.binary(max_size=30).map(lambda b: b.replace(b"\r", b"")), min_size=1, max_size=4),
    st.one_of(st.none(), st.text("abcdefghijklmnopqrstuvwxyz._", min_size=1, max_size=20)),
)
def test_encode_then_decode_round_trips(lines, name):
    data = b"\n".join(lines)  # data may span lines: one `data:` line each
    assert decode(sse.encode(data, name)) == [(name, data)]


def test_encoding_of_our_events():
    assert sse.encode(b'{"a":1}') == b'data: {"a":1}\n\n'
    event = {"type": "response.created", "sequence_number": 0}
    assert sse.encode_responses_event(event) == b"event: response.created\ndata: " + orjson.dumps(event) + b"\n\n"
    assert sse.DONE == b"data: [DONE]\n\n"
    assert decode(sse.DONE) == [(None, sse.DONE_DATA)]


def test_in_band_errors():
    error = OpenAIError(502, "the upstream broke off", code="upstream_disconnected")
    ((name, data),) = decode(sse.chat_error(error))
    assert name is None and orjson.loads(data)["error"]["code"] == "upstream_disconnected"
    ((name, data),) = decode(sse.responses_error(error))
    assert name == "error"
    assert orjson.loads(data) == {
        "type": "error",
        "code": "upstream_disconnected",
        "message": "the upstream broke off",
        "param": None,
    }


# ---- linear work on a large event -----------------------------------------------------------------


class CountingPattern:
    """Stands in for the decoder's line-end pattern and counts every byte it is asked to scan."""

    def __init__(self) -> None:
        self.pattern = re.compile(rb"\r\n|\r|\n")
        self.scanned = 0

    def finditer(self, string: bytes, pos: int = 0):
        self.scanned += len(string) - pos
        return self.pattern.finditer(string, pos)

    def split(self, string: bytes):
        return self.pattern.split(string)


def big_event_chunks(size: int = 4_000_000) -> tuple[bytes, list[bytes]]:
    payload = orjson.dumps({"type": "response.completed", "response": {"output": [{"text": "x" * size}]}})
    raw = b"event: response.completed\ndata: " + payload + b"\n\n"
    return payload, [raw[i : i + 4096] for i in range(0, len(raw), 4096)]


def test_a_multi_megabyte_event_in_small_chunks_is_scanned_once(monkeypatch):
    counter = CountingPattern()
    monkeypatch.setattr(sse, "_LINE_END", counter)
    payload, chunks = big_event_chunks()
    decoder = sse.Decoder()
    events = [event for chunk in chunks for event in decoder.feed(chunk)]
    assert [(e.event, e.data) for e in events] == [("response.completed", payload)]
    # Every byte that arrived was scanned at most once: no re-scan of the growing line. (The first
    # chunk arrives between events with LF endings only, so it is split without the pattern.)
    assert sum(map(len, chunks[1:])) <= counter.scanned <= sum(map(len, chunks))


def test_negative_control_the_counter_sees_a_rescanning_reader(monkeypatch):
    # The reader this module replaced kept one growing buffer and searched all of it per chunk.
    # Counted the same way, its work is quadratic: 100 chunks of 4 KB scan ~20 MB, not ~0.4 MB.
    counter = CountingPattern()
    _, chunks = big_event_chunks(400_000)
    buffer = b""
    for chunk in chunks:
        buffer += chunk
        for _ in counter.finditer(buffer):
            pass
    assert counter.scanned > 40 * sum(map(len, chunks))
