"""Store recovery (docs/guides/broker.md, "Recovery"): reads the `checkpoint` file
and the `abort` marker (their format is `checkpoint.py`), and runs the scan that
finds where the commit log's valid data ends.

The scan starts at a safe point — the file holding the checkpoint's flushed
offset (everything before it was fsynced when the checkpoint was written; this
is RocketMQ's "last file whose first record is older than the checkpoint",
found by offset rather than by timestamp so a clock step cannot move it) —
and validates every record (TOTALSIZE, MAGICCODE, field lengths, BODYCRC)
until zeros or the first invalid record.

What happens at an invalid record:
- in the newest file with data (a torn tail: the process or machine died
  mid-write): everything from it on is cut, with a warning naming the file,
  offset and bytes dropped;
- followed by data in a later file: that is not a torn tail but damage in the
  middle of the log, and cutting there would silently drop good records. The
  broker refuses to start, naming the file and offset (`RecoveryError`).

`recover_store` runs the whole recovery of a store's files: the scan, then
the consume queues brought in line with the commit log. Runs before the
broker serves anything, on the thread that opens the store.
"""

from __future__ import annotations

import logging
import struct
import time
from dataclasses import dataclass
from pathlib import Path

from ferry import record
from services.broker.store.checkpoint import ABORT, CHECKPOINT, load_checkpoint
from services.broker.store.commitlog import CommitLog
from services.broker.store.consumequeue import ConsumeQueues
from services.broker.store.dispatcher import Dispatcher

log = logging.getLogger(__name__)

SCAN_CHUNK = 8 << 20
_ZERO_CHECK = 1 << 20
_SIZE_MAGIC = struct.Struct(">iI")


class RecoveryError(Exception):
    """The commit log cannot be recovered without losing more than a torn tail."""


@dataclass
class RecoveryReport:
    crashed: bool
    end_offset: int
    scanned_from: int
    dropped_bytes: int
    reason: str | None
    dispatched_from: int
    dispatched_bytes: int
    consume_queues_rebuilt: bool
    cq_entries_dropped: int
    seconds: float = 0.0


def recover_store(
    root: Path,
    commit_log: CommitLog,
    queues: ConsumeQueues,
    dispatcher: Dispatcher,
    started: float,
) -> RecoveryReport:
    """Recover a store's files in place: find the commit log's valid end (and
    cut a torn tail), bring the consume queues in line with it (entries past
    the end dropped, entries below the oldest file gone with retention, missing
    queues rebuilt) and dispatch what they lack. The caller then writes the
    checkpoint and the abort marker."""
    crashed = (root / ABORT).exists()
    checkpoint = load_checkpoint(root / CHECKPOINT)
    scan_from = checkpoint.flushed_offset if checkpoint else commit_log.min_offset
    scan = scan_commit_log(commit_log, scan_from)
    end = scan.end_offset
    if not crashed and checkpoint and checkpoint.flushed_offset != end:
        log.warning(
            "clean shutdown, but the checkpoint's flushed offset %d differs from the "
            "recovered end %d",
            checkpoint.flushed_offset,
            end,
        )
    cq_existed = queues.load_all()
    dropped_entries = queues.truncate_commit_end(end)
    queues.delete_below(commit_log.min_offset)
    rebuild = not cq_existed or checkpoint is None
    if rebuild:
        dispatch_from = commit_log.min_offset
    else:
        assert checkpoint is not None
        dispatch_from = min(max(checkpoint.dispatched_offset, commit_log.min_offset), end)
    dispatcher.offset = dispatch_from
    dispatched = dispatcher.dispatch_all()
    report = RecoveryReport(
        crashed=crashed,
        end_offset=end,
        scanned_from=scan.scanned_from,
        dropped_bytes=scan.dropped_bytes,
        reason=scan.reason,
        dispatched_from=dispatch_from,
        dispatched_bytes=dispatched,
        consume_queues_rebuilt=rebuild,
        cq_entries_dropped=dropped_entries,
        seconds=time.monotonic() - started,
    )
    log.info(
        "store recovered crashed=%s commit_log=[%d,%d) scanned_from=%d dropped_bytes=%d "
        "dispatched_from=%d rebuilt=%s cq_entries_dropped=%d in %.2fs",
        crashed,
        commit_log.min_offset,
        end,
        scan.scanned_from,
        scan.dropped_bytes,
        dispatch_from,
        rebuild,
        dropped_entries,
        report.seconds,
    )
    return report


@dataclass(frozen=True)
class ScanResult:
    end_offset: int
    scanned_from: int
    dropped_bytes: int  # how much of a torn tail was cut (0: none)
    reason: str | None  # why the scan stopped early, when it did


def scan_commit_log(commit_log: CommitLog, start: int) -> ScanResult:
    """Find the end of valid data, starting at the file that holds `start`, and
    cut the commit log there (see the module docstring)."""
    starts = commit_log.segment_starts()
    if not starts:
        return ScanResult(0, 0, 0, None)
    file_size = commit_log.file_size
    start = min(max(start, starts[0]), starts[-1])
    pos = start - start % file_size
    scanned_from = pos
    reason: str | None = None
    while True:
        file_end = pos - pos % file_size + file_size
        chunk_start = pos
        chunk = commit_log.read_raw(chunk_start, min(SCAN_CHUNK, file_end - chunk_start))
        stop, verdict = record.scan_valid(chunk, 0, len(chunk))
        pos = chunk_start + stop
        if verdict is None:
            if pos >= file_end:
                verdict = "blank"  # the file is exactly full
            elif chunk_start + len(chunk) < file_end and stop > 0:
                continue  # read on from the record that straddles the chunk's end
            else:
                total, _ = _SIZE_MAGIC.unpack_from(chunk, stop)
                if pos + total > file_end:
                    verdict = f"a record of {total} bytes runs past the end of its file"
                else:  # one record larger than a chunk
                    big = commit_log.read_raw(pos, total)
                    _, verdict = record.scan_valid(big, 0, total)
                    if verdict is None:
                        pos += total
                        continue
        if verdict == "blank":
            if file_end in starts:
                pos = file_end
                continue
            end = file_end if pos < file_end else pos
            break
        if verdict == "zero":
            end = pos
            _check_nothing_after(commit_log, end, "zeros")
            break
        reason = verdict
        end = pos
        _check_nothing_after(commit_log, end, verdict)
        break
    dropped = _cut(commit_log, end)
    if reason is not None:
        log.warning(
            "commit log: invalid record in %s at offset %d (%s); cut the torn tail there "
            "(%d bytes dropped)",
            record_file_name(end, file_size),
            end,
            reason,
            dropped,
        )
    return ScanResult(end, scanned_from, dropped, reason)


def record_file_name(offset: int, file_size: int) -> str:
    return f"{offset - offset % file_size:020d}"


def _check_nothing_after(commit_log: CommitLog, end: int, why: str) -> None:
    """Refuse to cut when a later file holds data: that is damage, not a torn tail."""
    file_size = commit_log.file_size
    for start in commit_log.segment_starts():
        if start <= end - end % file_size:
            continue
        head = commit_log.read_raw(start, record.BLANK_SIZE)
        if any(head):
            raise RecoveryError(
                f"commit log file {record_file_name(end, file_size)} has an invalid record at "
                f"offset {end} ({why}), but the later file {start:020d} holds data: this is "
                f"damage inside the log, not a torn tail, and cutting it would drop good "
                f"records. Restore the files from a replica or backup, or move "
                f"{record_file_name(end, file_size)} and the files after it aside to start "
                f"from offset {end - end % file_size}."
            )


def _cut(commit_log: CommitLog, end: int) -> int:
    """Set the write position to `end`, zeroing the torn bytes after it (up to
    the first all-zero stretch) and deleting empty later files. Returns the
    non-zero bytes dropped (an estimate: whole chunks)."""
    dropped = 0
    # An end exactly at a file's end (the file full, the next one never
    # created) has nothing after it to look at.
    file_end = min(end - end % commit_log.file_size + commit_log.file_size, commit_log.files_end)
    pos = end
    while pos < file_end:
        chunk = commit_log.read_raw(pos, min(_ZERO_CHECK, file_end - pos))
        stripped = chunk.rstrip(b"\0")
        if not stripped:
            break
        dropped += len(stripped)
        pos += len(chunk)
    zero_to = pos
    commit_log.set_write_offset(end, zero_to=zero_to)
    return dropped
