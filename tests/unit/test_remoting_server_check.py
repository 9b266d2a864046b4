"""ferry.remoting.server's per-request check (the broker's ACL hook), socket-free: a
Connection fed frames through a fake transport. A refused request never reaches its
handler, is answered 16 (NO_PERMISSION) with the check's message (a oneway one is
dropped), is counted like any answer; every request of a Batchable run is checked on
its own; answers to the server's own requests are not checked; without a check the
server behaves as before."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry

from ferry.remoting import codes
from ferry.remoting.codec import FLAG_ONEWAY, FLAG_RESPONSE, Command, encode, read_frames
from ferry.remoting.metrics import RemotingMetrics
from ferry.remoting.server import Batchable, Connection, RemotingServer

SEND = codes.SEND_MESSAGE_V2
PULL = codes.PULL_MESSAGE


class FakeTransport:
    def __init__(self) -> None:
        self.out = bytearray()
        self.closed = False

    def get_extra_info(self, name: str, default=None):
        return ("10.0.0.7", 50123) if name == "peername" else default

    def write(self, data: bytes) -> None:
        self.out += data

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def answers(self) -> dict[int, Command]:
        commands, _, error = read_frames(self.out)
        assert error is None
        return {c.opaque: c for c in commands}


class Harness:
    """A server whose handlers record what they were given, refusing topic "secret"."""

    def __init__(self, check: bool = True) -> None:
        self.registry = CollectorRegistry()
        self.handled: list[tuple[int, int]] = []  # (code, opaque)
        self.runs: list[list[int]] = []
        self.checked: list[tuple[str, int]] = []

        async def one(connection: Connection, command: Command) -> Command:
            self.handled.append((command.code, command.opaque))
            return command.answer(codes.SUCCESS)

        async def many(connection: Connection, commands: list[Command]) -> list[Command | None]:
            self.runs.append([c.opaque for c in commands])
            self.handled.extend((c.code, c.opaque) for c in commands)
            return [c.answer(codes.SUCCESS) for c in commands]

        def refuse_secret(connection: Connection, command: Command) -> str | None:
            self.checked.append((connection.remote, command.opaque))
            if command.ext.get("topic") == "secret":
                return "No permission: lacks PUB on topic secret"
            return None

        self.server = RemotingServer(
            "test",
            {SEND: Batchable(one, many), PULL: one},
            metrics=RemotingMetrics(self.registry, "test"),
            check=refuse_secret if check else None,
        )
        self.transport = FakeTransport()
        self.connection = Connection(self.server)
        self.connection.connection_made(self.transport)  # type: ignore[arg-type]

    async def feed(self, *commands: Command) -> None:
        self.connection.data_received(b"".join(encode(c) for c in commands))
        for _ in range(5):  # let the handler tasks finish
            await asyncio.sleep(0)
        if self.connection._tasks:
            await asyncio.gather(*self.connection._tasks)

    def count(self, request_code: int, response_code: int) -> float | None:
        return self.registry.get_sample_value(
            "ferry_remoting_requests_total",
            {
                "server": "test",
                "request_code": str(request_code),
                "response_code": str(response_code),
            },
        )


def request(code: int, opaque: int, topic: str, oneway: bool = False) -> Command:
    return Command(code, opaque, FLAG_ONEWAY if oneway else 0, {"topic": topic})


def test_a_refused_request_is_answered_16_and_not_handled():
    async def main():
        h = Harness()
        await h.feed(request(PULL, 1, "secret"), request(PULL, 2, "open"))
        assert h.handled == [(PULL, 2)]
        answers = h.transport.answers()
        assert answers[1].code == codes.NO_PERMISSION == 16
        assert answers[1].remark == "No permission: lacks PUB on topic secret"
        assert answers[1].flag & FLAG_RESPONSE
        assert answers[2].code == codes.SUCCESS
        assert h.checked == [("10.0.0.7:50123", 1), ("10.0.0.7:50123", 2)]
        assert h.count(PULL, 16) == 1 and h.count(PULL, codes.SUCCESS) == 1

    asyncio.run(main())


def test_a_refused_oneway_request_is_dropped_without_an_answer():
    async def main():
        h = Harness()
        await h.feed(request(PULL, 1, "secret", oneway=True))
        assert h.handled == []
        assert h.transport.answers() == {}
        assert h.count(PULL, 16) == 1

    asyncio.run(main())


def test_every_request_of_a_batch_run_is_checked_on_its_own():
    async def main():
        h = Harness()
        await h.feed(
            request(SEND, 1, "open"),
            request(SEND, 2, "secret"),
            request(SEND, 3, "open"),
            request(SEND, 4, "secret", oneway=True),
            request(SEND, 5, "open"),
        )
        assert [opaque for _, opaque in h.checked] == [1, 2, 3, 4, 5]
        assert h.runs == [[1, 3, 5]]  # one run, the refused ones taken out
        answers = h.transport.answers()
        assert {o: a.code for o, a in answers.items()} == {1: 0, 2: 16, 3: 0, 5: 0}
        assert h.count(SEND, 16) == 2 and h.count(SEND, 0) == 3

    asyncio.run(main())


def test_answers_to_the_servers_own_requests_are_not_checked():
    async def main():
        h = Harness()
        asked = asyncio.ensure_future(
            h.connection.request(Command(codes.NOTIFY_CONSUMER_IDS_CHANGED), timeout=5)
        )
        await asyncio.sleep(0)
        reply = Command(0, 1, FLAG_RESPONSE, {"topic": "secret"})
        await h.feed(reply)
        assert (await asyncio.wait_for(asked, 5)).ext == {"topic": "secret"}
        assert h.checked == []

    asyncio.run(main())


def test_without_a_check_every_request_is_handled():
    async def main():
        h = Harness(check=False)
        await h.feed(request(PULL, 1, "secret"), request(SEND, 2, "secret"))
        assert sorted(h.handled) == [(PULL, 1), (SEND, 2)]
        assert h.checked == []

    asyncio.run(main())


def test_a_check_that_fails_refuses_the_request():
    async def main():
        h = Harness()

        def broken(connection: Connection, command: Command) -> str | None:
            raise RuntimeError("bug")

        h.server.check = broken
        await h.feed(request(PULL, 1, "open"))
        assert h.handled == []
        assert h.transport.answers()[1].code == 16

    asyncio.run(main())
