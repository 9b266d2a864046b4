"""`ferry_native`, the compiled hot path (native/, Rust through PyO3, built and
installed by `make venv`), or None.

It is optional: a plain `pip install` of ferry leaves it out, and
FERRY_NO_NATIVE=1 in the environment turns it off (to compare, or to rule it
out). Each of its functions mirrors a Python function (named in its caller)
and returns None for anything but the common case, which the Python function
then decides, so behaviour is the same with or without it.
"""

from __future__ import annotations

import os
from types import ModuleType

native: ModuleType | None = None
if os.environ.get("FERRY_NO_NATIVE") != "1":
    try:
        import ferry_native as native
    except ImportError:  # not built: the Python paths do it all
        native = None
