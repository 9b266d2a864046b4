"""The master side of the HA data plane (SPEC §3.1–§3.2): a TCP server on
`haListenPort` streaming commit-log bytes to slaves.

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
  `sendfile` straight from the file;
- a heartbeat (a header with size 0) after `heartbeat_interval_s` without data;
- the connection closes after `housekeeping_interval_s` without a report, on a
  report beyond the master's max offset or going backwards, and on any
  protocol error — each with a logged reason; other connections go on.

Acks are tracked per replica (the handshake's replica id, else the remote
address) in `ReplicaAcks`, which releases waiting SYNC_MASTER sends.
Runs on the broker's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from ferry.runtime.clock import wait_event
from ferry.runtime.tasks import cancel_and_wait
from services.broker.store import MessageStore
from services.ha import protocol
from services.ha.protocol import HAProtocolError
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
    sync_from: str = "lastFile"  # or "minOffset"
    group: str = "broker-a"
    max_connections: int = 16


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

    def bytes_per_second(self) -> float:
        now = time.monotonic()
        then, before = self._rate_mark
        if now - then >= 1.0:
            self.rate = (self.transferred_bytes - before) / (now - then) if then else 0.0
            self._rate_mark = (now, self.transferred_bytes)
        return self.rate


class HAMaster:
    def __init__(self, config: HAMasterConfig, store: MessageStore, acks: ReplicaAcks) -> None:
        self.config = config
        self.store = store
        self.acks = acks
        self.connections: dict[object, Connection] = {}
        self._tasks: dict[object, asyncio.Task] = {}
        self._server: asyncio.AbstractServer | None = None
        self._appended = asyncio.Event()
        self.port = 0
        self.out_of_range_closes = 0
        self.protocol_errors = 0

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> int:
        self._server = await asyncio.start_server(
            self._serve, self.config.host, self.config.port, reuse_address=True
        )
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("HA master listening on %s:%d", self.config.host, self.port)
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        await cancel_and_wait(*self._tasks.values())
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)
        self._server = None

    def notify_appended(self, end_offset: int) -> None:
        """The store appended bytes: wake every writer."""
        self._appended.set()

    # ------------------------------------------------------------ one connection

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
                if self.config.secret:
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
            self.acks.connect(key, first if first <= self.store.max_offset else 0)
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
            await self._read_loop(conn, reader, writer_task)
        except HAProtocolError as exc:
            self.protocol_errors += 1
            log.warning("closing HA connection from %s: %s", addr, exc)
        except TimeoutError:
            log.warning(
                "closing HA connection from %s: nothing read for %.0f s",
                addr,
                self.config.housekeeping_interval_s,
            )
        except (ConnectionError, OSError) as exc:
            log.info("HA connection from %s ended: %s", addr, exc)
        finally:
            await cancel_and_wait(writer_task)
            if conn is not None and self.connections.get(key) is conn:
                del self.connections[key]
                self.acks.disconnect(key)
            if self._tasks.get(key) is task:
                del self._tasks[key]
            self._tasks.pop(addr, None)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    def _start_for(self, report: int, addr: str) -> int:
        """Where the stream starts for a slave that reported `report` (legacy)."""
        store = self.store
        if report == 0:
            return self._fresh_start()
        if report > store.max_offset:
            raise HAProtocolError(
                f"slave reported offset {report}, beyond this master's max offset "
                f"{store.max_offset}: it holds data this master does not"
            )
        if report < store.min_offset:
            self.out_of_range_closes += 1
            raise HAProtocolError(
                f"slave reported offset {report}, older than this master's oldest offset "
                f"{store.min_offset} (deleted by retention): it cannot catch up by streaming; "
                "configure haSecret on both sides to let it resync by itself, or wipe its store"
            )
        return report

    def _fresh_start(self) -> int:
        store = self.store
        if self.config.sync_from == "minOffset":
            return store.min_offset
        top = store.max_offset
        return max(store.min_offset, top - top % store.commit_log.file_size)

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
        store = self.store
        offset = hello.max_offset
        if offset == 0:
            start = self._fresh_start()
        elif offset > store.max_offset:
            raise HAProtocolError(
                f"slave {hello.replica_id} is at {offset}, beyond this master's max offset "
                f"{store.max_offset}"
            )
        elif offset < store.min_offset:
            self.out_of_range_closes += 1
            start = self._fresh_start()
            log.warning(
                "slave %d at %d is older than this master's oldest offset %d: it resyncs from %d",
                hello.replica_id,
                offset,
                store.min_offset,
                start,
            )
        else:
            start = offset
        welcome = protocol.Welcome(store.min_offset, store.max_offset, start)
        writer.write(protocol.encode_welcome(secret, challenge, hello.mac, welcome))
        await writer.drain()
        # The first legacy report follows the WELCOME: the slave's offset after any resync.
        report = await protocol.read_report(reader)
        if report != start:
            raise HAProtocolError(f"slave reported {report} after a WELCOME starting at {start}")
        return hello.replica_id, start

    async def _read_loop(
        self, conn: Connection, reader: asyncio.StreamReader, writer_task: asyncio.Task
    ) -> None:
        housekeeping = self.config.housekeeping_interval_s
        while True:
            read = asyncio.ensure_future(protocol.read_report(reader))
            done, _ = await asyncio.wait(
                {read, writer_task}, timeout=housekeeping, return_when=asyncio.FIRST_COMPLETED
            )
            if not done:
                read.cancel()
                raise TimeoutError
            if writer_task in done and read not in done:
                read.cancel()
                writer_task.result()  # raises what ended the writer
                return
            offset = read.result()
            top = self.store.max_offset
            if offset > top:
                raise HAProtocolError(f"report {offset} is beyond this master's max offset {top}")
            if offset < conn.ack_offset:
                raise HAProtocolError(f"report went backwards from {conn.ack_offset} to {offset}")
            conn.ack_offset = offset
            conn.last_ack_ms = int(time.time() * 1000)
            self.acks.ack(conn.replica, offset)

    async def _write_loop(self, conn: Connection, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        store = self.store
        file_size = store.commit_log.file_size
        batch = self.config.transfer_batch_bytes
        heartbeat = self.config.heartbeat_interval_s
        files: dict[int, object] = {}
        last_write = time.monotonic()
        try:
            while True:
                position = conn.transfer_from
                limit = store.max_offset
                if position < limit:
                    start = position - position % file_size
                    size = min(batch, limit - position, start + file_size - position)
                    f = files.get(start)
                    if f is None:
                        if len(files) > 4:
                            for old in files.values():
                                old.close()  # type: ignore[attr-defined]
                            files.clear()
                        f = files[start] = open(  # noqa: SIM115 - closed below
                            Path(store.commit_log.directory) / f"{start:020d}", "rb"
                        )
                    writer.write(protocol.encode_header(position, size))
                    await loop.sendfile(writer.transport, f, position - start, size)  # type: ignore[arg-type]
                    conn.transfer_from = position + size
                    conn.transferred_bytes += size
                    last_write = time.monotonic()
                    continue
                idle = time.monotonic() - last_write
                if idle >= heartbeat:
                    writer.write(protocol.encode_header(position, 0))
                    await writer.drain()
                    last_write = time.monotonic()
                    continue
                self._appended.clear()
                if store.max_offset <= position:
                    await wait_event(self._appended, min(heartbeat - idle, 0.5))
        finally:
            for f in files.values():
                f.close()  # type: ignore[attr-defined]
