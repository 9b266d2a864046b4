"""One public port for TLS and plaintext gRPC: a relay that routes each
connection by its first byte (Apache's tlsMode permissive for gRPC).

grpcio's server cannot serve TLS and plaintext on one port, so the server
listens on two loopback-only ports (one TLS, one plaintext) and this relay
owns the public one: a connection whose first byte is 0x16 (a TLS handshake
record) is relayed to the TLS port, any other to the plaintext one. TLS ends
in the gRPC server, not here; the relay only copies bytes.

Cost per connection: one task to dial the internal port, then two
`asyncio.Protocol`s that write each chunk straight into the other side's
transport. Flow control is the transports' own: when one side's write buffer
passes its high-water mark, reading from the other side pauses until it
drains, so each direction holds at most about `HIGH_WATER_BYTES` plus one
read. A half-close is passed on (write_eof); a side is closed once both its
directions are done; a reset on one side aborts the other.

Who the client is: the gRPC server sees every relayed connection coming from
127.0.0.1. `PeerBook` keeps, for each relayed connection, the client's address
by the relay's own local port on it, and `PeerBook.real` turns the peer the
server reports back into the client's (what an ACL's remote-address rules and
the denial log need); a peer the book does not hold (a connection to an internal
port that did not come through the relay) is never taken for 127.0.0.1.

All state is owned by the event loop that runs the relay.
"""

from __future__ import annotations

import asyncio
import logging

from ferry.runtime.clock import within

log = logging.getLogger(__name__)

TLS_HANDSHAKE = 0x16  # the content type of a TLS record that starts a handshake
HIGH_WATER_BYTES = 256 * 1024
CONNECT_TIMEOUT_S = 5.0


def format_peer(address) -> str:
    """A socket address as gRPC writes a peer: "ipv4:1.2.3.4:5", "ipv6:[::1]:5"."""
    if not isinstance(address, tuple) or len(address) < 2:
        return f"unknown:{address}"
    host, port = address[0], address[1]
    return f"ipv6:[{host}]:{port}" if ":" in str(host) else f"ipv4:{host}:{port}"


class PeerBook:
    """The client behind each connection the relay holds to the gRPC server, by
    that connection's local port (the port the server reports as its peer's)."""

    UNKNOWN = "unknown:not-relayed"

    def __init__(self) -> None:
        self._by_port: dict[int, str] = {}

    def add(self, local_port: int, client_peer: str) -> None:
        self._by_port[local_port] = client_peer

    def discard(self, local_port: int) -> None:
        self._by_port.pop(local_port, None)

    def real(self, peer: str) -> str:
        """The client's peer string for the server-reported `peer` of a relayed
        connection; UNKNOWN for any other (never the relay's 127.0.0.1)."""
        kind, _, rest = peer.partition(":")
        host, _, port = rest.rpartition(":")
        if kind in ("ipv4", "ipv6") and port.isdigit():
            found = self._by_port.get(int(port))
            if found is not None:
                return found
        return self.UNKNOWN

    def __len__(self) -> int:
        return len(self._by_port)


class _Side(asyncio.Protocol):
    """One end of a relayed connection; writes what it reads into `other`."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.other: _Side | None = None
        self.read_done = False  # EOF read from this side
        self.write_done = False  # EOF passed on to this side
        self.writing_paused = False  # this side's write buffer is past its high-water mark

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.set_write_buffer_limits(high=HIGH_WATER_BYTES)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        self.other.transport.write(data)  # type: ignore[union-attr]

    def eof_received(self) -> bool:
        self.read_done = True
        other = self.other
        if other is not None and other.transport is not None and not other.transport.is_closing():
            other.transport.write_eof()
            other.write_done = True
            other._close_if_done()
        self._close_if_done()
        return True  # keep this side open for what the other still sends

    def _close_if_done(self) -> None:
        if self.read_done and self.write_done and self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        other = self.other
        if other is not None and other.transport is not None and not other.transport.is_closing():
            if exc is None:
                other.transport.close()  # flushes what is buffered first
            else:
                other.transport.abort()

    # The other side's reading follows this side's write buffer.
    def pause_writing(self) -> None:
        self.writing_paused = True
        if self.other is not None and self.other.transport is not None:
            self.other.transport.pause_reading()

    def resume_writing(self) -> None:
        self.writing_paused = False
        if self.other is not None and self.other.transport is not None:
            self.other.transport.resume_reading()


class _Upstream(_Side):
    """The relay's connection to the gRPC server; its entry in the peer book lives
    as long as it does (the server may still be answering after the client left)."""

    def __init__(self, peers: PeerBook) -> None:
        super().__init__()
        self._peers = peers
        self.local_port = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        sockname = transport.get_extra_info("sockname")
        self.local_port = sockname[1] if isinstance(sockname, tuple) else 0

    def connection_lost(self, exc: Exception | None) -> None:
        self._peers.discard(self.local_port)
        super().connection_lost(exc)


class _Client(_Side):
    """The accepted side: waits for the first byte, then dials the internal port."""

    def __init__(self, relay: TLSSniffRelay) -> None:
        super().__init__()
        self._relay = relay
        self._first = b""
        self._task: asyncio.Task | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._relay.clients.add(self)

    def data_received(self, data: bytes) -> None:
        if self.other is not None:
            self.other.transport.write(data)  # type: ignore[union-attr]
            return
        # Nothing more until the internal connection is up (the first chunk is bounded
        # by one read).
        self._first += data
        self.transport.pause_reading()  # type: ignore[union-attr]
        if self._task is None:
            tls = data[0] == TLS_HANDSHAKE
            self._relay.relayed[tls] += 1
            port = self._relay.tls_port if tls else self._relay.plain_port
            self._task = asyncio.get_running_loop().create_task(self._dial(port))

    async def _dial(self, port: int) -> None:
        loop = asyncio.get_running_loop()
        upstream = _Upstream(self._relay.peers)
        upstream.other = self  # the server may speak first (HTTP/2 SETTINGS)
        try:
            await within(
                loop.create_connection(lambda: upstream, "127.0.0.1", port), CONNECT_TIMEOUT_S
            )
        except OSError as exc:  # TimeoutError included
            log.warning("relay: cannot reach the internal port %d: %s", port, exc)
            self.transport.abort()  # type: ignore[union-attr]
            return
        if self.transport.is_closing():  # type: ignore[union-attr]
            upstream.transport.abort()  # type: ignore[union-attr]
            return
        # Before the first byte reaches the server: no call on it is read without its entry.
        peer = format_peer(self.transport.get_extra_info("peername"))  # type: ignore[union-attr]
        self._relay.peers.add(upstream.local_port, peer)
        self.other = upstream
        upstream.transport.write(self._first)  # type: ignore[union-attr]
        self._first = b""
        if self.read_done:
            upstream.transport.write_eof()  # type: ignore[union-attr]
            upstream.write_done = True
        elif not upstream.writing_paused:
            self.transport.resume_reading()  # type: ignore[union-attr]

    def eof_received(self) -> bool:
        if self.other is None and not self._first:
            return False  # closed before saying anything: nothing to relay
        return super().eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._relay.clients.discard(self)
        if self.other is None and self._task is not None:
            self._task.cancel()
        super().connection_lost(exc)


class TLSSniffRelay:
    """The public listener; `start()` binds `host:port` (0: a free one)."""

    def __init__(
        self, host: str, port: int, tls_port: int, plain_port: int, peers: PeerBook | None = None
    ) -> None:
        self.host, self.requested_port = host, port
        self.tls_port, self.plain_port = tls_port, plain_port
        self.peers = peers if peers is not None else PeerBook()
        self.clients: set[_Client] = set()
        self.relayed = {True: 0, False: 0}  # connections so far, by "was TLS"
        self._server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> int:
        """Bind and accept; the bound port, or OSError."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Client(self), self.host, self.requested_port, reuse_port=False
        )
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    def stop_accepting(self) -> None:
        """Refuse new connections; those relayed go on (a graceful stop's grace)."""
        if self._server is not None:
            self._server.close()

    async def stop(self) -> None:
        """Stop accepting and close every relayed connection."""
        if self._server is None:
            return
        self._server.close()
        for client in list(self.clients):
            if client.transport is not None:
                client.transport.abort()
        await self._server.wait_closed()
        self._server = None
