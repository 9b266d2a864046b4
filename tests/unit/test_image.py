"""The container image, checked without Docker (none runs here): everything
the Dockerfile copies exists and is not excluded by .dockerignore; the build
context leaves out venvs, data and cache directories and the generated gRPC
code, which the build stage generates itself (its commands are run here on
the context as Docker would send it); it runs as a numeric non-root user with
`ferry` as its entry point, and every `ferry` command a deployment runs
exists in the package."""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
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


def ignore_patterns() -> list[str]:
    lines = (REPO / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def _pattern_re(pattern: str) -> re.Pattern:
    out = ""
    for part in re.split(r"(\*\*/?|\*|\?)", pattern.strip("/")):
        if part.startswith("**"):
            out += "(?:.*/)?" if part.endswith("/") else ".*"
        elif part == "*":
            out += "[^/]*"
        elif part == "?":
            out += "[^/]"
        else:
            out += re.escape(part)
    return re.compile(out)


def docker_ignores(path: str, patterns: list[str]) -> bool:
    """Docker's rule: a path is left out of the build context when it or a
    directory above it matches a pattern (`*` within one path element, `**`
    across any); the last matching pattern decides (`!` brings a path back)."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    ignored = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        regex = _pattern_re(pattern.removeprefix("!"))
        if any(regex.fullmatch(prefix) for prefix in prefixes):
            ignored = not negated
    return ignored


def copied_sources() -> list[str]:
    return [
        source
        for line in DOCKERFILE.splitlines()
        if line.startswith("COPY ") and "--from=" not in line
        for source in line.split()[1:-1]
    ]


LEFT_OUT = [
    ".venv/bin/python", "var/broker-a/store/commitlog/0", ".cache/m2/repository/x.jar",
    ".tmp/x", "build/lib/ferry/model.py", "dist/ferry-0.1.0.whl", ".git/HEAD",
    ".pytest_cache/v/x", ".ruff_cache/x", ".mypy_cache/3.11/x.json", ".hypothesis/examples/x",
    "ferry/__pycache__/model.cpython-311.pyc", "services/broker/x.pyc", "ferry.egg-info/PKG-INFO",
    "chaos-report.jsonl", "ferry/v1/.stamp-proto", "ferry/v1/broker_pb2.py",
    "ferry/v1/broker_pb2_grpc.py", "ferry/v1/broker_pb2.pyi", "ferry/v1/broker_pb2_grpc.pyi",
    "apache/rocketmq/v2/service_pb2.py", "apache/rocketmq/v2/service_pb2_grpc.py",
    "apache/rocketmq/v2/definition_pb2.pyi", "apache/rocketmq/v2/definition_pb2_grpc.pyi",
]  # fmt: skip
KEPT = [
    "pyproject.toml", "README.md", "proto/ferry/v1/broker.proto",
    "proto/apache/rocketmq/v2/service.proto", "ferry/v1/__init__.py", "ferry/model.py",
    "apache/__init__.py", "apache/rocketmq/v2/__init__.py", "services/proxy/servicer.py",
]  # fmt: skip


def test_the_build_context_leaves_out_venvs_data_caches_and_generated_code():
    patterns = ignore_patterns()
    assert [p for p in LEFT_OUT if not docker_ignores(p, patterns)] == []
    assert [p for p in KEPT if docker_ignores(p, patterns)] == []


def test_nothing_git_ignores_under_the_copied_paths_reaches_the_context():
    """What git ignores (generated code, caches, run data) under what the
    Dockerfile copies is in .dockerignore too: the image is built from the
    repository's files, not from one machine's leftovers."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    listed = subprocess.run(
        ["git", "ls-files", "--others", "--ignored", "--exclude-standard", "--", *copied_sources()],
        capture_output=True, text=True, timeout=60, cwd=REPO, check=True,
    ).stdout.split()  # fmt: skip
    assert any("_pb2" in path for path in listed), "expected the generated code here (make proto)"
    patterns = ignore_patterns()
    assert [path for path in listed if not docker_ignores(path, patterns)] == []


def test_the_build_stage_generates_the_grpc_code_from_the_context(tmp_path):
    """The build stage's code generation, run here on the build context as
    Docker would send it (.dockerignore applied): every stub the packages
    import is made, and both packages import from the result alone."""
    build = DOCKERFILE.split("FROM python:3.11-slim AS build", 1)[1].split("\nFROM ", 1)[0]
    [run] = re.findall(r"^RUN (.*?)(?<!\\)$", build, re.M | re.S)
    steps = [" ".join(step.split()) for step in run.replace("\\\n", " ").split("&&")]
    assert steps[0].startswith("python -m pip install") and "grpcio-tools==" in steps[0]
    assert steps[-1].startswith("python -m pip wheel")
    make = (REPO / "Makefile").read_text()
    [make_sed] = re.findall(r"sed -i '([^']*)'", make)
    assert any(make_sed in step for step in steps), "the import rewrite differs from make proto"
    context = tmp_path / "context"
    patterns = ignore_patterns()
    for source in copied_sources():
        paths = [REPO / source] if (REPO / source).is_file() else (REPO / source).rglob("*")
        for path in paths:
            rel = path.relative_to(REPO).as_posix()
            if path.is_file() and not docker_ignores(rel, patterns):
                (context / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, context / rel)
    assert not list(context.rglob("*_pb2*.py")), "generated code in the build context"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    for step in steps[1:-1]:
        result = subprocess.run(
            step.replace("python ", f"{sys.executable} ", 1) if step.startswith("python ") else step,
            shell=True, cwd=context, capture_output=True, text=True, timeout=120, env=env,
        )  # fmt: skip
        assert result.returncode == 0, (step, result.stderr)
    for proto in (REPO / "proto").rglob("*.proto"):
        stem = proto.relative_to(REPO / "proto").with_suffix("")
        out = stem if stem.parts[0] == "ferry" else Path("apache/rocketmq/v2") / stem.name
        for suffix in ("_pb2.py", "_pb2_grpc.py"):
            assert (context / f"{out}{suffix}").is_file(), f"{out}{suffix}"
    check = subprocess.run(
        [sys.executable, "-I", "-c", "import sys; sys.path.insert(0, '.'); "
         "import ferry.v1.broker_pb2_grpc, ferry.v1.namesrv_pb2_grpc, "
         "apache.rocketmq.v2.service_pb2_grpc as a; print(ferry.v1.broker_pb2_grpc.__file__); "
         "print(a.__file__)"],
        cwd=context, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert check.returncode == 0, check.stderr
    assert all(f.startswith(str(context)) for f in check.stdout.split()), check.stdout


def test_non_root_user_and_entry_point():
    users = re.findall(r"^USER (\S+)", DOCKERFILE, re.M)
    assert users[-1] == "10001:10001" and users[users.index("root") - 1] == "10001:10001"
    runtime = DOCKERFILE.split("FROM python:3.11-slim AS runtime", 1)[1].split(" AS analytics")[0]
    assert re.search(r"^USER 10001:10001", runtime, re.M)
    assert 'ENTRYPOINT ["ferry"]' in runtime
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["ferry"] == "services.cli.main:main"
    # No compiler or grpcio-tools in the final stages: they only appear in the build stage.
    assert "grpcio-tools" not in runtime and "gcc" not in DOCKERFILE


def test_only_the_analytics_image_installs_spark():
    """The build stage makes the `spark` extra's wheels too; the runtime stage
    installs ferry without it and the analytics stage adds it, from wheels
    mounted rather than copied (so no layer of the runtime image holds PySpark)."""
    build = DOCKERFILE.split("FROM python:3.11-slim AS build", 1)[1].split("\nFROM ", 1)[0]
    runtime = DOCKERFILE.split("FROM python:3.11-slim AS runtime", 1)[1].split(" AS analytics")[0]
    analytics = DOCKERFILE.split("FROM runtime AS analytics", 1)[1]
    assert "pip wheel --no-cache-dir --wheel-dir /wheels '.[spark]'" in build
    commands = "\n".join(line for line in runtime.splitlines() if not line.startswith("#"))
    assert "ferry ferry-native" in commands and "spark" not in commands.lower()
    assert "COPY --from=build /wheels" not in DOCKERFILE
    assert "'ferry[spark]'" in analytics and "--mount=type=bind,from=build" in analytics


@pytest.mark.parametrize(
    "command",
    [["namesrv"], ["broker"], ["exporter"], ["analytics", "run"], ["analytics", "report"]],
)
def test_commands_a_deployment_runs_exist(command):
    result = subprocess.run(
        [sys.executable, "-m", "services.cli", *command, "--help"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "usage: ferry " + " ".join(command) in result.stdout
