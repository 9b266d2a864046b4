"""The import every test module of ferry_native's twins starts with.

`make venv` always builds ferry_native, so such a module fails when it cannot be
imported; FERRY_NO_NATIVE=1 skips it where the module is not built on purpose.
"""

from __future__ import annotations

import os
from types import ModuleType

import pytest


def require_native() -> ModuleType:
    """ferry_native, or a module-level skip under FERRY_NO_NATIVE=1 (call it at
    import time, from the test module's top level)."""
    if os.environ.get("FERRY_NO_NATIVE") == "1":
        pytest.skip("FERRY_NO_NATIVE=1: ferry_native is not built here", allow_module_level=True)
    try:
        import ferry_native
    except ImportError as e:
        raise ImportError(
            f"ferry_native is not installed ({e}): `make venv` builds it from native/; "
            "set FERRY_NO_NATIVE=1 to skip these tests"
        ) from e
    return ferry_native
