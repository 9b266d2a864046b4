"""The container image, checked without Docker (none runs here): everything
the Dockerfile copies exists and is not excluded by .dockerignore, it runs as a
numeric non-root user with `ferry` as its entry point, and every `ferry`
command a deployment runs exists in the package."""

from __future__ import annotations

import fnmatch
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = (REPO / "Dockerfile").read_text()


def test_copied_paths_exist_and_are_not_ignored():
    ignored = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    sources = []
    for line in DOCKERFILE.splitlines():
        if line.startswith("COPY ") and "--from=" not in line:
            sources += line.split()[1:-1]
    assert sources, "no COPY lines found"
    for source in sources:
        assert (REPO / source).exists(), source
        assert not any(fnmatch.fnmatch(source, pattern) for pattern in ignored), source


def test_non_root_user_and_entry_point():
    users = re.findall(r"^USER (\S+)", DOCKERFILE, re.M)
    assert users[-1] == "10001:10001" and users[users.index("root") - 1] == "10001:10001"
    runtime = DOCKERFILE.split("FROM python:3.11-slim AS runtime", 1)[1].split(" AS analytics")[0]
    assert re.search(r"^USER 10001:10001", runtime, re.M)
    assert 'ENTRYPOINT ["ferry"]' in runtime
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["ferry"] == "ferry.cli.main:main"
    # No compiler or grpcio-tools in the final stages: they only appear in the build stage.
    assert "grpcio-tools" not in runtime and "gcc" not in DOCKERFILE


@pytest.mark.parametrize(
    "command",
    [["namesrv"], ["broker"], ["exporter"], ["analytics", "run"], ["analytics", "report"]],
)
def test_commands_a_deployment_runs_exist(command):
    result = subprocess.run(
        [sys.executable, "-m", "ferry.cli.main", *command, "--help"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "usage: ferry " + " ".join(command) in result.stdout
