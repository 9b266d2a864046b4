"""This member's role in its group: what its running incarnation of the broker
app is ("leader", "follower"), or was, until the next one starts ("none" once
a master stepped down), with the epoch it leads or follows.

Owns: `Role`, one per FailoverNode. Only the node writes it (`set`), when it
stops one run of the app and starts the next; the fence and the member record
read it. Must never be written by anything else, and never decide a role:
etcd does (services.broker.failover.election).
"""

from __future__ import annotations

LEADER, FOLLOWER, NONE = "leader", "follower", "none"


class Role:
    def __init__(self) -> None:
        self.name = NONE
        self.epoch = 0  # led or followed (0: no leader known)
        self.leader_id: int | None = None

    def set(self, name: str, epoch: int, leader_id: int | None = None) -> None:
        self.name, self.epoch, self.leader_id = name, epoch, leader_id

    @property
    def leading(self) -> bool:
        return self.name == LEADER
