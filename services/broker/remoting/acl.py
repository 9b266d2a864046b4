"""RocketMQ's ACL on the broker's RocketMQ-protocol door: the server's check
(ferry.remoting.server's `check`) that runs ferry.acl's `AclChecker` on every
request before its handler, with the accounts of the broker's plain_acl.yml
(`aclFile`, re-read when it changes: ferry.runtime.acl_file).

A refused request is answered 16 (NO_PERMISSION) with AclDenied's message, which
names what is missing and what to do; the server does that. Here each refusal is
logged, at most once a minute per (access key, reason), never with a secret key
or a signature (AclDenied's messages carry neither).

Runs on the loop, for every request, so it does no I/O (the file's `stat` once a
second aside) and keeps no state but the log's last times.
"""

from __future__ import annotations

import logging

from ferry.acl import AclDenied
from ferry.remoting.codec import Command
from ferry.remoting.server import Check, Connection
from ferry.runtime.acl_file import AclFile, DenialLog

log = logging.getLogger(__name__)


class AclDoorCheck:
    """The check for a RemotingServer: None to serve a request, else why it is refused;
    `passed_all` passes a whole read of remembered sends and pulls in one native call."""

    def __init__(self, acl: AclFile) -> None:
        self.acl = acl
        self.clock = acl.clock
        self.denials = DenialLog(log)

    def passed_all(self, commands: list[Command]) -> list[bool] | None:
        acl = self.acl
        if self.clock() >= acl.next_check:  # the file is due a look: the full check
            return [False] * len(commands)
        return acl.fast_many(commands)

    def __call__(self, connection: Connection, command: Command) -> str | None:
        acl = self.acl
        # A send or pull already permitted for its key, topic and group, signed right:
        # one native call (while the file need not be looked at again).
        if self.clock() < acl.next_check and acl.fast(command.code, command.ext, command.body):
            return None
        ip = connection.remote.rpartition(":")[0]  # "ip:port", IPv6 too
        try:
            acl.checker.check(command.code, command.ext, command.body, ip)
        except AclDenied as denied:
            self.denials.denied(denied, f"request code {command.code}", connection.remote)
            return str(denied)
        return None


def acl_check(acl: AclFile) -> Check:
    """The broker's check of every RocketMQ-protocol request (see AclDoorCheck)."""
    return AclDoorCheck(acl)
