"""Pop consumption: pop, ack and change-invisible-time, the in-flight state they
share, and revival (an expired message goes to the retry topic or the DLQ).

Owns: `service` (PopService), `records` (the revive-record format: the journal pop
writes to and reloads from the revive queue). The receipt-handle format lives in
`ferry/receipt_handle.py`, because the proxy reads it too.

May import: store/ (through its public surface), messaging/ (the shared rules),
`ferry.receipt_handle`. Must never import: schedule/, api/, cluster/, failover/, app,
`grpc` or `ferry.v1`.
"""
