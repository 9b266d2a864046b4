"""The import graph of services/ and ferry/: no cycles, and no forbidden edges.

Every `import` and `from ... import` counts: module level, inside functions and
under `if TYPE_CHECKING:` alike (a type-only cycle is still a cycle: declare the
contract where the lower layer owns it). An edge goes to the most specific module
named (`from a.b import c` is an edge to `a.b.c` when that is a module, else to
`a.b`).

The broker's rooms (services/broker/), lowest first; each package's `__init__.py`
says what it owns and what it must not import:

    store/      the storage engine: message_store, reads, commitlog, allocator,
                reader, consumequeue, dispatcher, longpoll, flush, checkpoint,
                recovery, retention, failstop, storelock, replica_log, index,
                indexfile
    metadata/   tables (BrokerMetadata), metadata_log (the failover metadata log)
    messaging/  rules (lookups), outgoing, contracts, access (permission and
                topic/queue checks), staging, send and pull (the use cases),
                admin (admin use cases), statistics (the figures
                mqadmin and ferry.v1 report), clients, locks, sendback, stats
    pop/        state, records (revive-record format), revive, service (PopService)
    schedule/   delay (delay levels), timer, timer_done (timer-done record format)
    transactions/  service (half messages, decisions, check-back)
    api/        servicer, convert, sendstream: the gRPC adapters
    remoting/   deps, convert and one module per family of codes: the
                RocketMQ-protocol adapters (api/'s peer; neither imports the other;
                never the store: they reach it through the use cases)
    cluster/    registration, slave_sync, replication (the SYNC_MASTER ack wait)
    app.py, config.py, metrics.py   the composition root and its config/metrics
    servers.py                      the servers the roots build (gRPC, RocketMQ
                                    protocol, metrics endpoint)
    incarnation.py                  the contract failover/ drives the app through
    failover/   node, runs, lease, election, insync, handover, rejoin, role, metrics,
                etcd, epochs: drives the app; only the entry points import it
    cli.py, __main__.py             the entry points

Across the top level: `ferry/` is the library and the client, and no module under
it imports `services/`; `services/cli/` is the `ferry` command, the launcher, and
reaches into a service only through the edges CROSS_SERVICE lists.

`python tests/unit/test_imports.py` prints the map with each module's level (the
longest import chain below it within services/broker).
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
B = "services.broker"

_LOWER_THAN_APP = (f"{B}.app", f"{B}.servers", f"{B}.cli", f"{B}.__main__", f"{B}.failover")
# package -> what it must never import (prefixes).
FORBIDDEN: dict[str, tuple[str, ...]] = {
    f"{B}.store": (
        f"{B}.metadata", f"{B}.messaging", f"{B}.pop", f"{B}.schedule", f"{B}.api",
        f"{B}.transactions",
        f"{B}.cluster", f"{B}.metrics", f"{B}.config", *_LOWER_THAN_APP,
    ),
    f"{B}.metadata": (
        f"{B}.messaging", f"{B}.pop", f"{B}.schedule", f"{B}.api", f"{B}.cluster",
        f"{B}.metrics", *_LOWER_THAN_APP,
    ),
    f"{B}.messaging": (
        f"{B}.pop", f"{B}.schedule", f"{B}.api", f"{B}.cluster", f"{B}.metrics",
        f"{B}.transactions", *_LOWER_THAN_APP,
    ),
    f"{B}.transactions": (
        f"{B}.pop", f"{B}.schedule", f"{B}.api", f"{B}.remoting", f"{B}.cluster",
        f"{B}.metrics", *_LOWER_THAN_APP,
    ),
    f"{B}.pop": (
        f"{B}.schedule", f"{B}.api", f"{B}.cluster", f"{B}.metrics", *_LOWER_THAN_APP,
    ),
    f"{B}.schedule": (
        f"{B}.pop", f"{B}.api", f"{B}.cluster", f"{B}.metrics", *_LOWER_THAN_APP,
    ),
    f"{B}.api": (f"{B}.remoting", f"{B}.cluster", f"{B}.metrics", *_LOWER_THAN_APP),
    f"{B}.remoting": (
        f"{B}.store", f"{B}.api", f"{B}.cluster", f"{B}.metrics", *_LOWER_THAN_APP,
    ),
    f"{B}.cluster": (f"{B}.pop", f"{B}.schedule", f"{B}.metrics", *_LOWER_THAN_APP),
    f"{B}.metrics": _LOWER_THAN_APP,
    f"{B}.config": _LOWER_THAN_APP,
    f"{B}.app": (f"{B}.failover", f"{B}.cli", f"{B}.__main__"),
    f"{B}.servers": (f"{B}.app", f"{B}.failover", f"{B}.cli", f"{B}.__main__"),
    f"{B}.incarnation": (
        f"{B}.store", f"{B}.metadata", f"{B}.messaging", f"{B}.pop", f"{B}.schedule",
        f"{B}.api", f"{B}.cluster", f"{B}.metrics", f"{B}.config", *_LOWER_THAN_APP,
    ),
}  # fmt: skip
# Only these broker modules speak gRPC or protobuf.
WIRE = ("grpc", "ferry.v1", "apache.rocketmq")
WIRE_ALLOWED = (f"{B}.api", f"{B}.cluster", f"{B}.app", f"{B}.servers")
# Who may import failover/: itself and the entry points.
FAILOVER_IMPORTERS = (f"{B}.failover", f"{B}.cli", f"{B}.__main__", "services.cli.failover_cmds")
# Edges between services that are allowed, each with its reason.
CROSS_SERVICE = {
    (B, "services.ha"): "HA replication runs inside the broker process (no entry point of its own)",
    (f"{B}.app", "services.proxy"): "the composition root embeds the proxy in local mode",
    (f"{B}.servers", "services.proxy"): "in local mode the gRPC server checks the SDKs' door too",
    # services/cli is the `ferry` command, the launcher of every service.
    ("services.cli.main", f"{B}.cli"): "`ferry broker` runs the broker's entry point",
    ("services.cli.main", "services.namesrv.cli"): "`ferry namesrv` runs the name server's",
    ("services.cli.main", "services.proxy.cli"): "`ferry proxy` runs the proxy's",
    ("services.cli.dev.topology", f"{B}.config"): "broker.conf files, read as the broker reads them",
    ("services.cli.failover_cmds", f"{B}.failover.etcd"): "ha-status and failover use etcd's failover keys",
}  # fmt: skip


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def modules() -> dict[str, Path]:
    found = {}
    for top in ("services", "ferry"):
        for path in sorted((ROOT / top).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[:2] == ["ferry", "v1"]:
                continue  # generated
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _imports(name: str, path: Path, known: Iterable[str]) -> set[str]:
    known = set(known)
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                full = f"{target}.{alias.name}"
                out.add(full if full in known else target)
    return out


def graph() -> dict[str, set[str]]:
    found = modules()
    return {name: _imports(name, path, found) for name, path in found.items()}


def internal(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    return {m: {t for t in ts if t in edges and t != m} for m, ts in edges.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One concrete cycle per strongly connected component (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    sccs: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                sccs.append(comp)

    # Deep import chains recurse deeply; the limit is put back after, as other
    # tests (decoders refusing deep nesting) depend on the interpreter's own.
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10_000))
    try:
        for v in sorted(edges):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return [_cycle_in(set(comp), edges) for comp in sccs]


def _cycle_in(comp: set[str], edges: dict[str, set[str]]) -> list[str]:
    start = min(comp)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(edges[v] & comp):
                if w == start:
                    return paths[v] + [start]
                if w not in paths:
                    paths[w] = paths[v] + [w]
                    nxt.append(w)
        frontier = nxt
    return sorted(comp)


def levels(edges: dict[str, set[str]], within: str = B) -> dict[str, int]:
    """1 + the longest import chain below each module, counting only modules
    within `within` (cycles are collapsed to one node, so this is defined on any
    graph)."""
    local = {
        m: {t for t in ts if _within(t, within)} for m, ts in edges.items() if _within(m, within)
    }
    comp_of = {m: m for m in local}
    for cyc in cycles(local):
        for m in cyc:
            comp_of[m] = cyc[0]
    memo: dict[str, int] = {}

    def level(c: str, seen: frozenset[str]) -> int:
        if c in memo:
            return memo[c]
        members = [m for m in local if comp_of[m] == c]
        below = {comp_of[t] for m in members for t in local[m]} - {c} - seen
        memo[c] = 1 + max((level(b, seen | {c}) for b in below), default=0)
        return memo[c]

    return {m: level(comp_of[m], frozenset()) for m in local}


def forbidden_edges(edges: dict[str, set[str]]) -> list[str]:
    bad = []
    for src, targets in sorted(edges.items()):
        for dst in sorted(targets):
            for pkg, banned in FORBIDDEN.items():
                if _within(src, pkg) and any(_within(dst, b) for b in banned):
                    bad.append(f"{src} -> {dst} ({pkg} must not import it)")
            speaks_wire = any(_within(dst, w) for w in WIRE)
            if _within(src, B) and speaks_wire and not any(_within(src, a) for a in WIRE_ALLOWED):
                bad.append(f"{src} -> {dst} (only api/, cluster/, app and servers speak gRPC)")
            if _within(dst, f"{B}.failover") and not any(
                _within(src, a) for a in FAILOVER_IMPORTERS
            ):
                bad.append(f"{src} -> {dst} (only the entry points import failover/)")
            if src.startswith("services.") and dst.startswith("services."):
                s_svc, d_svc = src.split(".")[1], dst.split(".")[1]
                allowed = any(_within(src, a) and _within(dst, b) for a, b in CROSS_SERVICE)
                if s_svc != d_svc and not allowed:
                    bad.append(f"{src} -> {dst} (a service never imports another's modules)")
            inside = f"{B}.store."
            if dst.startswith(inside) and not _within(src, f"{B}.store"):
                bad.append(
                    f"{src} -> {dst} (outside store/, use the names services.broker.store exports)"
                )
            if _within(src, "ferry") and _within(dst, "services"):
                bad.append(f"{src} -> {dst} (ferry/ is a library: it never imports services/)")
    return bad


def test_no_import_cycles() -> None:
    found = cycles(internal(graph()))
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_no_forbidden_edges() -> None:
    bad = forbidden_edges(_external_wire_edges())
    assert not bad, "forbidden imports:\n" + "\n".join(bad)


def _external_wire_edges() -> dict[str, set[str]]:
    edges = graph()
    return {
        m: {t for t in ts if t in edges or any(_within(t, w) for w in WIRE)}
        for m, ts in edges.items()
    }


def test_every_broker_package_says_what_it_owns_and_must_not_import() -> None:
    for init in sorted((ROOT / "services" / "broker").glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert "Owns:" in doc, f"{init}: the docstring does not say what it owns"
        assert "never import" in doc, f"{init}: the docstring does not say what it must not import"


def test_the_checker_refuses_a_library_module_importing_a_service() -> None:
    edges = {
        "ferry.client.broker": {"services.cli.output"},
        "ferry": {"services"},
        "services.cli.main": {"ferry.client.broker", f"{B}.cli"},
    }
    assert forbidden_edges(edges) == [
        "ferry -> services (ferry/ is a library: it never imports services/)",
        "ferry.client.broker -> services.cli.output (ferry/ is a library: it never imports services/)",
    ]


def test_the_launcher_reaches_only_the_entry_points_of_a_service() -> None:
    assert forbidden_edges({"services.cli.main": {f"{B}.store.commitlog"}}) == [
        f"services.cli.main -> {B}.store.commitlog (a service never imports another's modules)",
        f"services.cli.main -> {B}.store.commitlog (outside store/, use the names "
        "services.broker.store exports)",
    ]
    assert forbidden_edges({"services.cli.dev.run": {f"{B}.failover.etcd"}}) != []


def test_the_checker_finds_a_cycle_and_names_it() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(edges) == [["a", "b", "c", "a"]]
    assert levels({"x.a": {"x.b"}, "x.b": set()}, "x") == {"x.a": 2, "x.b": 1}


def main() -> None:
    edges = internal(graph())
    lv = levels(edges)
    for name in sorted(lv, key=lambda m: (-lv[m], m)):
        print(f"{lv[name]:3d}  {name}")
    print(f"levels: {max(lv.values())}; cycles: {cycles(edges) or 'none'}")


if __name__ == "__main__":
    main()
