"""The slave side of the HA data plane: connect to the master's HA address, report
this log's end, append what the master streams (docs/reference/contract.md, "The HA
protocol").

- The master's HA address comes from the name server's registration answer
  (`set_master`), or from `haMasterAddress`; while it is unknown the slave waits.
- On connect the slave reports its end offset at once (RocketMQ 4.x waited 5 s),
  after applying the frames that arrived together (one report per read pass,
  as RocketMQ's HAClient does; one report per frame when they come one at a
  time), and at least every `heartbeat_interval_s`.
- A frame is appended only when its offset is this log's end; an empty log
  accepts the master's start (a file start) and creates the file named for it.
  Any other offset closes the connection (logged); the slave reconnects after
  `reconnect_s` and reports its end again, so nothing is appended out of place.
- The connection closes after `housekeeping_interval_s` with nothing read.
- With a secret: CHALLENGE → HELLO (HMAC) → WELCOME (HMAC checked). When the
  WELCOME's start differs from this log's end (the slave fell out of the
  master's retention) and `reset_out_of_range` is on, the slave discards its log
  and starts empty at that offset, and says so in the log.

The log is reached only through `ReplicatedLog` (replicated_log.py); the
broker's store builds the slave's consume queues from the appended bytes.
Runs on the broker's event loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from ferry.runtime.clock import wait_event
from ferry.runtime.tasks import cancel_and_wait
from services.ha import protocol
from services.ha.protocol import HAProtocolError
from services.ha.replicated_log import ReplicatedLog

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HASlaveConfig:
    master_address: str = ""  # haMasterAddress; else from registration
    heartbeat_interval_s: float = 5.0
    housekeeping_interval_s: float = 20.0
    reconnect_s: float = 5.0
    max_frame_bytes: int = 64 * 1024 * 1024
    read_buffer_bytes: int = 8 * 1024 * 1024  # grows only for one frame larger than this
    secret: bytes = b""
    # Automatic failover: the leader epoch this slave follows; the handshake
    # always runs and a master of any other epoch is refused.
    epoch: int | None = None
    group: str = "broker-a"
    replica_id: int = 1
    reset_out_of_range: bool = True
    connect_timeout_s: float = 5.0
    ssl: object = None  # an ssl.SSLContext: reach the master's HA port over TLS (haTls)


class HASlave:
    def __init__(self, config: HASlaveConfig, log_: ReplicatedLog) -> None:
        self.config = config
        self.replica_log = log_
        self.master_addr = config.master_address
        self._master_known = asyncio.Event()
        if self.master_addr:
            self._master_known.set()
        self._task: asyncio.Task | None = None
        self.connected = False
        self.last_read_ms = 0
        self.last_write_ms = 0
        self.master_max_offset = 0
        self.resyncs = 0
        self.disconnects = 0
        self._writer: _Writer | None = None

    # ------------------------------------------------------------ lifecycle

    def set_master(self, ha_addr: str) -> None:
        """From the registration answer; "" when the master is gone."""
        if self.config.master_address:
            return  # pinned by haMasterAddress
        if ha_addr == self.master_addr:
            return
        log.info("HA master address is now %s", ha_addr or "unknown")
        self.master_addr = ha_addr
        if ha_addr:
            self._master_known.set()
        else:
            self._master_known.clear()
            if self._writer is not None:
                self._writer.close()

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="ha-slave")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    # ------------------------------------------------------------ the loop

    async def _run(self) -> None:
        while True:
            await self._master_known.wait()
            addr = self.master_addr
            if not addr:
                # Known and then unknown again before this task ran (two answers
                # in one turn): wait for the next address.
                continue
            # Log messages, not exception objects: a log record keeps its
            # arguments, and an exception its traceback, which holds this
            # connection's read buffer (haReadBufferSize) alive.
            try:
                await self._session(addr)
            except HAProtocolError as exc:
                log.warning("HA connection to %s closed: %s", addr, str(exc))
            except TimeoutError:
                log.warning(
                    "HA connection to %s closed: nothing read for %.0f s",
                    addr,
                    self.config.housekeeping_interval_s,
                )
            except (ConnectionError, OSError) as exc:
                log.info("HA connection to %s failed: %s", addr, str(exc))
            except asyncio.CancelledError:
                raise
            except Exception:
                # Never let the replication task die with a bug: log it, retry.
                log.exception("HA session with %s failed unexpectedly; reconnecting", addr)
            finally:
                if self.connected:
                    self.disconnects += 1
                self.connected = False
                self._writer = None
            await asyncio.sleep(self.config.reconnect_s)

    async def _session(self, addr: str) -> None:
        host, _, port = addr.rpartition(":")
        loop = asyncio.get_running_loop()
        inbound = Inbound(self.config.read_buffer_bytes)
        async with asyncio.timeout(self.config.connect_timeout_s):
            transport, _ = await loop.create_connection(
                lambda: inbound,
                host,
                int(port),
                ssl=self.config.ssl,  # type: ignore[arg-type]
            )
        writer = _Writer(transport)
        self._writer = writer
        heartbeat: asyncio.Task | None = None
        try:
            housekeeping = self.config.housekeeping_interval_s
            if self.config.secret or self.config.epoch is not None:
                async with asyncio.timeout(housekeeping):
                    await self._handshake(inbound, writer)
            self.connected = True
            log.info("HA connected to master %s; reporting %d", addr, self.replica_log.max_offset)
            self._report(writer)
            heartbeat = asyncio.create_task(self._heartbeats(writer), name="ha-slave-heartbeat")
            log_ = self.replica_log
            max_frame = self.config.max_frame_bytes
            while True:
                async with asyncio.timeout(housekeeping):
                    await inbound.wait_more()
                self.last_read_ms = int(time.time() * 1000)
                # Everything that arrived in this turn: usually many frames.
                applied = False
                while (frame := inbound.next_frame(max_frame)) is not None:
                    offset, body = frame
                    size = len(body)
                    if not size:
                        self.master_max_offset = max(self.master_max_offset, offset)
                        continue
                    end = log_.max_offset
                    try:
                        log_.append(offset, body)
                    except ValueError as exc:
                        raise HAProtocolError(
                            f"master sent bytes at {offset}, but this log ends at {end} ({exc}); "
                            "reconnecting to report the end again"
                        ) from None
                    except OSError as exc:
                        raise HAProtocolError(
                            f"cannot append {size} bytes at {offset}: {exc}"
                        ) from None
                    finally:
                        body.release()
                    self.master_max_offset = max(self.master_max_offset, offset + size)
                    applied = True
                if applied:
                    # One report for all the frames applied in this turn, as
                    # RocketMQ's HAClient reports after each read-buffer pass.
                    self._report(writer)
                inbound.consumed()
                if inbound.eof:
                    raise HAProtocolError(inbound.eof_reason())
        finally:
            transport.close()
            await cancel_and_wait(heartbeat)

    async def _handshake(self, reader: Inbound, writer: _Writer) -> None:
        secret = self.config.secret
        challenge = protocol.decode_challenge(
            await protocol.read_exactly(reader, protocol.CHALLENGE_SIZE, "CHALLENGE")
        )
        hello = protocol.encode_hello(
            secret,
            challenge,
            self.config.group,
            self.config.replica_id,
            self.replica_log.max_offset,
            epoch=self.config.epoch,
        )
        writer.write(hello)
        welcome = protocol.decode_welcome(
            secret,
            challenge,
            hello[-protocol.MAC_SIZE :],
            await protocol.read_exactly(
                reader, protocol.welcome_size(self.config.epoch is not None), "WELCOME"
            ),
        )
        if welcome.epoch != self.config.epoch:
            raise HAProtocolError(
                f"the master at {self.master_addr} leads epoch {welcome.epoch}, this slave "
                f"follows epoch {self.config.epoch}: refusing its stream"
            )
        log_ = self.replica_log
        if welcome.start_offset != log_.max_offset:
            if log_.max_offset == log_.min_offset:  # empty: start where the master says
                log_.restart_at(welcome.start_offset)
            elif self.config.reset_out_of_range:
                self.resyncs += 1
                log.warning(
                    "this slave's log ends at %d, outside the master's range [%d, %d]: "
                    "discarding it and resyncing from %d",
                    log_.max_offset,
                    welcome.min_offset,
                    welcome.max_offset,
                    welcome.start_offset,
                )
                log_.restart_at(welcome.start_offset)
            else:
                raise HAProtocolError(
                    f"the master restarts the stream at {welcome.start_offset}, this log ends at "
                    f"{log_.max_offset}, and haResetOutOfRangeSlave is off"
                )
        self.master_max_offset = welcome.max_offset

    def _report(self, writer: _Writer) -> None:
        writer.write(protocol.encode_report(self.replica_log.max_offset))
        self.last_write_ms = int(time.time() * 1000)

    async def _heartbeats(self, writer: _Writer) -> None:
        never = asyncio.Event()
        while True:
            await wait_event(never, self.config.heartbeat_interval_s)
            self._report(writer)


class _Writer:
    """Reports go out through the transport's buffer (8 bytes each, never
    interleaved); a master that stops reading them is caught by its own
    housekeeping, and ours closes the connection when nothing comes back."""

    def __init__(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def write(self, data: bytes) -> None:
        if not self.transport.is_closing():
            self.transport.write(data)  # type: ignore[attr-defined]

    def close(self) -> None:
        self.transport.close()


class Inbound(asyncio.BufferedProtocol):
    """The master's stream, read in large chunks straight into one buffer.

    asyncio's StreamReader takes at most 256 KiB per event-loop turn and
    copies it twice; here the socket is read into a multi-MiB buffer (all that
    has arrived, up to its free space), and frames are handed out as views of
    it, so a slave catching up appends several MiB per turn without copies
    while the dispatcher and the gRPC server still get their turns.
    """

    CAPACITY = 8 << 20

    def __init__(self, capacity: int = CAPACITY) -> None:
        self.buf = bytearray(capacity)
        self.low_space = min(256 << 10, capacity // 4)  # pause reading below this much room
        self.start = 0  # first unconsumed byte
        self.end = 0  # end of the received bytes
        self.eof = False
        self.transport: asyncio.Transport | None = None
        self._paused = False
        self._seen_end = 0
        self._need = 0  # bytes the next incomplete item needs from `start`
        self._what = "header"
        self._waiter: asyncio.Future | None = None

    # -- protocol callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def get_buffer(self, sizehint: int) -> memoryview:
        if len(self.buf) - self.end < self.low_space:
            self._compact()
        return memoryview(self.buf)[self.end :]

    def buffer_updated(self, nbytes: int) -> None:
        self.end += nbytes
        if len(self.buf) - self.end < self.low_space:
            self._compact()
            if len(self.buf) - self.end < self.low_space and self.transport is not None:
                self.transport.pause_reading()
                self._paused = True
        self._wake()

    def eof_received(self) -> bool:
        self.eof = True
        self._wake()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.eof = True
        self._wake()

    # -- the consumer's side
    async def wait_more(self) -> None:
        """Until bytes beyond those already seen arrive, or the stream ends."""
        while self.end == self._seen_end and not self.eof:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        self._seen_end = self.end

    async def readexactly(self, n: int) -> bytes:
        """For the handshake: `n` bytes, or IncompleteReadError at the end."""
        self._reserve(n)
        while self.end - self.start < n:
            if self.eof:
                partial = bytes(self.buf[self.start : self.end])
                raise asyncio.IncompleteReadError(partial, n)
            await self.wait_more()
        data = bytes(self.buf[self.start : self.start + n])
        self.start += n
        self.consumed()
        return data

    def next_frame(self, max_body: int) -> tuple[int, memoryview] | None:
        """The next complete frame as (offset, view of its body), or None when
        the buffer holds only part of one. Release the view once applied."""
        available = self.end - self.start
        if available < protocol.HEADER_SIZE:
            self._need, self._what = protocol.HEADER_SIZE, "header"
            return None
        head = self.buf[self.start : self.start + protocol.HEADER_SIZE]
        offset, size = protocol.decode_header(bytes(head), max_body)
        total = protocol.HEADER_SIZE + size
        if available < total:
            self._need, self._what = total, "transfer body"
            self._reserve(total)
            return None
        body_start = self.start + protocol.HEADER_SIZE
        self.start += total
        self._need = 0
        return offset, memoryview(self.buf)[body_start : body_start + size]

    def consumed(self) -> None:
        if self.start == self.end:
            self.start = self.end = self._seen_end = 0
        self._resume_if_room()

    def eof_reason(self) -> str:
        left = self.end - self.start
        if left == 0:
            return "the master closed the connection"
        header = protocol.HEADER_SIZE
        if self._what == "header":
            have, need = left, header
        else:
            have, need = left - header, self._need - header
        return (
            f"the peer closed the connection in the middle of a {self._what} "
            f"({have} of {need} bytes)"
        )

    # -- internals
    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _compact(self) -> None:
        """Move the unconsumed bytes to the front (same-size slice assignment:
        views handed out earlier stay valid objects; they are released by then)."""
        if self.start == 0:
            return
        left = self.end - self.start
        self.buf[0:left] = self.buf[self.start : self.end]
        self._seen_end -= self.start
        self.start, self.end = 0, left

    def _reserve(self, n: int) -> None:
        """Make room for an item of `n` bytes starting at `start` (a frame
        larger than the buffer gets a bigger buffer, up to the frame limit)."""
        if self.start + n <= len(self.buf):
            return
        self._compact()
        if n + self.low_space > len(self.buf):
            bigger = bytearray(n + self.low_space)
            bigger[: self.end] = self.buf[: self.end]
            self.buf = bigger
        self._resume_if_room()

    def _resume_if_room(self) -> None:
        """Reading was paused on a full buffer: go on once there is room again."""
        if not self._paused:
            return
        if len(self.buf) - self.end < self.low_space:
            self._compact()
        if len(self.buf) - self.end >= self.low_space:
            self._paused = False
            assert self.transport is not None
            self.transport.resume_reading()
