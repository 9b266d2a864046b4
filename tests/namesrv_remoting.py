"""A ferry name server's RocketMQ-protocol port for tests: an in-process
NamesrvApp (gRPC, tests/conftest.py `start_namesrv`) with a RemotingServer
serving `services.namesrv.remoting.handlers` over the same route table and
KV store, on 127.0.0.1:0.

Stand-in until NamesrvApp serves its own remoting port (`remoting_port`):
then `start` can return the app's own port and this file goes away.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ferry.remoting.server import RemotingServer
from services.namesrv.remoting import handlers
from tests.conftest import LoopThread, RunningNamesrv, start_namesrv


@dataclass
class RemotingNamesrv:
    ns: RunningNamesrv
    server: RemotingServer
    port: int

    @property
    def addr(self) -> str:
        """The RocketMQ-protocol address (what namesrvAddr / mqadmin -n name)."""
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.ns.loop.run(self.server.stop())
        self.ns.stop()


def start(
    loop: LoopThread,
    home: Path,
    *,
    broker_hosts: Collection[str] = (),
    **config: Any,
) -> RemotingNamesrv:
    ns = start_namesrv(loop, home, **{"metrics_port": -1, **config})
    app = ns.app

    async def listen() -> tuple[RemotingServer, int]:
        server = RemotingServer(
            "namesrv",
            handlers(
                app.routes,
                app.kv,
                grpc_port=lambda: app.port,
                metrics=app.metrics,
                admin_token=app.config.admin_token,
                broker_hosts=broker_hosts,
            ),
        )
        return server, await server.listen("127.0.0.1", 0)

    try:
        server, port = loop.run(listen())
    except BaseException:
        ns.stop()
        raise
    return RemotingNamesrv(ns, server, port)
