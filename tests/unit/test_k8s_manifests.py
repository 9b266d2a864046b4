"""deploy/k8s, proven without a cluster: every kustomization renders with the
real `kubectl kustomize` and validates with `kubernetes-validate --strict`
against Kubernetes 1.29 and 1.33; selectors, ports, probes, volumes, PDBs,
NetworkPolicies, security settings and the monitoring pieces are checked on the
rendered documents; each broker pod's rendered broker.conf goes through the
broker's own loader (a failover group's members: alike but for brokerId, on
the etcd StatefulSet, each HA port published and open to the other member);
and `ferry dev` (make run) is checked to read the same topology.
(tests/integration/test_k8s_local_run.py runs the rendered containers.)"""

from __future__ import annotations

import base64
import functools
import json
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from services.broker.failover.node import IN_SYNC_HEALTH

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "k8s"
OVERLAYS = sorted((K8S / "overlays").iterdir())
# Deployable kustomizations (components are parts: they are tested inside an overlay).
KUSTOMIZATIONS = sorted(p.parent for p in K8S.rglob("kustomization.yaml")
                        if "components" not in p.relative_to(K8S).parts)  # fmt: skip
TLS_COMPONENT = K8S / "components" / "tls"
ETCD_COMPONENT = K8S / "components" / "etcd"
SELECTOR_LABELS = {"app.kubernetes.io/name", "app.kubernetes.io/instance",
                   "app.kubernetes.io/component"}  # fmt: skip
NAMESRV_ADDRS = ["ferry-namesrv-0.ferry-namesrv:9876", "ferry-namesrv-1.ferry-namesrv:9876"]
ETCD_IMAGE = "quay.io/coreos/etcd:v3.5."


def render(directory: Path) -> list[dict]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.fail("kubectl is not installed (it renders the kustomizations offline)")
    out = subprocess.run(
        [kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


def with_tls(overlay: Path, where: Path, tls_files: dict[str, str] | None = None) -> Path:
    """An overlay of one's own, as the README shows: `overlay` plus the TLS
    component, with the ferry-tls Secret (placeholder content unless given)."""
    import os

    where.mkdir(parents=True, exist_ok=True)
    files = tls_files or {}
    literals = [f"{k}=placeholder" for k in ("tls.crt", "tls.key", "ca.crt") if k not in files]
    generator: dict = {"name": "ferry-tls"}
    if files:
        generator["files"] = [f"{k}={v}" for k, v in files.items()]
    if literals:
        generator["literals"] = literals
    (where / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [os.path.relpath(overlay, where)],
                "components": [os.path.relpath(TLS_COMPONENT, where)],
                "secretGenerator": [generator],
                "generatorOptions": {
                    "labels": {
                        "app.kubernetes.io/name": "ferry",
                        "app.kubernetes.io/instance": "ferry",
                        "app.kubernetes.io/component": "tls",
                        "app.kubernetes.io/part-of": "ferry",
                        "app.kubernetes.io/version": "0.1.0",
                        "app.kubernetes.io/managed-by": "kustomize",
                    }
                },  # fmt: skip
            }
        )
    )
    return where


VARIANTS = [(o, False) for o in OVERLAYS] + [(o, True) for o in OVERLAYS]


@pytest.fixture(scope="module", params=VARIANTS, ids=lambda v: v[0].name + ("+tls" if v[1] else ""))
def docs(request, tmp_path_factory) -> list[dict]:
    """An overlay, rendered (base and monitoring are parts, not deployable alone),
    and the same with the TLS component."""
    overlay, tls = request.param
    if tls:
        return render(with_tls(overlay, tmp_path_factory.mktemp("tls") / "mine"))
    return render(overlay)


@pytest.fixture
def overlay(request, docs) -> tuple[str, list[dict]]:
    return request.node.callspec.params["docs"][0].name, docs


@pytest.fixture
def tls_variant(request, docs) -> bool:
    """Whether `docs` is the overlay with the TLS component."""
    return request.node.callspec.params["docs"][1]


@pytest.mark.parametrize("version", ["1.29.0", "1.33.0"])
@pytest.mark.parametrize(
    "directory", [*KUSTOMIZATIONS, "2m-2s-sync+tls", "2m-2s-failover+tls"],
    ids=lambda p: p if isinstance(p, str) else str(p.relative_to(K8S)),
)  # fmt: skip
def test_documents_validate_strictly(directory, version, tmp_path):
    if isinstance(directory, str):
        overlay = directory.removesuffix("+tls")
        directory = with_tls(K8S / "overlays" / overlay, tmp_path / "mine")
    docs = render(directory)
    rendered = tmp_path / "all.yaml"
    rendered.write_text(yaml.safe_dump_all(docs))
    exe = Path(sys.executable).with_name("kubernetes-validate")
    out = subprocess.run(
        [str(exe), "--strict", "-k", version, str(rendered)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    passed = out.stdout.count("passed for resource") + out.stderr.count("passed for resource")
    assert passed == len(docs), out.stdout + out.stderr  # nothing skipped


def workloads(docs):
    return [d for d in docs if d["kind"] in ("StatefulSet", "Deployment")]


def by_kind(docs, kind):
    return [d for d in docs if d["kind"] == kind]


ALL_LABELS = {f"app.kubernetes.io/{k}" for k in
              ("name", "instance", "component", "part-of", "version", "managed-by")}  # fmt: skip


def selects(selector: dict, labels: dict) -> bool:
    """A Kubernetes LabelSelector (matchLabels and matchExpressions)."""
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for e in selector.get("matchExpressions", []):
        key, op, values = e["key"], e["operator"], e.get("values", [])
        ok = {"In": labels.get(key) in values, "NotIn": labels.get(key) not in values,
              "Exists": key in labels, "DoesNotExist": key not in labels}[op]  # fmt: skip
        if not ok:
            return False
    return True


def every_selector(docs):
    """(where, selector) for every label selector in the documents."""
    for d in docs:
        where = f"{d['kind']}/{d['metadata']['name']}"
        spec = d.get("spec", {})
        if d["kind"] == "Service":
            yield where, {"matchLabels": spec["selector"]}
        if "selector" in spec and d["kind"] != "Service":
            yield where, spec["selector"]
        if d["kind"] == "NetworkPolicy":
            yield where, spec["podSelector"]
            for rule in spec.get("ingress", []):
                for peer in rule.get("from", []):
                    yield where, peer["podSelector"]
        affinity = spec.get("template", {}).get("spec", {}).get("affinity", {})
        for kind in affinity.values():
            for terms in kind.values():
                for term in terms:
                    yield where, term.get("podAffinityTerm", term)["labelSelector"]


def test_selectors_and_labels(docs):
    for w in workloads(docs):
        selector = w["spec"]["selector"]["matchLabels"]
        assert set(selector) == SELECTOR_LABELS, w["metadata"]["name"]
        template = w["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= template.items()
        assert set(template) >= ALL_LABELS, w["metadata"]["name"]
    for d in docs:
        assert set(d["metadata"]["labels"]) >= ALL_LABELS, d["metadata"]["name"]
    # Selectors use only name, instance and component.
    for where, selector in every_selector(docs):
        keys = set(selector.get("matchLabels", {})) | {
            e["key"] for e in selector.get("matchExpressions", [])
        }
        assert keys and keys <= SELECTOR_LABELS, (where, selector)
    pods = [w["spec"]["template"]["metadata"]["labels"] for w in workloads(docs)]
    for svc in by_kind(docs, "Service"):
        assert any(svc["spec"]["selector"].items() <= p.items() for p in pods), svc["metadata"]


GROUP_LABEL = "ferry.io/broker-group"


def test_a_pdb_per_group_covers_all_its_brokers(docs):
    """One PDB per broker group over its master and slave, or its elected members."""
    pods = {w["metadata"]["name"]: w["spec"]["template"]["metadata"]["labels"]
            for w in workloads(docs)}  # fmt: skip
    covered = {}
    for pdb in by_kind(docs, "PodDisruptionBudget"):
        assert pdb["spec"]["maxUnavailable"] == 1
        covered[pdb["metadata"]["name"]] = sorted(
            n for n, labels in pods.items() if selects(pdb["spec"]["selector"], labels)
        )
    brokers = {n: labels[GROUP_LABEL] for n, labels in pods.items() if n.startswith("broker-")}
    assert set(brokers.values()) == {"broker-a", "broker-b"}
    for group in set(brokers.values()):
        assert covered[group] == sorted(n for n, g in brokers.items() if g == group), group
    assert covered["ferry-namesrv"] == ["ferry-namesrv"]
    if "ferry-proxy" in pods:  # not with the TLS component (see test_the_proxy)
        assert covered["ferry-proxy"] == ["ferry-proxy"]


def test_service_ports_target_container_ports(docs):
    for svc in by_kind(docs, "Service"):
        [w] = [w for w in workloads(docs)
               if svc["spec"]["selector"].items() <= w["spec"]["template"]["metadata"]["labels"].items()]  # fmt: skip
        declared = {
            p.get("name"): p["containerPort"]
            for c in w["spec"]["template"]["spec"]["containers"]
            for p in c.get("ports", [])
        }
        for port in svc["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            assert target in declared or target in declared.values(), (svc["metadata"], port)
            assert declared.get(target, target) == port["port"], port  # same number everywhere


def test_probes_security_and_storage(docs):
    pdb_selectors = [d["spec"]["selector"] for d in by_kind(docs, "PodDisruptionBudget")]
    claims = {d["metadata"]["name"] for d in by_kind(docs, "PersistentVolumeClaim")}
    electing = {p.workload["metadata"]["name"]: elects(p) for p in broker_pods(docs)}
    for w in workloads(docs):
        name = w["metadata"]["name"]
        pod = w["spec"]["template"]["spec"]
        assert pod["automountServiceAccountToken"] is False
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] != 0
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        stores = {t["metadata"]["name"] for t in w["spec"].get("volumeClaimTemplates", [])}
        for c in pod["containers"]:
            ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
            # A gRPC server is probed on grpc.health.v1: on its gRPC port, or with
            # TLS (which the kubelet's probes cannot speak) on its health-only port.
            probe_port = ports.get("health", ports.get("grpc"))
            if "grpc" in ports:
                for probe in ("readinessProbe", "livenessProbe"):
                    assert c[probe]["grpc"]["port"] == probe_port, (name, probe)
            if name.startswith("broker-"):
                # Long enough for commit-log recovery: 10 minutes before liveness counts.
                startup = c["startupProbe"]
                assert startup["grpc"]["port"] == probe_port
                assert startup["periodSeconds"] * startup["failureThreshold"] >= 600
                # An electing member is Ready while it could be elected (master or
                # in the in-sync set): a rolling update waits until it caught up.
                # Its DNS name stays published while it is not.
                elected = electing[name]
                ready_on = c["readinessProbe"]["grpc"].get("service", "")
                assert ready_on == (IN_SYNC_HEALTH if elected else ""), name
                [svc] = [s for s in by_kind(docs, "Service") if s["metadata"]["name"] == name]
                assert svc["spec"].get("publishNotReadyAddresses", False) is elected, name
                for probe in ("startupProbe", "livenessProbe"):
                    assert "service" not in c[probe]["grpc"], (name, probe)  # alive: serving
            assert c["securityContext"]["readOnlyRootFilesystem"] is True
            assert c["securityContext"]["allowPrivilegeEscalation"] is False
            assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
            assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
            # The only writable mounts: the store (a PVC), the spool (a PVC), /tmp (emptyDir).
            for mount in c.get("volumeMounts", []):
                if mount.get("readOnly"):
                    continue
                source = volumes.get(mount["name"], {})
                is_claim = mount["name"] in stores or (
                    source.get("persistentVolumeClaim", {}).get("claimName") in claims
                )
                assert is_claim or (mount["mountPath"] == "/tmp" and "emptyDir" in source), (
                    name,
                    mount,
                )
            if c.get("command"):  # not the ferry image: etcd (see test_etcd)
                assert c["image"].startswith(ETCD_IMAGE), (name, c["image"])
                continue
            # The command exists in the image (its entry point is `ferry`).
            command = [a for a in c["args"] if not a.startswith("-")][:2]
            if command[0] != "analytics":
                command = command[:1]
            assert help_exit_code(tuple(command)) == 0, c["args"]
        if w["kind"] == "StatefulSet":
            assert w["spec"]["volumeClaimTemplates"], name
            labels = w["spec"]["template"]["metadata"]["labels"]
            assert any(selects(sel, labels) for sel in pdb_selectors), name


@functools.cache
def help_exit_code(command: tuple[str, ...]) -> int:
    """`ferry <command> --help`'s exit code (asked once per command: the
    overlays share their commands, and each run costs a Python start)."""
    return subprocess.run(
        [sys.executable, "-m", "services.cli", *command, "--help"],
        capture_output=True, timeout=60,
    ).returncode  # fmt: skip


def test_a_groups_brokers_never_share_a_node(docs):
    """A master and its slave, or the members of an electing group (the pods
    of one StatefulSet), are kept on different nodes."""
    sets = {w["metadata"]["name"]: w for w in by_kind(docs, "StatefulSet")
            if w["metadata"]["name"].startswith("broker-")}  # fmt: skip
    for name, w in sets.items():
        group = w["spec"]["template"]["metadata"]["labels"][GROUP_LABEL]
        terms = w["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]
        for other_name, other in sets.items():
            labels = other["spec"]["template"]["metadata"]["labels"]
            if labels[GROUP_LABEL] != group or (other_name == name and w["spec"]["replicas"] == 1):
                continue
            assert any(
                t["topologyKey"] == "kubernetes.io/hostname" and selects(t["labelSelector"], labels)
                for t in terms
            ), (name, other_name)


# What each overlay must yield: broker -> (group, id, role), a broker named as
# its file in the overlay's brokers/ (a StatefulSet of one pod, or a pod).
SYNC = {
    "broker-a-master": ("broker-a", 0, "SYNC_MASTER"),
    "broker-a-slave": ("broker-a", 1, "SLAVE"),
    "broker-b-master": ("broker-b", 0, "SYNC_MASTER"),
    "broker-b-slave": ("broker-b", 1, "SLAVE"),
}
ASYNC = {**SYNC, "broker-a-master": ("broker-a", 0, "ASYNC_MASTER"),
         "broker-b-master": ("broker-b", 0, "ASYNC_MASTER")}  # fmt: skip
FAILOVER = {  # the role is how a member replicates while it leads
    "broker-a-0": ("broker-a", 1, "SYNC_MASTER"),
    "broker-a-1": ("broker-a", 2, "SYNC_MASTER"),
    "broker-b-0": ("broker-b", 1, "SYNC_MASTER"),
    "broker-b-1": ("broker-b", 2, "SYNC_MASTER"),
}
EXPECTED = {
    "2m-2s-failover": FAILOVER,
    "2m-2s-sync": SYNC,
    "2m-2s-async": ASYNC,
    "2m-noslave": {k: v for k, v in ASYNC.items() if k.endswith("-master")},
}


def test_every_overlay_is_expected():
    assert sorted(EXPECTED) == [p.name for p in OVERLAYS]


@dataclass
class BrokerPod:
    name: str  # what the overlay's brokers/ calls its file: the StatefulSet's, or the pod's
    pod: str  # broker-a-master-0, broker-a-0
    workload: dict  # its StatefulSet
    args: list[str]  # its container's arguments, $(POD_NAME) expanded
    conf: str  # the broker.conf it runs, from its ConfigMap


def broker_pods(docs) -> list[BrokerPod]:
    """Every broker pod and the file it runs: a StatefulSet's ConfigMap holds
    broker.conf (one pod), or one <pod>.conf per pod (-c /etc/ferry/$(POD_NAME).conf)."""
    maps = {d["metadata"]["name"]: d for d in by_kind(docs, "ConfigMap")}
    pods = []
    for w in by_kind(docs, "StatefulSet"):
        if not w["metadata"]["name"].startswith("broker-"):
            continue
        template = w["spec"]["template"]["spec"]
        [volume] = [v for v in template["volumes"] if v["name"] == "config"]
        [container] = template["containers"]
        [mount] = [m for m in container["volumeMounts"] if m["name"] == "config"]
        for i in range(w["spec"]["replicas"]):
            pod = f"{w['metadata']['name']}-{i}"
            args = [a.replace("$(POD_NAME)", pod) for a in container["args"]]
            assert args[:2] == ["broker", "-c"], args
            directory, _, key = args[2].rpartition("/")
            assert directory == mount["mountPath"], args
            name = w["metadata"]["name"] if key == "broker.conf" else key.removesuffix(".conf")
            conf = maps[volume["configMap"]["name"]]["data"][key]
            pods.append(BrokerPod(name, pod, w, args, conf))
    return pods


def elects(pod: BrokerPod) -> bool:
    return re.search(r"^enableFailover=true$", pod.conf, re.M) is not None


def secret_value(docs, name: str, key: str) -> str:
    [secret] = [s for s in by_kind(docs, "Secret") if s["metadata"]["name"].startswith(name + "-")]
    return base64.b64decode(secret["data"][key]).decode()


def etcd_members(docs) -> list[str]:
    """host:port of each etcd pod (its stable DNS name and client port)."""
    [sts] = [s for s in by_kind(docs, "StatefulSet") if s["metadata"]["name"] == "etcd"]
    [container] = sts["spec"]["template"]["spec"]["containers"]
    port = {p["name"]: p["containerPort"] for p in container["ports"]}["client"]
    return [f"etcd-{i}.{sts['spec']['serviceName']}:{port}" for i in range(sts["spec"]["replicas"])]


def test_broker_confs_load_with_the_brokers_own_loader(overlay, tmp_path):
    from services.broker.config import load_config

    name, docs = overlay
    expected = EXPECTED[name]
    pods = broker_pods(docs)
    assert sorted(p.name for p in pods) == sorted(expected)
    secret = secret_value(docs, "ferry-ha", "secret")
    token = secret_value(docs, "ferry-admin", "token")
    services = {s["metadata"]["name"]: s for s in by_kind(docs, "Service")}
    groups: dict[str, list[tuple[BrokerPod, object]]] = {}
    for pod in pods:
        [container] = pod.workload["spec"]["template"]["spec"]["containers"]
        path = tmp_path / f"{pod.name}.conf"
        path.write_text(pod.conf)
        env = {"HA_SECRET": secret, "FERRY_ADMIN_TOKEN": token}
        overrides = [re.sub(r"\$\((\w+)\)", lambda m, env=env: env[m.group(1)], a)
                     for a in pod.args[4::2]]  # fmt: skip
        assert pod.args[3::2] == ["-o"] * len(overrides)
        config, warnings = load_config(path, overrides, env={})
        assert warnings == [], warnings
        assert (config.broker_name, config.broker_id, config.broker_role) == expected[pod.name]
        assert config.cluster_name == "DefaultCluster"
        service = pod.workload["spec"]["serviceName"]
        assert config.broker_ip1 == config.broker_ip2 == f"{pod.pod}.{service}"
        assert config.ha_secret == secret
        assert config.admin_token == token
        assert list(config.namesrv_addrs) == NAMESRV_ADDRS
        assert str(config.store_root) == "/data/store"
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert (config.listen_port, config.fast_port, config.grpc_port, config.ha_listen_port,
                config.metrics_port) == (ports["remoting"], ports["remoting-vip"], ports["grpc"],
                                         ports["ha"], ports["metrics"])  # fmt: skip
        # Every Service of a broker names both protocols' ports.
        published = {p["name"] for p in services[service]["spec"]["ports"]}
        assert {"remoting", "remoting-vip", "grpc"} <= published, (service, published)
        assert config.enable_failover is (name == "2m-2s-failover")
        if config.enable_failover:
            # It elects in the etcd StatefulSet, and leads with an HA address
            # (brokerIP2:haListenPort) its group's other member can dial: its
            # stable DNS name under a headless Service that publishes the port.
            assert list(config.etcd_endpoints) == etcd_members(docs)
            assert config.failover_lease_ttl_s == 6.0 and config.ha_master_address == ""
            governing = services[service]["spec"]
            assert governing["clusterIP"] == "None"
            published = {(p["name"], p["port"]) for p in governing["ports"]}
            assert ("ha", config.ha_listen_port) in published
        groups.setdefault(config.broker_name, []).append((pod, config))
    for group, members in groups.items():
        ids = [config.broker_id for _, config in members]
        assert len(set(ids)) == len(ids), (group, ids)
        if any(config.enable_failover for _, config in members):
            # The members are configured alike but for their identity.
            assert len(members) == 2 and len({id(p.workload) for p, _ in members}) == 1, group
            keys = {
                frozenset(re.sub(r"^brokerId=\d+$", "", line)
                          for line in p.conf.splitlines() if line and not line.startswith("#"))
                for p, _ in members
            }  # fmt: skip
            assert len(keys) == 1, group


def test_namesrv_addresses_are_the_stable_pod_names(overlay):
    _, docs = overlay
    [sts] = [s for s in by_kind(docs, "StatefulSet") if s["metadata"]["name"] == "ferry-namesrv"]
    [container] = sts["spec"]["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    # Brokers, the proxy and the exporter name the RocketMQ-protocol port (and
    # find the gRPC port through it).
    pods = [f"{sts['metadata']['name']}-{i}.{sts['spec']['serviceName']}:{ports['remoting']}"
            for i in range(sts["spec"]["replicas"])]  # fmt: skip
    assert pods == NAMESRV_ADDRS
    # ferry dev gives each local name server gRPC on its RocketMQ-protocol port + 3 and
    # metrics on + 1, as here; the arguments say the same ports.
    assert (ports["grpc"], ports["metrics"]) == (ports["remoting"] + 3, ports["remoting"] + 1)
    args = container["args"]
    assert [int(args[args.index(flag) + 1]) for flag in ("--port", "--grpc-port")] == [
        ports["remoting"],
        ports["grpc"],
    ]
    [svc] = [s for s in by_kind(docs, "Service") if s["metadata"]["name"] == "ferry-namesrv"]
    assert {p["name"] for p in svc["spec"]["ports"]} >= {"remoting", "grpc"}
    [exporter] = [w for w in workloads(docs) if w["metadata"]["name"] == "ferry-exporter"]
    args = exporter["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("-n") + 1] == ";".join(NAMESRV_ADDRS)


def test_ferry_dev_finds_the_overlays_from_any_directory(tmp_path, monkeypatch):
    """Outside a checkout, `ferry dev` finds deploy/k8s next to the package it runs
    from (an editable install): this repository's."""
    from services.cli.dev.topology import find_k8s_dir

    monkeypatch.chdir(tmp_path)
    assert find_k8s_dir() == K8S.resolve()


def test_make_run_starts_the_overlays_own_files(overlay, tls_variant, tmp_path):
    """ferry dev's topology is the rendered one: the same brokers, the same
    broker.conf text, the same ports (before the local offsets); a failover
    topology's brokers elect in ferry dev's own etcd."""
    from services.broker.config import load_config
    from services.cli.dev.topology import load_topology

    name, docs = overlay
    topology = load_topology(name, K8S)
    pods = {p.name: p for p in broker_pods(docs)}
    assert [b.name for b in topology.brokers] == sorted(pods)
    for i, b in enumerate(topology.brokers):
        assert b.conf.read_text() == pods[b.name].conf
        assert (b.port, b.fast_port, b.grpc_port, b.ha_port, b.metrics_port) == (
            10911 + 10 * i, 10909 + 10 * i, 10915 + 10 * i, 10912 + 10 * i, 10913 + 10 * i
        )  # fmt: skip
        local, warnings = load_config(
            b.conf, b.overrides(topology.namesrv_addr, "127.0.0.1:2379", tmp_path / b.name, "s")
        )
        assert warnings == [] and local.enable_failover is elects(pods[b.name])
        assert local.etcd_endpoints == (("127.0.0.1:2379",) if local.enable_failover else ())
        assert (local.broker_ip1, local.ha_host) == ("127.0.0.1", "127.0.0.1")
    assert topology.elects is (name == "2m-2s-failover")
    if topology.elects:  # the groups of the overlay's StatefulSets, in id order
        assert {g: [b.name for b in members] for g, members in topology.groups().items()} == {
            "broker-a": ["broker-a-0", "broker-a-1"], "broker-b": ["broker-b-0", "broker-b-1"]
        }  # fmt: skip
        assert topology.masters() == [] and topology.slaves() == []
    assert [n.dns for n in topology.namesrvs] == NAMESRV_ADDRS
    assert [(n.port, n.grpc_port, n.metrics_port) for n in topology.namesrvs] == [
        (9876, 9879, 9877), (9886, 9889, 9887)
    ]  # fmt: skip
    if tls_variant:
        return  # no proxy there (see test_the_proxy)
    # The proxy: its Service's name and port, its container's ports.
    [svc] = [s for s in by_kind(docs, "Service") if s["metadata"]["name"] == "ferry-proxy"]
    [proxy] = [d for d in by_kind(docs, "Deployment") if d["metadata"]["name"] == "ferry-proxy"]
    ports = {p["name"]: p["containerPort"]
             for p in proxy["spec"]["template"]["spec"]["containers"][0]["ports"]}  # fmt: skip
    [grpc_port] = [p["port"] for p in svc["spec"]["ports"] if p["name"] == "grpc"]
    assert topology.proxy.dns == f"{svc['metadata']['name']}:{grpc_port}"
    assert (topology.proxy.port, topology.proxy.metrics_port) == (ports["grpc"], ports["metrics"])
    # etcd: its client Service's name and port, its container's ports. ferry dev
    # starts one member for every topology; only the failover overlay deploys it.
    if not topology.elects:
        docs = [d for d in yaml.safe_load_all((ETCD_COMPONENT / "etcd.yaml").read_text()) if d]
    [etcd] = [s for s in by_kind(docs, "StatefulSet") if s["metadata"]["name"] == "etcd"]
    [client] = [s for s in by_kind(docs, "Service") if s["metadata"]["name"] == "etcd-client"]
    ports = {p["name"]: p["containerPort"]
             for p in etcd["spec"]["template"]["spec"]["containers"][0]["ports"]}  # fmt: skip
    assert topology.etcd.dns == f"etcd-client:{client['spec']['ports'][0]['port']}"
    assert (topology.etcd.client_port, topology.etcd.peer_port) == (ports["client"], ports["peer"])
    assert topology.etcd_endpoints == f"127.0.0.1:{ports['client']}"


def test_only_the_groups_other_brokers_reach_an_ha_port(docs):
    """A master's HA port admits its group's slave alone; an electing group's
    members (one StatefulSet) admit each other alone: whoever leads, the
    other dials its HA port."""
    pods = {w["metadata"]["name"]: w["spec"]["template"]["metadata"]["labels"]
            for w in workloads(docs)}  # fmt: skip
    policies = by_kind(docs, "NetworkPolicy")
    electing = {p.workload["metadata"]["name"] for p in broker_pods(docs) if elects(p)}
    masters = [n for n in pods
               if n.startswith("broker-") and (n.endswith("-master") or n in electing)]  # fmt: skip
    assert masters
    for master in masters:
        mine = [p for p in policies
                if p["spec"]["podSelector"]["matchLabels"].items() <= pods[master].items()]  # fmt: skip
        assert len(mine) == 1, master
        reaching_ha: set[str] = set()
        for rule in mine[0]["spec"]["ingress"]:
            ports = {p["port"] for p in rule.get("ports", [])}
            if "ha" not in ports and 10912 not in ports:
                assert ports, f"{master}: a rule without ports opens the HA port too"
                continue
            assert rule.get("from"), f"{master}: the HA port is open to everyone"
            for peer in rule["from"]:
                assert set(peer) == {"podSelector"}, peer  # no namespace or IP blocks
                selector = peer["podSelector"]["matchLabels"]
                reaching_ha |= {
                    n for n, labels in pods.items() if selector.items() <= labels.items()
                }
        if master in electing:
            expected = {master}  # its pods: the group's members
        else:
            group_slave = master.removesuffix("-master") + "-slave"
            expected = {group_slave} if group_slave in pods else set()
        assert reaching_ha == expected, master


# --- monitoring -------------------------------------------------------------

MONITORING = K8S / "monitoring"


def config_map(docs, name) -> dict:
    [cm] = [d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"] == name]
    return cm


def test_rules_and_dashboard_ship_unchanged(docs):
    rules = config_map(docs, "ferry-prometheus-rules")["data"]
    for path in (MONITORING / "prometheus" / "rules").glob("*.yml"):
        assert rules[path.name] == path.read_text()
    dashboard = config_map(docs, "ferry-grafana-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"  # the sidecar's label
    shipped = (MONITORING / "grafana" / "ferry-dashboard.json").read_text()
    assert dashboard["data"]["ferry-dashboard.json"] == shipped
    json.loads(shipped)


def _relabel(labels: dict[str, str], rules: list[dict]) -> dict[str, str] | None:
    """Prometheus relabelling, for the actions the configuration uses."""
    labels = dict(labels)
    for rule in rules:
        value = rule.get("separator", ";").join(labels.get(s, "") for s in rule["source_labels"])
        match = re.fullmatch(rule.get("regex", "(.*)"), value)
        action = rule.get("action", "replace")
        if action == "keep":
            if not match:
                return None
        elif action == "replace":
            if match:
                labels[rule["target_label"]] = match.expand(
                    rule.get("replacement", "$1").replace("$", "\\")
                )
        else:
            raise AssertionError(f"relabel action {action} is not modelled here")
    return labels


def _selected(selector: str, labels: dict[str, str]) -> bool:
    """A Kubernetes label selector string, for key, key=value and key!=value."""
    for term in selector.split(","):
        if "!=" in term:
            key, value = term.split("!=")
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = term.split("=")
            if labels.get(key) != value:
                return False
        elif term not in labels:
            return False
    return True


def test_prometheus_discovers_each_pod_once_on_its_metrics_port(overlay):
    """The in-cluster scrape configuration against the rendered pods, as pod
    discovery sees them: one target per declared container port."""
    _, docs = overlay
    config = yaml.safe_load(config_map(docs, "ferry-prometheus-config")["data"]["prometheus.yml"])
    found: dict[str, list[tuple[str, str]]] = {}
    for w in workloads(docs):
        meta = w["spec"]["template"]["metadata"]
        for c in w["spec"]["template"]["spec"]["containers"]:
            for port in c.get("ports", []):
                discovered = {
                    "__address__": f"10.0.0.1:{port['containerPort']}",
                    "__meta_kubernetes_pod_name": w["metadata"]["name"] + "-0",
                    "__meta_kubernetes_namespace": "ferry",
                    "__meta_kubernetes_pod_container_port_name": port["name"],
                    **{"__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", k): v
                       for k, v in meta["labels"].items()},
                    **{"__meta_kubernetes_pod_annotation_" + re.sub(r"[^a-zA-Z0-9_]", "_", k): v
                       for k, v in meta.get("annotations", {}).items()},
                }  # fmt: skip
                for job in config["scrape_configs"]:
                    [sd] = job["kubernetes_sd_configs"]
                    assert sd["role"] == "pod" and sd["namespaces"] == {"own_namespace": True}
                    if not all(_selected(s["label"], meta["labels"]) for s in sd["selectors"]):
                        continue
                    target = _relabel(discovered, job["relabel_configs"])
                    if target is not None:
                        found.setdefault(w["metadata"]["name"], []).append(
                            (job["job_name"], target["__address__"])
                        )
                        assert target["pod"] == w["metadata"]["name"] + "-0"
    servers = [w for w in workloads(docs)
               if any(p["name"] == "metrics" for c in w["spec"]["template"]["spec"]["containers"]
                      for p in c.get("ports", []))]  # fmt: skip
    assert servers
    for w in servers:
        name = w["metadata"]["name"]
        annotations = w["spec"]["template"]["metadata"]["annotations"]
        job = {"ferry-namesrv": "ferry-namesrv", "ferry-proxy": "ferry-proxy"}.get(
            name, "ferry-broker"
        )
        assert found.get(name) == [(job, f"10.0.0.1:{annotations['prometheus.io/port']}")], name
    assert set(found) == {w["metadata"]["name"] for w in servers}


def test_exporter_and_spark_job_share_the_spool(overlay):
    _, docs = overlay
    deployments = {d["metadata"]["name"]: d for d in by_kind(docs, "Deployment")}
    assert set(deployments) - {"ferry-proxy"} == {"ferry-exporter", "ferry-analytics"}
    deployments.pop("ferry-proxy", None)  # not part of the pipeline (see test_the_proxy)
    claims = {d["metadata"]["name"]: d for d in by_kind(docs, "PersistentVolumeClaim")}
    mounted = {}
    for name, d in deployments.items():
        pod = d["spec"]["template"]["spec"]
        [spool] = [v for v in pod["volumes"] if "persistentVolumeClaim" in v]
        [mount] = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == spool["name"]]
        mounted[name] = (spool["persistentVolumeClaim"]["claimName"], mount["mountPath"])
        assert d["spec"]["replicas"] == 1 and d["spec"]["strategy"]["type"] == "Recreate"
    assert mounted["ferry-exporter"] == mounted["ferry-analytics"]
    assert claims[mounted["ferry-exporter"][0]]["spec"]["accessModes"] == ["ReadWriteMany"]
    exporter = deployments["ferry-exporter"]["spec"]["template"]["spec"]["containers"][0]["args"]
    analytics = deployments["ferry-analytics"]["spec"]["template"]["spec"]["containers"][0]
    assert analytics["image"].startswith("ferry-analytics:")  # the image target with Java
    args = analytics["args"]
    assert args[:2] == ["analytics", "run"]
    assert args[args.index("--spool") + 1] == exporter[exporter.index("--spool") + 1]
    assert args[args.index("--interval") + 1] == exporter[exporter.index("--interval") + 1]
    # The job's own parser accepts the arguments.
    from services.cli.main import build_parser

    parsed = build_parser().parse_args(args)
    assert parsed.spool.startswith("/spool/") and parsed.out.startswith("/spool/")


@pytest.mark.parametrize("overlay_name", ["2m-2s-sync", "2m-2s-failover"])
def test_the_tls_component_puts_every_grpc_server_and_client_on_tls(tmp_path, overlay_name):
    docs = render(with_tls(K8S / "overlays" / overlay_name, tmp_path / "mine"))
    [secret] = [d["metadata"]["name"] for d in by_kind(docs, "Secret")
                if d["metadata"]["name"].startswith("ferry-tls-")]  # fmt: skip
    for w in workloads(docs):
        pod = w["spec"]["template"]["spec"]
        [c] = pod["containers"]
        name = w["metadata"]["name"]
        if name in ("ferry-analytics", "etcd"):
            continue  # reads the spool, speaks no gRPC; etcd stays plaintext (base/etcd.yaml)
        assert {"name": "tls", "secret": {"secretName": secret}} in pod["volumes"], name
        assert {"name": "tls", "mountPath": "/etc/ferry/tls", "readOnly": True} in c["volumeMounts"]
        args = " ".join(c["args"])
        if name.startswith("broker-"):
            for key in ("tlsCert", "tlsKey", "tlsClientCa", "tlsCa"):
                assert f"{key}=/etc/ferry/tls/" in args, (name, key)
            assert "haTls=true" in args and "healthPort=10914" in args
        elif name == "ferry-namesrv":
            for flag in ("--tls-cert", "--tls-key", "--tls-client-ca"):
                assert flag in c["args"], flag
            assert c["args"][c["args"].index("--health-port") + 1] == "9878"
        else:  # the exporter: a client
            env = {e["name"]: e["value"] for e in c["env"]}
            assert env["FERRY_TLS_CA"] == "/etc/ferry/tls/ca.crt" and env["FERRY_TLS_CERT"]
    for policy in by_kind(docs, "NetworkPolicy"):
        assert {"ports": [{"port": "health"}]} in policy["spec"]["ingress"]


def test_the_proxy(overlay, tls_variant):
    """The RocketMQ 5 proxy: 2 replicas behind the ferry-proxy Service on 8081,
    gRPC-probed, a PDB, pointed at the name servers the brokers register with.
    The TLS component leaves it out (the proxy has no TLS yet)."""
    _, docs = overlay
    named = [d for d in docs if d["metadata"]["name"] == "ferry-proxy"]
    if tls_variant:
        assert named == []
        return
    assert sorted(d["kind"] for d in named) == ["Deployment", "PodDisruptionBudget", "Service"]
    [deployment] = by_kind(named, "Deployment")
    [svc] = by_kind(named, "Service")
    [pdb] = by_kind(named, "PodDisruptionBudget")
    spec = deployment["spec"]
    assert spec["replicas"] == 2
    assert spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0  # a new pod ready first
    labels = spec["template"]["metadata"]["labels"]
    assert labels["app.kubernetes.io/component"] == "proxy"
    [container] = spec["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"grpc": 8081, "metrics": 8082}
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["grpc"] == {"port": 8081}, probe
    assert spec["template"]["metadata"]["annotations"]["prometheus.io/port"] == "8082"
    # The Service: clients' endpoint ferry-proxy:8081, on every proxy pod.
    assert svc["spec"].get("clusterIP") != "None"  # one stable virtual IP for the SDKs
    assert svc["spec"]["selector"].items() <= labels.items()
    assert {(p["name"], p["port"], p["targetPort"]) for p in svc["spec"]["ports"]} == {
        ("grpc", 8081, "grpc"), ("metrics", 8082, "metrics")
    }  # fmt: skip
    # One pod of two may be evicted at a time, no more.
    assert pdb["spec"]["maxUnavailable"] == 1 and selects(pdb["spec"]["selector"], labels)
    others = [w for w in workloads(docs) if w is not deployment]
    assert not any(selects(pdb["spec"]["selector"], w["spec"]["template"]["metadata"]["labels"])
                   for w in others)  # fmt: skip
    # Its command line, as `ferry proxy` parses it: the brokers' name servers.
    from services.cli.main import build_parser

    args = build_parser().parse_args(container["args"])
    assert args.func.__module__ == "services.proxy.cli"
    assert (args.host, args.port, args.metrics_port) == ("0.0.0.0", 8081, 8082)
    assert args.namesrv == ";".join(NAMESRV_ADDRS)
    assert args.advertise_host == svc["metadata"]["name"]
    confs = [pod.conf for pod in broker_pods(docs)]
    assert confs and all(f"namesrvAddr={args.namesrv}" in conf for conf in confs)


def test_name_servers_and_brokers_share_the_admin_token(overlay):
    _, docs = overlay
    for w in workloads(docs):
        name = w["metadata"]["name"]
        if not (name == "ferry-namesrv" or name.startswith("broker-")):
            continue
        env = {e["name"]: e for e in w["spec"]["template"]["spec"]["containers"][0]["env"]}
        ref = env["FERRY_ADMIN_TOKEN"]["valueFrom"]["secretKeyRef"]
        assert ref["name"].startswith("ferry-admin-") and ref["key"] == "token", name


def test_etcd(overlay):
    """The 3-member etcd for broker failover, in the failover overlay only (the
    etcd component): a static cluster whose --initial-cluster names each pod by
    its stable DNS name and peer port, each pod advertising exactly its own
    entry; peers resolvable before anyone is ready; a PDB keeping quorum; every
    flag one the etcd binary knows (the Debian etcd-server here, 3.4, so the
    local run can start it too). The fixed-role overlays deploy no etcd."""
    from services.cli.dev.etcd import find_etcd

    name, docs = overlay
    etcd_objects = [
        f"{d['kind']}/{d['metadata']['name']}" for d in docs
        if d["metadata"]["name"].startswith("etcd")
        or d["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "etcd"
        or ETCD_IMAGE in json.dumps(d)
    ]  # fmt: skip
    if name != "2m-2s-failover":
        assert etcd_objects == [], name
        return
    named = [d for d in docs if d["metadata"]["name"] in ("etcd", "etcd-client", "etcd-peers")]
    assert sorted(etcd_objects) == sorted(f"{d['kind']}/{d['metadata']['name']}" for d in named)
    assert sorted(f"{d['kind']}/{d['metadata']['name']}" for d in named) == [
        "NetworkPolicy/etcd-peers", "PodDisruptionBudget/etcd", "Service/etcd",
        "Service/etcd-client", "StatefulSet/etcd",
    ]  # fmt: skip
    [sts] = by_kind(named, "StatefulSet")
    spec = sts["spec"]
    assert (spec["replicas"], spec["podManagementPolicy"]) == (3, "Parallel")
    [headless] = [s for s in by_kind(named, "Service") if s["metadata"]["name"] == "etcd"]
    assert spec["serviceName"] == "etcd" and headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is True
    [c] = spec["template"]["spec"]["containers"]
    assert c["image"] == "quay.io/coreos/etcd:v3.5.17" and c["command"] == ["/usr/local/bin/etcd"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"client": 2379, "peer": 2380}
    flags = dict(a.removeprefix("--").split("=", 1) for a in c["args"])
    assert len(flags) == len(c["args"])  # every argument is --flag=value, none twice
    members = [f"etcd-{i}" for i in range(spec["replicas"])]
    assert flags["initial-cluster"] == ",".join(
        f"{m}=http://{m}.{spec['serviceName']}:{ports['peer']}" for m in members
    )
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in c["env"]}
    assert env == {"POD_NAME": "metadata.name"} and flags["name"] == "$(POD_NAME)"
    assert flags["initial-advertise-peer-urls"] == f"http://$(POD_NAME).etcd:{ports['peer']}"
    assert flags["advertise-client-urls"] == f"http://$(POD_NAME).etcd:{ports['client']}"
    assert flags["listen-client-urls"] == f"http://0.0.0.0:{ports['client']}"
    assert flags["listen-peer-urls"] == f"http://0.0.0.0:{ports['peer']}"
    assert flags["initial-cluster-state"] == "new"
    [mount] = c["volumeMounts"]
    assert flags["data-dir"].startswith(mount["mountPath"] + "/")  # etcd makes it 0700 itself
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        http = c[probe]["httpGet"]
        assert http["port"] == ports["client"] and http["path"].startswith("/health"), probe
    assert c["readinessProbe"]["httpGet"]["path"] == "/health"  # ready: the cluster has a leader
    [pdb] = by_kind(named, "PodDisruptionBudget")
    assert selects(pdb["spec"]["selector"], spec["template"]["metadata"]["labels"])
    assert spec["replicas"] - pdb["spec"]["maxUnavailable"] > spec["replicas"] // 2  # quorum
    # The peer port admits the members (an overlay's NetworkPolicy patches leave it alone).
    [policy] = by_kind(named, "NetworkPolicy")
    assert {"from": [{"podSelector": {"matchLabels": spec["selector"]["matchLabels"]}}],
            "ports": [{"port": "peer"}]} in policy["spec"]["ingress"]  # fmt: skip
    known = subprocess.run([find_etcd(), "--help"], capture_output=True, text=True, timeout=30)
    help_text = known.stdout + known.stderr
    for flag in flags:
        assert re.search(rf"^\s+--{re.escape(flag)}\b", help_text, re.M), flag
