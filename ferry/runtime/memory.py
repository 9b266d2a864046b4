"""How a long-running ferry process asks glibc's allocator to keep the memory it frees.

glibc serves a large allocation (from 128 KiB, a threshold it raises as it goes) with
a fresh `mmap` and hands it back on free, and it returns the free top of its heap to
the kernel beyond 128 KiB. A broker allocates such buffers for every batch it stores
or sends (requests of a few hundred KiB, replication frames of up to a few MiB), so
it keeps faulting in fresh pages; on a VM that reports freed pages to its host, a
first touch costs several times a copy. Measured on 2026-11-26 (store benchmark,
sustained writes of 16 x 16 KiB batches under retention): 203-212 MB/s with glibc's
defaults, 274-295 MB/s with the thresholds below, the same code.

This fixes the mmap threshold at 8 MiB (larger buffers still get their own mapping)
and keeps up to 64 MiB of free heap instead of trimming it at once. A JVM broker
keeps its whole heap; this keeps a bounded part of what was used. An operator's
own MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_ (glibc's environment variables)
win: then nothing is changed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 8 << 20
TRIM_THRESHOLD = 64 << 20
_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")


def retain_freed_memory() -> str:
    """Set the thresholds (once, at startup); returns what was done, for the log."""
    if any(name in os.environ for name in _ENV):
        return "allocator thresholds left as the environment sets them"
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return "allocator thresholds unchanged (no glibc mallopt here)"
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    if not (
        mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    ):
        return "allocator thresholds unchanged (mallopt refused them)"
    return (
        f"allocator: buffers below {MMAP_THRESHOLD >> 20} MiB come from the heap, "
        f"which keeps up to {TRIM_THRESHOLD >> 20} MiB of freed memory"
    )
