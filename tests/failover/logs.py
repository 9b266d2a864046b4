"""A store's commit log read straight from its files (`read_image`, `LogImage`), and the
check that the members' logs are byte-identical (`assert_identical`).

Read a log once its writer has caught up: a torn tail fails `read_image`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ferry import record
from services.broker.store.commitlog import segment_name
from tests.chaos.harness import read_log
from tests.failover.config import FILE_SIZE


@dataclass
class LogImage:
    """A store's commit log as its files hold it: the records from its first
    file to its end (the first zero header)."""

    store: Path
    start: int
    end: int
    records: list[record.Record] = field(default_factory=list)

    def bytes(self, lo: int, hi: int) -> bytes:
        return read_log(self.store, lo, hi, FILE_SIZE)


def _segments(store: Path) -> list[int]:
    directory = store / "commitlog"
    if not directory.exists():
        return []
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())


def read_image(store: Path) -> LogImage:
    """Every record of a store's commit log, read from its files.

    Raises:
        AssertionError: the files are not contiguous, or a record is not valid
            (a torn tail would be: read a log once its writer has caught up).
    """
    bases = _segments(store)
    if not bases:
        return LogImage(store, 0, 0)
    image = LogImage(store, bases[0], bases[0])
    for i, base in enumerate(bases):
        assert base == bases[0] + i * FILE_SIZE, f"{store}: commit-log files {bases} not contiguous"
        data = (store / "commitlog" / segment_name(base)).read_bytes()
        pos = 0
        while pos + record.BLANK_SIZE <= len(data):
            if data[pos : pos + record.BLANK_SIZE] == bytes(record.BLANK_SIZE):
                assert base == bases[-1], f"{store}: the log ends at {base + pos}, files follow"
                image.end = base + pos
                return image
            try:
                rec = record.decode(data, pos, max_size=FILE_SIZE)
            except record.RecordError as exc:
                raise AssertionError(f"{store}: commit log at {base + pos}: {exc}") from None
            if isinstance(rec, record.Blank):
                break
            assert rec.commit_offset == base + pos, (store, rec.commit_offset, base + pos)
            image.records.append(rec)
            pos += record.peek(data[pos : pos + record.BLANK_SIZE])  # its TOTALSIZE
        image.end = base + FILE_SIZE
    return image


def assert_identical(images: dict[int, LogImage]) -> int:
    """The members' logs end at the same offset and hold the same bytes from
    the latest first file on; returns the common end."""
    ends = {i: img.end for i, img in images.items()}
    assert len(set(ends.values())) == 1, f"the members' logs end at different offsets: {ends}"
    lo = max(img.start for img in images.values())
    end = next(iter(ends.values()))
    (ref_id, ref), *others = images.items()
    want = ref.bytes(lo, end)
    for other_id, img in others:
        got = img.bytes(lo, end)
        if got != want:
            at = next(i for i, (a, b) in enumerate(zip(want, got, strict=True)) if a != b)
            raise AssertionError(
                f"the logs of members {ref_id} and {other_id} differ at offset {lo + at} "
                f"(compared [{lo}, {end}))"
            )
    return end
