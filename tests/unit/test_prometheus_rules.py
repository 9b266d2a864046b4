"""The Prometheus files, checked by the real promtool: the rules and their tests
in deploy/k8s/monitoring/prometheus (the only copies; Kubernetes gets them as a
ConfigMap), the in-cluster scrape configuration there, and the local one in
deploy/prometheus parse, and every alerting and recording rule passes its unit
tests (firing and not firing)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy" / "k8s" / "monitoring" / "prometheus"


def promtool(*args: str, cwd: Path = DEPLOY) -> str:
    exe = shutil.which("promtool")
    if exe is None:
        pytest.fail(
            "promtool is not installed: apt-get install -y --no-install-recommends prometheus "
            "(make test and .ci/run do this when they can)"
        )
    result = subprocess.run([exe, *args], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout + result.stderr


def test_local_config_loads_the_shared_rules():
    out = promtool("check", "config", "prometheus.yml", cwd=REPO / "deploy" / "prometheus")
    assert "2 rule files found" in out


def test_in_cluster_config_and_rules_are_valid(tmp_path):
    """As the ConfigMaps are mounted: the configuration, and the rules under
    rules/. Debian's Prometheus 2.42 is built without Kubernetes discovery, so
    promtool checks everything else with each job's kubernetes_sd_configs
    swapped for a static target; the discovery stanza itself is checked for
    the fields Prometheus documents, and its relabelling against the rendered
    pods in test_k8s_manifests.py."""
    import yaml

    config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    assert config["rule_files"] == ["/etc/prometheus/rules/*.yml"]
    (tmp_path / "rules").mkdir()
    for rules in (DEPLOY / "rules").glob("*.yml"):
        (tmp_path / "rules" / rules.name).write_text(rules.read_text())
    config["rule_files"] = [str(tmp_path / "rules" / "*.yml")]
    for job in config["scrape_configs"]:
        for sd in job.pop("kubernetes_sd_configs"):
            assert set(sd) <= {"role", "namespaces", "selectors"} and sd["role"] == "pod"
            assert set(sd["namespaces"]) <= {"own_namespace", "names"}
            for selector in sd["selectors"]:
                assert set(selector) <= {"role", "label", "field"} and selector["role"] == "pod"
        job["static_configs"] = [{"targets": ["10.0.0.1:10913"]}]
    (tmp_path / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
    out = promtool("check", "config", "prometheus.yml", cwd=tmp_path)
    assert "2 rule files found" in out
    out = promtool("check", "config", "prometheus.yml", cwd=tmp_path)
    assert "2 rule files found" in out
    out = promtool("check", "rules", "rules/alerts.yml", "rules/recording.yml")
    assert "SUCCESS" in out


@pytest.mark.parametrize("test_file", ["alerts_test.yml", "recording_test.yml"])
def test_rule_unit_tests_pass(test_file):
    assert "SUCCESS" in promtool("test", "rules", test_file, cwd=DEPLOY / "tests")


def test_every_alert_has_a_firing_test():
    import yaml

    alerts = {
        rule["alert"]
        for group in yaml.safe_load((DEPLOY / "rules" / "alerts.yml").read_text())["groups"]
        for rule in group["rules"]
        if "alert" in rule
    }
    tests = yaml.safe_load((DEPLOY / "tests" / "alerts_test.yml").read_text())["tests"]
    fired = {
        case["alertname"]
        for test in tests
        for case in test["alert_rule_test"]
        if case.get("exp_alerts")
    }
    quiet = {
        case["alertname"]
        for test in tests
        for case in test["alert_rule_test"]
        if not case.get("exp_alerts")
    }
    assert alerts - fired == set(), "alerts without a firing test"
    assert alerts - quiet == set(), "alerts without a not-firing test"
