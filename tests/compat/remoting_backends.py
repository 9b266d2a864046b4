"""The clusters RocketMQ 4.x clients (tests/compat/clients.py) run against, speaking
RocketMQ's own TCP protocol: a name server's address and brokers' addresses, nothing else.
A test takes its cluster from `start_remoting_backend(name, topology, dir)`, one per test
module (JVMs take seconds to start), and uses only what `RemotingBackend` offers, so the same
test runs against every back end in `BACKENDS`.

Back ends:
- "apache": Apache RocketMQ 4.9's name server and brokers (tests/apache.py), the oracle;
- "ferry": ferry's name server and brokers, each its own process (`python -m
  services.namesrv`, `python -m services.broker`, tests/integration/support.py), on their
  RocketMQ-protocol ports: `namesrv` is the name server's `--port`, each `Node.address` its
  broker's `listenPort`; topics are created through ferry's admin API (BrokerAdmin's
  UpdateAndCreateTopic over ferry.v1 gRPC, on every master).

Topologies:
- `SINGLE`: one ASYNC_MASTER (broker-a);
- `TWO_MASTERS`: broker-a and broker-b, each an ASYNC_MASTER without a slave;
- `ONE_GROUP`: broker-a's ASYNC_MASTER and its SLAVE;
- `TWO_SYNC_GROUPS`: broker-a and broker-b, each a SYNC_MASTER with one SLAVE (a master's
  SEND_OK means its slave has the message: the failover test's "acknowledged").

Both run with short delay levels (`DELAY_LEVELS`): level 1 is 1 s, level 2 is 2 s, every
other level 1 s, so delayed sends and consumer retries (level 3 + reconsume times) come back
within about a second.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import grpc

from ferry.remoting import codes
from ferry.remoting.client import call
from ferry.remoting.codec import Command
from ferry.v1 import namesrv_pb2_grpc, slave_sync_pb2, slave_sync_pb2_grpc
from tests.apache import ApacheAdmin, ApacheBroker, ApacheNamesrv, JavaProcess
from tests.conftest import broker_options
from tests.integration import support
from tests.waiting import wait_for

J = TypeVar("J", bound=JavaProcess)

BACKENDS = ("apache", "ferry")
SINGLE = "1m"
TWO_MASTERS = "2m"
ONE_GROUP = "1m-1s"
TWO_SYNC_GROUPS = "2m-2s-sync"
# Each topology's brokers: (brokerName, brokerId, brokerRole), masters first.
LAYOUTS = {
    SINGLE: [("broker-a", 0, "ASYNC_MASTER")],
    TWO_MASTERS: [("broker-a", 0, "ASYNC_MASTER"), ("broker-b", 0, "ASYNC_MASTER")],
    ONE_GROUP: [("broker-a", 0, "ASYNC_MASTER"), ("broker-a", 1, "SLAVE")],
    TWO_SYNC_GROUPS: [
        (name, broker_id, role)
        for name in ("broker-a", "broker-b")
        for broker_id, role in ((0, "SYNC_MASTER"), (1, "SLAVE"))
    ],
}
# Apache 4.9 parses seconds at the least ("1s"); 18 levels, as RocketMQ's default has.
DELAY_LEVELS = " ".join(["1s", "2s"] + ["1s"] * 16)
DELAY_S = {1: 1.0, 2: 2.0}  # what the tests' delayed sends wait, by level
STOP_S = 3.0  # a JVM's time to stop on SIGTERM before SIGKILL (test data is thrown away)


@dataclass
class Node:
    """One broker: its group (brokerName), brokerId (0: master) and RocketMQ-protocol
    address host:port."""

    broker_name: str
    broker_id: int
    address: str


class RemotingBackend:
    """What a RocketMQ 4.x client test needs of a cluster (see the module doc)."""

    name = ""
    cluster_name = ""  # brokerClusterName of every broker

    def __init__(self) -> None:
        self.namesrv = ""  # the name server's RocketMQ-protocol address, host:port
        self.nodes: list[Node] = []

    def masters(self) -> list[Node]:
        return [n for n in self.nodes if n.broker_id == 0]

    def create_topic(self, topic: str, queues: int = 4) -> None:
        """`topic` with `queues` read and write queues on every master, routed by the name
        server when this returns."""
        raise NotImplementedError

    def kill(self, node: Node) -> None:
        """SIGKILL one broker (no shutdown hook, no unregistration)."""
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError


class ApacheRemoting(RemotingBackend):
    """Apache RocketMQ 4.9: a name server, the topology's brokers, and ferry's Admin5
    (tests/compat/rocketmq5: mqadmin's updateTopic in one JVM for the module)."""

    name = "apache"
    cluster_name = "ApacheCluster"  # tests/apache.py's brokers

    def __init__(self, d: Path, topology: str) -> None:
        super().__init__()
        self.dir = d
        self._namesrv: ApacheNamesrv | None = None
        self._brokers: dict[tuple[str, int], ApacheBroker] = {}
        self._admin: ApacheAdmin | None = None
        try:
            self._namesrv = _started(lambda n: ApacheNamesrv(d / f"namesrv-{n}"))
            self.namesrv = self._namesrv.address
            # SQL92 subscriptions served, as the RocketMQ e2e suites' clusters do.
            settings = {"messageDelayLevel": DELAY_LEVELS, "enablePropertyFilter": "true"}
            layout = _layout(topology)

            def broker(name: str, broker_id: int, role: str) -> ApacheBroker:
                return _started(
                    lambda n: ApacheBroker(
                        d / f"{name}-{broker_id}-{n}",
                        name=f"apache-{name}-{broker_id}",
                        broker_name=name,
                        broker_id=broker_id,
                        role=role,
                        namesrv=self.namesrv,
                        settings=settings,
                    )
                )

            with ThreadPoolExecutor(len(layout) + 1) as pool:
                starts = {(n, i): pool.submit(broker, n, i, role) for n, i, role in layout}
                admin = pool.submit(ApacheAdmin(d / "admin", self.namesrv).start)
            # Keep every JVM that did start, so that stop() ends it when another did not.
            failures = []
            for key, started in starts.items():
                try:
                    self._brokers[key] = started.result()
                except Exception as e:  # noqa: BLE001 - raised below, after the others
                    failures.append(e)
            self._admin = admin.result()
            if failures:
                raise failures[0]
        except BaseException:
            self.stop()
            raise
        self.nodes = [
            Node(name, broker_id, b.address) for (name, broker_id), b in self._brokers.items()
        ]
        self._wait_registered({name for name, _, _ in layout})

    def _wait_registered(self, groups: set[str], timeout_s: float = 60) -> None:
        """Until every group's master has registered with the name server, so that a topic
        created now lands on all of them. A master with autoCreateTopicEnable registers
        TBW102, the template topic, with its first registration."""
        admin = self._admin
        assert admin is not None

        def registered() -> bool:
            try:
                return set(admin.call(op="route", topic="TBW102")["queues"]) >= groups
            except RuntimeError:  # no route yet
                return False

        wait_for(registered, timeout_s, f"{sorted(groups)} registered with the name server", 0.1)

    def create_topic(self, topic: str, queues: int = 4) -> None:
        """On every master (mqadmin's updateTopic), then until every slave has it, as
        ferry's backend waits for its slaves: a 4.9 slave copies its master's topics
        every 10 s (and refuses to create one itself), and a slave without the topic
        answers its consumers 17 (topic not exist) for good once its master is dead."""
        assert self._admin is not None
        self._admin.call(op="topic", topic=topic, queues=queues)
        quoted = f'"{topic}"'.encode()
        for (_, broker_id), broker in self._brokers.items():
            if broker_id == 0:
                continue

            def copied(addr: str = broker.address) -> bool:
                answer = call(addr, Command(codes.GET_ALL_TOPIC_CONFIG), timeout=10)
                return answer.code == codes.SUCCESS and quoted in answer.body

            wait_for(copied, 60, f"{topic} on the slave {broker.address}", 0.5)

    def kill(self, node: Node) -> None:
        self._brokers[(node.broker_name, node.broker_id)].kill()

    def stop(self) -> None:
        """Every JVM by PID, all at once; each is stopped (and reaped) even when another's
        stop fails."""
        jvms = [j for j in (self._admin, *self._brokers.values(), self._namesrv) if j]
        if not jvms:
            return
        with ThreadPoolExecutor(len(jvms)) as pool:
            stops = [pool.submit(j.stop, timeout_s=STOP_S) for j in jvms]
        for stopped in stops:
            stopped.result()


def _started(make: Callable[[int], J], attempts: int = 3) -> J:
    """make(attempt).start(), again with fresh ports when the JVM lost its port to another
    process between choosing it and binding it (free ports are only free when chosen)."""
    for attempt in range(attempts):
        try:
            return make(attempt).start()
        except RuntimeError as e:
            if "Address already in use" not in str(e) or attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


def _layout(topology: str) -> list[tuple[str, int, str]]:
    try:
        return LAYOUTS[topology]
    except KeyError:
        raise ValueError(f"unknown topology {topology!r} (known: {', '.join(LAYOUTS)})") from None


class FerryRemoting(RemotingBackend):
    """ferry: a name server and the topology's brokers, each its own process (stopped or
    killed by PID), and a gRPC channel to each master and to the name server for the
    admin API."""

    name = "ferry"
    cluster_name = "DefaultCluster"  # the broker's default

    def __init__(self, d: Path, topology: str) -> None:
        super().__init__()
        self.dir = d
        self._namesrv: support.NamesrvProcess | None = None
        self._brokers: dict[tuple[str, int], support.BrokerServer] = {}
        self._channels: list[grpc.Channel] = []
        self._proxy: support.ProxyProcess | None = None
        try:
            self._namesrv = support.NamesrvProcess(d / "namesrv").wait_ready()
            self.namesrv = self._namesrv.remoting_addr
            self._ns_stub = namesrv_pb2_grpc.NameServerStub(self._channel(self._namesrv.addr))
            layout = _layout(topology)
            # The masters side by side, then their slaves (which need the masters' HA ports).
            for wave in ([s for s in layout if s[1] == 0], [s for s in layout if s[1] != 0]):
                if not wave:
                    continue
                with ThreadPoolExecutor(len(wave)) as pool:
                    failures = list(pool.map(lambda spec: self._start_broker(*spec), wave))
                for failure in failures:
                    if failure is not None:
                        raise failure
            self.nodes = [
                Node(name, broker_id, b.remoting_addr)
                for (name, broker_id), b in self._brokers.items()
            ]
            # (ferry's brokers register their ferry.v1 address; the name server keeps each
            # one's RocketMQ-protocol address beside it, for routes asked over that protocol.)
            grpc_addrs = {b.addr for b in self._brokers.values()}
            wait_for(
                lambda: support.live_addrs(self._ns_stub) >= grpc_addrs,
                30,
                "every broker registered with the name server",
                0.1,
            )
        except BaseException:
            self.stop()
            raise

    def _channel(self, addr: str) -> grpc.Channel:
        channel = grpc.insecure_channel(addr)
        self._channels.append(channel)
        return channel

    def _start_broker(self, name: str, broker_id: int, role: str) -> BaseException | None:
        """Starts one broker (a slave after its master); the failure, returned so that the
        other brokers still start and are stopped with the rest."""
        store = self.dir / f"{name}-{broker_id}"
        keys: dict[str, object] = {
            "brokerName": name,
            "brokerId": broker_id,
            "brokerRole": role,
            "messageDelayLevel": DELAY_LEVELS,
            "mappedFileSizeCommitLog": 4 << 20,
            "enablePropertyFilter": "true",
        }
        if broker_id != 0:
            master = self._brokers[(name, 0)]
            keys["haMasterAddress"] = f"127.0.0.1:{master.ha_port}"
            keys["haReconnectInterval"] = 200
            # Topics, groups and offsets from the master every second from the start, not
            # every 10 s after 3 s: create_topic waits for the slaves to have the topic.
            keys["slaveSyncDelay"] = 0
            keys["slaveSyncInterval"] = 1000
        server = support.BrokerServer(store, broker_options(store, self.namesrv, **keys))
        self._brokers[(name, broker_id)] = server
        try:
            server.start()
        except BaseException as e:  # noqa: BLE001 - raised by the caller, after the others
            return e
        return None

    def create_topic(self, topic: str, queues: int = 4) -> None:
        """Also waits for every slave to have copied the topic from its master: a slave
        serves reads only of the topics it knows (as Apache's), and a test may kill the
        master right away (Apache's slaves copy theirs in their first 3-13 s, while a test
        is still waiting for its JVMs)."""
        masters = [self._brokers[(n.broker_name, 0)] for n in self.masters()]
        for b in masters:
            support.create_topic(self._channel(b.addr), topic, queues)
        wait_for(
            lambda: support.route_queue_datas(self._ns_stub, topic) == len(masters),
            30,
            f"{topic} on every master in the name server's route",
            0.05,
        )
        for node in self.nodes:
            if node.broker_id != 0:
                stub = slave_sync_pb2_grpc.SlaveSyncStub(
                    self._channel(self._brokers[(node.broker_name, node.broker_id)].addr)
                )
                wait_for(
                    lambda stub=stub: topic in _topics(stub),
                    30,
                    f"{topic} on the slave {node}",
                    0.05,
                )

    def proxy_endpoint(self) -> str:
        """ferry's proxy (`python -m services.proxy`) in front of this name server, started
        on first use: where RocketMQ 5 SDKs connect (ferry's back end only)."""
        if self._proxy is None:
            workdir = self.dir / "proxy"
            workdir.mkdir(exist_ok=True)
            self._proxy = support.ProxyProcess(workdir, self.namesrv)
        return self._proxy.endpoint

    def kill(self, node: Node) -> None:
        self._brokers[(node.broker_name, node.broker_id)].kill()

    def stop(self) -> None:
        """The proxy, the brokers, then the name server, each by PID (each even when
        another's stop fails)."""
        for channel in self._channels:
            channel.close()
        errors: list[Exception] = []

        def stopping(stop: Callable[[], None]) -> None:
            try:
                stop()
            except Exception as e:  # noqa: BLE001 - raised below, after the others
                errors.append(e)

        if self._proxy is not None:
            stopping(self._proxy.stop)
        servers = list(self._brokers.values())
        if servers:
            with ThreadPoolExecutor(len(servers)) as pool:
                list(pool.map(lambda server: stopping(server.stop), servers))
        if self._namesrv is not None:
            stopping(self._namesrv.stop)
        if errors:
            raise errors[0]


def _topics(stub: slave_sync_pb2_grpc.SlaveSyncStub) -> set[str]:
    """The topics a broker holds (its SlaveSync table); none while it does not answer."""
    try:
        tables = stub.GetAllTopicConfig(slave_sync_pb2.GetAllTopicConfigRequest(), timeout=3)
    except grpc.RpcError:
        return set()
    return set(tables.topic_config_table)


def start_remoting_backend(name: str, topology: str, d: Path) -> RemotingBackend:
    if name == "apache":
        return ApacheRemoting(d, topology)
    if name == "ferry":
        return FerryRemoting(d, topology)
    raise ValueError(f"unknown back end {name!r} (known: {', '.join(BACKENDS)})")
