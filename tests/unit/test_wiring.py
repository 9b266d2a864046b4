"""How the broker's parts are put together, checked on the source.

- No collaborator is assigned after construction: a composition root (each
  service's app.py, the failover node) hands every part its collaborators through
  its constructor, so it never assigns an attribute of another object; and no
  module anywhere assigns a lambda to another object's attribute (the usual shape
  of a callback wired in late). The few state assignments a root makes are listed
  below with their reason.
- Outside services/broker/store/, the store is used through MessageStore's own
  methods and properties: nothing reaches into one of its parts (`store.queues`,
  `store.dispatcher`, `store.reads`…) or a private name (`store._append`). The
  reads live in their own class (store/reads.py), but the store delegates to it,
  so callers name one object whatever side of it serves them.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

ROOTS = (
    "services/broker/app.py",
    "services/broker/servers.py",
    "services/broker/failover/node.py",
    "services/broker/failover/runs.py",
    "services/namesrv/app.py",
    "services/proxy/app.py",
)
# Assignments a composition root may make to another object: state, not collaborators.
ALLOWED = {
    "self.gate.open": "the gate's state: whether calls are served",
    "self.admin.master_addr": "the master's address as the name servers report it",
    "ctx.verify_mode": "how the standard library configures an ssl.SSLContext",
}
# MessageStore's parts: only the store package itself reaches into them.
STORE_PARTS = {
    "queues", "dispatcher", "retention", "commit_log", "long_polls", "flusher", "reader",
    "allocator", "config", "reads",
}  # fmt: skip


def _sources(*tops: str) -> list[Path]:
    paths = []
    for top in tops:
        for path in sorted((ROOT / top).rglob("*.py")):
            if path.relative_to(ROOT).parts[:2] != ("ferry", "v1"):  # generated
                paths.append(path)
    return paths


def _assigned_attributes(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            targets, value = [node.target], node.value
        else:
            continue
        for target in targets:
            if isinstance(target, ast.Attribute):
                yield node.lineno, target, value


def _is_self(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id == "self"


def late_wiring(path: Path, root: bool, base: Path = ROOT) -> list[str]:
    """Assignments to another object's attributes: any of them in a composition
    root (unless allowed), a lambda anywhere."""
    bad = []
    rel = path.relative_to(base)
    for line, target, value in _assigned_attributes(ast.parse(path.read_text(), str(path))):
        if _is_self(target.value):
            continue  # an object's own state
        name = ast.unparse(target)
        if root and name not in ALLOWED:
            bad.append(f"{rel}:{line}: {name} = {ast.unparse(value)[:60]}")
        elif isinstance(value, ast.Lambda):
            bad.append(f"{rel}:{line}: {name} = a lambda")
    return bad


def _is_store(node: ast.expr) -> bool:
    """`store`, `self.store`, `app.store`…: an expression naming a MessageStore."""
    if isinstance(node, ast.Name):
        return node.id == "store"
    return isinstance(node, ast.Attribute) and node.attr == "store"


def store_reaches(path: Path, base: Path = ROOT) -> list[str]:
    bad: list[tuple[int, str]] = []
    rel = path.relative_to(base)
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Attribute) or not _is_store(node.value):
            continue
        inner = isinstance(node.ctx, ast.Load) and node.attr in STORE_PARTS
        if node.attr.startswith("_") or inner:
            bad.append((node.lineno, f"{rel}:{node.lineno}: {ast.unparse(node)}"))
    return [text for _, text in sorted(bad)]


def test_composition_roots_hand_collaborators_through_constructors() -> None:
    bad = []
    for path in _sources("services", "ferry"):
        bad += late_wiring(path, root=str(path.relative_to(ROOT)) in ROOTS)
    assert not bad, "assigned after construction (pass it to the constructor):\n" + "\n".join(bad)


def test_nothing_outside_the_store_reaches_into_its_parts() -> None:
    bad = []
    store_dir = ROOT / "services" / "broker" / "store"
    for path in _sources("services", "ferry"):
        if store_dir not in path.parents:
            bad += store_reaches(path)
    assert not bad, "use MessageStore's own methods and properties:\n" + "\n".join(bad)


def test_the_checks_find_what_they_look_for(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text(
        "def wire(messaging, metrics, store, self):\n"
        "    messaging.on_sent = metrics.observe_send\n"
        "    store.hook = lambda: 0\n"
        "    self.gate.open = True\n"
        "    self.x = 1\n"
        "    n = store.queues.all()\n"
        "    self.store._append()\n"
        "    m = store.max_offset\n"
    )
    assert late_wiring(src, root=True, base=tmp_path) == [
        "m.py:2: messaging.on_sent = metrics.observe_send",
        "m.py:3: store.hook = lambda: 0",
    ]
    assert late_wiring(src, root=False, base=tmp_path) == ["m.py:3: store.hook = a lambda"]
    assert store_reaches(src, base=tmp_path) == [
        "m.py:6: store.queues",
        "m.py:7: self.store._append",
    ]
