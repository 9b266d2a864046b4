"""Delayed delivery: delay levels and timers.

Owns: `delay` (DelayScheduler: messages parked on SCHEDULE_TOPIC by delay level,
moved to their real topic when due), `timer` (TimerService: messages with an exact
delivery time) and `timer_done` (the timer-done record format).

May import: store/ (through its public surface), messaging/ (the shared rules).
Must never import: pop/, api/, cluster/, failover/, app, `grpc` or `ferry.v1`.
"""
