"""The topologies `ferry dev` runs, read from the Kubernetes overlays.

Each overlay in `deploy/k8s/overlays/<topology>/` holds the brokers'
configuration files, `brokers/<broker>.conf` (the ConfigMaps its
kustomization generates). `ferry dev` starts exactly those files, so the local
cluster and the Kubernetes one cannot drift: the brokers, their groups, ids,
roles and every other key come from the file. Only what cannot be the same on
one machine is mapped, as `-o` overrides on the broker's command line:

- addresses: every process binds and advertises 127.0.0.1; the name server
  DNS names in `namesrvAddr` become the local name servers;
- ports: the n-th name server in `namesrvAddr` and the n-th broker (in
  group, id order) add 10*n to the ports of their file (9876, 9886; 10911,
  10921, 10931, 10941), plus `--port-offset`, and so do the ports derived
  from them (a name server's gRPC port 9879, 9889; a broker's VIP port
  10909…, its gRPC port 10915…);
- the store: `<data-dir>/<broker>/store` instead of `/data/store`, with
  64 MiB commit-log files.

The RocketMQ 5 proxy (the `ferry-proxy` Deployment) has no file of its own:
one runs on its manifest's ports, 8081 (gRPC) and 8082 (metrics), plus
`--port-offset`, pointed at the local name servers.

etcd (the `etcd` StatefulSet, 3 members in Kubernetes) runs as one member on
its manifest's ports, 2379 (clients) and 2380 (peers), plus `--port-offset`.
Its endpoint is `Topology.etcd_endpoints`, in the form of the brokers'
`etcdEndpoints` key: a broker whose file sets `enableFailover=true` (the
`2m-2s-failover` overlay) gets it in place of the file's etcd pods, so the
members of each group elect their master in the local etcd. Such a topology
has no fixed roles (`Topology.elects`): which member is master is known only
once it runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from services.broker.config import BrokerConfig, ConfigError, load_config

TOPOLOGIES = ("2m-2s-failover", "2m-2s-sync", "2m-2s-async", "2m-noslave")
DEFAULT_TOPOLOGY = "2m-2s-failover"
# 64 MiB commit-log files keep a laptop's disk use small; production uses 1 GiB.
LOCAL_COMMITLOG_FILE_SIZE = 64 * 1024 * 1024
# The proxy's ports in its Deployment (deploy/k8s/base/proxy.yaml); a test checks they agree.
PROXY_PORT = 8081
PROXY_METRICS_PORT = 8082
# etcd's ports in its StatefulSet (deploy/k8s/base/etcd.yaml); a test checks they agree.
ETCD_CLIENT_PORT = 2379
ETCD_PEER_PORT = 2380


class TopologyError(Exception):
    """The overlay cannot be read as a topology; the message says what to fix."""


# A name server's gRPC port is its RocketMQ-protocol port + 3 (9876 → 9879, the
# default of `ferry namesrv --grpc-port`), its metrics port + 1 (9877), as in its
# StatefulSet; a test checks the manifests agree.
NAMESRV_GRPC_OFFSET = 3
NAMESRV_METRICS_OFFSET = 1


@dataclass(frozen=True)
class LocalNamesrv:
    name: str  # namesrv-0
    dns: str  # ferry-namesrv-0.ferry-namesrv:9876, as the brokers' files name it
    port: int  # RocketMQ's protocol: what namesrvAddr and -n name
    grpc_port: int
    metrics_port: int

    @property
    def addr(self) -> str:
        """RocketMQ's protocol (brokers' namesrvAddr, the CLI's -n)."""
        return f"127.0.0.1:{self.port}"

    @property
    def grpc_addr(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"


@dataclass(frozen=True)
class LocalProxy:
    name: str  # proxy
    dns: str  # ferry-proxy:8081, its Service in Kubernetes
    port: int
    metrics_port: int

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"


@dataclass(frozen=True)
class LocalEtcd:
    name: str  # etcd
    dns: str  # etcd-client:2379, its client Service in Kubernetes
    client_port: int
    peer_port: int

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"


@dataclass(frozen=True)
class LocalBroker:
    name: str  # the file's name: broker-a-master (a StatefulSet), broker-a-0 (a pod)
    conf: Path
    config: BrokerConfig  # the file as the broker reads it (no local overrides)
    port: int  # listenPort: RocketMQ's protocol
    fast_port: int  # fastListenPort (-1: off)
    grpc_port: int  # grpcListenPort: ferry.v1
    ha_port: int
    metrics_port: int

    @property
    def addr(self) -> str:
        """ferry.v1 gRPC: what ferry's CLI -b, grpcurl and the name servers' ferry.v1
        answers name."""
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def remoting_addr(self) -> str:
        """RocketMQ's protocol: what RocketMQ's clients are routed to."""
        return f"127.0.0.1:{self.port}"

    @property
    def ports(self) -> tuple[int, ...]:
        """Every port it listens on."""
        listening = (self.port, self.fast_port, self.grpc_port, self.ha_port, self.metrics_port)
        return tuple(p for p in listening if p >= 0)

    def overrides(
        self, namesrv_addr: str, etcd_endpoints: str, store: Path, ha_secret: str
    ) -> list[str]:
        """The `-o key=value` options that map the file to this machine
        (`etcd_endpoints` only for a broker with enableFailover)."""
        elects = [f"etcdEndpoints={etcd_endpoints}"] if self.config.enable_failover else []
        return [
            "bindAddress=127.0.0.1",
            "brokerIP1=127.0.0.1",
            f"namesrvAddr={namesrv_addr}",
            f"listenPort={self.port}",
            f"fastListenPort={self.fast_port}",
            f"grpcListenPort={self.grpc_port}",
            f"haListenPort={self.ha_port}",
            f"metricsPort={self.metrics_port}",
            f"storePathRootDir={store}",
            f"mappedFileSizeCommitLog={LOCAL_COMMITLOG_FILE_SIZE}",
            f"haSecret={ha_secret}",
            *elects,
        ]


@dataclass(frozen=True)
class Topology:
    name: str
    directory: Path
    namesrvs: tuple[LocalNamesrv, ...]
    brokers: tuple[LocalBroker, ...]
    proxy: LocalProxy
    etcd: LocalEtcd

    @property
    def namesrv_addr(self) -> str:
        """RocketMQ-protocol addresses: brokers' namesrvAddr, the proxy's and the CLI's -n."""
        return ";".join(n.addr for n in self.namesrvs)

    @property
    def etcd_endpoints(self) -> str:
        """The value of the brokers' `etcdEndpoints` key for this machine."""
        return self.etcd.endpoint

    @property
    def elects(self) -> bool:
        """Whether the groups elect their masters (enableFailover): then no
        broker is a master or a slave by its file (see `masters`)."""
        return any(b.config.enable_failover for b in self.brokers)

    def groups(self) -> dict[str, list[LocalBroker]]:
        """The brokers of each group (brokerName), in id order."""
        groups: dict[str, list[LocalBroker]] = {}
        for b in self.brokers:
            groups.setdefault(b.config.broker_name, []).append(b)
        return groups

    def masters(self) -> list[LocalBroker]:
        """The masters by their files; none when the groups elect them."""
        return [b for b in self.brokers
                if b.config.broker_role != "SLAVE" and not b.config.enable_failover]  # fmt: skip

    def slaves(self, group: str | None = None) -> list[LocalBroker]:
        """The slaves by their files, of one broker group when `group` is given."""
        return [b for b in self.brokers if b.config.broker_role == "SLAVE"
                and group in (None, b.config.broker_name)]  # fmt: skip


def find_k8s_dir(explicit: Path | None = None) -> Path:
    """deploy/k8s of this checkout: the given one, else under the current
    directory (kept relative, so what `ferry dev` prints names no path of the
    machine), else next to the installed package (an editable install)."""
    candidates = [explicit] if explicit else [
        Path("deploy") / "k8s",
        Path(__file__).resolve().parents[3] / "deploy" / "k8s",
    ]  # fmt: skip
    for path in candidates:
        if path is not None and (path / "overlays").is_dir():
            return path
    raise TopologyError(
        f"no deploy/k8s/overlays under {', '.join(str(c) for c in candidates)}: run from a "
        "ferry checkout, or pass --k8s-dir DIR"
    )


def load_topology(name: str, k8s_dir: Path, port_offset: int = 0) -> Topology:
    directory = k8s_dir / "overlays" / name / "brokers"
    confs = sorted(directory.glob("*.conf"))
    if not confs:
        known = sorted(p.parent.name for p in (k8s_dir / "overlays").glob("*/brokers"))
        raise TopologyError(
            f"topology {name!r} has no broker files ({directory}/*.conf); "
            f"known topologies: {', '.join(known) or 'none'}"
        )
    loaded: list[tuple[str, Path, BrokerConfig]] = []
    for conf in confs:
        try:
            config, warnings = load_config(conf, env={})
        except ConfigError as exc:
            raise TopologyError(f"{conf}: {exc}") from exc
        if warnings:
            raise TopologyError(f"{conf}: {'; '.join(warnings)}")
        loaded.append((conf.stem, conf, config))
    loaded.sort(key=lambda item: (item[2].broker_name, item[2].broker_id))
    for _, conf, config in loaded:
        if config.enable_failover != loaded[0][2].enable_failover:
            raise TopologyError(
                f"{conf}: enableFailover={str(config.enable_failover).lower()} unlike "
                f"{loaded[0][1]}: a topology either elects its masters or names them"
            )

    dns_names = loaded[0][2].namesrv_addrs
    for _, conf, config in loaded:
        if config.namesrv_addrs != dns_names:
            raise TopologyError(
                f"{conf}: namesrvAddr {';'.join(config.namesrv_addrs)} differs from "
                f"{loaded[0][1]}'s {';'.join(dns_names)}; every broker registers with every "
                "name server"
            )
    if not dns_names:
        raise TopologyError(f"{loaded[0][1]}: no namesrvAddr")
    namesrvs = []
    for i, dns in enumerate(dns_names):
        _, _, port_text = dns.rpartition(":")
        if not port_text.isdigit():
            raise TopologyError(f"namesrvAddr entry {dns!r} has no port")
        port = int(port_text) + 10 * i + port_offset
        namesrvs.append(
            LocalNamesrv(
                f"namesrv-{i}",
                dns,
                port,
                port + NAMESRV_GRPC_OFFSET,
                port + NAMESRV_METRICS_OFFSET,
            )
        )

    def moved(port: int, j: int) -> int:
        return port + 10 * j + port_offset if port >= 0 else port

    brokers = tuple(
        LocalBroker(
            name=stem,
            conf=conf,
            config=config,
            port=moved(config.listen_port, j),
            fast_port=moved(config.fast_port, j),
            grpc_port=moved(config.grpc_port, j),
            ha_port=moved(config.ha_listen_port, j),
            metrics_port=moved(config.metrics_port, j),
        )
        for j, (stem, conf, config) in enumerate(loaded)
    )
    proxy = LocalProxy(
        "proxy",
        f"ferry-proxy:{PROXY_PORT}",
        PROXY_PORT + port_offset,
        PROXY_METRICS_PORT + port_offset,
    )
    etcd = LocalEtcd(
        "etcd",
        f"etcd-client:{ETCD_CLIENT_PORT}",
        ETCD_CLIENT_PORT + port_offset,
        ETCD_PEER_PORT + port_offset,
    )
    return Topology(name, directory, tuple(namesrvs), brokers, proxy, etcd)
