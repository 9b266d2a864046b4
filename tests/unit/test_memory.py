"""ferry.runtime.memory: the allocator thresholds a broker sets at startup."""

from __future__ import annotations

import platform

import pytest

from ferry.runtime.memory import retain_freed_memory


def test_an_operators_malloc_environment_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "131072")
    assert retain_freed_memory() == "allocator thresholds left as the environment sets them"


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_glibc_takes_the_thresholds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
    assert retain_freed_memory().startswith("allocator: buffers below 8 MiB")
