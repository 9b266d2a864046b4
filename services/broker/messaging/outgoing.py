"""What a send carries and what it answers: `OutgoingMessage` (the domain's
message, which every door converts its requests into), `Staged` (a send
appended and not yet settled), `SendOutcome` and `SendStatus`, and the one rule
of what marks a transactional half (`is_half`).

Owns these values only: no checks, no store calls, no I/O. Must never hold a
door's request objects (protobuf, RocketMQ commands): a door converts first.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from ferry import record
from ferry.model import PROPERTY_TRANSACTION_PREPARED
from ferry.runtime.errors import ResourceExhausted
from services.broker.store import PutResult

# RocketMQ's MessageSysFlag transaction type bits: a prepared half (0x4), a
# commit (0x8), a rollback (0xC). A plain message is stored without them.
TRANSACTION_TYPE = 0xC
TRANSACTION_PREPARED = 0x4


class MessageTooLarge(ResourceExhausted):
    """A body over maxMessageSize: refused wherever it is sent (unlike a full
    disk, which another broker may not have)."""


class SendStatus(enum.Enum):
    SEND_OK = "SEND_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"


@dataclass(slots=True)  # not frozen: one per send or pull, and frozen __init__ costs ~5x
class OutgoingMessage:
    """A message to send, as every door hands it to the send use case:
    `sys_flag` (the compression and multi-tags bits, and a RocketMQ producer's
    transaction type: see `is_half`), `born_host` (the producer's ("ip", port);
    None: the broker's default), `reconsume_times`; and `max_reconsume_times`
    (None: the group's retryMaxTimes), which decides where a send to a retry
    topic goes. Built positionally on the hot paths (a third of the keyword
    call's cost)."""

    body: bytes
    tags: str = ""
    keys: str = ""
    properties: Mapping[str, str] = field(default_factory=dict)
    flag: int = 0
    born_timestamp: int = 0
    sys_flag: int = 0
    born_host: tuple[str, int] | None = None
    reconsume_times: int = 0
    max_reconsume_times: int | None = None


def is_half(message: OutgoingMessage) -> bool:
    """Whether `message` is a transaction's half: sysFlag's transaction type
    prepared (0x4, RocketMQ's producers) or TRAN_MSG=true (every door)."""
    if message.sys_flag & TRANSACTION_TYPE == TRANSACTION_PREPARED:
        return True
    properties = message.properties
    return bool(properties) and (
        properties.get(PROPERTY_TRANSACTION_PREPARED, "").lower() == "true"
    )


@dataclass(slots=True)  # not frozen: one per send or pull, and frozen __init__ costs ~5x
class SendOutcome:
    status: SendStatus
    topic: str
    queue_id: int
    queue_offset: int
    commit_offset: int
    msg_ids: list[str]
    half: bool = False  # a transaction's half: the ids and offsets are the half's


@dataclass(slots=True)  # not frozen: one per send or pull, and frozen __init__ costs ~5x
class Staged:
    """A send appended to the log and not yet waited for (`Stager.stage`)."""

    topic: str  # as the producer named it (a timed message is stored elsewhere)
    result: PutResult
    started: float  # perf_counter() at the append
    index: int | None = None  # one message of an append of several (`stage_each`)
    half: bool = False  # a transaction's half (`Stager.stage_halves`)

    @property
    def count(self) -> int:
        return len(self.result.commit_offsets) if self.index is None else 1

    def outcome(self, status: SendStatus) -> SendOutcome:
        r, i = self.result, self.index
        if i is None:
            return SendOutcome(
                status,
                r.topic,
                r.queue_id,
                r.queue_offset,
                r.commit_offsets[0],
                r.msg_ids,
                self.half,
            )
        return SendOutcome(
            status,
            r.topic,
            r.queue_id,
            r.queue_offset + i,
            r.commit_offsets[i],
            [r.msg_ids[i]],
            self.half,
        )


_HOSTS: dict[tuple[str, int], bytes] = {}


def packed_host(host: tuple[str, int]) -> bytes:
    """A producer's ("ip", port) as a record stores it (IPv4 only: any other
    address is stored as 127.0.0.1:0)."""
    packed = _HOSTS.get(host)
    if packed is None:
        try:
            packed = record.pack_host(host)
        except record.RecordError:
            packed = record.pack_host(("127.0.0.1", 0))
        if len(_HOSTS) > 4096:
            _HOSTS.clear()
        _HOSTS[host] = packed
    return packed
