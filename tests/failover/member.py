"""One member of the group as the harness knows it (`Member`: its ports, store, config
keys, process and proxies) and one read of the group's keys in etcd (`GroupView`).

Plain records: starting, stopping and reading members is `group.FailoverGroup`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.faultproxy import FaultProxy
from tests.integration.support import BrokerServer


@dataclass
class Member:
    id: int
    port: int
    ha_port: int
    store: Path
    keys: dict[str, Any]
    server: BrokerServer
    remoting_port: int = 0  # RocketMQ's protocol (listenPort); `port` is gRPC
    etcd_proxy: FaultProxy | None = None
    ha_proxy: FaultProxy | None = None
    paused: bool = False

    @property
    def addr(self) -> str:
        """ferry.v1 gRPC."""
        return f"127.0.0.1:{self.port}"

    @property
    def remoting_addr(self) -> str:
        return f"127.0.0.1:{self.remoting_port}"

    @property
    def alive(self) -> bool:
        proc = self.server.proc
        return proc is not None and proc.poll() is None

    @property
    def pid(self) -> int:
        assert self.server.proc is not None
        return self.server.proc.pid

    def log(self) -> str:
        return self.server.log() if self.server.log_path.exists() else ""

    def __repr__(self) -> str:
        return f"member {self.id} ({self.addr})"


@dataclass
class GroupView:
    """One read of the group's keys in etcd."""

    leader: dict | None
    epoch: int
    isr: dict | None
    members: dict[int, dict]

    @property
    def ready_leader(self) -> int | None:
        if self.leader and self.leader.get("ready"):
            return self.leader.get("id")
        return None

    @property
    def in_sync(self) -> list[int]:
        if not self.isr or self.isr.get("epoch") != self.epoch:
            return []
        return sorted(self.isr.get("members", []))

    def epoch_start(self) -> int:
        """Where the leader's epoch starts in the log (its history's last entry)."""
        assert self.leader is not None
        epoch, start = self.leader["history"][-1]
        assert epoch == self.leader["epoch"], self.leader
        return start
