"""The storage engine: the commit log, its consume queues and everything that keeps
them durable, recovered, readable and bounded.

Owns: `message_store` (MessageStore, the one entry point: the appends, each named
by its callers — client sends, the broker's own records, due messages, transaction
decisions, replicated bytes —, queue offsets, long polls, and the reads it
delegates), `reads` (MessageReads: pulls, records by commit offset, by key and by
store time, the confirm offset; never writes), `commitlog` (segment files, the
single appender), `allocator` (pre-allocated segments), `reader` (cold reads off
the loop), `consumequeue`, `dispatcher` (commit log -> consume queues), `longpoll`,
`flush` (fsync and the checkpoint writer), `checkpoint` (the checkpoint/abort file
format: written by flush, read by recovery), `recovery`, `retention`, `failstop`
(storage errors are fatal), `storelock` (one process per store), `replica_log`
(the `ReplicatedLog` that `services/ha` declares, implemented over the store),
`index` (the message index by key: its own tail of the commit log) and
`indexfile` (RocketMQ's index file format).

Must never import: messaging/, metadata/, pop/, schedule/, api/, cluster/,
failover/, app, metrics, `grpc` or `ferry.v1`. Everything above the store reaches it
through the names exported here, and a MessageStore through its own methods and
properties, never its parts (`store.queues`, `store.dispatcher`, `store.reads`…):
its public fail-stop signal `store.failstop` aside, tests/unit/test_wiring.py fails
on such a reach (tests may reach further in).
"""

from services.broker.store.commitlog import CommitLogError
from services.broker.store.consumequeue import ConsumeQueueError
from services.broker.store.index import IndexConfig, KeyLookup
from services.broker.store.message_store import (
    FlushDiskType,
    MessageIn,
    MessageStore,
    PutResult,
    PutStatus,
    StoreConfig,
    copy_message,
)
from services.broker.store.reads import GetResult, GetStatus, QueueView
from services.broker.store.recovery import RecoveryError, RecoveryReport
from services.broker.store.retention import CleanResult, RetentionConfig, RetentionStatus
from services.broker.store.storelock import StoreLockedError

__all__ = [
    "CleanResult",
    "CommitLogError",
    "ConsumeQueueError",
    "RecoveryError",
    "RetentionConfig",
    "RetentionStatus",
    "StoreLockedError",
    "FlushDiskType",
    "GetResult",
    "GetStatus",
    "IndexConfig",
    "KeyLookup",
    "MessageIn",
    "MessageStore",
    "PutResult",
    "PutStatus",
    "QueueView",
    "RecoveryReport",
    "StoreConfig",
    "copy_message",
]
