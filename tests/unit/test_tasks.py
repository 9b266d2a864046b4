"""cancel_and_wait: stops child tasks and never swallows the caller's own
cancellation (the race that kept an HA slave reconnecting after stop())."""

from __future__ import annotations

import asyncio

import pytest

from ferry.runtime.tasks import cancel_and_wait


def test_children_are_cancelled_and_their_errors_dropped():
    async def main():
        async def boom():
            try:
                await asyncio.sleep(10)
            finally:
                raise RuntimeError("while stopping")

        a = asyncio.create_task(asyncio.sleep(10))
        b = asyncio.create_task(boom())
        await asyncio.sleep(0)
        await cancel_and_wait(a, None, b)
        return a.cancelled(), b.done()

    assert asyncio.run(main()) == (True, True)


def test_a_cancellation_of_the_caller_while_it_waits_is_raised_again():
    async def main():
        released = asyncio.Event()
        stopping = asyncio.Event()

        async def slow_to_stop():
            try:
                await asyncio.sleep(10)
            finally:
                stopping.set()
                await released.wait()  # takes a while to finish

        async def owner():
            child = asyncio.create_task(slow_to_stop())
            await asyncio.sleep(0)
            await cancel_and_wait(child)
            return "carried on"  # must not be reached once the owner is cancelled

        task = asyncio.create_task(owner())
        await stopping.wait()  # the owner has cancelled its child and waits for it
        task.cancel()
        released.set()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())


def test_a_task_that_swallows_its_cancellation_is_told_again(monkeypatch, caplog):
    """What Python 3.11's asyncio.wait_for does when the cancellation lands as its
    awaitable finishes (the registration loop that kept a broker's stop waiting)."""
    from ferry.runtime import tasks

    monkeypatch.setattr(tasks, "RECANCEL_S", 0.05)

    async def main():
        swallowed = []

        async def stubborn():
            while True:
                try:
                    await asyncio.sleep(10)
                except asyncio.CancelledError:
                    if swallowed:
                        raise
                    swallowed.append(True)  # carries on, as if nothing happened

        child = asyncio.create_task(stubborn(), name="stubborn")
        await asyncio.sleep(0)
        await cancel_and_wait(child)
        return swallowed, child.cancelled()

    assert asyncio.run(main()) == ([True], True)
    assert "task stubborn is still running" in caplog.text


def test_within_never_swallows_a_cancellation_that_lands_as_its_awaitable_finishes():
    from ferry.runtime.clock import within

    async def main():
        loop = asyncio.get_running_loop()
        done = loop.create_future()

        async def waiter():
            await within(done, 5)
            return "carried on"

        task = asyncio.create_task(waiter())
        await asyncio.sleep(0)  # the waiter awaits the future
        done.set_result(None)  # finishes, and in the same step the waiter is cancelled
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
