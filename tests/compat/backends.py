"""The two back ends a RocketMQ 5 SDK test runs against: ferry's proxy, and Apache
RocketMQ's 5.x proxy as the oracle, with the same operations on both, done each back end's
own way (below). ferry's is one cluster per test module. Apache's is one per pytest
process, shared by the modules that use it (marked `apache5`, which tests/conftest.py
runs first and one after another): its three JVMs cost ~33 CPU-seconds to start, and
`make test` would otherwise start them once a module. A module `release()`s its back end
when it is done (ferry's stops; the shared one stays up), conftest stops the shared one
when the process goes on to a module without the mark, and `start_backend` starts it
again when one of its JVMs has died. Modules that share it use topic and group names of
their own (each module's names carry its prefix), as they see each other's leftovers.

- `create_topic(topic, queues, message_type)`: ferry's admin API on every master; Apache's
  `mqadmin updateTopic -c ApacheCluster -r N -w N -a +message.type=T` (through ferry's
  Admin5, tests/compat/rocketmq5, which runs it for the whole module in one JVM);
- `set_group(group, retry_max_times=, consume_message_orderly=)`: ferry's admin API;
  Apache's `mqadmin updateSubGroup -r R -o B -p POLICY`;
- `ensure_group(group)`: the group with its defaults unless `set_group` made it before.
  Apache's proxy refuses a consumer whose group does not exist (its settings come back
  INVALID_ARGUMENT "group not found", whatever `autoCreateSubscriptionGroup` says), so a
  test creates every group it consumes with, on both back ends;
- `wait_route(topic)`: until the name server routes a topic a broker created (a DLQ).

Both run with fast retries, so tests stay short: ferry's brokers with `messageDelayLevel`
of 300 ms steps; Apache's groups with a retry policy of the same steps, and its broker with
its revive scan every 200 ms and a 100 ms timer (`reviveInterval`, `reviveMaxSlow`,
`timerPrecisionMs`), as its pop retries wait for the revive service rather than for delay
levels; Apache's proxy takes receives with 1 s of invisibility (its default minimum is 10 s).
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rocketmq import ClientConfiguration, Credentials

from tests.apache import ApacheAdmin, ApacheNamesrv, ApacheProxy
from tests.conftest import LoopThread, start_broker, start_namesrv
from tests.integration import support
from tests.waiting import wait_for

BROKER_MAX_BODY = 64 * 1024  # tests' brokers (conftest.broker_options): maxMessageSize
LEVELS = "300ms 300ms 300ms 300ms"  # ferry's messageDelayLevel: the retry backoff by attempt
# The same backoff as an Apache group's retry policy (its consumers' backoff, which Apache's
# proxy hands the SDKs; `mqadmin updateSubGroup -p`).
APACHE_RETRY_POLICY = (
    '{"type": "CUSTOMIZED", "customizedRetryPolicy": {"next": [300, 300, 300, 300]}}'
)
BACKENDS = ("ferry", "apache")
STOP_S = 3.0  # an Apache JVM's time to stop on SIGTERM before SIGKILL

# Both back ends: a transaction left undecided is checked back after 1 s, in passes 1 s
# apart, and given up after 3 checks (RocketMQ's defaults, 6 s, 60 s and 15 checks, would
# make each check-back test minutes long).
TRANSACTION_SETTINGS: dict[str, object] = {
    "transactionTimeOut": 1000,
    "transactionCheckInterval": 1000,
    "transactionCheckMax": 3,
}
# Both back ends serve SQL92 subscriptions, as the RocketMQ e2e suites' clusters do.
FILTER_SETTINGS: dict[str, object] = {"enablePropertyFilter": "true"}
# Apache's broker inside its proxy (local mode): what makes its retries fast, and ferry's
# test brokers' message size limit.
APACHE_BROKER_SETTINGS: dict[str, object] = {
    **TRANSACTION_SETTINGS,
    **FILTER_SETTINGS,
    "maxMessageSize": BROKER_MAX_BODY,
    "timerPrecisionMs": 100,
    "reviveInterval": 200,
    "reviveMaxSlow": 1,
    # A topic the broker creates by itself (a DLQ) reaches the name server with the next
    # registration: every 10 s (its least) instead of 30.
    "registerNameServerPeriod": 10_000,
}
# Apache's proxy refuses a receive with less than 10 s of invisibility by default (ferry's
# tests redeliver after 1 s), and long-polls a push consumer for 20 s, which its close
# waits for (and a revived message waits for: it does not end the poll).
APACHE_PROXY_SETTINGS: dict[str, object] = {
    "minInvisibleTimeMillsForRecv": 1000,
    "grpcClientConsumerMaxLongPollingTimeoutMillis": 5000,
}


class Backend:
    """What a v5 SDK test needs of a back end (see the module doc)."""

    name = ""
    endpoint = ""
    namesrv_addr = ""  # the name server's RocketMQ-protocol address (4.x/5.x remoting clients)

    def __init__(self) -> None:
        self.groups: set[str] = set()

    def ensure_group(self, group: str) -> None:
        if group not in self.groups:
            self.set_group(group)

    def config(self) -> ClientConfiguration:
        return ClientConfiguration(self.endpoint, Credentials(), request_timeout=10)

    def create_topic(self, topic: str, queues: int = 4, message_type: str = "") -> None:
        raise NotImplementedError

    def set_group(
        self,
        group: str,
        *,
        retry_max_times: int | None = None,
        consume_message_orderly: bool = False,
    ) -> None:
        raise NotImplementedError

    def wait_route(self, topic: str, timeout_s: float = 60) -> None:
        """Until the name server routes `topic` (one a broker created by itself: a DLQ)."""
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def release(self) -> None:
        """A module is done with this back end: stopped unless other modules share it."""
        self.stop()


class FerryBackend(Backend):
    """Two ferry masters and a name server (in this process, on their own loop thread)
    and ferry's proxy as its own process."""

    name = "ferry"

    def __init__(self, d: Path, proxy_args: Sequence[str] = ()) -> None:
        """`proxy_args`: more of the proxy's flags (--tls-cert ...)."""
        from ferry.v1 import broker_admin_pb2, broker_admin_pb2_grpc, common_pb2

        super().__init__()
        self._admin = (broker_admin_pb2, broker_admin_pb2_grpc, common_pb2)
        self.dir = d
        self.loop = LoopThread()
        self.ns = None
        self.brokers: list = []
        self.proxy = None
        try:
            self.ns = start_namesrv(self.loop, d / "ns")
            for name in ("broker-a", "broker-b"):
                self.brokers.append(
                    start_broker(
                        self.loop,
                        d / name,
                        self.ns.remoting_addr,
                        brokerName=name,
                        messageDelayLevel=LEVELS,
                        mappedFileSizeCommitLog=8 << 20,
                        **TRANSACTION_SETTINGS,
                        **FILTER_SETTINGS,
                    )
                )
            self.proxy = support.ProxyProcess(d, self.ns.remoting_addr, proxy_args)
        except BaseException:
            self.stop()
            raise
        self.endpoint = self.proxy.endpoint
        self.namesrv_addr = self.ns.remoting_addr
        self.metrics_url = self.proxy.metrics_url

    def create_topic(self, topic: str, queues: int = 4, message_type: str = "") -> None:
        for b in self.brokers:
            support.create_topic(b.channel, topic, queues, message_type=message_type)
        wait_for(
            lambda: support.route_queue_datas(self.ns.stub, topic) == len(self.brokers),
            30,
            f"{topic} on every broker in the name server's route",
        )

    def set_group(
        self,
        group: str,
        *,
        retry_max_times: int | None = None,
        consume_message_orderly: bool = False,
    ) -> None:
        broker_admin_pb2, broker_admin_pb2_grpc, common_pb2 = self._admin
        fields: dict[str, object] = {"consume_message_orderly": consume_message_orderly}
        if retry_max_times is not None:
            fields["retry_max_times"] = retry_max_times
        for b in self.brokers:
            broker_admin_pb2_grpc.BrokerAdminStub(b.channel).UpdateAndCreateSubscriptionGroup(
                broker_admin_pb2.UpdateAndCreateSubscriptionGroupRequest(
                    config=common_pb2.SubscriptionGroupConfig(group_name=group, **fields)
                ),
                timeout=10,
            )
        self.groups.add(group)

    def wait_route(self, topic: str, timeout_s: float = 60) -> None:
        wait_for(
            lambda: support.route_queue_datas(self.ns.stub, topic) >= 1,
            timeout_s,
            f"{topic}'s route",
        )

    def stop(self) -> None:
        try:
            if self.proxy is not None:
                self.proxy.stop()
            for b in self.brokers:
                b.stop()
            if self.ns is not None:
                self.ns.stop()
        finally:
            self.loop.close()


class ApacheBackend(Backend):
    """Apache RocketMQ 5.x: a name server and the proxy in local mode (with its broker in
    the same JVM), and ferry's Admin5 for mqadmin's topic and group commands."""

    name = "apache"

    def __init__(self, d: Path, shared: bool = False) -> None:
        """`shared`: the process's one Apache back end (`shared_apache`), which
        `release()` leaves running."""
        super().__init__()
        self.dir = d
        self.shared = shared
        self.namesrv = ApacheNamesrv(d / "apache-namesrv", kit="rocketmq5")
        self.proxy: ApacheProxy | None = None
        self.admin: ApacheAdmin | None = None
        try:
            self.namesrv.start()
            self.proxy = ApacheProxy(
                d / "apache-proxy",
                self.namesrv.address,
                broker_settings=APACHE_BROKER_SETTINGS,
                proxy_settings=APACHE_PROXY_SETTINGS,
            )
            self.proxy.start()
            self.admin = ApacheAdmin(d / "apache-admin", self.namesrv.address).start()
        except BaseException:
            self.stop()
            raise
        self.endpoint = self.proxy.endpoint
        self.namesrv_addr = self.namesrv.address

    def create_topic(self, topic: str, queues: int = 4, message_type: str = "") -> None:
        assert self.admin is not None
        attributes = f"+message.type={message_type}" if message_type else ""
        self.admin.call(op="topic", topic=topic, queues=queues, attributes=attributes)

    def set_group(
        self,
        group: str,
        *,
        retry_max_times: int | None = None,
        consume_message_orderly: bool = False,
    ) -> None:
        assert self.admin is not None
        command: dict[str, object] = {
            "group": group,
            "orderly": consume_message_orderly,
            "retryPolicy": APACHE_RETRY_POLICY,
        }
        if retry_max_times is not None:
            command["retryMaxTimes"] = retry_max_times
        self.admin.call(op="group", **command)
        self.groups.add(group)

    def wait_route(self, topic: str, timeout_s: float = 60) -> None:
        assert self.admin is not None
        admin = self.admin

        def routed() -> bool:
            try:
                return bool(admin.call(op="route", topic=topic)["queues"])
            except RuntimeError:  # no route yet: mqadmin's "No topic route info"
                return False

        wait_for(routed, timeout_s, f"{topic}'s route")

    def stop(self) -> None:
        """Stops every JVM by PID, all at once; a test cluster's data is thrown away, so
        none is given more than a few seconds to shut down cleanly (the proxy's hooks take
        ~20 s). Each is stopped (and reaped) even when another's stop fails."""
        jvms = [j for j in (self.admin, self.proxy, self.namesrv) if j is not None]
        with ThreadPoolExecutor(len(jvms)) as pool:
            stops = [pool.submit(j.stop, timeout_s=STOP_S) for j in jvms]
        for stopped in stops:
            stopped.result()

    def release(self) -> None:
        if not self.shared:
            self.stop()

    @property
    def running(self) -> bool:
        """Every JVM of it is alive (`ApacheAdmin` kills Admin5 after a missed answer)."""
        jvms = (self.admin, self.proxy, self.namesrv)
        return all(j is not None and j.running for j in jvms)


_shared: ApacheBackend | None = None


def shared_apache(d: Path) -> ApacheBackend:
    """The process's Apache back end, started (under `d`) when there is none or one of its
    JVMs has died (then the rest of it is stopped first)."""
    global _shared
    if _shared is not None and _shared.running:
        return _shared
    stop_shared_apache()
    _shared = ApacheBackend(d, shared=True)
    return _shared


def stop_shared_apache() -> None:
    """Stops the shared Apache back end, if one runs (tests/conftest.py, when no module
    that shares it comes next)."""
    global _shared
    backend, _shared = _shared, None
    if backend is not None:
        backend.stop()


def start_backend(name: str, d: Path, ferry_proxy_args: Sequence[str] = ()) -> Backend:
    """`ferry_proxy_args`: more flags for ferry's proxy (Apache's has its defaults).
    Apache's is the shared one: a module gives it back with `release()`."""
    if name == "ferry":
        return FerryBackend(d, ferry_proxy_args)
    if name == "apache":
        return shared_apache(d)
    raise ValueError(f"unknown back end {name!r}")
