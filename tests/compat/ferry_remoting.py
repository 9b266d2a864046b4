"""ferry as a back end of the RocketMQ 4.x client tests (tests/compat/remoting_backends.py):
a ferry name server and ferry brokers, each its own process (`python -m services.namesrv`,
`python -m services.broker`, tests/integration/support.py), so that one can be SIGKILLed
as a crash. Clients get the name server's RocketMQ-protocol address; each `Node.address` is
its broker's RocketMQ-protocol address (listenPort).

`FerryRemoting(d, topology)` starts a topology's brokers as Apache's back end lays them out
(`TWO_SYNC_GROUPS`: broker-a and broker-b, each a SYNC_MASTER with a SLAVE; `SINGLE`: one
ASYNC_MASTER): the slaves learn their master's HA address from the name server, copy its
topics and groups every second (slaveSyncInterval), and serve pulls as Apache's slaves do
(the Java consumer reads a group whose master is gone through its slave). Topics are
created through ferry's admin API (ferry.v1) on every master; readiness is read through
RocketMQ's protocol, as a Java client reads it: the name server's route (105) and the
brokers' own answers.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc

from ferry.remoting import codes
from ferry.remoting.client import call
from ferry.remoting.codec import Command
from tests.compat.remoting_backends import (
    DELAY_LEVELS,
    SINGLE,
    TWO_SYNC_GROUPS,
    Node,
    RemotingBackend,
)
from tests.conftest import broker_options, wait_for
from tests.integration.support import BrokerServer, NamesrvProcess, create_topic

SLAVE_SYNC_INTERVAL_MS = 1000  # a slave's copy of its master's topics and groups


def layout(topology: str) -> list[tuple[str, int, str]]:
    """(brokerName, brokerId, brokerRole) of every broker of `topology`."""
    if topology == SINGLE:
        return [("broker-a", 0, "ASYNC_MASTER")]
    if topology == TWO_SYNC_GROUPS:
        return [
            (name, broker_id, role)
            for name in ("broker-a", "broker-b")
            for broker_id, role in ((0, "SYNC_MASTER"), (1, "SLAVE"))
        ]
    raise ValueError(f"unknown topology {topology!r}")


def route(namesrv: str, topic: str) -> dict | None:
    """The name server's route of `topic` as a RocketMQ client reads it (105), None when it
    has none (17)."""
    answer = call(namesrv, Command(codes.GET_ROUTEINFO_BY_TOPIC, ext={"topic": topic}))
    if answer.code == codes.TOPIC_NOT_EXIST:
        return None
    if answer.code != codes.SUCCESS:
        raise AssertionError(f"route of {topic} from {namesrv}: {answer.code} {answer.remark}")
    return json.loads(answer.body)


def group_addrs(namesrv: str, topic: str) -> dict[str, dict[int, str]]:
    """brokerName -> {brokerId: RocketMQ-protocol address} in `topic`'s route."""
    found = route(namesrv, topic)
    if found is None:
        return {}
    return {
        b["brokerName"]: {int(i): a for i, a in b["brokerAddrs"].items()}
        for b in found["brokerDatas"]
    }


def has_topic(address: str, topic: str) -> bool:
    """The broker at `address` holds `topic` (its GET_MAX_OFFSET of queue 0 succeeds)."""
    try:
        answer = call(address, Command(codes.GET_MAX_OFFSET, ext={"topic": topic, "queueId": "0"}))
    except OSError:
        return False
    return answer.code == codes.SUCCESS


class FerryRemoting(RemotingBackend):
    """ferry's name server and `topology`'s brokers, every one its own process."""

    name = "ferry"

    def __init__(self, d: Path, topology: str) -> None:
        super().__init__()
        self.dir = d
        self.layout = layout(topology)
        self._namesrv: NamesrvProcess | None = None
        self._brokers: dict[tuple[str, int], BrokerServer] = {}
        self._channels: dict[str, grpc.Channel] = {}
        try:
            self._namesrv = NamesrvProcess(d / "namesrv").wait_ready()
            self.namesrv = self._namesrv.remoting_addr
            for name, broker_id, role in self.layout:
                store = d / f"{name}-{broker_id}"
                keys: dict[str, object] = {
                    "brokerName": name,
                    "brokerId": broker_id,
                    "brokerRole": role,
                    "messageDelayLevel": DELAY_LEVELS,
                    "slaveSyncInterval": SLAVE_SYNC_INTERVAL_MS,
                    "haReconnectInterval": 200,
                    "mappedFileSizeCommitLog": 8 << 20,
                }
                self._brokers[(name, broker_id)] = BrokerServer(
                    store, broker_options(store, self.namesrv, **keys)
                )
            with ThreadPoolExecutor(len(self._brokers)) as pool:
                starts = [pool.submit(b.start) for b in self._brokers.values()]
            for started in starts:
                started.result()
        except BaseException:
            self.stop()
            raise
        self.nodes = [
            Node(name, broker_id, b.remoting_addr) for (name, broker_id), b in self._brokers.items()
        ]
        self._wait_registered()

    def _wait_registered(self, timeout_s: float = 30) -> None:
        """Until the name server lists every broker of the layout (its cluster info, 106)."""
        want = {(n.broker_name, n.broker_id): n.address for n in self.nodes}

        def registered() -> bool:
            answer = call(self.namesrv, Command(codes.GET_BROKER_CLUSTER_INFO))
            if answer.code != codes.SUCCESS:
                return False
            table = json.loads(answer.body)["brokerAddrTable"]
            have = {
                (name, int(i)): a
                for name, data in table.items()
                for i, a in data["brokerAddrs"].items()
            }
            return have == want

        wait_for(registered, timeout_s, f"every broker registered with the name server: {want}")

    def channel(self, node: Node) -> grpc.Channel:
        """ferry.v1 gRPC to a broker (its admin API)."""
        addr = self._brokers[(node.broker_name, node.broker_id)].addr
        if addr not in self._channels:
            self._channels[addr] = grpc.insecure_channel(addr)
        return self._channels[addr]

    def create_topic(self, topic: str, queues: int = 4) -> None:
        """On every master; returns once the name server routes it to every group with all
        its brokers, and every slave holds it too (a consumer may read through one)."""
        for master in self.masters():
            create_topic(self.channel(master), topic, queues)
        want = {name: {i for n, i, _ in self.layout if n == name} for name, _, _ in self.layout}
        wait_for(
            lambda: {k: set(v) for k, v in group_addrs(self.namesrv, topic).items()} == want,
            30,
            f"{topic} routed to {want}",
        )
        for node in self.nodes:
            wait_for(lambda node=node: has_topic(node.address, topic), 30,
                     f"{topic} on {node}")  # fmt: skip

    def kill(self, node: Node) -> None:
        self._brokers[(node.broker_name, node.broker_id)].kill()

    def log(self, node: Node) -> str:
        return self._brokers[(node.broker_name, node.broker_id)].log()

    def stop(self) -> None:
        """Every process by PID (brokers SIGTERMed together, SIGKILLed when they overrun)."""
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()
        brokers = list(self._brokers.values())
        if brokers:
            with ThreadPoolExecutor(len(brokers)) as pool:
                stops = [pool.submit(b.stop) for b in brokers]
            for stopped in stops:
                stopped.result()
        if self._namesrv is not None:
            self._namesrv.stop()
