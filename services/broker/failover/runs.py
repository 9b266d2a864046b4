"""The runs of the broker app one member makes, one at a time, and the servers
they share.

Owns:
- the servers that outlive every run, built once (`open`): the gRPC server
  (each run mounts its servicers on its `ServiceSwitch`; between two, calls get
  UNAVAILABLE), the RocketMQ-protocol listener with the tables of its
  connections (heartbeats, orderly consumers' queue locks; between two runs
  every request is answered SERVICE_NOT_AVAILABLE, 14) and /metrics (the
  node's series and the running app's);
- the running `BrokerApp` (`app`): `start` builds one in a role from an
  `Incarnation`, `stop` stops it (its calls in flight get SWITCH_GRACE_S), and
  a run that fails, or stops on a storage fault, sets the member's `failed`;
- the run's `ferry.failover.InSync` health (`report_in_sync`).

Runs on the event loop, called by the node's failover loop only. The only part
of failover/ that reads the app. Must never decide a role nor talk to etcd:
the node says which run to start, with what.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry

from ferry.remoting import codes
from ferry.remoting.codec import Command
from ferry.remoting.server import Connection, Handler, RemotingServer
from ferry.runtime.metrics_http import MetricsEndpoint
from ferry.runtime.server import GrpcServer
from ferry.runtime.swap import ServiceSwitch
from services.broker.config import BrokerConfig
from services.broker.failover.lease import Fence
from services.broker.incarnation import EpochStart, Incarnation, SlaveTimeouts
from services.broker.messaging.clients import ClientTables
from services.broker.messaging.locks import QueueLocks
from services.broker.servers import (
    grpc_server,
    listen_remoting,
    load_acl_file,
    metrics_endpoint,
    remoting_server,
    servable,
)
from services.ha.sync import ReplicaAcks

log = logging.getLogger(__name__)

IN_SYNC_HEALTH = "ferry.failover.InSync"  # grpc.health.v1 name: this member is eligible
SWITCH_GRACE_S = 0.5  # in-flight calls of an incarnation that hands over its role


class _Unavailable(Mapping[int, Handler]):
    """The RocketMQ-protocol table between two incarnations: every code is
    answered SERVICE_NOT_AVAILABLE, saying why (RocketMQ's producers send to
    another broker, its consumers try again)."""

    def __init__(self, why: str) -> None:
        self.why = why

        async def answer(connection: Connection, request: Command) -> Command:
            return request.answer(codes.SERVICE_NOT_AVAILABLE, self.why)

        self._answer = answer

    def __getitem__(self, code: int) -> Handler:
        return self._answer

    def __iter__(self) -> Iterator[int]:
        return iter(())

    def __len__(self) -> int:
        return 0


class _Delegating:
    """The node's /metrics: its own series and the current incarnation's."""

    def __init__(self, runs: Runs) -> None:
        self.runs = runs

    def collect(self):
        yield from self.runs.registry.collect()
        app = self.runs.app
        if app is not None:
            yield from app.registry.collect()


class Runs:
    def __init__(
        self,
        config: BrokerConfig,
        clock,
        registry: CollectorRegistry,
        fence: Fence,
        failed: asyncio.Event,
    ) -> None:
        """
        Args:
            config: the member's config; each run gets a copy for its role.
            registry: the node's own series, served with the running app's.
            fence: what every run's sends and metadata changes pass.
            failed: set when a run fails (the process stops).
        """
        self.config = config
        self.clock = clock
        self.registry = registry
        self.fence = fence
        self.failed = failed
        self.app = None  # services.broker.app.BrokerApp, the current incarnation
        self._in_sync_reported: tuple[object, bool] | None = None
        self._port = config.grpc_port  # 0 until the server binds one, then kept
        self.server: GrpcServer | None = None  # one for all incarnations
        self.switch: ServiceSwitch | None = None
        # RocketMQ's protocol, one listener for all incarnations: (listenPort,
        # fastListenPort) once bound, fast -1 when off.
        self.remoting: RemotingServer | None = None
        self._remoting_ports = (config.listen_port, config.fast_port)
        # What the connections on that listener said (heartbeats) and hold
        # (orderly consumers' queue locks): theirs, so kept across runs too.
        self.remoting_clients = ClientTables()
        self.remoting_locks = QueueLocks()
        self._between = _Unavailable(
            f"member {config.broker_id} of {config.broker_name} is starting or changing its role "
            "(automatic failover); try another broker"
        )
        self._app_watch: asyncio.Task | None = None
        self._metrics_endpoint: MetricsEndpoint | None = None

    # ------------------------------------------------------------ addresses

    @property
    def running(self) -> bool:
        return self.app is not None

    @property
    def store(self):
        return self.app.store if self.app is not None else None

    @property
    def port(self) -> int:
        """The ferry.v1 gRPC port (bound)."""
        return self._port

    @property
    def remoting_port(self) -> int:
        return self._remoting_ports[0]

    @property
    def ha_addr(self) -> str:
        """The running master's HA address ("" without one)."""
        app = self.app
        return app.ha_addr if app is not None and app.ha_master is not None else ""

    # ------------------------------------------------------------ the servers

    async def open(self) -> None:
        """Bind the servers every run will serve on."""
        cfg = self.config
        acl = load_acl_file(cfg)  # the node's servers check every run's requests
        self.switch = ServiceSwitch(
            servable(cfg),
            between=f"member {cfg.broker_id} of {cfg.broker_name} is starting or changing its "
            "role (automatic failover); retry",
        )
        self.server = grpc_server(cfg, self.switch.services, self.registry, acl)
        self._port = await self.server.start()
        self.remoting = remoting_server(self.registry, self._between, acl=acl)
        self._remoting_ports = await listen_remoting(cfg, self.remoting)
        self._metrics_endpoint = metrics_endpoint(cfg, _Delegating(self))  # type: ignore[arg-type]

    async def close(self) -> None:
        """Stop the running app (no grace) and the servers."""
        if self._app_watch is not None:
            self._app_watch.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._app_watch
        if self.app is not None:
            await self.app.stop()
        if self.remoting is not None:
            await self.remoting.stop()  # nothing is installed by now
        if self.server is not None:
            await self.server.stop(SWITCH_GRACE_S)  # nothing is mounted by now

    def close_metrics(self) -> None:
        if self._metrics_endpoint is not None:
            self._metrics_endpoint.stop()

    def _serve_remoting(
        self,
        table: Mapping[int, Handler] | None,
        on_close: Callable[[Connection], None] | None = None,
    ) -> None:
        """An incarnation's table on the node's listener; None: answer 14 (a
        connection that closes meanwhile still leaves its groups and locks)."""
        if self.remoting is not None:
            if table is None:
                self.remoting.serve(self._between, self._closed_between_runs)
            else:
                self.remoting.serve(table, on_close)

    def _closed_between_runs(self, connection: Connection) -> None:
        """A connection closed between two runs: its registrations and locks go
        (its groups' other members see it at their next rebalance: with no run,
        nobody is notified)."""
        self.remoting_clients.channel_closed(connection)
        self.remoting_locks.channel_closed(connection)

    # ------------------------------------------------------------ runs

    async def start(
        self,
        epoch: int,
        leader: dict | None,
        epoch_start: EpochStart,
        *,
        leading: bool,
        acks: ReplicaAcks | None = None,
        slave_timeouts: SlaveTimeouts | None = None,
    ) -> None:
        """Start a run, as master of `epoch` (`leading`, with the replica
        acknowledgements `acks` and the in-sync set `slave_timeouts`) or as a
        follower of `leader` (None: of nobody); `epoch_start` readies its store
        for that role as the app opens it. Call `stop` first."""
        from services.broker.app import BrokerApp

        cfg = self.config
        common = dict(
            grpc_listen_port=self._port,
            listen_port=self._remoting_ports[0],
            fast_listen_port=self._remoting_ports[1],
            metrics_port=-1,
            enable_failover=False,
        )
        if leading:
            run_cfg = dataclasses.replace(cfg, broker_id=0, **common)
        else:
            run_cfg = dataclasses.replace(
                cfg,
                broker_role="SLAVE",
                ha_master_address=(leader or {}).get("ha_addr", ""),
                # Topics and groups reach a new follower soon (they come only
                # with the slave sync; one it lacks is missing if it is elected).
                slave_sync_delay_s=min(cfg.slave_sync_delay_s, 0.5),
                **common,
            )
        incarnation = Incarnation(
            epoch=epoch,
            epoch_start=epoch_start,
            fence=self.fence,
            slave_timeouts=slave_timeouts,
            acks=acks,
            metrics_port=self._metrics_endpoint.port if self._metrics_endpoint else -1,
            server=self.server,
            switch=self.switch,
            serve_remoting=self._serve_remoting,
            remoting_clients=self.remoting_clients,
            remoting_locks=self.remoting_locks,
        )
        app = BrokerApp(run_cfg, clock=self.clock, incarnation=incarnation)
        try:
            await app.start()
        except BaseException:
            with contextlib.suppress(Exception):
                await app.stop(grace_s=0)
            raise
        self._port = app.port
        self.app = app
        self._app_watch = asyncio.create_task(self._watch(app), name="failover-app-watch")

    async def stop(self) -> None:
        """Stop the running incarnation, if any: its servicers leave the server
        at once (new calls get UNAVAILABLE), its calls in flight get
        SWITCH_GRACE_S to finish.

        Raises:
            asyncio.CancelledError: it stopped on a storage fault (`failed` is set).
        """
        old = self.app
        if self._app_watch is not None:
            self._app_watch.cancel()
            self._app_watch = None
        if old is None:
            return
        self.app = None
        await old.stop(grace_s=SWITCH_GRACE_S)
        if old.store is not None and old.store.failstop.tripped:
            self.failed.set()
            raise asyncio.CancelledError

    async def report_in_sync(self, in_sync: bool) -> None:
        """IN_SYNC_HEALTH of the running incarnation (NOT_SERVING until set)."""
        app = self.app
        if app is None or app.server is None or self._in_sync_reported == (app, in_sync):
            return
        self._in_sync_reported = (app, in_sync)
        await app.server.set_health(IN_SYNC_HEALTH, in_sync)
        log.info("member %d %s eligible for election", self.config.broker_id,
                 "is" if in_sync else "is not")  # fmt: skip

    async def _watch(self, app) -> None:
        await app.failed.wait()
        if self.app is app:
            self.failed.set()
