"""The disconnect watcher: a client that goes away cancels the work; work that is done or answered is left alone."""

from __future__ import annotations

import asyncio
import functools

import pytest

from server.http.asgi import ClientGone, run_until_disconnect


def run(test):
    """Run an async test on a fresh event loop (as the rest of the suite does, with asyncio.run).

    The timeout only turns a hang (the watcher failing to cancel) into a failure; no test is near it.
    """

    async def bounded() -> None:
        async with asyncio.timeout(60):
            await test()

    @functools.wraps(test)
    def sync() -> None:
        asyncio.run(bounded())

    return sync


class Receive:
    """An ASGI `receive` whose `http.disconnect` arrives when the test says so."""

    def __init__(self) -> None:
        self.gone = asyncio.Event()
        self.calls = 0

    async def __call__(self) -> dict:
        self.calls += 1
        await self.gone.wait()
        return {"type": "http.disconnect"}


@run
async def test_a_client_disconnect_cancels_the_work_and_raises_client_gone():
    receive = Receive()
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def work() -> None:
        started.set()
        try:
            await asyncio.Event().wait()  # an upstream call that would never end
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async def disconnect_once_started() -> None:
        await started.wait()
        receive.gone.set()

    helper = asyncio.ensure_future(disconnect_once_started())
    with pytest.raises(ClientGone):
        await run_until_disconnect(receive, work)
    await helper
    assert cancelled.is_set()
    # The cancel was ours and is handled: this task goes on awaiting normally (its cleanup must run).
    await asyncio.sleep(0)
    assert asyncio.current_task().cancelling() == 0


@run
async def test_completed_work_is_not_cancelled_and_the_watcher_stops():
    receive = Receive()
    finished = []

    async def work() -> None:
        await asyncio.sleep(0)
        finished.append(True)

    await run_until_disconnect(receive, work)
    assert finished == [True]
    receive.gone.set()  # a disconnect after the work ended reaches no one
    await asyncio.sleep(0)
    assert asyncio.current_task().cancelling() == 0


@run
async def test_a_disconnect_after_the_answer_lets_the_cleanup_finish():
    receive = Receive()
    answered = False
    cleaned_up = asyncio.Event()

    async def work() -> None:
        nonlocal answered
        answered = True  # the last body message is sent; what follows is cleanup (capture hand-off)
        receive.gone.set()
        for _ in range(5):
            await asyncio.sleep(0)  # the watcher sees the disconnect meanwhile
        cleaned_up.set()

    await run_until_disconnect(receive, work, answered=lambda: answered)
    assert cleaned_up.is_set()


@run
async def test_negative_control_the_same_late_disconnect_cancels_when_not_answered():
    # Identical to the test above except that the answer is not complete: now the work is cut.
    receive = Receive()
    cleaned_up = asyncio.Event()

    async def work() -> None:
        receive.gone.set()
        for _ in range(5):
            await asyncio.sleep(0)
        cleaned_up.set()

    with pytest.raises(ClientGone):
        await run_until_disconnect(receive, work, answered=lambda: False)
    assert not cleaned_up.is_set()


@run
async def test_a_cancel_from_elsewhere_stays_a_cancel():
    receive = Receive()

    async def work() -> None:
        await asyncio.Event().wait()

    task = asyncio.ensure_future(run_until_disconnect(receive, work))
    await asyncio.sleep(0)
    task.cancel()  # e.g. server shutdown: not a client disconnect
    with pytest.raises(asyncio.CancelledError):
        await task


@run
async def test_an_empty_body_message_after_the_body_is_skipped_and_the_disconnect_still_seen():
    # granian hands back one more empty `http.request` once the body is read; only a disconnect cancels.
    gone = asyncio.Event()
    messages = 0

    async def receive() -> dict:
        nonlocal messages
        messages += 1
        if messages == 1:
            return {"type": "http.request", "body": b"", "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def work() -> None:
        await asyncio.sleep(0)  # the watcher takes the empty message here: it must not cancel
        gone.set()
        await asyncio.Event().wait()

    with pytest.raises(ClientGone):
        await run_until_disconnect(receive, work)
    assert messages == 2  # cut by the disconnect, not by the empty message
