"""The slave side of the HA data plane (SPEC §3.1–§3.2): connect to the
master's HA address, report this log's end, append what the master streams.

- The master's HA address comes from the name server's registration answer
  (`set_master`), or from `haMasterAddress`; while it is unknown the slave waits.
- On connect the slave reports its end offset at once (RocketMQ 4.x waited 5 s),
  after every applied frame, and at least every `heartbeat_interval_s`.
- A frame is appended only when its offset is this log's end; an empty log
  accepts the master's start (a file start) and creates the file named for it.
  Any other offset closes the connection (logged); the slave reconnects after
  `reconnect_s` and reports its end again, so nothing is appended out of place.
- The connection closes after `housekeeping_interval_s` with nothing read.
- With a secret: CHALLENGE → HELLO (HMAC) → WELCOME (HMAC checked). When the
  WELCOME's start differs from this log's end (the slave fell out of the
  master's retention) and `reset_out_of_range` is on, the slave discards its log
  and starts empty at that offset, and says so in the log.

The dispatcher builds the slave's consume queues from the appended bytes.
Runs on the broker's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass

from ferry.runtime.clock import wait_event
from ferry.runtime.tasks import cancel_and_wait
from services.broker.store import MessageStore
from services.ha import protocol
from services.ha.protocol import HAProtocolError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HASlaveConfig:
    master_address: str = ""  # haMasterAddress; else from registration
    heartbeat_interval_s: float = 5.0
    housekeeping_interval_s: float = 20.0
    reconnect_s: float = 5.0
    max_frame_bytes: int = 64 * 1024 * 1024
    secret: bytes = b""
    group: str = "broker-a"
    replica_id: int = 1
    reset_out_of_range: bool = True
    connect_timeout_s: float = 5.0


class HASlave:
    def __init__(self, config: HASlaveConfig, store: MessageStore) -> None:
        self.config = config
        self.store = store
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
        self._writer: asyncio.StreamWriter | None = None

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
            try:
                await self._session(addr)
            except HAProtocolError as exc:
                log.warning("HA connection to %s closed: %s", addr, exc)
            except TimeoutError:
                log.warning(
                    "HA connection to %s closed: nothing read for %.0f s",
                    addr,
                    self.config.housekeeping_interval_s,
                )
            except (ConnectionError, OSError) as exc:
                log.info("HA connection to %s failed: %s", addr, exc)
            finally:
                if self.connected:
                    self.disconnects += 1
                self.connected = False
                self._writer = None
            await asyncio.sleep(self.config.reconnect_s)

    async def _session(self, addr: str) -> None:
        host, _, port = addr.rpartition(":")
        async with asyncio.timeout(self.config.connect_timeout_s):
            reader, writer = await asyncio.open_connection(host, int(port))
        self._writer = writer
        heartbeat: asyncio.Task | None = None
        try:
            housekeeping = self.config.housekeeping_interval_s
            if self.config.secret:
                async with asyncio.timeout(housekeeping):
                    await self._handshake(reader, writer)
            self.connected = True
            log.info("HA connected to master %s; reporting %d", addr, self.store.max_offset)
            self._report(writer)
            heartbeat = asyncio.create_task(self._heartbeats(writer), name="ha-slave-heartbeat")
            store = self.store
            max_frame = self.config.max_frame_bytes
            while True:
                async with asyncio.timeout(housekeeping):
                    offset, body = await protocol.read_transfer(reader, max_frame)
                self.last_read_ms = int(time.time() * 1000)
                if not body:
                    self.master_max_offset = max(self.master_max_offset, offset)
                    continue
                end = store.max_offset
                empty = not store.commit_log.segment_starts()
                if offset != end and not (empty and offset % store.commit_log.file_size == 0):
                    raise HAProtocolError(
                        f"master sent bytes at {offset}, but this log ends at {end}; reconnecting "
                        "to report the end again"
                    )
                try:
                    store.append_raw(offset, body)
                except (ValueError, OSError) as exc:
                    raise HAProtocolError(
                        f"cannot append {len(body)} bytes at {offset}: {exc}"
                    ) from None
                self.master_max_offset = max(self.master_max_offset, offset + len(body))
                self._report(writer)
        finally:
            await cancel_and_wait(heartbeat)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _handshake(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        secret = self.config.secret
        challenge = protocol.decode_challenge(
            await protocol.read_exactly(reader, protocol.CHALLENGE_SIZE, "CHALLENGE")
        )
        hello = protocol.encode_hello(
            secret, challenge, self.config.group, self.config.replica_id, self.store.max_offset
        )
        writer.write(hello)
        await writer.drain()
        welcome = protocol.decode_welcome(
            secret,
            challenge,
            hello[-protocol.MAC_SIZE :],
            await protocol.read_exactly(reader, protocol.WELCOME_SIZE, "WELCOME"),
        )
        store = self.store
        if welcome.start_offset != store.max_offset:
            empty = not store.commit_log.segment_starts()
            if empty and store.max_offset == store.commit_log.min_offset:
                store.commit_log.start_at(welcome.start_offset)
                store.dispatcher.offset = welcome.start_offset
            elif self.config.reset_out_of_range:
                self.resyncs += 1
                log.warning(
                    "this slave's log ends at %d, outside the master's range [%d, %d]: "
                    "discarding it and resyncing from %d",
                    store.max_offset,
                    welcome.min_offset,
                    welcome.max_offset,
                    welcome.start_offset,
                )
                store.discard_all(welcome.start_offset)
            else:
                raise HAProtocolError(
                    f"the master restarts the stream at {welcome.start_offset}, this log ends at "
                    f"{store.max_offset}, and haResetOutOfRangeSlave is off"
                )
        self.master_max_offset = welcome.max_offset

    def _report(self, writer: asyncio.StreamWriter) -> None:
        writer.write(protocol.encode_report(self.store.max_offset))
        self.last_write_ms = int(time.time() * 1000)

    async def _heartbeats(self, writer: asyncio.StreamWriter) -> None:
        never = asyncio.Event()
        while True:
            await wait_event(never, self.config.heartbeat_interval_s)
            self._report(writer)
            await writer.drain()
