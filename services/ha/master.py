"""The master side of the HA data plane: a TCP server on `haListenPort` streaming
commit-log bytes to slaves (docs/reference/contract.md, "The HA protocol").

Per connection, one reader task (the slave's reports: acks) and one writer
task (transfer frames and heartbeats), as RocketMQ's HAConnection:

- nothing is sent before the slave's first report (or, with a secret, before
  the CHALLENGE/HELLO/WELCOME handshake);
- an empty slave (report 0) starts at the start of the master's last file, or
  at the oldest offset with `haSyncFrom=minOffset`; an offset older than the
  oldest file is out of range: without the handshake the connection is closed
  with the reason logged and counted (never heartbeats forever), with it the
  WELCOME names where the stream restarts and the slave resyncs;
- a frame never crosses a file boundary, carries at most `transfer_batch_bytes`
  and never goes past the commit log's write position; bodies go out with
  `sendfile` straight from the file (a region the log holds for the transfer
  and brings into the page cache first, off the loop, when it is cold);
- a heartbeat (a header with size 0) after `heartbeat_interval_s` without data;
- the connection closes after `housekeeping_interval_s` without a report, on a
  report beyond the master's max offset or going backwards, and on any
  protocol error — each with a logged reason; other connections go on.

Acks are tracked per replica (the handshake's replica id, else the remote
address) in `ReplicaAcks`, which releases waiting SYNC_MASTER sends.
The log is reached only through `ReplicatedLog` (replicated_log.py).
Runs on the broker's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from dataclasses import dataclass, field

from ferry.runtime.clock import within
from ferry.runtime.tasks import cancel_and_wait
from services.ha import protocol
from services.ha.protocol import HAProtocolError
from services.ha.replicated_log import ReplicatedLog
from services.ha.sync import ReplicaAcks

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HAMasterConfig:
    host: str = "0.0.0.0"
    port: int = 10912
    transfer_batch_bytes: int = 32 * 1024
    heartbeat_interval_s: float = 5.0
    housekeeping_interval_s: float = 20.0
    secret: bytes = b""
    # Automatic failover: this master's leader epoch. The handshake always runs
    # and slaves must follow this very epoch (protocol.FLAG_EPOCH).
    epoch: int | None = None
    sync_from: str = "lastFile"  # or "minOffset"
    group: str = "broker-a"
    max_connections: int = 16
    ssl: object = None  # an ssl.SSLContext: serve the HA stream over TLS (haTls)


@dataclass
class Connection:
    """What the master knows of one slave connection (read by GetHAStatus)."""

    addr: str
    replica: object
    replica_id: int = 0
    ack_offset: int = 0
    transfer_from: int = -1
    transferred_bytes: int = 0
    last_ack_ms: int = 0
    started: float = field(default_factory=time.monotonic)
    _rate_mark: tuple[float, int] = (0.0, 0)
    rate: float = 0.0
    # The writer's direct sender while it is parked waiting for the log to grow
    # (nothing of a frame in progress): `HAMaster.push_now` may send from there.
    parked: _DirectSender | None = None
    unsent: bytes = b""  # the rest of a frame `push_now` could not send whole

    @property
    def label(self) -> str:
        """The slave's name in metrics: its handshake replica id, else its address."""
        return str(self.replica_id) if self.replica_id else self.addr

    def bytes_per_second(self) -> float:
        now = time.monotonic()
        then, before = self._rate_mark
        if now - then >= 1.0:
            self.rate = (self.transferred_bytes - before) / (now - then) if then else 0.0
            self._rate_mark = (now, self.transferred_bytes)
        return self.rate


@dataclass(frozen=True)
class ReplicaState:
    """One connected slave as GetHAStatus and the metrics report it."""

    conn: Connection
    lag: int  # the master's max offset minus the slave's ack offset
    in_sync: bool  # lag < haMaxGapNotInSync


class HAMaster:
    def __init__(self, config: HAMasterConfig, log_: ReplicatedLog, acks: ReplicaAcks) -> None:
        self.config = config
        self.replica_log = log_
        self.acks = acks
        self.connections: dict[object, Connection] = {}
        # replica label -> commit-log bytes streamed to it, over all its connections
        self.sent_bytes: dict[str, int] = {}
        self._tasks: dict[object, asyncio.Task] = {}
        self._server: asyncio.AbstractServer | None = None
        self.port = 0
        self.out_of_range_closes = 0
        self.protocol_errors = 0

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> int:
        self._server = await asyncio.start_server(
            self._accept, self.config.host, self.config.port, reuse_address=True,
            ssl=self.config.ssl,  # type: ignore[arg-type]
        )  # fmt: skip
        self.port = self._server.sockets[0].getsockname()[1]
        log.info(
            "HA master listening on %s:%d%s",
            self.config.host,
            self.port,
            " (TLS)" if self.config.ssl else "",
        )
        return self.port

    def replica_states(self) -> list[ReplicaState]:
        top = self.replica_log.max_offset
        states = []
        for conn in list(self.connections.values()):
            lag = max(0, top - conn.ack_offset)
            states.append(ReplicaState(conn, lag, lag < self.acks.max_gap))
        return states

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        await cancel_and_wait(*self._tasks.values())
        if self._server is not None:
            with contextlib.suppress(Exception):
                await within(self._server.wait_closed(), 2)
        self._server = None

    def push_now(self) -> None:
        """Send what the log gained to every slave whose writer is parked, now, from
        the caller's event-loop turn (a SYNC_MASTER send about to wait for its
        slave): the writer task would send it one turn later. The frame's bytes
        were just appended, so they are read from the page cache; a frame the
        socket takes only in part is finished by the writer before anything else."""
        log_ = self.replica_log
        end = log_.max_offset
        for conn in self.connections.values():
            sender = conn.parked
            position = conn.transfer_from
            if sender is None or position >= end:
                continue
            body = log_.read_now(position, self.config.transfer_batch_bytes)
            if not body:
                continue
            frame = protocol.encode_header(position, len(body)) + body
            try:
                sent = os.write(sender.fd, frame)
            except BlockingIOError:
                continue  # the writer sends it once the socket has room
            except OSError:
                continue  # the connection is going: its tasks see it
            if sent < len(frame):
                conn.unsent = frame[sent:]
            conn.parked = None
            size = len(body)
            conn.transfer_from = position + size
            conn.transferred_bytes += size
            self.sent_bytes[conn.label] = self.sent_bytes.get(conn.label, 0) + size

    # ------------------------------------------------------------ one connection

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """The server's per-connection task. It ends quietly when this master
        cancels it (a stop, or its replica reconnected): Python 3.11's
        StreamReaderProtocol asks a finished connection task for its
        exception, which raises for a cancelled one, and logs an ERROR
        "Exception in callback" for every connection a stop closed (every
        failover role change showed one)."""
        with contextlib.suppress(asyncio.CancelledError):
            await self._serve(reader, writer)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        addr = f"{peer[0]}:{peer[1]}" if peer else "?"
        key: object = addr
        task = asyncio.current_task()
        self._tasks[addr] = task  # type: ignore[assignment]
        conn: Connection | None = None
        writer_task: asyncio.Task | None = None
        try:
            if len(self.connections) >= self.config.max_connections:
                raise HAProtocolError(
                    f"too many HA connections (max {self.config.max_connections})"
                )
            async with asyncio.timeout(self.config.housekeeping_interval_s):
                if self.config.secret or self.config.epoch is not None:
                    replica_id, start = await self._handshake(reader, writer, addr)
                    key = ("replica", replica_id)
                    first = start
                else:
                    replica_id = 0
                    first = await protocol.read_report(reader)
                    start = self._start_for(first, addr)
            old = self.connections.get(key)
            if old is not None and key in self._tasks:
                log.info("replica %s reconnected from %s; closing its old connection", key, addr)
                self._tasks[key].cancel()
            self._tasks.pop(addr, None)
            self._tasks[key] = task  # type: ignore[assignment]
            conn = Connection(addr, key, replica_id, ack_offset=first, transfer_from=start)
            self.connections[key] = conn
            self.acks.connect(key, first if first <= self.replica_log.max_offset else 0)
            log.info(
                "HA slave connected from %s (replica %s): reported %d, streaming from %d",
                addr,
                replica_id or "-",
                first,
                start,
            )
            writer_task = asyncio.create_task(
                self._write_loop(conn, writer), name=f"ha-write-{addr}"
            )
            await self._read_loop(conn, reader, writer, writer_task)
        except HAProtocolError as exc:
            self.protocol_errors += 1
            log.warning("closing HA connection from %s: %s", addr, str(exc))
        except TimeoutError:
            log.warning(
                "closing HA connection from %s: nothing read for %.0f s",
                addr,
                self.config.housekeeping_interval_s,
            )
        except (ConnectionError, OSError) as exc:
            log.info("HA connection from %s ended: %s", addr, str(exc))
        finally:
            # Bookkeeping first: the awaits below re-raise a cancellation.
            if conn is not None and self.connections.get(key) is conn:
                del self.connections[key]
                self.acks.disconnect(key)
                if not conn.replica_id:  # labelled by address: gone with the connection
                    self.sent_bytes.pop(conn.addr, None)
            if self._tasks.get(key) is task:
                del self._tasks[key]
            self._tasks.pop(addr, None)
            writer.close()
            await cancel_and_wait(writer_task)
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    def _start_for(self, report: int, addr: str) -> int:
        """Where the stream starts for a slave that reported `report` (legacy)."""
        log_ = self.replica_log
        if report == 0:
            return self._fresh_start()
        if report > log_.max_offset:
            raise HAProtocolError(
                f"slave reported offset {report}, beyond this master's max offset "
                f"{log_.max_offset}: it holds data this master does not"
            )
        if report < log_.min_offset:
            self.out_of_range_closes += 1
            raise HAProtocolError(
                f"slave reported offset {report}, older than this master's oldest offset "
                f"{log_.min_offset} (deleted by retention): it cannot catch up by streaming; "
                "configure haSecret on both sides to let it resync by itself, or wipe its store"
            )
        return report

    def _fresh_start(self) -> int:
        log_ = self.replica_log
        if self.config.sync_from == "minOffset":
            return log_.min_offset
        return max(log_.min_offset, log_.file_start(log_.max_offset))

    async def _handshake(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, addr: str
    ) -> tuple[int, int]:
        secret = self.config.secret
        challenge = os.urandom(protocol.NONCE_SIZE)
        writer.write(protocol.encode_challenge(challenge))
        await writer.drain()
        hello, signed = await protocol.read_hello(reader)
        if not protocol.verify_hello(secret, challenge, hello, signed):
            raise HAProtocolError("HELLO's HMAC does not verify: wrong haSecret")
        if hello.version != protocol.VERSION:
            raise HAProtocolError(
                f"HELLO version {hello.version}, this master speaks {protocol.VERSION}"
            )
        if hello.group != self.config.group:
            raise HAProtocolError(
                f"slave of group {hello.group!r} connected to the master of {self.config.group!r}"
            )
        epoch = self.config.epoch
        if epoch is not None and hello.epoch is None:
            raise HAProtocolError(
                f"slave {hello.replica_id} does not run with enableFailover, and this master "
                f"leads epoch {epoch} of a failover group"
            )
        if epoch is not None and hello.epoch != epoch:
            raise HAProtocolError(
                f"slave {hello.replica_id} follows epoch {hello.epoch}, this master leads epoch "
                f"{epoch}: "
                + (
                    "this master was deposed"
                    if hello.epoch > epoch
                    else "the slave has not yet seen this election"
                )
            )
        log_ = self.replica_log
        offset = hello.max_offset
        if offset == 0:
            start = self._fresh_start()
        elif offset > log_.max_offset:
            raise HAProtocolError(
                f"slave {hello.replica_id} is at {offset}, beyond this master's max offset "
                f"{log_.max_offset}"
            )
        elif offset < log_.min_offset:
            self.out_of_range_closes += 1
            start = self._fresh_start()
            log.warning(
                "slave %d at %d is older than this master's oldest offset %d: it resyncs from %d",
                hello.replica_id,
                offset,
                log_.min_offset,
                start,
            )
        else:
            start = offset
        welcome = protocol.Welcome(log_.min_offset, log_.max_offset, start, epoch)
        writer.write(protocol.encode_welcome(secret, challenge, hello.mac, welcome))
        await writer.drain()
        # The first legacy report follows the WELCOME: the slave's offset after any resync.
        report = await protocol.read_report(reader)
        if report != start:
            raise HAProtocolError(f"slave reported {report} after a WELCOME starting at {start}")
        return hello.replica_id, start

    async def _read_loop(
        self,
        conn: Connection,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        writer_task: asyncio.Task,
    ) -> None:
        """Reports (acks): everything that has arrived is read at once and only
        the newest report is applied, after every one was checked."""
        housekeeping = self.config.housekeeping_interval_s
        size = protocol.REPORT_SIZE
        pending = b""

        def writer_ended(task: asyncio.Task) -> None:
            # Wake the read below: a writer that failed ends the connection.
            if not task.cancelled() and task.exception() is not None:
                writer.transport.abort()

        writer_task.add_done_callback(writer_ended)
        while True:
            try:
                async with asyncio.timeout(housekeeping):
                    data = await reader.read(64 * 1024)
            finally:
                if writer_task.done() and not writer_task.cancelled():
                    writer_task.result()  # raises what ended the writer
            if not data:
                if pending:
                    raise HAProtocolError(
                        f"the peer closed the connection in the middle of a report "
                        f"({len(pending)} of {size} bytes)"
                    )
                raise HAProtocolError("the slave closed the connection")
            pending += data
            whole = len(pending) - len(pending) % size
            if not whole:
                continue
            top = self.replica_log.max_offset
            last = conn.ack_offset
            for start in range(0, whole, size):
                offset = protocol.decode_report(pending[start : start + size])
                if offset > top:
                    raise HAProtocolError(
                        f"report {offset} is beyond this master's max offset {top}"
                    )
                if offset < last:
                    raise HAProtocolError(f"report went backwards from {last} to {offset}")
                last = offset
            pending = pending[whole:]
            conn.ack_offset = last
            conn.last_ack_ms = int(time.time() * 1000)
            self.acks.ack(conn.replica, last)

    async def _write_loop(self, conn: Connection, writer: asyncio.StreamWriter) -> None:
        await writer.drain()  # the handshake's bytes go first
        # sendfile() would bypass TLS: over TLS the bytes go through the transport.
        sender = _StreamSender(writer) if self.config.ssl else _DirectSender(writer)
        label = conn.label
        log_ = self.replica_log
        batch = self.config.transfer_batch_bytes
        heartbeat = self.config.heartbeat_interval_s
        last_write = time.monotonic()
        frames = 0  # sent since the last yield to the event loop
        try:
            while True:
                position = conn.transfer_from
                if position < log_.max_offset:
                    region = await log_.read_region(position, batch)
                    try:
                        size = region.size
                        await sender.send_bytes(protocol.encode_header(position, size))
                        await sender.send_file(region.fd, region.file_position, size)
                    finally:
                        log_.release(region)
                    conn.transfer_from = position + size
                    conn.transferred_bytes += size
                    self.sent_bytes[label] = self.sent_bytes.get(label, 0) + size
                    last_write = time.monotonic()
                    frames += 1
                    if frames >= _FRAMES_PER_TURN:
                        frames = 0
                        await asyncio.sleep(0)  # let the reader and the rest of the broker run
                    continue
                idle = time.monotonic() - last_write
                if idle >= heartbeat:
                    await sender.send_bytes(protocol.encode_header(position, 0))
                    last_write = time.monotonic()
                    continue
                if isinstance(sender, _DirectSender):
                    conn.parked = sender
                try:
                    await log_.wait_for_growth(position, min(heartbeat - idle, 0.5))
                finally:
                    conn.parked = None
                if conn.unsent:
                    unsent, conn.unsent = conn.unsent, b""
                    await sender.send_bytes(unsent)
                if conn.transfer_from != position:
                    last_write = time.monotonic()  # push_now sent a frame meanwhile
        finally:
            sender.close()


# Frames sent back to back before the writer yields to the event loop (when
# the socket never fills, as on loopback with a fast slave).
_FRAMES_PER_TURN = 64


class _StreamSender:
    """The HA stream over TLS: frames read from the commit-log files and
    written through the (TLS) transport, waiting while its buffer is full.
    Slower than _DirectSender's sendfile, which TLS rules out."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer

    def close(self) -> None:
        pass  # the connection's owner closes the writer

    async def send_bytes(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def send_file(self, file_fd: int, offset: int, count: int) -> None:
        data = await asyncio.to_thread(os.pread, file_fd, count, offset)
        if len(data) != count:
            raise OSError(
                f"read {len(data)} of {count} bytes at file offset {offset}: file cut short?"
            )
        self.writer.write(data)
        await self.writer.drain()


class _DirectSender:
    """Writes frames straight to the connection's socket: the 12-byte header
    with one send, the body with `os.sendfile` (zero-copy from the page
    cache). asyncio's `loop.sendfile` costs several event-loop turns and
    selector registrations per call, which at 32 KiB frames was most of the
    master's CPU. The socket is a duplicate of the transport's (the transport
    keeps reading reports; it writes nothing once this starts), and waits for
    room only when the socket buffer is full."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.loop = asyncio.get_running_loop()
        sock = writer.get_extra_info("socket")
        self.fd = os.dup(sock.fileno())
        os.set_blocking(self.fd, False)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    async def _writable(self) -> None:
        future = self.loop.create_future()

        def ready() -> None:
            if not future.done():
                future.set_result(None)

        self.loop.add_writer(self.fd, ready)
        try:
            await future
        finally:
            self.loop.remove_writer(self.fd)

    async def send_bytes(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                sent = os.write(self.fd, view)
            except BlockingIOError:
                await self._writable()
                continue
            view = view[sent:]

    async def send_file(self, file_fd: int, offset: int, count: int) -> None:
        while count:
            try:
                sent = os.sendfile(self.fd, file_fd, offset, count)
            except BlockingIOError:
                await self._writable()
                continue
            if sent == 0:
                raise OSError(f"sendfile sent nothing at file offset {offset}: file cut short?")
            offset += sent
            count -= sent
