"""deploy/k8s, proven without a cluster: every kustomization renders with the
real `kubectl kustomize` and validates with `kubernetes-validate --strict`
against Kubernetes 1.29 and 1.33; selectors, ports, probes, volumes, PDBs and
security settings are checked on the rendered documents.

IN PROGRESS (issue #6): only the base with the name servers exists so far."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "k8s"
KUSTOMIZATIONS = sorted(p.parent for p in K8S.rglob("kustomization.yaml"))
SELECTOR_LABELS = {"app.kubernetes.io/name", "app.kubernetes.io/instance",
                   "app.kubernetes.io/component"}  # fmt: skip


def render(directory: Path) -> list[dict]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.fail("kubectl is not installed (it renders the kustomizations offline)")
    out = subprocess.run(
        [kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


@pytest.fixture(scope="module", params=KUSTOMIZATIONS, ids=lambda p: str(p.relative_to(K8S)))
def docs(request) -> list[dict]:
    return render(request.param)


@pytest.mark.parametrize("version", ["1.29.0", "1.33.0"])
def test_documents_validate_strictly(docs, version, tmp_path):
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


def test_selectors_and_labels(docs):
    for w in workloads(docs):
        selector = w["spec"]["selector"]["matchLabels"]
        assert set(selector) == SELECTOR_LABELS, w["metadata"]["name"]
        template = w["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= template.items()
        for key in ("part-of", "version", "managed-by"):
            assert f"app.kubernetes.io/{key}" in template
    pods = [w["spec"]["template"]["metadata"]["labels"] for w in workloads(docs)]
    for svc in (d for d in docs if d["kind"] == "Service"):
        assert any(svc["spec"]["selector"].items() <= p.items() for p in pods), svc["metadata"]


def test_service_ports_target_container_ports(docs):
    for svc in (d for d in docs if d["kind"] == "Service"):
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


def test_probes_security_and_storage(docs):
    pdb_selectors = [d["spec"]["selector"]["matchLabels"] for d in docs
                     if d["kind"] == "PodDisruptionBudget"]  # fmt: skip
    for w in workloads(docs):
        pod = w["spec"]["template"]["spec"]
        assert pod["automountServiceAccountToken"] is False
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] != 0
        for c in pod["containers"]:
            ports = {p["name"]: p["containerPort"] for p in c["ports"]}
            for probe in ("readinessProbe", "livenessProbe"):
                assert c[probe]["grpc"]["port"] == ports["grpc"], (c["name"], probe)
            assert c["securityContext"]["readOnlyRootFilesystem"] is True
            assert c["securityContext"]["allowPrivilegeEscalation"] is False
            # The command exists in the image (its entry point is `ferry`).
            help_run = subprocess.run(
                [sys.executable, "-m", "ferry.cli.main", c["args"][0], "--help"],
                capture_output=True, timeout=60,
            )  # fmt: skip
            assert help_run.returncode == 0, c["args"]
        if w["kind"] == "StatefulSet":
            assert w["spec"]["volumeClaimTemplates"], w["metadata"]["name"]
            labels = w["spec"]["template"]["metadata"]["labels"]
            assert any(sel.items() <= labels.items() for sel in pdb_selectors), w["metadata"][
                "name"
            ]


# What each kustomization must yield: broker -> (group, id, role).
SYNC = {
    "broker-a-master": ("broker-a", 0, "SYNC_MASTER"),
    "broker-a-slave": ("broker-a", 1, "SLAVE"),
    "broker-b-master": ("broker-b", 0, "SYNC_MASTER"),
    "broker-b-slave": ("broker-b", 1, "SLAVE"),
}
ASYNC = {**SYNC, "broker-a-master": ("broker-a", 0, "ASYNC_MASTER"),
         "broker-b-master": ("broker-b", 0, "ASYNC_MASTER")}  # fmt: skip
EXPECTED = {
    "base": SYNC,
    "2m-2s-sync": SYNC,
    "2m-2s-async": ASYNC,
    "2m-noslave": {k: v for k, v in ASYNC.items() if k.endswith("-master")},
}


def test_broker_confs_load_with_the_brokers_own_loader(docs, tmp_path, request):
    import re

    from services.broker.config import load_config

    expected = EXPECTED[request.node.callspec.params["docs"].name]
    maps = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
    brokers = [w for w in workloads(docs) if w["metadata"]["name"].startswith("broker-")]
    assert sorted(w["metadata"]["name"] for w in brokers) == sorted(expected)
    for w in brokers:
        name = w["metadata"]["name"]
        pod = w["spec"]["template"]["spec"]
        [container] = pod["containers"]
        [volume] = [v for v in pod["volumes"] if v["name"] == "config"]
        conf = maps[volume["configMap"]["name"]]["data"]["broker.conf"]
        path = tmp_path / f"{name}.conf"
        path.write_text(conf)
        args = container["args"]
        assert args[:3] == ["broker", "-c", "/etc/ferry/broker.conf"]
        env = {"POD_NAME": f"{name}-0", "HA_SECRET": "s3cret"}
        overrides = [re.sub(r"\$\((\w+)\)", lambda m, env=env: env[m.group(1)], a)
                     for a in args[4::2]]  # fmt: skip
        config, warnings = load_config(path, overrides)
        assert warnings == [], warnings
        cluster_group_id_role = (config.broker_name, config.broker_id, config.broker_role)
        assert cluster_group_id_role == expected[name]
        assert config.cluster_name == "DefaultCluster"
        assert config.broker_ip1 == f"{name}-0.{name}"
        assert config.ha_secret == "s3cret"
        assert list(config.namesrv_addrs) == [
            "ferry-namesrv-0.ferry-namesrv:9876",
            "ferry-namesrv-1.ferry-namesrv:9876",
        ]


def test_only_the_groups_slave_reaches_a_masters_ha_port(docs):
    pods = {w["metadata"]["name"]: w["spec"]["template"]["metadata"]["labels"]
            for w in workloads(docs)}  # fmt: skip
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    masters = [n for n in pods if n.startswith("broker-") and n.endswith("-master")]
    assert masters
    for master in masters:
        mine = [p for p in policies
                if p["spec"]["podSelector"]["matchLabels"].items() <= pods[master].items()]  # fmt: skip
        assert len(mine) == 1, master
        reaching_ha: set[str] = set()
        for rule in mine[0]["spec"]["ingress"]:
            ports = {p["port"] for p in rule.get("ports", [])}
            if "ha" not in ports and 10912 not in ports:
                continue
            assert rule.get("from"), f"{master}: the HA port is open to everyone"
            for peer in rule["from"]:
                assert set(peer) == {"podSelector"}, peer  # no namespace or IP blocks
                selector = peer["podSelector"]["matchLabels"]
                reaching_ha |= {
                    n for n, labels in pods.items() if selector.items() <= labels.items()
                }
        group_slave = master.removesuffix("-master") + "-slave"
        expected = {group_slave} if group_slave in pods else set()
        assert reaching_ha == expected, master
