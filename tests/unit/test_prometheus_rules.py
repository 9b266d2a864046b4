"""The Prometheus files under deploy/prometheus, checked by the real promtool:
the configuration and rule files parse, and every alerting and recording rule
passes its unit tests (firing and not firing)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"


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


def test_config_and_rules_are_valid():
    out = promtool("check", "config", "prometheus.yml")
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
