"""Admission's parts alone: the body deadline, the count of calls in flight, and limits that fit the open-file limit."""

from __future__ import annotations

import asyncio
import resource

import pytest

from server.config import Settings
from server.errors import OpenAIError
from server.http import admission as admission_module
from server.http.admission import Admission, limits

ATTACHED = {"switchyard_base_url": "http://127.0.0.1:9/v1"}


def body(*chunks: bytes):
    """A `receive` that delivers `chunks` as one body, then waits forever (for a disconnect)."""
    messages = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]

    async def receive():
        if messages:
            return messages.pop(0)
        await asyncio.Event().wait()

    return receive


def test_a_body_that_does_not_arrive_in_time_gets_a_408_that_closes_the_connection():
    async def run():
        admission = Admission(limit=4, body_timeout_s=0.05)
        receiver = admission.receiver(body(b"{", b"}", b"never"))  # the last part never comes in time
        receiver.receive = _stalls_after(receiver.receive, 2)
        assert (await receiver())["more_body"] is True
        assert (await receiver())["more_body"] is True
        with pytest.raises(OpenAIError) as raised:
            await receiver()
        return admission, raised.value

    admission, error = asyncio.run(run())
    assert error.status == 408 and error.headers == {"connection": "close"}
    assert admission.timed_out == 1 and admission.in_flight == 0


def _stalls_after(receive, n: int):
    count = [0]

    async def stalling():
        count[0] += 1
        if count[0] > n:
            await asyncio.Event().wait()
        return await receive()

    return stalling


def test_after_the_body_receive_is_not_bounded():
    async def run():
        receiver = Admission(limit=4, body_timeout_s=0.05).receiver(body(b"{}"))
        await receiver()
        # The disconnect watcher waits here for the whole call; the deadline must not cut it.
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(receiver(), 0.2)

    asyncio.run(run())


def test_calls_are_counted_once_their_body_is_whole_and_refused_beyond_the_limit():
    async def run():
        admission = Admission(limit=2, body_timeout_s=5)
        first, second, third = (admission.receiver(body(b"{}")) for _ in range(3))
        reading = admission.receiver(body(b"{", b"}"))
        await reading()  # half a body: not a call yet
        await first()
        await second()
        assert admission.in_flight == 2
        with pytest.raises(OpenAIError) as raised:
            await third()
        assert raised.value.status == 503 and raised.value.headers == {"retry-after": "1"}
        first.release()
        first.release()  # twice is once
        assert admission.in_flight == 1
        await reading()  # its body is whole now, and there is a place
        assert admission.in_flight == 2 and admission.refused == 1 and admission.peak == 2
        third.release()  # refused: it held no place
        assert admission.in_flight == 2

    asyncio.run(run())


def test_a_disconnect_is_no_call():
    async def run():
        admission = Admission(limit=1, body_timeout_s=5)

        async def gone():
            return {"type": "http.disconnect"}

        receiver = admission.receiver(gone)
        assert (await receiver())["type"] == "http.disconnect"
        return admission

    assert asyncio.run(run()).in_flight == 0


@pytest.mark.parametrize("nofile", [1024, 4096, 20000, 1 << 20])
@pytest.mark.parametrize("hosted", [True, False])
def test_derived_limits_fit_the_open_file_limit(monkeypatch, nofile, hosted):
    monkeypatch.setattr(admission_module, "open_file_limit", lambda: nofile)
    settings = Settings(deployment="demo") if hosted else Settings(**ATTACHED)
    got = limits(settings)
    assert got.fds_per_call == (4 if hosted else 2)
    assert got.connections > got.calls  # room for /health and the 503s beside the calls
    assert got.upstream == got.calls
    if nofile >= 4096:
        assert got.connections + got.calls * (got.fds_per_call - 1) + admission_module.RESERVED_FDS <= nofile


def test_set_limits_win_over_derived_ones():
    settings = Settings(**ATTACHED, max_calls_in_flight=10, max_connections_per_worker=50, upstream_max_connections=7)
    got = limits(settings)
    assert (got.calls, got.connections, got.upstream) == (10, 50, 7)


def test_open_file_limit_is_raised_to_the_hard_limit():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        if hard != resource.RLIM_INFINITY and hard > 256:
            resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
            assert admission_module.open_file_limit() == hard
            assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == hard
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_an_expiry_between_reads_answers_the_next_read_408_and_never_cancels_other_work():
    async def run():
        admission = Admission(limit=4, body_timeout_s=0.05)
        receiver = admission.receiver(body(b"{", b"}"))
        await receiver()  # half the body; the app now does something else (not reading)
        await asyncio.sleep(0.2)  # past the deadline and a sweep: this task must not be cancelled
        with pytest.raises(OpenAIError) as raised:
            await receiver()
        return admission, raised.value

    admission, error = asyncio.run(run())
    assert error.status == 408 and admission.timed_out == 1


def test_a_request_that_stops_reading_early_is_released_from_its_deadline():
    async def run():
        admission = Admission(limit=4, body_timeout_s=0.05)
        receiver = admission.receiver(body(b"{", b"}"))
        await receiver()
        assert admission.stats()["bodies_arriving"] == 1
        receiver.release()  # e.g. a 413 after the first part: the request is over
        assert admission.stats()["bodies_arriving"] == 0
        await asyncio.sleep(0.2)  # no sweep finds it: nothing is cancelled, nothing counted
        return admission

    admission = asyncio.run(run())
    assert admission.timed_out == 0 and admission.in_flight == 0
