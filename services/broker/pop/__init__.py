"""Pop consumption: pop, ack and change-invisible-time, the in-flight state they
share, and revival (an expired message goes to the retry topic or the DLQ).

Owns: (lowest first; each imports only the ones before it) `records` (the
revive-record format: the journal pop writes to and replays from the revive
queue), `state` (PopState: offsets, in-flight messages, open checkpoints, the
journal and its replay), `revive` (Reviver: expiry -> retry topic or DLQ) and
`service` (PopService: pop, ack, change-invisible-time, status). The three are
put together by composition, state -> revive -> service: the Reviver is given
the PopState, the PopService builds both, and each uses the others only
through their public methods (the service tells the reviver of every new
deadline with `Reviver.deadline_added`). Exported here: PopService, PopConfig
and the result types. The receipt-handle format lives in
`ferry/receipt_handle.py`, because the proxy reads it too.

May import: store/ (through its public surface), messaging/ (the shared rules),
`ferry.receipt_handle`. Must never import: schedule/, api/, cluster/, failover/, app,
`grpc` or `ferry.v1`.
"""

from services.broker.pop.service import PopService
from services.broker.pop.state import (
    AckResult,
    ChangeResult,
    GroupStatus,
    PopConfig,
    Popped,
    QueueStatus,
)

__all__ = [
    "AckResult",
    "ChangeResult",
    "GroupStatus",
    "PopConfig",
    "PopService",
    "Popped",
    "QueueStatus",
]
