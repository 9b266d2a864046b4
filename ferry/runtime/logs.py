"""Logging set up once per process; modules use `logging.getLogger(__name__)`."""

from __future__ import annotations

import logging
import os
import sys

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def setup_logging(level: str | None = None) -> None:
    """Log to stderr at `level` (default: $FERRY_LOG_LEVEL or INFO)."""
    name = (level or os.environ.get("FERRY_LOG_LEVEL") or "INFO").upper()
    logging.basicConfig(
        level=getattr(logging, name, logging.INFO), format=FORMAT, stream=sys.stderr, force=True
    )
