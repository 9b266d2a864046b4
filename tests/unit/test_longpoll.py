"""LongPolls' count of waiting pulls, which tests wait on before they wake a long poll."""

from __future__ import annotations

import asyncio

from services.broker.store.longpoll import LongPolls
from tests.waiting import wait_for_async


def test_waiting_counts_each_pull_once_until_it_is_woken_or_times_out():
    async def scenario():
        visible: set[tuple[str, int]] = set()
        polls = LongPolls(lambda topic, queue_id, offset: (topic, queue_id) in visible)
        assert polls.waiting == 0
        one = asyncio.create_task(polls.wait("T", 0, 0, 30))
        many = asyncio.create_task(polls.wait_any([("T", 0), ("T", 1), ("U", 0)], 30))
        await wait_for_async(lambda: polls.waiting == 2, 5, "two pulls to wait")
        assert [polls.waiting_on(*key) for key in [("T", 0), ("T", 1), ("U", 0), ("V", 0)]] == [
            2, 1, 1, 0,
        ]  # fmt: skip
        await polls.wait_any([("T", 0), ("V", 0)], 0.01)  # timed out: no longer waiting
        assert polls.waiting == 2
        visible.add(("T", 0))
        polls.notify([("T", 0)])
        await asyncio.wait_for(asyncio.gather(one, many), 5)
        assert polls.waiting == 0
        assert polls.waiting_on("T", 1) == 0  # woken on one queue, it left all three

    asyncio.run(scenario())


def test_close_releases_every_waiter():
    async def scenario():
        polls = LongPolls(lambda topic, queue_id, offset: False)
        pull = asyncio.create_task(polls.wait("T", 0, 0, 30))
        await wait_for_async(lambda: polls.waiting == 1, 5, "the pull to wait")
        polls.close()
        await asyncio.wait_for(pull, 5)
        assert polls.waiting == 0

    asyncio.run(scenario())
