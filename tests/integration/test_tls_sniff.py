"""The first-byte relay (ferry.runtime.tls_sniff) alone, in front of two plain TCP
servers standing in for the gRPC server's TLS and plaintext ports: each connection
goes where its first byte says, every byte comes through both ways (more than the
relay buffers, to a reader that is slower than the writer), a half-close is passed
on, and stopping closes what is relayed."""

from __future__ import annotations

import asyncio

import pytest

from ferry.runtime.tls_sniff import HIGH_WATER_BYTES, PeerBook, TLSSniffRelay

BIG = 8 * HIGH_WATER_BYTES


async def _echo(tag: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answer `tag`, then echo until EOF, then EOF."""
    writer.write(tag)
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()
    writer.write_eof()
    await writer.drain()
    writer.close()


async def _relay() -> tuple[TLSSniffRelay, list[asyncio.Server]]:
    servers = [
        await asyncio.start_server(lambda r, w, t=tag: _echo(t, r, w), "127.0.0.1", 0)
        for tag in (b"T", b"P")
    ]
    tls_port, plain_port = (s.sockets[0].getsockname()[1] for s in servers)
    relay = TLSSniffRelay("127.0.0.1", 0, tls_port, plain_port)
    await relay.start()
    return relay, servers


async def _through(relay: TLSSniffRelay, first: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", relay.port)
    payload = first + bytes(range(256)) * (BIG // 256)

    async def send() -> None:
        for i in range(0, len(payload), 100_000):
            writer.write(payload[i : i + 100_000])
            await writer.drain()
        writer.write_eof()

    async def receive() -> bytes:
        got = bytearray()
        while data := await reader.read(16384):
            got += data
            await asyncio.sleep(0)  # a slower reader than the writer
        return bytes(got)

    _, got = await asyncio.wait_for(asyncio.gather(send(), receive()), 60)
    writer.close()
    assert got[1:] == payload  # everything, in order, then EOF (the half-close came back)
    return got[:1]


@pytest.mark.parametrize(("first", "tag"), [(b"\x16", b"T"), (b"PRI", b"P")])
def test_a_connection_goes_where_its_first_byte_says(first, tag):
    async def main() -> None:
        relay, servers = await _relay()
        try:
            assert await _through(relay, first) == tag
            assert relay.relayed == {True: tag == b"T", False: tag == b"P"}
        finally:
            await relay.stop()
            for s in servers:
                s.close()

    asyncio.run(main())


def test_stop_closes_what_is_relayed():
    async def main() -> None:
        relay, servers = await _relay()
        reader, writer = await asyncio.open_connection("127.0.0.1", relay.port)
        writer.write(b"\x16hello")
        assert await asyncio.wait_for(reader.readexactly(7), 10) == b"T\x16hello"
        await relay.stop()
        assert await asyncio.wait_for(reader.read(), 10) == b""
        assert not relay.clients
        writer.close()
        for s in servers:
            s.close()

    asyncio.run(main())


def test_the_peer_book_names_the_client_behind_each_relayed_connection():
    """The server behind the relay sees 127.0.0.1 for every client; the book gives
    back the real one (here a client bound to 127.0.0.2) for as long as the relay's
    connection to the server lives, and never 127.0.0.1 for a peer it does not hold
    (what an ACL's globalWhiteRemoteAddresses must not be fooled by)."""

    async def main() -> None:
        seen: asyncio.Queue[tuple[str, int]] = asyncio.Queue()

        async def record(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            seen.put_nowait(writer.get_extra_info("peername")[:2])
            while await reader.read(65536):
                pass
            writer.close()

        upstream = await asyncio.start_server(record, "127.0.0.1", 0)
        port = upstream.sockets[0].getsockname()[1]
        relay = TLSSniffRelay("127.0.0.1", 0, port, port)
        await relay.start()
        try:
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", relay.port, local_addr=("127.0.0.2", 0)
            )
            client_port = writer.get_extra_info("sockname")[1]
            writer.write(b"\x16hello")
            await writer.drain()
            host, relay_port = await asyncio.wait_for(seen.get(), 10)
            assert host == "127.0.0.1"  # what the server sees
            assert relay.peers.real(f"ipv4:127.0.0.1:{relay_port}") == (
                f"ipv4:127.0.0.2:{client_port}"
            )
            assert relay.peers.real("ipv4:127.0.0.1:1") == PeerBook.UNKNOWN
            assert relay.peers.real("unix:/x") == PeerBook.UNKNOWN
            writer.close()
            deadline = asyncio.get_running_loop().time() + 10
            while len(relay.peers) and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.01)  # the relay's side closes after the client's
            assert len(relay.peers) == 0
        finally:
            await relay.stop()
            upstream.close()

    asyncio.run(main())
