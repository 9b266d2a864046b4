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
