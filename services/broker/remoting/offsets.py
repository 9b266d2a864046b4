"""(filled in by issue 28's work)"""

from __future__ import annotations

from ferry.remoting.server import Handler
from services.broker.remoting.deps import Deps


def handlers(deps: Deps) -> dict[int, Handler]:
    return {}
