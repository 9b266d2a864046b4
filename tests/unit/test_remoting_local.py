"""ferry.remoting.local.LocalLink: a request goes to the handler of its code in the
same process; the requests of a Batchable code made in one loop turn go to its
`many` as one run, as requests read back to back from one socket do."""

from __future__ import annotations

import asyncio

import pytest

from ferry.remoting import codes
from ferry.remoting.codec import Command
from ferry.remoting.local import LocalLink
from ferry.remoting.server import Batchable

SEND, PLAIN, BROKEN = codes.SEND_MESSAGE_V2, codes.HEART_BEAT, codes.SEND_BATCH_MESSAGE


def _link() -> tuple[LocalLink, list[list[str]]]:
    runs: list[list[str]] = []

    async def one(connection, command):
        runs.append([command.remark])
        return command.answer(codes.SUCCESS, f"one {command.remark}")

    async def many(connection, commands):
        runs.append([c.remark for c in commands])
        return [c.answer(codes.SUCCESS, f"run {c.remark}") for c in commands]

    async def plain(connection, command):
        return command.answer(codes.SUCCESS, "plain")

    async def broken_many(connection, commands):
        raise RuntimeError("boom")

    handlers = {
        SEND: Batchable(one, many),
        PLAIN: plain,
        BROKEN: Batchable(one, broken_many),
    }
    return LocalLink(lambda: handlers), runs


def _request(code: int, name: str) -> Command:
    command = Command(code)
    command.remark = name
    return command


def test_requests_of_one_turn_go_as_one_run_and_each_gets_its_own_answer():
    async def main():
        link, runs = _link()
        answers = await asyncio.gather(
            *(link.request(_request(SEND, str(i)), 5) for i in range(4)),
            link.request(_request(PLAIN, "p"), 5),
        )
        assert [a.remark for a in answers] == ["run 0", "run 1", "run 2", "run 3", "plain"]
        assert runs == [["0", "1", "2", "3"]]
        # A later turn is a run of its own.
        assert (await link.request(_request(SEND, "4"), 5)).remark == "run 4"
        assert runs[-1] == ["4"]

    asyncio.run(main())


def test_a_run_whose_handler_raises_is_answered_system_error_each():
    async def main():
        link, _ = _link()
        answers = await asyncio.gather(*(link.request(_request(BROKEN, n), 5) for n in "ab"))
        assert [a.code for a in answers] == [codes.SYSTEM_ERROR] * 2
        assert all("boom" in a.remark for a in answers)

    asyncio.run(main())


def test_an_unknown_code_and_a_closed_link():
    async def main():
        link, _ = _link()
        answer = await link.request(_request(9999, "x"), 5)
        assert answer.code == codes.REQUEST_CODE_NOT_SUPPORTED
        link.close()
        with pytest.raises(ConnectionError):
            await link.request(_request(SEND, "late"), 5)

    asyncio.run(main())
