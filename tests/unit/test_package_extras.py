"""What a plain install of ferry brings: the client and the servers, without
Spark. PySpark is the `spark` extra (the `ferry analytics` job alone imports
it), `dev` pulls it in for the tests, and `ferry analytics` on an install
without it names the extra to install."""

from __future__ import annotations

import ast
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# The one module that needs PySpark, and the command that imports it when run.
SPARK_JOB = ROOT / "ferry" / "pipeline" / "analytics.py"
SPARK_COMMAND = ROOT / "services" / "cli" / "pipeline_cmds.py"


def test_pyspark_is_an_extra_that_dev_includes():
    assert not [d for d in PROJECT["dependencies"] if d.lower().startswith("pyspark")]
    extras = PROJECT["optional-dependencies"]
    assert extras["spark"] == ["pyspark==4.3.0"]
    assert "ferry[spark]" in extras["dev"]


def _pyspark_imports(path: Path) -> list[tuple[int, bool]]:
    """(line, at module level) of each pyspark import in `path`."""
    tree = ast.parse(path.read_text(), str(path))
    top = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        if any(n == "pyspark" or n.startswith("pyspark.") for n in names):
            found.append((node.lineno, id(node) in top))
    return found


def test_only_the_spark_job_imports_pyspark_and_the_command_only_when_run():
    importers = {
        path: found
        for top in ("ferry", "services")
        for path in sorted((ROOT / top).rglob("*.py"))
        if (found := _pyspark_imports(path))
    }
    assert set(importers) <= {SPARK_JOB, SPARK_COMMAND}, sorted(map(str, importers))
    assert all(not at_top for _, at_top in importers.get(SPARK_COMMAND, []))


def test_ferry_analytics_without_pyspark_names_the_extra(monkeypatch, tmp_path, capsys):
    from services.cli.main import main

    monkeypatch.setitem(sys.modules, "pyspark", None)  # an install without the extra
    for name in [m for m in sys.modules if m.startswith("pyspark.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.delitem(sys.modules, "ferry.pipeline.analytics", raising=False)
    import ferry.pipeline

    monkeypatch.delattr(ferry.pipeline, "analytics", raising=False)
    assert main(["analytics", "report", "--out", str(tmp_path)]) == 1
    assert "pip install 'ferry[spark]'" in capsys.readouterr().err
