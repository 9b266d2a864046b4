"""The reference pages under docs/reference/ stay complete: every broker.conf
key (with the default the broker really uses), every metric the code declares
and every `ferry` command, subcommand and option is documented, the
README and docs/ link only to files that exist in the repository, and the
code cites those docs rather than a spec file kept outside it.

Each check is a function that returns what is missing, so the last tests can
show that it does fail when an entry is taken out. Nothing here imports the
broker's store or HA code (services/broker is being split into packages): the
metrics are found by reading the source, not by importing it.
"""

from __future__ import annotations

import argparse
import ast
import math
import re
from pathlib import Path

import pytest

from services.broker.config import KNOWN_KEYS, BrokerConfig
from services.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
BROKER_CONFIG_MD = DOCS / "reference" / "broker-config.md"
METRICS_MD = DOCS / "reference" / "metrics.md"
CLI_MD = DOCS / "reference" / "cli.md"

METRIC_NAME = re.compile(r"ferry_[a-z0-9_]+")
COUNTER_DECLARATIONS = {"Counter", "CounterMetricFamily", "_counter"}
GENERATED = {ROOT / "ferry" / "v1"}


# ---------------------------------------------------------------- broker.conf


def config_rows(text: str) -> dict[str, str]:
    """`| `key` ... | default cell | meaning |` rows of the broker.conf page."""
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and (m := re.fullmatch(r"`([A-Za-z0-9]+)`(?: \*ferry\*)?", cells[0])):
            rows[m.group(1)] = cells[1]
    return rows


def _same(a: object, b: object) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return math.isclose(float(a), float(b), rel_tol=1e-9)  # type: ignore[arg-type]
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def broker_config_problems(text: str) -> list[str]:
    """Keys missing from the page, and defaults that the broker's own parser
    does not read back as the default `BrokerConfig` has."""
    rows = config_rows(text)
    defaults = BrokerConfig()
    problems = []
    for key, (field_name, parse, _) in KNOWN_KEYS.items():
        if key not in rows:
            problems.append(f"{key}: not documented")
            continue
        cell, default = rows[key], getattr(defaults, field_name)
        if cell.startswith("(empty)"):
            if default:
                problems.append(f"{key}: documented as empty, but the default is {default!r}")
            continue
        value = re.match(r"`([^`]*)`", cell)
        if value is None:
            problems.append(f"{key}: the default cell {cell!r} has no `value`")
            continue
        parsed = parse(key, value.group(1))
        if not _same(parsed, default):
            problems.append(
                f"{key}: documented default {value.group(1)!r} reads as {parsed!r}, "
                f"the broker's default is {default!r}"
            )
    return problems


def test_every_broker_conf_key_is_documented_with_the_default_the_broker_uses():
    assert len(KNOWN_KEYS) > 50  # the table really was found
    assert broker_config_problems(BROKER_CONFIG_MD.read_text()) == []


# ---------------------------------------------------------------- metrics


def _called_name(call: ast.Call) -> str:
    func = call.func
    return func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")


def declared_metrics() -> dict[str, str]:
    """Every `ferry_*` string literal in services/ and ferry/ (generated code
    aside), as Prometheus exposes it: a counter (declared with `Counter`,
    `CounterMetricFamily`, or a helper given `Counter`) gets its `_total`."""
    names: dict[str, str] = {}
    for base in (ROOT / "services", ROOT / "ferry"):
        for path in sorted(base.rglob("*.py")):
            if any(g in path.parents for g in GENERATED):
                continue
            tree = ast.parse(path.read_text(), str(path))
            parent = {c: n for n in ast.walk(tree) for c in ast.iter_child_nodes(n)}
            for node in ast.walk(tree):
                if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
                    continue
                if not METRIC_NAME.fullmatch(node.value):
                    continue
                call = parent.get(node)
                counter = isinstance(call, ast.Call) and (
                    _called_name(call) in COUNTER_DECLARATIONS
                    or any(isinstance(a, ast.Name) and a.id == "Counter" for a in call.args)
                )
                name = node.value
                if counter and not name.endswith("_total"):
                    name += "_total"
                names.setdefault(name, str(path.relative_to(ROOT)))
    return names


def _documented(name: str, text: str) -> bool:
    return re.search(rf"`{re.escape(name)}(?:\{{[^`]*\}})?`", text) is not None


def undocumented_metrics(text: str, names: dict[str, str]) -> list[str]:
    return sorted(f"{n} ({where})" for n, where in names.items() if not _documented(n, text))


def test_the_metric_scan_finds_the_metrics_the_code_declares():
    names = declared_metrics()
    assert len(names) >= 45
    for expected in (
        "ferry_broker_put_messages_total",  # Counter
        "ferry_store_deleted_files_total",  # CounterMetricFamily
        "ferry_ha_failovers_total",  # series(Counter, ...), named with _total
        "ferry_grpc_late_answers_total",  # ferry/runtime
        "ferry_namesrv_live_brokers",
        "ferry_proxy_streams_open",
        "ferry_ha_replication_lag_bytes",
    ):
        assert expected in names
    assert "ferry_broker_put_messages" not in names


def test_every_metric_is_documented():
    assert undocumented_metrics(METRICS_MD.read_text(), declared_metrics()) == []


# ---------------------------------------------------------------- CLI


def cli_commands() -> dict[str, list[str]]:
    """`ferry X [Y]` -> its documented options (long form; --help and hidden
    options aside), walked from the parser the `ferry` command runs."""
    found: dict[str, list[str]] = {}

    def walk(parser: argparse.ArgumentParser, path: list[str]) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    command = [*path, name]
                    found[" ".join(command)] = [
                        next(
                            (o for o in a.option_strings if o.startswith("--")), a.option_strings[0]
                        )
                        for a in sub._actions
                        if a.option_strings
                        and "--help" not in a.option_strings
                        and a.help != argparse.SUPPRESS
                    ]
                    walk(sub, command)

    walk(build_parser(), ["ferry"])
    return found


def cli_sections(text: str) -> dict[str, str]:
    parts = re.split(r"^## `(ferry[^`]*)`\s*$", text, flags=re.M)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def cli_problems(text: str, commands: dict[str, list[str]]) -> list[str]:
    sections = cli_sections(text)
    problems = []
    for command, options in commands.items():
        section = sections.get(command)
        if section is None:
            problems.append(f"{command}: no section '## `{command}`'")
            continue
        problems += [
            f"{command} {option}: not documented"
            for option in options
            if not re.search(rf"`{re.escape(option)}`", section)
        ]
    return problems


def test_the_parser_walk_finds_commands_subcommands_and_options():
    commands = cli_commands()
    for expected in (
        "ferry send",
        "ferry topic create",
        "ferry kv put",
        "ferry store clean",
        "ferry analytics run",
        "ferry dev",
        "ferry namesrv",
        "ferry proxy",
    ):
        assert expected in commands
    assert "--delay-ms" in commands["ferry send"]
    assert "--help" not in commands["ferry send"]


def test_every_cli_command_subcommand_and_option_is_documented():
    assert cli_problems(CLI_MD.read_text(), cli_commands()) == []


# ---------------------------------------------------------------- citations


SPEC_CITATION = "SPEC §"  # a section of the product spec, which is not in the repository
CITING_DIRS = ("services", "ferry", "proto", "benchmarks", "deploy")


def spec_citations(root: Path) -> list[str]:
    """`path:line` of every "SPEC §x.y" under `root`'s code, protos, benchmarks
    and deployment files (generated code and bytecode aside). The spec is not in
    the repository, so such a citation points nowhere a reader can open: cite
    the page under docs/ (and its heading) that says the same thing."""
    generated = {root / g.relative_to(ROOT) for g in GENERATED}
    found = []
    for base in CITING_DIRS:
        for path in sorted((root / base).rglob("*")):
            if not path.is_file() or "__pycache__" in path.parts:
                continue
            if any(g in path.parents for g in generated):
                continue
            try:
                text = path.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                continue  # not text
            found += [
                f"{path.relative_to(root)}:{number}"
                for number, line in enumerate(text.splitlines(), 1)
                if SPEC_CITATION in line
            ]
    return found


def test_the_code_cites_docs_not_the_spec_file():
    assert spec_citations(ROOT) == []


# ---------------------------------------------------------------- the checks can fail


def _drop_lines(text: str, needle: str) -> str:
    kept = [line for line in text.splitlines() if needle not in line]
    assert len(kept) < len(text.splitlines()), needle
    return "\n".join(kept)


def test_a_missing_or_wrong_broker_conf_row_is_caught():
    text = BROKER_CONFIG_MD.read_text()
    assert broker_config_problems(_drop_lines(text, "| `slaveTimeout` |")) == [
        "slaveTimeout: not documented"
    ]
    wrong = text.replace("| `slaveTimeout` | `3000`", "| `slaveTimeout` | `2000`")
    assert [p.split(":")[0] for p in broker_config_problems(wrong)] == ["slaveTimeout"]


def test_a_missing_metric_is_caught_and_a_longer_name_does_not_hide_it():
    names = declared_metrics()
    text = METRICS_MD.read_text()
    assert undocumented_metrics(_drop_lines(text, "`ferry_ha_leader`"), names) == [
        "ferry_ha_leader (services/broker/failover/metrics.py)"
    ]  # `ferry_ha_leader_changes_total` is still there, and does not count
    no_total = text.replace("`ferry_pop_dead_letters_total`", "`ferry_pop_dead_letters`")
    assert [m.split()[0] for m in undocumented_metrics(no_total, names)] == [
        "ferry_pop_dead_letters_total"
    ]


def test_a_missing_command_or_option_is_caught():
    commands = cli_commands()
    text = CLI_MD.read_text()
    assert "ferry store clean: no section '## `ferry store clean`'" in cli_problems(
        text.replace("## `ferry store clean`", "## ferry store clean"), commands
    )
    assert cli_problems(_drop_lines(text, "`--delay-ms`"), commands) == [
        "ferry send --delay-ms: not documented"
    ]


def test_a_spec_citation_is_caught_outside_generated_code(tmp_path):
    for name, text in {
        "services/ha/master.py": '"""The HA master (SPEC §3.1)."""\n',
        "deploy/rules.yml": "# groups:\n# over the metrics (SPEC §6)\n",
        "ferry/v1/ha_pb2.py": "# HA (SPEC §3)\n",  # generated: regenerated from proto/
        "ferry/__pycache__/record.cpython-311.pyc": "SPEC §4.2",
        "benchmarks/drains.py": "consume SPEC_JSON\n",  # not a citation
        "tests/unit/test_x.py": "# SPEC §1\n",  # tests are not scanned
    }.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert spec_citations(tmp_path) == ["services/ha/master.py:1", "deploy/rules.yml:2"]


# ---------------------------------------------------------------- links


LINK = re.compile(r"\]\(([^)\s]+)\)")


def broken_links(path: Path) -> list[str]:
    """Relative links that do not name a file or folder in the repository."""
    problems = []
    fence = False
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            fence = not fence
        if fence:
            continue
        for target in LINK.findall(line):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            file_part = target.split("#", 1)[0]
            resolved = (path.parent / file_part).resolve()
            if not resolved.exists() or ROOT not in (resolved, *resolved.parents):
                problems.append(f"{path.relative_to(ROOT)}:{number}: {target}")
    return problems


DOC_FILES = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


@pytest.mark.parametrize("path", DOC_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_link_only_to_files_in_the_repository(path):
    assert broken_links(path) == []
    assert "shared/SPEC.md" not in path.read_text()


def test_the_readme_is_a_front_door():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    for command in ("make run", "make test"):
        assert command in text
