"""The 2m-2s-sync and 2m-2s-failover overlays, run: `kubectl kustomize` renders
one (with the HA secret replaced the way the README tells users to), and every
pod's container (args, environment, mounted ConfigMaps, volumes) starts as a
local process, as a node would start it. What differs from a cluster is
mapped, nothing else:

- each pod's declared container ports become free loopback ports, and the
  stable DNS names (`<pod>.<service>`) become 127.0.0.1 with those ports;
- `0.0.0.0` (a pod's own addresses) becomes 127.0.0.1, `0.0.0.0:PORT` with
  its local port;
- each volume mount becomes a directory (a PVC claim is shared by name);
- the image's entry point `ferry` is this interpreter's `-m services.cli`;
  the etcd image's `/usr/local/bin/etcd` is the etcd binary here (Debian's
  etcd-server, 3.4: the manifest's flags must suit it too).

Everything starts at once (podManagementPolicy: Parallel), so the brokers also
show they wait for name servers that come up after them. Then the cluster must
form: 4 brokers in GetBrokerClusterInfo on both name servers, routes for a new
topic on both groups, both slaves replicating what their SYNC_MASTER
acknowledged, health SERVING on every gRPC port, the RocketMQ 5 proxy
routing the new topic to both groups (through the name servers its -n names),
and the exporter writing rows for all four brokers. With 2m-2s-failover the
masters are not known beforehand: the overlay alone deploys etcd, whose 3
members must form one cluster with a leader (each healthy, each listing all
three); each group (a StatefulSet of two pods, each running its own file of
the group's ConfigMap) must elect a master in it, which both name servers
route to as broker 0 with the other member as a SLAVE under its own brokerId,
replicating over the HA address the master advertises (its pod's DNS name).
A Deployment runs one pod here (the proxy's second replica would be the same
process twice); the TLS component leaves the proxy out. The Spark Deployment
is rendered but not started here (a JVM per test run is slow on 2 cores); its
arguments are parsed by the job's own parser in test_k8s_manifests.py and
the job runs in test_analytics_spark.py.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import aetcd
import grpc
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from apache.rocketmq.v2 import definition_pb2, service_pb2, service_pb2_grpc
from ferry.runtime import auth
from ferry.runtime.tls import ClientTLS
from ferry.v1 import (
    broker_admin_pb2,
    broker_admin_pb2_grpc,
    broker_pb2,
    broker_pb2_grpc,
    common_pb2,
    ha_admin_pb2,
    ha_admin_pb2_grpc,
    namesrv_pb2,
    namesrv_pb2_grpc,
)
from services.cli.dev.etcd import etcd_healthy, find_etcd
from tests.integration.support import PortRange, child_env, make_test_certs, stop_pid
from tests.unit.test_k8s_manifests import TLS_COMPONENT, render
from tests.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]
OVERLAYS = REPO / "deploy" / "k8s" / "overlays"
DEADLINE_S = 60.0
TOKEN = "admin-" + secrets.token_hex(8)


def render_with_secret(
    tmp_path: Path, overlay: str, secret: str, certs: Path | None = None
) -> list[dict]:
    """The README's recipe: an overlay of one's own on `overlay` that replaces
    the secret (and, with `certs`, adds the TLS component and the ferry-tls Secret)."""
    mine = tmp_path / "my-ferry"
    mine.mkdir()
    kustomization: dict = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(OVERLAYS / overlay, mine)],
        "secretGenerator": [
            {"name": "ferry-ha", "behavior": "replace", "literals": [f"secret={secret}"]},
            {"name": "ferry-admin", "behavior": "replace", "literals": [f"token={TOKEN}"]},
        ],
    }
    if certs is not None:
        # The server certificate serves as every pod's (its SANs cover 127.0.0.1,
        # where the pods' DNS names lead here).
        for src, dst in (
            ("server.pem", "tls.crt"),
            ("server.key", "tls.key"),
            ("ca.pem", "ca.crt"),
        ):
            shutil.copy(certs / src, mine / dst)
        kustomization["components"] = [os.path.relpath(TLS_COMPONENT, mine)]
        kustomization["secretGenerator"].append(
            {"name": "ferry-tls", "files": ["tls.crt", "tls.key", "ca.crt"]}
        )
    (mine / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    return render(mine)


@dataclass
class Pod:
    name: str  # broker-a-master-0
    dns: str  # broker-a-master-0.broker-a-master ("" for a Deployment's pod)
    spec: dict
    ports: dict[int, int] = field(default_factory=dict)  # containerPort -> local port


_PORTS = PortRange(21000, 31500)  # each pod's ports, fresh per process and below 32768


def free_port() -> int:
    return _PORTS.take()


def pods_of(docs: list[dict]) -> list[Pod]:
    pods = []
    for w in docs:
        if w["kind"] == "StatefulSet":
            for i in range(w["spec"]["replicas"]):
                name = f"{w['metadata']['name']}-{i}"
                pods.append(Pod(name, f"{name}.{w['spec']['serviceName']}", w))
        elif w["kind"] == "Deployment" and w["metadata"]["name"] != "ferry-analytics":
            pods.append(Pod(f"{w['metadata']['name']}-0", "", w))
    for pod in pods:
        for c in pod.spec["spec"]["template"]["spec"]["containers"]:
            for p in c.get("ports", []):
                pod.ports[p["containerPort"]] = free_port()
    return pods


class Mapper:
    """Rewrites a string a container sees (an argument, a mounted file) for
    this machine: DNS names and ports, 0.0.0.0, mount paths."""

    def __init__(self, pods: list[Pod], pod: Pod, mounts: dict[str, Path]) -> None:
        self.pods, self.pod, self.mounts = pods, pod, mounts

    def __call__(self, text: str) -> str:
        for other in self.pods:
            if not other.dns:
                continue
            for port, local in other.ports.items():
                text = text.replace(f"{other.dns}:{port}", f"127.0.0.1:{local}")
            text = re.sub(rf"\b{re.escape(other.dns)}\b", "127.0.0.1", text)
        for port, local in self.pod.ports.items():  # its own listening addresses
            text = re.sub(rf"\b0\.0\.0\.0:{port}(?!\d)", f"127.0.0.1:{local}", text)
        text = text.replace("0.0.0.0", "127.0.0.1")
        for port, local in self.pod.ports.items():  # its own listening ports
            text = re.sub(rf"(?<![\d.:]){port}(?!\d)", str(local), text)
        for path in sorted(self.mounts, key=len, reverse=True):
            text = re.sub(rf"(?<![\w/]){re.escape(path)}(?=/|\b|$)", str(self.mounts[path]), text)
        return text


def start_pod(pod: Pod, pods: list[Pod], docs: list[dict], root: Path) -> subprocess.Popen:
    template = pod.spec["spec"]["template"]["spec"]
    [container] = template["containers"]
    config_maps = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
    secrets_ = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Secret"}
    home = root / pod.name  # the working directory (the image's is /data)
    home.mkdir(parents=True, exist_ok=True)
    claims = {t["metadata"]["name"] for t in pod.spec["spec"].get("volumeClaimTemplates", [])}
    volumes = {v["name"]: v for v in template.get("volumes", [])}
    mounts: dict[str, Path] = {}
    for m in container.get("volumeMounts", []):
        volume = volumes.get(m["name"], {})
        if m["name"] in claims:
            local = home / m["name"]
        elif "persistentVolumeClaim" in volume:  # shared by every pod that claims it
            local = root / "claims" / volume["persistentVolumeClaim"]["claimName"]
        else:
            local = home / m["name"]
        local.mkdir(parents=True, exist_ok=True)
        mounts[m["mountPath"]] = local
    mapper = Mapper(pods, pod, mounts)
    for m in container.get("volumeMounts", []):
        volume = volumes.get(m["name"], {})
        if "configMap" in volume:
            for key, value in config_maps[volume["configMap"]["name"]]["data"].items():
                (mounts[m["mountPath"]] / key).write_text(mapper(value))
        elif "secret" in volume:
            for key, value in secrets_[volume["secret"]["secretName"]]["data"].items():
                (mounts[m["mountPath"]] / key).write_bytes(base64.b64decode(value))
    env: dict[str, str] = {}
    for e in container.get("env", []):
        if "value" in e:
            env[e["name"]] = mapper(e["value"])
        elif "fieldRef" in e["valueFrom"]:
            assert e["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name", e
            env[e["name"]] = pod.name
        else:
            ref = e["valueFrom"]["secretKeyRef"]
            env[e["name"]] = base64.b64decode(secrets_[ref["name"]]["data"][ref["key"]]).decode()
    # Kubernetes expands $(VAR) in args from the container's environment.
    args = [re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), a)
            for a in container["args"]]  # fmt: skip
    args = [mapper(a) for a in args]
    if container.get("command"):  # the etcd image: the etcd binary here
        assert [Path(c).name for c in container["command"]] == ["etcd"], container["command"]
        argv = [find_etcd(), *args]
    else:  # the ferry image, whose entry point is `ferry`
        argv = [sys.executable, "-m", "services.cli", *args]
        if args and args[0] == "broker":
            # A node's disk is not this machine's: 1 GiB commit-log files, the
            # current one and the next preallocated, would write 8 GB per run.
            argv += ["-o", "mappedFileSizeCommitLog=16777216"]
    log = open(root / f"{pod.name}.log", "wb")  # noqa: SIM115 - handed to the child
    proc = subprocess.Popen(
        argv,
        env={**child_env(), **env},
        cwd=home,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    log.close()
    return proc


async def etcd_members(client_port: int) -> list[tuple[str, list[str]]]:
    """(name, client URLs) of each member, as the etcd on `client_port` lists them."""
    async with aetcd.Client(host="127.0.0.1", port=client_port, timeout=5) as client:
        return [(m.name, list(m.client_urls)) async for m in client.members()]


def wait_cluster(what: str, check, deadline: float, logs: Path):
    """Until `check()` is truthy (a gRPC error counts as not yet) by `deadline`, which the
    whole cluster's start shares; fails with the last error and every pod's log tail."""
    last: object = None

    def attempt():
        nonlocal last
        try:
            return check()
        except grpc.RpcError as exc:
            last = exc.code()
            return None

    def failed() -> str:
        tails = "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-1500:]}"
            for p in sorted(logs.glob("*.log"))
        )
        return f"{what} (within {DEADLINE_S:.0f}s; last error {last})\n{tails}"

    return wait_for(attempt, max(0.0, deadline - time.monotonic()), failed, interval_s=0.2)


# Each overlay's broker pods per group: (master, slave) by their roles, or
# (with failover) the two members, either of which may be elected.
BROKERS = {
    "2m-2s-sync": {"broker-a": ("broker-a-master-0", "broker-a-slave-0"),
                   "broker-b": ("broker-b-master-0", "broker-b-slave-0")},
    "2m-2s-failover": {"broker-a": ("broker-a-0", "broker-a-1"),
                       "broker-b": ("broker-b-0", "broker-b-1")},
}  # fmt: skip


@pytest.mark.parametrize(
    ("overlay", "tls"),
    [("2m-2s-sync", False), ("2m-2s-sync", True), ("2m-2s-failover", False),
     ("2m-2s-failover", True)],
    ids=["2m-2s-sync-plaintext", "2m-2s-sync-tls", "2m-2s-failover-plaintext",
         "2m-2s-failover-tls"],
)  # fmt: skip
def test_rendered_overlay_forms_a_cluster(tmp_path, overlay, tls):
    """With `tls`, the overlay of one's own adds deploy/k8s/components/tls: every
    gRPC server and client and the HA stream use mutual TLS, the probes' health
    checks go to the plaintext health-only ports, and this test's own clients
    present a client certificate."""
    secret = secrets.token_hex(16)
    certs = None
    if tls:
        (tmp_path / "certs").mkdir()
        certs = make_test_certs(tmp_path / "certs")
    docs = render_with_secret(tmp_path, overlay, secret, certs)
    pods = pods_of(docs)
    names = sorted(p.name for p in pods)
    elects = overlay == "2m-2s-failover"
    brokers = sorted(n for pair in BROKERS[overlay].values() for n in pair)
    assert names == sorted(brokers + ["ferry-exporter-0", "ferry-namesrv-0", "ferry-namesrv-1"]
                           + (["etcd-0", "etcd-1", "etcd-2"] if elects else [])
                           + ([] if tls else ["ferry-proxy-0"]))  # fmt: skip
    root = tmp_path / "pods"
    root.mkdir()
    procs: dict[str, subprocess.Popen] = {}
    channels: list[grpc.Channel] = []
    try:
        for pod in pods:
            procs[pod.name] = start_pod(pod, pods, docs, root)
        deadline = time.monotonic() + DEADLINE_S
        by_name = {p.name: p for p in pods}

        client_tls = (
            ClientTLS.load(certs / "ca.pem", certs / "client.pem", certs / "client.key")
            if certs else None
        )  # fmt: skip

        def channel(pod: str, port: int | None = None) -> grpc.Channel:
            target = f"127.0.0.1:{by_name[pod].ports[port or grpc_port(pod)]}"
            if client_tls is not None and port is None:
                ch = grpc.secure_channel(target, client_tls.credentials())
            else:
                ch = grpc.insecure_channel(target)
            channels.append(ch)
            return ch

        def grpc_port(pod: str) -> int:
            if pod.startswith("ferry-proxy"):
                return 8081
            return 9879 if pod.startswith("ferry-namesrv") else 10915

        def probe_port(pod: str) -> int | None:  # where the kubelet's gRPC probe goes
            if not tls:
                return None
            return 9878 if pod.startswith("ferry-namesrv") else 10914

        etcds = [p for p in names if p.startswith("etcd-")]
        for pod in etcds:  # healthy: the cluster has a leader, so a quorum formed
            wait_cluster(
                f"{pod} healthy",
                lambda pod=pod: etcd_healthy(by_name[pod].ports[2379]),
                deadline,
                root,
            )
        members = [(p, [f"http://127.0.0.1:{by_name[p].ports[2379]}"]) for p in etcds]
        for pod in etcds:  # one cluster of the three, not three of one
            wait_cluster(
                f"{pod} listing the 3 members under their names and local client URLs",
                lambda pod=pod: (
                    sorted(asyncio.run(etcd_members(by_name[pod].ports[2379]))) == members
                ),
                deadline,
                root,
            )

        servers = [p for p in names if not p.startswith(("ferry-exporter", "etcd-"))]
        health = {p: health_pb2_grpc.HealthStub(channel(p, probe_port(p))) for p in servers}
        for pod, stub in health.items():
            wait_cluster(
                f"{pod} SERVING",
                lambda stub=stub: (
                    stub.Check(health_pb2.HealthCheckRequest(), timeout=2).status
                    == health_pb2.HealthCheckResponse.SERVING
                ),
                deadline,
                root,
            )

        # Each group as the name servers route it: (master, slave, the slave's
        # brokerId, the master's failover epoch), by pod. With failover the
        # group's members elect the master (broker 0, epoch >= 1); the other
        # is its slave under its own brokerId (its pod's ordinal + 1).
        by_addr = {f"127.0.0.1:{by_name[p].ports[10915]}": p for p in brokers}
        views = []
        for ns in ("ferry-namesrv-0", "ferry-namesrv-1"):
            stub = namesrv_pb2_grpc.NameServerStub(channel(ns))

            def registered(stub=stub):
                info = stub.GetBrokerClusterInfo(
                    namesrv_pb2.GetBrokerClusterInfoRequest(), timeout=2
                )
                if list(info.cluster_addr_table) != ["DefaultCluster"]:
                    return None
                view = {}
                for group in BROKERS[overlay]:
                    addrs = dict(info.broker_addr_table[group].broker_addrs)
                    routed = {i: by_addr.get(a) for i, a in addrs.items()}
                    if len(routed) != 2 or 0 not in routed or None in routed.values():
                        return None  # not elected, or the master still listed as a slave
                    [(slave_id, slave)] = [(i, p) for i, p in routed.items() if i != 0]
                    epoch = info.broker_live_table[addrs[0]].epoch
                    view[group] = (routed[0], slave, slave_id, epoch)
                return view

            views.append(wait_cluster(f"4 brokers on {ns}", registered, deadline, root))
        assert views[0] == views[1], views
        groups = views[0]
        for group, (master, slave, slave_id, epoch) in groups.items():
            if elects:
                assert {master, slave} == set(BROKERS[overlay][group]), groups
                assert slave_id == int(slave.rsplit("-", 1)[1]) + 1 and epoch >= 1, groups
            else:
                assert (master, slave, slave_id, epoch) == (*BROKERS[overlay][group], 1, 0)

        topic = "K8sLocalRun"
        for master, *_ in groups.values():
            with pytest.raises(grpc.RpcError) as err:  # the admin token is on
                broker_admin_pb2_grpc.BrokerAdminStub(channel(master)).DeleteTopic(
                    broker_admin_pb2.DeleteTopicRequest(topic="TBW102"), timeout=10
                )
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            broker_admin_pb2_grpc.BrokerAdminStub(channel(master)).UpdateAndCreateTopic(
                broker_admin_pb2.UpdateAndCreateTopicRequest(
                    topic_config=common_pb2.TopicConfig(
                        topic_name=topic, read_queue_nums=4, write_queue_nums=4, perm=6
                    )
                ),
                timeout=10,
                metadata=auth.bearer(TOKEN),
            )
        for ns in ("ferry-namesrv-0", "ferry-namesrv-1"):
            stub = namesrv_pb2_grpc.NameServerStub(channel(ns))

            def routed(stub=stub):
                route = stub.GetRouteInfoByTopic(
                    namesrv_pb2.GetRouteInfoByTopicRequest(topic=topic), timeout=2
                )
                return {q.broker_name for q in route.queue_datas} == {"broker-a", "broker-b"}

            wait_cluster(f"{topic} routed to both groups by {ns}", routed, deadline, root)

        if not tls:  # the SDKs' view: the proxy routes the topic to both groups' masters
            proxy_port = by_name["ferry-proxy-0"].ports[8081]
            messaging = service_pb2_grpc.MessagingServiceStub(channel("ferry-proxy-0"))
            route = messaging.QueryRoute(
                service_pb2.QueryRouteRequest(
                    topic=definition_pb2.Resource(name=topic),
                    endpoints=definition_pb2.Endpoints(
                        scheme=definition_pb2.IPv4,
                        addresses=[definition_pb2.Address(host="127.0.0.1", port=proxy_port)],
                    ),
                ),
                timeout=10,
            )
            assert route.status.code == definition_pb2.OK, route.status
            assert {q.broker.name for q in route.message_queues} == {"broker-a", "broker-b"}
            assert {(a.host, a.port) for q in route.message_queues
                    for a in q.broker.endpoints.addresses} == {("127.0.0.1", proxy_port)}  # fmt: skip

        for group in ("broker-a", "broker-b"):
            master, slave, slave_id, _ = groups[group]
            master_admin = ha_admin_pb2_grpc.HAAdminStub(channel(master))
            wait_cluster(
                f"{slave} connected to {master}'s HA port",
                lambda a=master_admin: (
                    a.GetHAStatus(ha_admin_pb2.GetHAStatusRequest(), timeout=2).in_sync_slave_nums
                    == 1
                ),
                deadline,
                root,
            )
            result = broker_pb2_grpc.BrokerStub(channel(master)).SendMessage(
                broker_pb2.SendMessageRequest(topic=topic, body=b"over the manifests"),
                timeout=10,
            )
            # A SYNC_MASTER says SEND_OK only once its slave has the bytes.
            assert result.status == broker_pb2.SEND_OK, result
            master_ha = master_admin.GetHAStatus(ha_admin_pb2.GetHAStatusRequest(), timeout=5)
            assert master_ha.broker_role == "SYNC_MASTER"
            [conn] = master_ha.connections
            assert conn.replica_id == slave_id  # authenticated with the Secret's value
            assert conn.ack_offset == master_ha.master_max_offset > 0
            slave_stub = ha_admin_pb2_grpc.HAAdminStub(channel(slave))
            wait_cluster(
                f"{slave} at its master's offset",
                lambda s=slave_stub, end=master_ha.master_max_offset: (
                    (st := s.GetHAStatus(ha_admin_pb2.GetHAStatusRequest(), timeout=2).slave)
                    .connected and st.max_offset == end
                ),
                deadline,
                root,
            )  # fmt: skip

        spool = root / "claims" / "ferry-spool" / "metrics"

        want = {(g, i) for g, (_, _, slave_id, _) in groups.items() for i in (0, slave_id)}

        def exported():
            up: dict[str, set[tuple[str, int]]] = {}  # per round (its timestamp)
            for f in sorted(spool.glob("metrics-*.json")):
                for line in f.read_text().splitlines():
                    row = json.loads(line)
                    if row["metric"] == "ferry_exporter_scrape_up":
                        broker = (row["broker_name"], row["broker_id"])
                        up.setdefault(row["ts"], set()).update([broker] if row["value"] else [])
            return bool(up) and up[max(up)] == want  # the latest round

        # The exporter's first rounds may predate the brokers (or an election);
        # its interval is 15 s.
        wait_cluster("exporter rows for the 4 brokers", exported, time.monotonic() + 40, root)
        for name, proc in procs.items():
            assert proc.poll() is None, f"{name} exited with {proc.returncode}"
    finally:
        for ch in channels:
            ch.close()
        for name in reversed(names):
            if name in procs:
                stop_pid(procs[name])
