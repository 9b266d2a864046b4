"""Transactional ("half") messages, as RocketMQ keeps them: a producer sends a
prepared half, runs its local transaction, then commits or rolls it back; a
half left undecided is checked back with a live producer of its group.

Owns: the half and op topics (`RMQ_SYS_TRANS_HALF_TOPIC`,
`RMQ_SYS_TRANS_OP_HALF_TOPIC`), which halves are pending, the decisions, the
check-back loop and its progress (group `CID_RMQ_SYS_TRANS` in the
consumer-offset table). Protocol-independent: no door prepares a half
itself — a door calls the one send use case (messaging's `SendService`),
which hands the halves here (`prepare_many`, messaging's `Transactions`
contract); a door converts its ends into `end` calls and registers a
`Checker` that reaches its producers.

May import: messaging/ (the send use case), store/ (public surface),
ferry. Must never import: remoting/, api/, cluster/, failover/, app, `grpc`
or `ferry.v1`.
"""

from services.broker.transactions.service import (
    CHECKPOINT_GROUP,
    HALF_TOPIC,
    OP_TOPIC,
    Checker,
    CheckRequest,
    Decision,
    EndResult,
    TransactionConfig,
    TransactionService,
)

__all__ = [
    "CHECKPOINT_GROUP",
    "HALF_TOPIC",
    "OP_TOPIC",
    "CheckRequest",
    "Checker",
    "Decision",
    "EndResult",
    "TransactionConfig",
    "TransactionService",
]
