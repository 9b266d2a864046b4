"""ferry.remoting.server when a client goes away with requests still unread: the server
had stopped reading (backpressure), the client sent more and reset the connection, and the
server's next answer fails. The requests whose effect outlives the connection (the server's
`after_close` codes) are still handled; the others are not. Real sockets, a real server;
the handlers only record what reached them."""

from __future__ import annotations

import asyncio
import socket
import struct

from ferry.remoting.codec import Command, encode
from ferry.remoting.server import RemotingServer
from tests.conftest import LoopThread
from tests.waiting import wait_for

SLOW, KEPT, DROPPED = 1, 2, 3  # request codes: held until released; after_close; not


def test_requests_sent_before_a_reset_are_handled_when_their_effect_outlives_it():
    loop = LoopThread()
    handled: list[str] = []
    release = loop.run(_event())

    async def slow(connection, command):
        await release.wait()
        handled.append(command.ext["n"])
        return command.answer(0)

    async def quick(connection, command):
        handled.append(command.ext["n"])
        return command.answer(0)

    server = RemotingServer(
        "test", {SLOW: slow, KEPT: quick, DROPPED: quick}, max_in_flight=2, after_close={KEPT}
    )
    port = loop.run(server.listen("127.0.0.1", 0))
    client = socket.create_connection(("127.0.0.1", port))
    try:
        client.sendall(request(SLOW, 1, "a") + request(SLOW, 2, "b"))
        # Two requests in flight: the server stops reading this connection.
        wait_for(lambda: loop.call(lambda: any(c._paused for c in server.connections)))
        cut = request(KEPT, 6, "f")
        client.sendall(
            request(KEPT, 3, "c") + request(DROPPED, 4, "d") + request(KEPT, 5, "e") + cut[:-3]
        )
        # Gone with a reset: the answers to a and b, unread, are thrown away.
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    finally:
        client.close()
    loop.call(release.set)
    wait_for(lambda: loop.call(lambda: not server.connections), what="the connection to go")
    wait_for(lambda: len(handled) >= 4, what="the requests to be handled")
    loop.run(server.stop())
    loop.close()
    # c and e (after_close) still count; d does not, nor f (cut short by the close).
    assert sorted(handled) == ["a", "b", "c", "e"]


async def _event() -> asyncio.Event:
    return asyncio.Event()


def request(code: int, opaque: int, n: str) -> bytes:
    return encode(Command(code, opaque=opaque, ext={"n": n}, language="JAVA"))
