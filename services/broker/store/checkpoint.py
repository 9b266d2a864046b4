"""The store's `checkpoint` file and `abort` marker, and nothing else: their names
and format. The flusher writes the checkpoint (atomically, after an fsync); the
store creates the abort marker when it opens and removes it on a clean stop;
recovery reads both.

`checkpoint` is a JSON object of the `Checkpoint` fields (integers). An
unreadable checkpoint counts as none: recovery then scans from the first file.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path

from ferry.runtime.files import atomic_write_bytes

log = logging.getLogger(__name__)

CHECKPOINT = "checkpoint"
ABORT = "abort"


@dataclass(frozen=True)
class Checkpoint:
    """What was durable at the last flush."""

    flushed_offset: int = 0  # commit log fsynced below this
    dispatched_offset: int = 0  # consume queues fsynced for records below this
    physic_msg_timestamp: int = 0  # ms, wall clock of that flush (informational)
    logics_msg_timestamp: int = 0


def load_checkpoint(path: Path) -> Checkpoint | None:
    try:
        data = json.loads(Path(path).read_bytes())
        return Checkpoint(**{k: int(data[k]) for k in Checkpoint.__dataclass_fields__})
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as exc:
        log.warning("checkpoint %s is unreadable (%s); recovering from the first file", path, exc)
        return None


def save_checkpoint(path: Path, checkpoint: Checkpoint) -> None:
    atomic_write_bytes(Path(path), json.dumps(asdict(checkpoint), sort_keys=True).encode())
