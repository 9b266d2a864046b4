"""Atomic file writes and JSON files with a `.bak` fallback.

Writes go to a temporary file in the same directory, are fsynced, then
`os.replace`d over the target, and the directory is fsynced: a reader sees the
old content or the new, never a mix. JSON metadata keeps the previous version
as `NAME.bak` (hard-linked before the replace, so the main file never goes
missing); a load falls back to it when the main file is corrupt, reports that,
and keeps the corrupt file aside rather than silently losing it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ferry.runtime.errors import CorruptFileError

log = logging.getLogger(__name__)


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def pwrite_all(fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
    """Write all of `data` at `offset`. pwrite may write less than asked (a
    file system filling up writes what fits, then fails on the rest): loop, so
    a short write either completes or raises, never passes for a whole one."""
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view = view[written:]
        offset += written


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Replace `path` with `data` atomically and durably."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def backup_path(path: Path) -> Path:
    return path.with_name(path.name + ".bak")


def write_json_with_backup(path: Path, document: Any) -> None:
    """Write `document` as JSON; the previous content becomes `NAME.bak`."""
    path = Path(path)
    data = json.dumps(document, indent=2, sort_keys=True).encode() + b"\n"
    if path.exists():
        staged = path.with_name(f".{path.name}.bak.tmp{os.getpid()}")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(staged)
        os.link(path, staged)
        os.replace(staged, backup_path(path))
    atomic_write_bytes(path, data)


def load_json_with_backup(
    path: Path, validate: Callable[[Any], None] | None = None
) -> tuple[Any | None, str]:
    """Load a JSON file written by `write_json_with_backup`.

    Returns `(document, source)` where source is "main", "backup" (the main
    file was missing or corrupt) or "none" (neither exists: a fresh start).
    `validate` may raise ValueError for a parseable document of the wrong shape.
    A corrupt main file is renamed `NAME.corrupt-<epoch>` when the backup is used.

    Raises:
        CorruptFileError: the main file is corrupt and there is no usable backup.
    """
    path = Path(path)
    bak = backup_path(path)
    main_error = None
    if path.exists():
        try:
            return _parse(path, validate), "main"
        except ValueError as exc:
            main_error = str(exc)
    if bak.exists():
        try:
            document = _parse(bak, validate)
        except ValueError as exc:
            raise CorruptFileError(
                str(path),
                f"unreadable ({main_error or 'missing'}) and its backup {bak.name} is "
                f"unreadable too ({exc}); restore one of them or move both aside to start empty",
            ) from None
        if main_error is not None:
            aside = path.with_name(f"{path.name}.corrupt-{int(time.time())}")
            os.replace(path, aside)
            log.warning(
                "%s is corrupt (%s); loaded its backup %s and kept the corrupt file as %s",
                path,
                main_error,
                bak.name,
                aside.name,
            )
        else:
            log.warning("%s is missing; loaded its backup %s", path, bak.name)
        return document, "backup"
    if main_error is not None:
        raise CorruptFileError(
            str(path),
            f"unreadable ({main_error}) and there is no backup {bak.name}; "
            "fix the file or move it aside to start empty",
        )
    return None, "none"


def _parse(path: Path, validate: Callable[[Any], None] | None) -> Any:
    try:
        document = json.loads(path.read_bytes())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not valid JSON: {exc}") from None
    if validate is not None:
        validate(document)
    return document
