"""`ferry dev` (what `make run` starts): a Kubernetes topology, run locally on
loopback until Ctrl-C.

The topology is read from `deploy/k8s/overlays/<topology>/brokers/*.conf`, the
files the overlay turns into the brokers' ConfigMaps (see services.cli.dev.topology
for what is mapped to this machine): `2m-2s-failover` (the default) runs 2
name servers, broker-a and broker-b each as two members that elect their
master (a SYNC_MASTER) in etcd, the metrics exporter and the RocketMQ 5 proxy
(apache.rocketmq.v2, for the official SDKs); `2m-2s-sync` has fixed roles
instead (broker-a and broker-b each a SYNC_MASTER with a SLAVE). A `TopicTest`
topic is created on every master.

First of all a one-member etcd starts (the `etcd` binary of the Debian package
etcd-server, data in `DATA_DIR/etcd`, 127.0.0.1 only). The brokers of a
failover topology (enableFailover) are pointed at it; the cluster is ready once
every group has elected a master, both name servers route to it as broker 0,
and the group's other member replicates from it and has copied the demo
topic (so a failover right away keeps it). The summary says which
member won each group, with which epoch (it stays in etcd, so a later
`make run` on the same data directory counts on from it).

Every process is a child with its own command line, logged to
`DATA_DIR/logs/`, and stopped by PID (SIGTERM, then SIGKILL after a grace
period) when this command gets SIGINT or SIGTERM, newest first, so nothing is
left behind and brokers unregister while the name servers still run.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ferry.model import NAMESRV_ADDR_ENV
from services.cli.dev.certs import ProxyCert, self_signed
from services.cli.dev.etcd import etcd_command, etcd_healthy, find_etcd
from services.cli.dev.topology import (
    DEFAULT_TOPOLOGY,
    TOPOLOGIES,
    LocalBroker,
    LocalEtcd,
    Topology,
    TopologyError,
    find_k8s_dir,
    load_topology,
)
from services.cli.failover_cmds import ENV_ETCD

DEMO_TOPIC = "TopicTest"


@dataclass
class Child:
    name: str
    proc: subprocess.Popen
    port_file: Path | None  # None: not a ferry process (etcd); readiness is probed instead
    log_path: Path


@dataclass(frozen=True)
class Elected:
    """A broker group of a failover topology as both name servers route it."""

    master: LocalBroker  # the member registered as broker 0
    epoch: int  # the failover epoch it registered with
    slaves: tuple[LocalBroker, ...]  # the other members, under their own brokerId


def add_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "dev",
        help="run a Kubernetes topology locally on loopback until Ctrl-C (make run)",
        description="Start a one-member etcd (etcd-server) and the name servers, brokers, "
        "exporter and RocketMQ 5 proxy of a deploy/k8s overlay as local processes on 127.0.0.1, "
        "from the overlay's own broker.conf files; print their endpoints, the cluster and example "
        "commands; stop them all on Ctrl-C.",
    )
    p.add_argument(
        "--topology",
        choices=TOPOLOGIES,
        default=DEFAULT_TOPOLOGY,
        help=f"which overlay of deploy/k8s/overlays (default {DEFAULT_TOPOLOGY})",
    )
    p.add_argument(
        "--data-dir", type=Path, default=Path("var"), help="where data and logs go (default ./var)"
    )
    p.add_argument(
        "--port-offset",
        type=int,
        default=0,
        metavar="N",
        help="add N to every port (default 0: name servers 9876/9886 with gRPC on 9879/9889, "
        "brokers 10911..10941 with their VIP ports 2 below and gRPC 4 above, proxy 8081, "
        "etcd 2379/2380), e.g. to run next to another ferry",
    )
    p.add_argument(
        "--k8s-dir",
        type=Path,
        default=None,
        help="the deploy/k8s directory (default: the one in this checkout)",
    )
    p.add_argument(
        "--ready-timeout",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="how long the cluster may take to form (default 60)",
    )
    p.add_argument(
        "--proxy-tls-cert",
        type=Path,
        default=os.environ.get("FERRY_PROXY_TLS_CERT") or None,
        metavar="PEM",
        help="the proxy's TLS certificate (with --proxy-tls-key; default: a self-signed one for "
        "127.0.0.1 and localhost, made with openssl into DATA_DIR/proxy-tls/ on the first run; "
        "$FERRY_PROXY_TLS_CERT); the proxy serves TLS and plaintext on its port, as Apache's",
    )
    p.add_argument(
        "--proxy-tls-key",
        type=Path,
        default=os.environ.get("FERRY_PROXY_TLS_KEY") or None,
        metavar="PEM",
        help="the certificate's private key ($FERRY_PROXY_TLS_KEY)",
    )
    p.set_defaults(func=run)


def _start(name: str, argv: list[str], data_dir: Path) -> Child:
    logs = data_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    port_file = data_dir / "run" / f"{name}.json"
    port_file.parent.mkdir(parents=True, exist_ok=True)
    port_file.unlink(missing_ok=True)
    log_path = logs / f"{name}.log"
    log_file = open(log_path, "ab")  # noqa: SIM115 - handed to the child
    proc = subprocess.Popen(
        [sys.executable, *argv, "--port-file", str(port_file)],
        stdout=log_file,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,  # our Ctrl-C is ours to forward, in order
    )
    log_file.close()
    return Child(name, proc, port_file, log_path)


def _start_etcd(etcd: LocalEtcd, data_dir: Path) -> Child:
    binary = find_etcd()
    logs = data_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log_path = logs / f"{etcd.name}.log"
    log_file = open(log_path, "ab")  # noqa: SIM115 - handed to the child
    proc = subprocess.Popen(
        etcd_command(binary, etcd.name, data_dir / etcd.name, etcd.client_port, etcd.peer_port),
        stdout=log_file,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    log_file.close()
    return Child(etcd.name, proc, None, log_path)


def _wait_etcd(child: Child, client_port: int, deadline: float) -> None:
    while time.monotonic() < deadline:
        if child.proc.poll() is not None:
            tail = child.log_path.read_text(errors="replace")[-2000:]
            raise RuntimeError(
                f"{child.name} exited with status {child.proc.returncode}; its log ends:\n{tail}"
            )
        if etcd_healthy(client_port, timeout_s=max(0.1, min(1.0, deadline - time.monotonic()))):
            return
        time.sleep(0.05)
    raise RuntimeError(
        f"{child.name} was not healthy (GET /health on 127.0.0.1:{client_port}) in time; "
        f"see {child.log_path}"
    )


def _wait_ready(child: Child, deadline: float) -> dict:
    assert child.port_file is not None, child.name
    while time.monotonic() < deadline:
        if child.proc.poll() is not None:
            tail = child.log_path.read_text(errors="replace")[-2000:]
            raise RuntimeError(
                f"{child.name} exited with status {child.proc.returncode}; its log ends:\n{tail}"
            )
        if child.port_file.exists():
            return json.loads(child.port_file.read_text())
        time.sleep(0.05)
    raise RuntimeError(f"{child.name} was not ready in time; see {child.log_path}")


def _check_ports_free(topology: Topology) -> None:
    wanted = [(topology.etcd.name, p) for p in (topology.etcd.client_port, topology.etcd.peer_port)]
    wanted += [
        (n.name, p) for n in topology.namesrvs for p in (n.port, n.grpc_port, n.metrics_port)
    ]
    wanted += [(b.name, p) for b in topology.brokers for p in b.ports]
    wanted += [(topology.proxy.name, p) for p in (topology.proxy.port, topology.proxy.metrics_port)]
    for owner, port in wanted:
        with socket.socket() as s:
            # As the servers bind: connections closed a moment ago (TIME_WAIT) do not count.
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
            except OSError as exc:
                why = "in use" if exc.errno == errno.EADDRINUSE else exc.strerror
                raise RuntimeError(
                    f"port {port} (for {owner}) is {why}: is another `make run` going? Stop it, "
                    f"or pass --port-offset N (make run ARGS='--port-offset 1000')"
                ) from None


def _create_topic(broker_addr: str, topic: str) -> None:
    """Create the demo topic through the broker's admin API (idempotent)."""
    import grpc

    from ferry.v1 import broker_admin_pb2, broker_admin_pb2_grpc, common_pb2

    with grpc.insecure_channel(broker_addr) as channel:
        stub = broker_admin_pb2_grpc.BrokerAdminStub(channel)
        stub.UpdateAndCreateTopic(
            broker_admin_pb2.UpdateAndCreateTopicRequest(
                topic_config=common_pb2.TopicConfig(
                    topic_name=topic, read_queue_nums=4, write_queue_nums=4, perm=6
                )
            ),
            timeout=10,
        )


def _wait_registered(topology: Topology, deadline: float) -> None:
    """Until every name server lists every broker of the topology."""
    from ferry.client.namesrv import NamesrvClient

    want = {(b.config.broker_name, b.config.broker_id) for b in topology.brokers}
    for ns in topology.namesrvs:
        with NamesrvClient([ns.grpc_addr], timeout_s=3) as client:
            while True:
                info = client.cluster_info()
                have = {
                    (name, broker_id)
                    for name, group in info.broker_addr_table.items()
                    for broker_id in group.broker_addrs
                }
                if want <= have:
                    break
                if time.monotonic() > deadline:
                    missing = ", ".join(f"{n}/{i}" for n, i in sorted(want - have))
                    raise RuntimeError(
                        f"{ns.name} ({ns.addr}) still misses {missing}; see the brokers' logs"
                    )
                time.sleep(0.1)


def _elected(topology: Topology, info) -> tuple[dict[str, Elected], list[str]]:
    """The groups one name server's cluster info shows with an elected master,
    and why each other group is not there yet: its broker 0 must be one of its
    members (with a failover epoch), every other member listed under its own
    brokerId, and the master no longer under its own (its life as a follower
    before the election)."""
    elected: dict[str, Elected] = {}
    waiting: list[str] = []
    for name, members in topology.groups().items():
        group = info.broker_addr_table.get(name)
        addrs = dict(group.broker_addrs) if group is not None else {}
        master = next((m for m in members if m.addr == addrs.get(0)), None)
        if master is None:
            waiting.append(f"{name} has no master (broker 0) yet")
            continue
        live = info.broker_live_table.get(master.addr)
        epoch = live.epoch if live is not None else 0
        others = tuple(m for m in members if m is not master)
        if epoch <= 0:
            waiting.append(f"{name}'s broker 0 ({master.name}) has no failover epoch")
        elif addrs.get(master.config.broker_id) is not None:
            waiting.append(f"{name}'s master {master.name} is still listed as a slave too")
        elif any(addrs.get(m.config.broker_id) != m.addr for m in others):
            waiting.append(f"{name}'s other members are not all listed as slaves yet")
        else:
            elected[name] = Elected(master, epoch, others)
    return elected, waiting


def _wait_elected(topology: Topology, deadline: float) -> dict[str, Elected]:
    """Until both name servers route every group of a failover topology to
    the same elected master, at the same epoch, with its other members as slaves."""
    from ferry.client.namesrv import NamesrvClient

    clients = [NamesrvClient([ns.grpc_addr], timeout_s=3) for ns in topology.namesrvs]
    try:
        while True:
            views = [_elected(topology, c.cluster_info()) for c in clients]
            first = views[0][0]
            agreed = all(
                {g: (e.master.name, e.epoch) for g, e in view.items()}
                == {g: (e.master.name, e.epoch) for g, e in first.items()}
                for view, _ in views
            )
            if agreed and len(first) == len(topology.groups()):
                return first
            if time.monotonic() > deadline:
                why = [
                    f"{ns.name} ({ns.addr}): {'; '.join(waiting) or 'the name servers disagree'}"
                    for ns, (_, waiting) in zip(topology.namesrvs, views, strict=True)
                ]
                raise RuntimeError(
                    "the broker groups did not elect their masters in time: "
                    + " / ".join(why)
                    + "; see the brokers' logs and `ferry ha-status`"
                )
            time.sleep(0.1)
    finally:
        for c in clients:
            c.close()


def _wait_replicating(masters: list[tuple[LocalBroker, int]], deadline: float) -> None:
    """Until every master has its group's `n` slaves on its HA port: before
    that a SYNC_MASTER answers sends with SLAVE_NOT_AVAILABLE."""
    import grpc

    from ferry.v1 import ha_admin_pb2, ha_admin_pb2_grpc

    for master, slaves in masters:
        if not slaves:
            continue
        with grpc.insecure_channel(master.addr) as channel:
            stub = ha_admin_pb2_grpc.HAAdminStub(channel)
            connected: object = "?"
            while True:
                try:
                    status = stub.GetHAStatus(ha_admin_pb2.GetHAStatusRequest(), timeout=3)
                except grpc.RpcError as exc:  # a failover member between two roles
                    connected = f"? ({exc.code().name})"
                else:
                    connected = status.in_sync_slave_nums
                    if connected >= slaves:
                        break
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"{master.name}: {connected} of {slaves} slaves connected to its HA "
                        "port in time; see the slaves' logs"
                    )
                time.sleep(0.1)


def _masters_first(topology: Topology, children: list[Child]) -> None:
    """Put each group's current master (broker 0 on the name servers) before
    its other members among `children`, which stop newest first: with its
    slaves gone first, a stopping master leaves no one to elect in its place.
    Roles may have changed since startup (`ferry failover`, a killed master);
    when the name servers do not answer, the order stays as it is."""
    import grpc

    from ferry.client.namesrv import NamesrvClient, NoNameServerAnswered

    brokers = {b.name: b for b in topology.brokers}
    places = [i for i, c in enumerate(children) if c.name in brokers]
    if len(places) < 2:
        return
    try:
        with NamesrvClient([ns.grpc_addr for ns in topology.namesrvs], timeout_s=2) as client:
            info = client.cluster_info()
    except (NoNameServerAnswered, grpc.RpcError):
        return
    masters = {g.broker_addrs[0] for g in info.broker_addr_table.values() if 0 in g.broker_addrs}
    ordered = sorted(
        (children[i] for i in places),
        key=lambda c: (
            brokers[c.name].config.broker_name,
            brokers[c.name].addr not in masters,
            brokers[c.name].config.broker_id,
        ),
    )
    for i, child in zip(places, ordered, strict=True):
        children[i] = child


def _wait_topic_synced(slaves: list[LocalBroker], topic: str, deadline: float) -> None:
    """Until every slave has `topic` from its master (slave sync copies the
    topic table a few seconds after it starts following): a member elected
    before then would not know the topic."""
    import grpc

    from ferry.v1 import slave_sync_pb2, slave_sync_pb2_grpc

    for slave in slaves:
        with grpc.insecure_channel(slave.addr) as channel:
            stub = slave_sync_pb2_grpc.SlaveSyncStub(channel)
            while True:
                try:
                    table = stub.GetAllTopicConfig(
                        slave_sync_pb2.GetAllTopicConfigRequest(), timeout=3
                    ).topic_config_table
                except grpc.RpcError:  # a failover member between two roles
                    table = {}
                if topic in table:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"{slave.name} did not copy topic {topic} from its master in time; "
                        "see its log"
                    )
                time.sleep(0.1)


def _stop(children: list[Child], grace_s: float = 10.0) -> None:
    """Stop children newest first, each fully before the next (a broker must
    unregister while its name servers still run)."""
    for child in reversed(children):
        if child.proc.poll() is not None:
            continue  # already exited, and reported then
        child.proc.send_signal(signal.SIGTERM)
        try:
            child.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            child.proc.kill()
            child.proc.wait()
        print(f"stopped {child.name} (pid {child.proc.pid})", flush=True)


def _proxy_cert(args: argparse.Namespace, data_dir: Path) -> tuple[ProxyCert | None, str]:
    """The proxy's certificate (the user's, else a self-signed one in the data
    directory) and the line that says so; None when none can be had."""
    both = "TLS and plaintext on one port (permissive, as Apache's proxy)"
    if args.proxy_tls_cert:
        cert = ProxyCert(args.proxy_tls_cert, args.proxy_tls_key, made=False)
        return cert, f"{both}, with your certificate {cert.cert}"
    try:
        cert = self_signed(data_dir / "proxy-tls")
    except OSError as exc:
        return None, f"plaintext only: no certificate could be made ({exc})"
    how = "made now with openssl" if cert.made else "from an earlier run"
    return cert, f"{both}; self-signed certificate for 127.0.0.1/localhost {how}: {cert.cert}"


def _ha_secret(data_dir: Path) -> str:
    """One HA handshake secret per data directory (slaves get a stable replica
    id in ha-status and metrics, and a wrong peer gets nothing)."""
    secret_file = data_dir / "ha-secret"
    if not secret_file.exists():
        data_dir.mkdir(parents=True, exist_ok=True)
        secret_file.write_text(secrets.token_hex(16))
        secret_file.chmod(0o600)
    return secret_file.read_text().strip()


def _sdk_example(endpoint: str) -> str:
    """A producer and a simple consumer of the official RocketMQ 5 Python SDK
    on the proxy: flush left, to paste into a shell as a here-document."""
    return f"""\
from rocketmq import ClientConfiguration, Credentials, FilterExpression, Message, Producer, SimpleConsumer
conf = ClientConfiguration("{endpoint}", Credentials())
producer = Producer(conf, ("{DEMO_TOPIC}",))
producer.startup()
msg = Message()
msg.topic, msg.body, msg.tag = "{DEMO_TOPIC}", b"hello RocketMQ 5", "TagA"
sent = producer.send(msg).message_id
print("sent", sent)
producer.shutdown()
consumer = SimpleConsumer(conf, "demo-sdk", {{"{DEMO_TOPIC}": FilterExpression("TagA")}}, 5)
consumer.startup()
for _ in range(12):  # each receive long-polls one broker for up to 5 s: until ours comes
    messages = consumer.receive(16, 15)
    for m in messages:
        print("received", m.message_id, m.tag, m.body)
        consumer.ack(m)
    if any(m.message_id == sent for m in messages):
        break
consumer.shutdown()"""


def _describe(b: LocalBroker, ports: dict, elected: dict[str, Elected]) -> str:
    """A broker's summary line: its role by its file, or as its group elected it."""
    group = elected.get(b.config.broker_name)
    if group is None:
        role = b.config.broker_role
        extra = f", HA 127.0.0.1:{ports['ha_port']}" if role != "SLAVE" else ""
    elif group.master is b:
        role = f"elected master (epoch {group.epoch})"
        extra = f", {b.config.broker_role}, HA 127.0.0.1:{b.ha_port}"
    else:
        role = f"slave of {group.master.name}"
        extra = f" (brokerId {b.config.broker_id})"
    return (
        f"  {b.name:<16} rocketmq {b.remoting_addr:<16} grpc {b.addr:<16} "
        f"metrics :{ports['metrics_port']:<6} pid {ports['pid']:<8} {role}{extra}"
    )


def run(args: argparse.Namespace) -> int:
    data_dir: Path = args.data_dir
    children: list[Child] = []
    topology: Topology | None = None
    stop_requested = False
    started = False

    def request_stop(signum: int, frame: object) -> None:
        nonlocal stop_requested
        stop_requested = True
        if not started:
            raise KeyboardInterrupt  # out of a startup wait; `finally` stops what runs

    if bool(args.proxy_tls_cert) != bool(args.proxy_tls_key):
        print("ferry dev: --proxy-tls-cert and --proxy-tls-key go together", file=sys.stderr)
        return 2
    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)
    try:
        topology = load_topology(args.topology, find_k8s_dir(args.k8s_dir), args.port_offset)
        _check_ports_free(topology)
        deadline = time.monotonic() + args.ready_timeout
        print(
            f"starting {topology.name} from {topology.directory}/*.conf "
            f"({len(topology.namesrvs)} name servers, {len(topology.brokers)} brokers)",
            flush=True,
        )
        etcd = topology.etcd
        etcd_child = _start_etcd(etcd, data_dir)
        children.append(etcd_child)  # first in, last out: it outlives the brokers
        _wait_etcd(etcd_child, etcd.client_port, deadline)
        for ns in topology.namesrvs:
            children.append(
                _start(
                    ns.name,
                    [
                        "-m",
                        "services.namesrv",
                        "--host",
                        "127.0.0.1",
                        "--port",
                        str(ns.port),
                        "--grpc-port",
                        str(ns.grpc_port),
                        "--metrics-port",
                        str(ns.metrics_port),
                        "--home",
                        str(data_dir / ns.name),
                    ],
                    data_dir,
                )  # fmt: skip
            )
        ready = {c.name: _wait_ready(c, deadline) for c in children if c is not etcd_child}
        addr = topology.namesrv_addr
        secret = _ha_secret(data_dir)
        for b in topology.brokers:  # in group, id order (a fixed master before its slaves)
            options = b.overrides(
                addr, topology.etcd_endpoints, data_dir / b.name / "store", secret
            )
            argv = ["-m", "services.broker", "-c", str(b.conf)]
            children.append(
                _start(b.name, argv + [x for o in options for x in ("-o", o)], data_dir)
            )
        for child in children[1 + len(topology.namesrvs) :]:
            ready[child.name] = _wait_ready(child, deadline)
        elected: dict[str, Elected] = {}
        if topology.elects:
            elected = _wait_elected(topology, deadline)
            masters = [(e.master, len(e.slaves)) for e in elected.values()]
        else:
            masters = [(m, len(topology.slaves(m.config.broker_name))) for m in topology.masters()]
        for master, _ in masters:
            _create_topic(master.addr, DEMO_TOPIC)
        if not elected:  # (an elected group's registration is what _wait_elected waited for)
            _wait_registered(topology, deadline)
        _wait_replicating(masters, deadline)
        if elected:  # any member may be master next: each has the topic
            _wait_topic_synced(
                [b for e in elected.values() for b in e.slaves], DEMO_TOPIC, deadline
            )
        spool = data_dir / "spool"
        exporter = _start(
            "exporter",
            ["-m", "services.cli", "exporter", "-n", addr, "--spool", str(spool),
             "--interval", "5s"],
            data_dir,
        )  # fmt: skip
        children.append(exporter)
        ready["exporter"] = _wait_ready(exporter, deadline)
        proxy = topology.proxy
        proxy_cert, proxy_tls_line = _proxy_cert(args, data_dir)
        tls_args = (
            ["--tls-cert", str(proxy_cert.cert), "--tls-key", str(proxy_cert.key)]
            if proxy_cert
            else ["--tls-server-mode", "disabled"]
        )
        proxy_child = _start(
            proxy.name,
            ["-m", "services.proxy", "--host", "127.0.0.1", "--port", str(proxy.port),
             "--metrics-port", str(proxy.metrics_port), "-n", addr, *tls_args],
            data_dir,
        )  # fmt: skip
        children.append(proxy_child)
        ready[proxy.name] = _wait_ready(proxy_child, deadline)

        lines = [f"ferry {topology.name} is running on loopback (data and logs in {data_dir}/):"]
        lines.append(
            f"  {etcd.name:<16} etcd {etcd.endpoint:<16} peer    :{etcd.peer_port:<6} "
            f"pid {etcd_child.proc.pid:<8} one member, "
            + ("where the groups elect their masters" if elected else "for broker failover")
            + f" ({etcd.dns} in Kubernetes{'' if elected else '; failover is off'})"
        )
        for ns in topology.namesrvs:
            r = ready[ns.name]
            lines.append(
                f"  {ns.name:<16} rocketmq {ns.addr:<16} grpc {ns.grpc_addr:<16} "
                f"metrics :{ns.metrics_port:<6} pid {r['pid']:<8} name server "
                f"({ns.dns} in Kubernetes)"
            )
        lines += [_describe(b, ready[b.name], elected) for b in topology.brokers]
        lines.append(f"  {'exporter':<16} every 5 s into {spool}/   pid {exporter.proc.pid}")
        lines.append(
            f"  {proxy.name:<16} grpc {proxy.addr:<16} metrics :{proxy.metrics_port:<6} "
            f"pid {ready[proxy.name]['pid']:<8} RocketMQ 5 proxy, apache.rocketmq.v2 "
            f"({proxy.dns} in Kubernetes)"
        )
        lines.append(f"  {'':<16} {proxy_tls_line}")
        lines.append(
            f"  topic {DEMO_TOPIC} (4 queues) on "
            + ", ".join(m.config.broker_name for m, _ in masters)
        )
        print("\n".join(lines) + "\n", flush=True)
        from services.cli.namesrv_cmds import cluster

        cluster(argparse.Namespace(namesrv=addr, timeout=3.0, json=False))
        master = masters[0][0]
        slaves = [*topology.slaves(), *(b for e in elected.values() for b in e.slaves)]
        ha_lines = f"  .venv/bin/ferry ha-status -b {master.addr}\n" if slaves else ""
        if slaves:
            ha_lines += f"  .venv/bin/ferry ha-status -b {slaves[0].addr}\n"
        exports = f"  export {NAMESRV_ADDR_ENV}='{addr}'\n"
        etcd_lines = ""
        if elected:  # the failover view, from etcd, and a graceful handover
            exports += f"  export {ENV_ETCD}='{topology.etcd_endpoints}'\n"
            etcd_lines = (
                "  .venv/bin/ferry ha-status\n"
                f"  .venv/bin/ferry failover -c {master.config.cluster_name} "
                f"-b {master.config.broker_name}\n"
            )
        first_ns = topology.namesrvs[0].grpc_addr
        tls_try = (
            f"  .venv/bin/grpcurl -cacert {proxy_cert.cert} {proxy.addr} list  # over TLS\n"
            if proxy_cert
            else ""
        )
        print(
            f"""
Try:
{exports}  .venv/bin/ferry cluster
  .venv/bin/ferry route {DEMO_TOPIC}
  .venv/bin/ferry send {DEMO_TOPIC} --body 'hello ferry'
  .venv/bin/ferry send {DEMO_TOPIC} --count 10000 --size 128 --batch 64
  .venv/bin/ferry consume {DEMO_TOPIC} --group demo --from-beginning --max 5
{etcd_lines}{ha_lines}  .venv/bin/ferry runtime -b {master.addr}
  .venv/bin/grpcurl -plaintext {master.addr} list
  .venv/bin/grpcurl -plaintext -d '{{"topic":"{DEMO_TOPIC}"}}' {first_ns} ferry.v1.NameServer/GetRouteInfoByTopic
  .venv/bin/ferry analytics run --spool {spool} --out {data_dir}/analytics --once
  .venv/bin/grpcurl -plaintext {proxy.addr} describe apache.rocketmq.v2.MessagingService
{tls_try}  .venv/bin/python - <<'EOF'  # the official RocketMQ 5 SDK (pip: rocketmq-python-client)
{_sdk_example(proxy.addr)}
EOF

Ctrl-C stops everything.""",
            flush=True,
        )
        started = True
        # A child that dies (or that you kill to watch a failover) is reported;
        # the others keep running until Ctrl-C, or until none is left.
        reported: set[str] = set()
        while not stop_requested:
            for child in children:
                if child.proc.poll() is not None and child.name not in reported:
                    reported.add(child.name)
                    print(
                        f"{child.name} exited with status {child.proc.returncode} (see "
                        f"{child.log_path}); the others keep running",
                        flush=True,
                    )
            if len(reported) == len(children):
                return 1
            time.sleep(0.2)
        return 0
    except KeyboardInterrupt:
        print("ferry dev: interrupted while starting; stopping what started", file=sys.stderr)
        return 130
    except (RuntimeError, TopologyError) as exc:
        print(f"ferry dev: {exc}", file=sys.stderr)
        return 1
    finally:
        started = True  # from here on a Ctrl-C no longer interrupts: stopping goes on
        if topology is not None and topology.elects:
            _masters_first(topology, children)
        _stop(children)
