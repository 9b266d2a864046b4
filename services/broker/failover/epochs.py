"""A store's leader-epoch history (automatic failover): which epoch wrote
which part of the commit log, and where a returning replica's log parts from
its new leader's (Kafka's KIP-101 leader-epoch rule; RocketMQ 5's
`EpochFileCache`).

Each election gives the group a new epoch; the winner records
`(epoch, start offset)` = (new epoch, its log end) before it takes a write.
A follower adopts its leader's history (it comes with the leader key in
etcd), so the history travels with the data it describes.

File `<storePathRootDir>/epoch` (written whole, atomically)::

    <count>
    <crc32 of the entry lines>
    <epoch>-<start offset>
    ...

Epoch 0 is the implicit epoch of everything written before failover was
enabled (and of an empty store): it starts at offset 0 in every history, so
two stores that were master and slave before failover share it.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ferry.runtime.errors import CorruptFileError
from ferry.runtime.files import atomic_write_bytes

log = logging.getLogger(__name__)

FILE_NAME = "epoch"
MAX_ENTRIES = 1000  # RocketMQ sizes its handshake for 1000; older ones are dropped


@dataclass(frozen=True, order=True)
class Epoch:
    epoch: int
    start: int


def check(entries: Sequence[Epoch]) -> None:
    """Epochs strictly increase and starts never go back.

    Raises:
        ValueError: naming the first entry out of order.
    """
    for prev, cur in zip(entries, entries[1:], strict=False):
        if cur.epoch <= prev.epoch or cur.start < prev.start:
            raise ValueError(
                f"epoch history out of order: {prev.epoch}@{prev.start} then {cur.epoch}@{cur.start}"
            )
    for e in entries:
        if e.epoch < 0 or e.start < 0:
            raise ValueError(f"epoch history entry {e.epoch}@{e.start} is negative")


def with_base(entries: Iterable[Epoch]) -> list[Epoch]:
    out = list(entries)
    if not out or out[0].epoch != 0:
        out.insert(0, Epoch(0, 0))
    return out


def clip(entries: Sequence[Epoch], end: int) -> list[Epoch]:
    """What describes a log ending at `end`: epochs that started at or before it."""
    return [e for e in with_base(entries) if e.start <= end]


def divergence(
    local: Sequence[Epoch], local_end: int, leader: Sequence[Epoch], leader_end: int
) -> int | None:
    """The offset up to which a replica's log (`local`, ending at `local_end`)
    is the leader's: the newest local epoch the leader also has, starting at
    the same offset, ends at the smaller of its two ends there. None when they
    share no epoch (the replica must copy the leader's log from scratch)."""
    mine = clip(local, local_end)
    theirs = clip(leader, leader_end)
    ends = {}
    for i, e in enumerate(theirs):
        ends[e.epoch] = (e.start, theirs[i + 1].start if i + 1 < len(theirs) else leader_end)
    for i in range(len(mine) - 1, -1, -1):
        e = mine[i]
        mine_end = mine[i + 1].start if i + 1 < len(mine) else local_end
        found = ends.get(e.epoch)
        if found is not None and found[0] == e.start:
            return min(mine_end, found[1])
    return None


def encode(entries: Sequence[Epoch]) -> bytes:
    lines = "".join(f"{e.epoch}-{e.start}\n" for e in entries)
    return f"{len(entries)}\n{zlib.crc32(lines.encode())}\n{lines}".encode()


def decode(data: bytes, where: str = FILE_NAME) -> list[Epoch]:
    """Raises CorruptFileError for anything but a well-formed, ordered history."""
    try:
        text = data.decode("ascii")
        head, crc_line, *rest = text.split("\n")
        count, crc = int(head), int(crc_line)
        if rest[count:] != [""]:
            raise ValueError(f"{count} entries announced, {len(rest) - 1} lines follow")
        lines = rest[:count]
        body = "".join(f"{line}\n" for line in lines)
        if zlib.crc32(body.encode()) != crc:
            raise ValueError("the CRC32 of the entries does not match")
        entries = []
        for line in lines:
            epoch, sep, start = line.partition("-")
            if not sep:
                raise ValueError(f"line {line!r} is not <epoch>-<offset>")
            entries.append(Epoch(int(epoch), int(start)))
        check(entries)
    except (UnicodeDecodeError, ValueError) as exc:
        raise CorruptFileError(where, str(exc)) from None
    return entries


class EpochHistory:
    """The history of one store, persisted at every change (before the change
    is acted on: a new leader records its epoch before it takes a write)."""

    def __init__(self, path: Path, entries: Sequence[Epoch] = ()) -> None:
        self.path = path
        self.entries: list[Epoch] = list(entries)

    @classmethod
    def open(cls, store_root: Path) -> EpochHistory:
        path = store_root / FILE_NAME
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return cls(path)
        return cls(path, decode(data, str(path)))

    @property
    def epoch(self) -> int:
        """The newest epoch this store has seen (0: none)."""
        return self.entries[-1].epoch if self.entries else 0

    def begin(self, epoch: int, start: int) -> None:
        """This store leads `epoch` from `start` (its log end): entries that
        start past the end go (a follower's copy of its leader's history can
        run ahead of its log)."""
        kept = [e for e in self.entries if e.start <= start and e.epoch < epoch]
        if kept and kept[-1].epoch >= epoch:
            raise ValueError(f"epoch {epoch} is not newer than {kept[-1].epoch}")
        self._replace([*kept, Epoch(epoch, start)])

    def adopt(self, leader: Sequence[Epoch]) -> None:
        """A follower's history is its leader's (checked, then persisted)."""
        check(leader)
        self._replace(list(leader))

    def _replace(self, entries: list[Epoch]) -> None:
        entries = entries[-MAX_ENTRIES:]
        check(entries)
        atomic_write_bytes(self.path, encode(entries))
        self.entries = entries


def to_json(entries: Sequence[Epoch]) -> list[list[int]]:
    return [[e.epoch, e.start] for e in entries]


def from_json(value: object) -> list[Epoch]:
    """Raises ValueError for anything but a list of [epoch, start] pairs in order."""
    if not isinstance(value, list):
        raise ValueError("an epoch history is a list of [epoch, start] pairs")
    entries = []
    for item in value:
        if (
            not isinstance(item, list)
            or len(item) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in item)
        ):
            raise ValueError(f"epoch history entry {item!r} is not [epoch, start]")
        entries.append(Epoch(item[0], item[1]))
    check(entries)
    return entries
