"""The pages that used to go stale stay true to the code and the tree:

- the services each process serves (`docs/reference/contract.md`, "Processes and
  ports"), every `ferry.v1` service and RPC with a section there, and every
  `grpcurl ... list` transcript in the README and docs/, against what the
  processes register (found by reading services/, not by importing it) and the
  services proto/ declares;
- the request codes of `docs/reference/remoting.md` against the handler tables of
  the name server and the broker (dict literals keyed by `codes.X` under
  services/namesrv/ and services/broker/) and the numbers in ferry/remoting/codes.py;
- the package map of `docs/concepts.md` against the packages under services/ and
  ferry/, and its table of the rest of the repository against the top-level folders;
- no committed text file names a path of a development machine, and no code or
  configuration cites a Markdown file that is not in the repository.

Each check returns what is wrong, so the last tests show that it does fail.
"""

from __future__ import annotations

import ast
import fnmatch
import functools
import re
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
CONTRACT_MD = DOCS / "reference" / "contract.md"
REMOTING_MD = DOCS / "reference" / "remoting.md"
CONCEPTS_MD = DOCS / "concepts.md"
CODES_PY = ROOT / "ferry" / "remoting" / "codes.py"
DOC_FILES = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
CODE_ROOTS = ("services", "ferry")
GENERATED = {ROOT / "ferry" / "v1"}
# What ferry.runtime.server registers beside a process's own services.
HEALTH = "grpc.health.v1.Health"
REFLECTION = "grpc.reflection.v1alpha.ServerReflection"
OWN_PACKAGE = "ferry.v1"


def _python_files(base: Path) -> Iterable[Path]:
    for path in sorted(base.rglob("*.py")):
        if "__pycache__" in path.parts or any(g in path.parents for g in GENERATED):
            continue
        yield path


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


# ---------------------------------------------------------------- gRPC services


def proto_services(root: Path = ROOT) -> dict[str, str]:
    """`service X` of every .proto under proto/ -> its full name (`package.X`)."""
    found = {}
    for path in sorted((root / "proto").rglob("*.proto")):
        text = path.read_text()
        package = re.search(r"^package\s+([\w.]+)\s*;", text, flags=re.M)
        for name in re.findall(r"^service\s+(\w+)\s*\{", text, flags=re.M):
            found[name] = f"{package.group(1)}.{name}" if package else name
    return found


def proto_rpcs(root: Path = ROOT) -> dict[str, list[str]]:
    """Full service name -> its RPCs, from the .proto files."""
    rpcs: dict[str, list[str]] = {}
    for path in sorted((root / "proto").rglob("*.proto")):
        text = path.read_text()
        package = re.search(r"^package\s+([\w.]+)\s*;", text, flags=re.M)
        for name, body in re.findall(r"^service\s+(\w+)\s*\{(.*?)^\}", text, flags=re.M | re.S):
            full = f"{package.group(1)}.{name}" if package else name
            rpcs[full] = re.findall(r"^\s*rpc\s+(\w+)\s*\(", body, flags=re.M)
    return rpcs


@functools.cache
def served_services(process: str, root: Path = ROOT) -> frozenset[str]:
    """The gRPC services `services/<process>/` registers: every
    `..._pb2.DESCRIPTOR.services_by_name["X"]` in its tree, as a full name."""
    names = proto_services(root)
    found = set()
    for path in _python_files(root / "services" / process):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Subscript)
                and isinstance(node.value, ast.Attribute)
                and node.value.attr == "services_by_name"
                and isinstance(node.slice, ast.Constant)
                and node.slice.value in names
            ):
                found.add(names[node.slice.value])
    return frozenset(found)


def serving_processes(root: Path = ROOT) -> dict[str, frozenset[str]]:
    """`services/<process>` (one with a `__main__.py`) -> the services it serves."""
    return {
        main.parent.name: served
        for main in sorted((root / "services").glob("*/__main__.py"))
        if (served := served_services(main.parent.name, root))
    }


def contract_process_rows(text: str) -> dict[str, str]:
    """`python -m services.X` of the "Processes and ports" table -> its row."""
    rows = {}
    for line in text.splitlines():
        if line.startswith("|") and (m := re.search(r"python -m services\.(\w+)", line)):
            rows[m.group(1)] = line
    return rows


def contract_service_problems(text: str, processes: dict[str, frozenset[str]]) -> list[str]:
    rows = contract_process_rows(text)
    problems = []
    for process, services in processes.items():
        row = rows.get(process)
        if row is None:
            problems.append(f"services.{process}: no row with `python -m services.{process}`")
            continue
        serves = _cells(row)[-1]
        problems += [
            f"services.{process}: {service} not in its Serves cell"
            for service in sorted(services)
            if f"`{service}`" not in serves
        ]
    problems += [f"services.{p}: a row, but it serves no gRPC" for p in rows if p not in processes]
    return problems


def contract_rpc_problems(text: str, rpcs: dict[str, list[str]]) -> list[str]:
    """Every ferry.v1 service has a `### ` section naming it, and every one of
    its RPCs appears in a section that names the service."""
    parts = re.split(r"^(### .*)$", text, flags=re.M)
    sections = [(parts[i], parts[i + 1]) for i in range(1, len(parts) - 1, 2)]
    problems = []
    for service, names in sorted(rpcs.items()):
        if not service.startswith(OWN_PACKAGE + "."):
            continue
        mine = [body for heading, body in sections if f"`{service}`" in heading]
        if not mine:
            problems.append(f"{service}: no '### `{service}`' section")
            continue
        problems += [
            f"{service}/{rpc}: not in its section"
            for rpc in names
            if not any(re.search(rf"`(?:\w+/)?{rpc}`", body) for body in mine)
        ]
    return problems


def test_the_service_scan_finds_what_the_processes_serve():
    processes = serving_processes()
    assert {"ferry.v1.NameServer"} == processes["namesrv"]
    assert {"ferry.v1.Broker", "ferry.v1.Transactions", "ferry.v1.HAAdmin"} <= processes["broker"]
    assert "apache.rocketmq.v2.MessagingService" in processes["proxy"]
    assert "SendMessage" in proto_rpcs()["ferry.v1.Broker"]


def test_the_contract_lists_every_service_each_process_serves():
    assert contract_service_problems(CONTRACT_MD.read_text(), serving_processes()) == []


def test_the_contract_has_a_section_for_every_ferry_v1_service_and_rpc():
    assert contract_rpc_problems(CONTRACT_MD.read_text(), proto_rpcs()) == []


def grpcurl_lists(path: Path) -> list[tuple[int, str, list[str]]]:
    """(line, command, output) of every `$ ... grpcurl ... list` in a fenced block."""
    found = []
    lines = path.read_text().splitlines()
    fence = False
    for number, line in enumerate(lines, 1):
        if line.lstrip().startswith("```"):
            fence = not fence
            continue
        if not (fence and line.startswith("$ ") and "grpcurl" in line):
            continue
        if not re.search(r"\slist\s*$", line):
            continue
        output = []
        for following in lines[number:]:
            if following.startswith("$ ") or following.lstrip().startswith("```"):
                break
            output.append(following.strip())
        found.append((number, line, output))
    return found


def transcript_problems(output: list[str], processes: dict[str, frozenset[str]]) -> str | None:
    """What is wrong with one `grpcurl list` output: it must be one process's
    services (its ferry.v1 ones all there; the rest, such as a broker's local
    proxy, optional), with health and reflection, sorted as grpcurl prints."""
    listed = set(output)
    owners = [p for p, services in processes.items() if listed & services]
    if not owners:
        return f"names no service a process serves: {output}"
    best = min(owners, key=lambda p: len(processes[p] ^ listed))
    served = processes[best]
    required = {s for s in served if s.startswith(OWN_PACKAGE + ".")} or served
    required |= {HEALTH, REFLECTION}
    missing = sorted(required - listed)
    extra = sorted(listed - served - {HEALTH, REFLECTION})
    if missing or extra or output != sorted(output):
        return f"as services.{best}: missing {missing}, not served {extra}, listed {output}"
    return None


@pytest.mark.parametrize(
    "path",
    [p for p in DOC_FILES if grpcurl_lists(p)],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_every_grpcurl_list_transcript_shows_what_the_process_serves(path):
    processes = serving_processes()
    problems = [
        f"{path.relative_to(ROOT)}:{number}: {problem}"
        for number, _, output in grpcurl_lists(path)
        if (problem := transcript_problems(output, processes))
    ]
    assert problems == []


def test_the_transcript_scan_finds_the_transcripts():
    found = {p.relative_to(ROOT).as_posix() for p in DOC_FILES if grpcurl_lists(p)}
    assert {"README.md", "docs/guides/name-server.md", "docs/guides/security.md"} <= found


# ---------------------------------------------------------------- request codes


def request_codes(path: Path = CODES_PY) -> dict[str, int]:
    """The request codes of ferry/remoting/codes.py (the block before "responses")."""
    text = path.read_text()
    requests = re.split(r"^# -+ responses$", text, maxsplit=1, flags=re.M)[0]
    return {n: int(v) for n, v in re.findall(r"^([A-Z][A-Z0-9_]*) = (\d+)$", requests, flags=re.M)}


def _codes_attributes(node: ast.AST) -> list[str]:
    return [
        n.attr
        for n in ast.walk(node)
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "codes"
    ]


@functools.cache
def handled_codes(side: str, root: Path = ROOT) -> tuple[frozenset[str], frozenset[str]]:
    """(served, referenced) request codes of `services/<side>/`: the keys of its
    handler tables (dict literals keyed by `codes.X`), and every `codes.X` it
    names at all (such as the check-backs a broker sends its producers)."""
    names = set(request_codes(root / CODES_PY.relative_to(ROOT)))
    served: set[str] = set()
    referenced: set[str] = set()
    for path in _python_files(root / "services" / side):
        tree = ast.parse(path.read_text(), str(path))
        referenced |= set(_codes_attributes(tree)) & names
        for node in ast.walk(tree):
            if isinstance(node, ast.Dict) and node.keys:
                keys = [_codes_attributes(k) for k in node.keys if k is not None]
                if len(keys) == len(node.keys) and all(len(k) == 1 for k in keys):
                    served |= {k[0] for k in keys} & names
    return frozenset(served), frozenset(referenced)


REMOTING_SIDES = {"Name server": "namesrv", "Broker": "broker"}


def documented_codes(text: str) -> dict[str, list[tuple[int, str]]]:
    """Side -> (number, NAME) pairs its `## ` sections of remoting.md document:
    rows `| n | NAME |` and `| n, m | A, B |`, rows `| n NAME | ...`, and
    headings `### ...: n NAME, m NAME`."""
    found: dict[str, list[tuple[int, str]]] = {side: [] for side in REMOTING_SIDES.values()}
    parts = re.split(r"^## (.*)$", text, flags=re.M)
    for heading, body in zip(parts[1::2], parts[2::2], strict=True):
        side = next((s for h, s in REMOTING_SIDES.items() if heading.startswith(h)), None)
        if side is None:
            continue
        for line in body.splitlines():
            if line.startswith("### "):
                found[side] += [
                    (int(n), c) for n, c in re.findall(r"(\d+) ([A-Z][A-Z0-9_]+)", line)
                ]
            elif line.startswith("|"):
                cells = _cells(line)
                if len(cells) < 2:
                    continue
                if re.fullmatch(r"\d+(?:, \d+)*", cells[0]) and re.fullmatch(
                    r"[A-Z][A-Z0-9_]*(?:, [A-Z][A-Z0-9_]*)*", cells[1]
                ):
                    numbers, names = cells[0].split(", "), cells[1].split(", ")
                    found[side] += [(int(n), c) for n, c in zip(numbers, names, strict=False)]
                elif m := re.fullmatch(r"(\d+) ([A-Z][A-Z0-9_]+)", cells[0]):
                    found[side].append((int(m.group(1)), m.group(2)))
    return found


def remoting_problems(text: str, root: Path = ROOT) -> list[str]:
    codes = request_codes(root / CODES_PY.relative_to(ROOT))
    documented = documented_codes(text)
    problems = []
    for side, pairs in documented.items():
        served, referenced = handled_codes(side, root)
        named = {name for _, name in pairs}
        problems += [
            f"{side}: {codes[c]} {c} is served but not documented" for c in sorted(served - named)
        ]
        for number, name in pairs:
            if name not in codes:
                continue  # a response code (0 SUCCESS, 19 NOT_FOUND ...)
            if codes[name] != number:
                problems.append(f"{side}: {number} {name} documented, codes.py says {codes[name]}")
            if name not in referenced:
                problems.append(
                    f"{side}: {number} {name} documented, but services/{side} has no use of it"
                )
    return problems


def test_the_handler_scan_finds_the_tables_the_servers_serve():
    served, referenced = handled_codes("broker")
    assert {"SEND_MESSAGE", "PULL_MESSAGE", "END_TRANSACTION", "GET_CONSUME_STATS"} <= served
    assert "CHECK_TRANSACTION_STATE" in referenced - served  # the broker sends it
    served, _ = handled_codes("namesrv")
    assert {"REGISTER_BROKER", "GET_ROUTEINFO_BY_TOPIC", "QUERY_DATA_VERSION"} <= served
    assert "SEND_MESSAGE" not in served


def test_remoting_md_documents_exactly_the_request_codes_served():
    assert remoting_problems(REMOTING_MD.read_text()) == []


# ---------------------------------------------------------------- package map


def code_packages(root: Path = ROOT) -> set[str]:
    """`services/...`/`ferry/...` folders with an `__init__.py` and at least one
    other module: the packages that need a row (services/ itself holds none)."""
    found = set()
    for base in CODE_ROOTS:
        for init in (root / base).rglob("__init__.py"):
            folder = init.parent
            if "__pycache__" in folder.parts:
                continue
            if any(p.name != "__init__.py" for p in folder.glob("*.py")):
                found.add(folder.relative_to(root).as_posix() + "/")
    return found


def _table_after(text: str, heading: str) -> list[list[str]]:
    section = text.split(heading, 1)[1]
    rows = []
    for line in section.splitlines()[1:]:
        if line.startswith("## "):
            break
        if line.startswith("|") and not line.startswith("|---"):
            rows.append(_cells(line))
    return rows[1:]  # the header


def package_map_problems(text: str, root: Path = ROOT) -> list[str]:
    """Packages with no row in "## Package map", and first-cell paths (`dir/`,
    `dir/file.py`, or a bare `file.py` beside the path before it) that do not exist."""
    named: set[str] = set()
    problems = []
    for cells in _table_after(text, "## Package map"):
        folder = ""
        for token in re.findall(r"`([^`]+)`", cells[0]):
            path = token if token.startswith(tuple(b + "/" for b in CODE_ROOTS)) else folder + token
            folder = path if path.endswith("/") else path.rsplit("/", 1)[0] + "/"
            named.add(folder)
            if not (root / path).exists():
                problems.append(f"row {cells[0]!r}: {path} does not exist")
    problems += [f"{p}: no row" for p in sorted(code_packages(root) - named)]
    return problems


def top_level_folders(root: Path = ROOT) -> set[str]:
    """Folders at the top of the repository, hidden and git-ignored ones aside."""
    ignored = [
        line.strip().rstrip("/")
        for line in (root / ".gitignore").read_text().splitlines()
        if line.strip() and not line.startswith("#") and "/" not in line.strip().rstrip("/")
    ]
    return {
        p.name + "/"
        for p in root.iterdir()
        if p.is_dir()
        and not p.name.startswith(".")
        and not any(fnmatch.fnmatch(p.name, pattern) for pattern in ignored)
    }


def rest_of_repository_problems(text: str, root: Path = ROOT) -> list[str]:
    """Top-level folders with no row in "## The rest of the repository" (the
    code packages have theirs in the package map), and rows naming none."""
    rows = {
        token
        for cells in _table_after(text, "## The rest of the repository")
        for token in re.findall(r"`([^`]+/)`", cells[0])
    }
    expected = top_level_folders(root) - {b + "/" for b in CODE_ROOTS}
    problems = [f"{f}: no row" for f in sorted(expected - rows)]
    problems += [f"{f}: a row, but no such folder" for f in sorted(rows - top_level_folders(root))]
    return problems


def test_the_package_scan_finds_the_rooms():
    packages = code_packages()
    for expected in ("ferry/", "ferry/runtime/", "services/broker/", "services/broker/store/"):
        assert expected in packages
    assert "services/" not in packages  # only packages
    assert {"docs/", "tests/", "proto/"} <= top_level_folders()
    assert "var/" not in top_level_folders()


def test_the_package_map_has_a_row_for_every_package_and_names_only_real_paths():
    assert package_map_problems(CONCEPTS_MD.read_text()) == []


def test_the_rest_of_the_repository_has_a_row_for_every_top_level_folder():
    assert rest_of_repository_problems(CONCEPTS_MD.read_text()) == []


# ---------------------------------------------------------------- machine paths


# A path that only exists on one machine: a home or work directory, or a
# temporary directory a tool made (pytest's, tempfile's, a benchmark's). Paths
# a page tells the reader to make (`/tmp/tlsdemo`) are examples, not these.
MACHINE_PATH = re.compile(
    r"(?<![\w./~-])/(?:work|root|home/\w+|Users/\w+)/"
    r"|/tmp/(?:pytest-of-|tmp[a-z0-9_]{8}\b|ferry-bench-)"
)


def committed_text_files(root: Path = ROOT) -> list[Path]:
    if shutil.which("git") is None or not (root / ".git").exists():
        pytest.skip("not a git checkout")
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True
    ).stdout.decode()
    return [root / name for name in listed.split("\0") if name and (root / name).is_file()]


def machine_paths(files: Iterable[Path], root: Path = ROOT) -> list[str]:
    found = []
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # not text
        found += [
            f"{path.relative_to(root)}:{number}: {m.group(0)}"
            for number, line in enumerate(text.splitlines(), 1)
            for m in MACHINE_PATH.finditer(line)
        ]
    return found


def test_no_committed_file_names_a_path_of_a_development_machine():
    assert machine_paths(committed_text_files()) == []


# ---------------------------------------------------------------- citations of Markdown files


MARKDOWN_NAME = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*[\w-]+\.md)\b")


def missing_markdown_citations(files: Iterable[Path], root: Path = ROOT) -> list[str]:
    """`NAME.md` cited in code, configuration and scripts that is no Markdown
    file of the repository (by its path from the root or the citing file, or by
    its file name). The docs tests, which build such names, are not scanned."""
    files = list(files)
    markdown = {p.relative_to(root).as_posix() for p in files if p.suffix == ".md"}
    basenames = {m.rsplit("/", 1)[-1] for m in markdown}
    found = []
    for path in files:
        if path.suffix == ".md" or path.name.startswith("test_docs_"):
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            for name in MARKDOWN_NAME.findall(line):
                beside = (path.parent / name).resolve()
                if name in markdown or name.rsplit("/", 1)[-1] in basenames and "/" not in name:
                    continue
                if beside.exists() and root in beside.parents:
                    continue
                found.append(f"{path.relative_to(root)}:{number}: {name}")
    return found


def test_code_and_configuration_cite_only_markdown_files_in_the_repository():
    assert missing_markdown_citations(committed_text_files()) == []


# ---------------------------------------------------------------- the checks can fail


def _drop_lines(text: str, needle: str) -> str:
    kept = [line for line in text.splitlines() if needle not in line]
    assert len(kept) < len(text.splitlines()), needle
    return "\n".join(kept)


def test_a_service_missing_from_the_contract_is_caught():
    text = CONTRACT_MD.read_text()
    without = text.replace(", `ferry.v1.Transactions`;", ";", 1)
    assert without != text
    assert contract_service_problems(without, serving_processes()) == [
        "services.broker: ferry.v1.Transactions not in its Serves cell"
    ]
    no_rpc = text.replace("| `WatchTransactionChecks` |", "| `WatchChecks` |")
    assert contract_rpc_problems(no_rpc, proto_rpcs()) == [
        "ferry.v1.Transactions/WatchTransactionChecks: not in its section"
    ]


def test_a_stale_grpcurl_transcript_is_caught():
    processes = serving_processes()
    old_broker = [
        "ferry.v1.Broker",
        "ferry.v1.BrokerAdmin",
        "ferry.v1.HAAdmin",
        "ferry.v1.SlaveSync",
        HEALTH,
        REFLECTION,
    ]
    problem = transcript_problems(old_broker, processes)
    assert problem is not None and "missing ['ferry.v1.Transactions']" in problem
    with_proxy = sorted(
        [*old_broker, "ferry.v1.Transactions", "apache.rocketmq.v2.MessagingService"]
    )
    assert transcript_problems(with_proxy, processes) is None  # a broker in local proxy mode
    assert transcript_problems([HEALTH, "ferry.v1.NameServer", REFLECTION], processes)  # unsorted


def test_a_missing_or_unserved_request_code_is_caught():
    text = REMOTING_MD.read_text()
    assert remoting_problems(_drop_lines(text, "| 322 | QUERY_DATA_VERSION |")) == [
        "namesrv: 322 QUERY_DATA_VERSION is served but not documented"
    ]
    wrong = text.replace("| 224 | GET_TOPICS_BY_CLUSTER |", "| 225 | GET_TOPICS_BY_CLUSTER |")
    assert remoting_problems(wrong) == [
        "namesrv: 225 GET_TOPICS_BY_CLUSTER documented, codes.py says 224"
    ]
    unserved = text.replace(
        "| 46 | CHECK_CLIENT_CONFIG |",
        "| 106 | GET_BROKER_CLUSTER_INFO | a name server's code |\n| 46 | CHECK_CLIENT_CONFIG |",
    )
    assert remoting_problems(unserved) == [
        "broker: 106 GET_BROKER_CLUSTER_INFO documented, but services/broker has no use of it"
    ]


def test_a_missing_package_row_or_a_stale_path_is_caught():
    text = CONCEPTS_MD.read_text()
    assert package_map_problems(_drop_lines(text, "| `services/broker/transactions/` |")) == [
        "services/broker/transactions/: no row"
    ]
    stale = text.replace(
        "| `services/broker/metadata/` |", "| `services/broker/metadata/`, `gone.py` |"
    )
    assert package_map_problems(stale) == [
        "row '`services/broker/metadata/`, `gone.py`': services/broker/metadata/gone.py does not exist"
    ]
    assert rest_of_repository_problems(_drop_lines(text, "| `native/` |")) == ["native/: no row"]


def test_a_machine_path_is_caught(tmp_path):
    home = "/" + "root/"
    for name, text in {
        "docs/run.md": f"starting from /{'work'}/wt-docs/deploy/k8s\n",
        "BENCH.md": f"--out {home}bench.md and {'/tmp/'}pytest-of-root/x\n",
        # a relative folder named work is no machine path (built so this file names none)
        "ok.md": f"made in /tmp/tlsdemo; ~/.cargo/bin; /tmp/opsacl/home/conf; var/{'work'}/x\n",
    }.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    found = machine_paths(sorted(tmp_path.rglob("*.md")), tmp_path)
    assert [f.split(":")[0] for f in found] == ["BENCH.md", "BENCH.md", "docs/run.md"]


def test_a_citation_of_a_missing_markdown_file_is_caught(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "guide.md").write_text("# guide\n")
    (tmp_path / "pyproject.toml").write_text("# works (TOOLING.md); see docs/guide.md, guide.md\n")
    files = [tmp_path / "pyproject.toml", tmp_path / "docs" / "guide.md"]
    assert missing_markdown_citations(files, tmp_path) == ["pyproject.toml:1: TOOLING.md"]
