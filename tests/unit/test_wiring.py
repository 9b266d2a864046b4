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
- Every door makes the same send call (issue 42): no door (services/broker/api,
  services/broker/remoting, services/proxy) stages a transactional half itself
  (`prepare`, `prepare_many`, `stage_halves`) or reads what marks one (TRAN_MSG,
  the sysFlag prepared type) to branch on it; the send use case does. A door may
  write the mark (the proxy turns a v5 TRANSACTION message into ferry.v1's
  TRAN_MSG=true).
- Collaborators are objects with named methods (issue 42): no use case's
  constructor in services/broker/{messaging,transactions,pop,schedule,cluster}
  takes a parameter annotated `Callable[...]` (or an alias of one), but those
  listed in CALLABLE_ALLOWED with their reason.
- The fence contract, declared where each of its users may import it
  (messaging/contracts.py, metadata/metadata_log.py, incarnation.py), says the
  same in all three.
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
    "deps.broker_addr": "the RocketMQ-protocol address, a value known once the port is bound",
}
# MessageStore's parts: only the store package itself reaches into them.
STORE_PARTS = {
    "queues", "dispatcher", "retention", "commit_log", "long_polls", "flusher", "reader",
    "allocator", "config", "reads",
}  # fmt: skip


DOORS = ("services/broker/api", "services/broker/remoting", "services/proxy")
# What marks a transactional half: the property (by its constant or its name)
# and RocketMQ's sysFlag prepared type.
HALF_MARK_NAMES = {"PROPERTY_TRANSACTION_PREPARED", "TRANSACTION_PREPARED"}
HALF_MARK_TEXT = "TRAN_MSG"
HALF_STAGING_CALLS = {"prepare", "prepare_many", "stage_halves"}
USE_CASES = tuple(
    f"services/broker/{room}"
    for room in ("messaging", "transactions", "pop", "schedule", "cluster")
)
# Callable parameters a use case may take ("module.py:Class.parameter"), each with its reason.
CALLABLE_ALLOWED = {
    "messaging/stats.py:TrafficStats.monotonic": "a clock function, as `time.monotonic`",
    "messaging/stats.py:TrafficStats.totals": "a reading of the store's two counters, like a clock",
    "messaging/stats.py:TrafficStats.reads": "a reading of its two read counters, likewise",
    "messaging/sendback.py:SendBack.choose": "a random source (`random.randrange`), like a clock",
}
FENCES = (
    "services/broker/messaging/contracts.py",
    "services/broker/metadata/metadata_log.py",
    "services/broker/incarnation.py",
)


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


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    return {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def half_decisions(path: Path, base: Path = ROOT) -> list[str]:
    """Where a door stages a half itself or reads a half's mark (to branch on
    it); writing the mark (`props[PROPERTY_TRANSACTION_PREPARED] = "true"`) is
    converting, not deciding."""
    tree = ast.parse(path.read_text(), str(path))
    parent = _parents(tree)
    rel = path.relative_to(base)
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in HALF_STAGING_CALLS:
                bad.append((node.lineno, f"{rel}:{node.lineno}: {ast.unparse(node.func)}(…)"))
            continue
        mark = isinstance(node, ast.Name) and node.id in HALF_MARK_NAMES
        mark = mark or isinstance(node, ast.Constant) and node.value == HALF_MARK_TEXT
        if not mark:
            continue
        up = parent.get(node)
        if isinstance(up, ast.Subscript) and isinstance(up.ctx, ast.Store):
            continue  # writing the mark
        read = isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)
        read = read or isinstance(up, (ast.Compare, ast.Subscript))
        read = read or isinstance(up, ast.Call) and ast.unparse(up.func).endswith(".get")
        if read:
            bad.append((node.lineno, f"{rel}:{node.lineno}: {ast.unparse(up or node)[:70]}"))
    return [text for _, text in sorted(bad)]


def _callable_aliases(tree: ast.Module) -> set[str]:
    """Module-level names bound to a Callable type (`Checker = Callable[...]`)."""
    return {
        target.id
        for node in tree.body
        if isinstance(node, ast.Assign) and _names_callable(node.value, set())
        for target in node.targets
        if isinstance(target, ast.Name)
    }


def _names_callable(annotation: ast.expr, aliases: set[str]) -> bool:
    for node in ast.walk(annotation):
        name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", None)
        if name == "Callable" or name in aliases:
            return True
        if isinstance(node, ast.Constant) and "Callable" in str(node.value):
            return True  # a quoted annotation
    return False


def callable_collaborators(path: Path, base: Path) -> list[str]:
    """ "module.py:Class.parameter" for each constructor parameter annotated as
    a bare callable."""
    tree = ast.parse(path.read_text(), str(path))
    aliases = _callable_aliases(tree)
    rel = path.relative_to(base).as_posix()
    found = []
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        for init in cls.body:
            if not (isinstance(init, ast.FunctionDef) and init.name == "__init__"):
                continue
            args = init.args
            for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
                if arg.annotation is not None and _names_callable(arg.annotation, aliases):
                    found.append(f"{rel}:{cls.name}.{arg.arg}")
    return found


def _fence_methods(path: Path) -> set[str] | None:
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ClassDef) and node.name == "Fence":
            return {f.name for f in node.body if isinstance(f, ast.FunctionDef)}
    return None


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


def test_no_door_decides_what_a_half_is() -> None:
    bad = []
    for path in _sources(*DOORS):
        bad += half_decisions(path)
    assert not bad, (
        "a door stages a half or reads its mark (call the send use case, which routes it):\n"
        + "\n".join(bad)
    )


def test_use_cases_take_collaborators_not_callables() -> None:
    found = []
    for top in USE_CASES:
        for path in _sources(top):
            found += callable_collaborators(path, ROOT / "services" / "broker")
    bad = [f for f in found if f not in CALLABLE_ALLOWED]
    assert not bad, (
        "a bare callable collaborator (give it a small Protocol with named methods, as "
        "services/broker/messaging/contracts.py does):\n" + "\n".join(bad)
    )
    stale = sorted(set(CALLABLE_ALLOWED) - set(found))
    assert not stale, "CALLABLE_ALLOWED names what is gone (drop it):\n" + "\n".join(stale)


def test_the_fence_contracts_agree() -> None:
    methods = {path: _fence_methods(ROOT / path) for path in FENCES}
    assert all(m is not None for m in methods.values()), methods
    assert len({frozenset(m or ()) for m in methods.values()}) == 1, methods
    assert methods[FENCES[0]] == {"check_accepting", "check_acknowledging"}


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
    door = tmp_path / "door.py"
    door.write_text(
        "def send(self, request, header, props):\n"
        "    if request.properties.get(PROPERTY_TRANSACTION_PREPARED) == 'true':\n"
        "        return self.transactions.prepare(request)\n"
        "    if header.sys_flag & 0xC == TRANSACTION_PREPARED or 'TRAN_MSG' in props:\n"
        "        self.messaging.stage_halves([], 'H')\n"
        "    props[PROPERTY_TRANSACTION_PREPARED] = 'true'\n"
        "    reserved = {'TRAN_MSG', 'UNIQ_KEY'}\n"
        "    return self.sends.send(request.topic, None, [request])\n"
    )
    assert half_decisions(door, base=tmp_path) == [
        "door.py:2: request.properties.get(PROPERTY_TRANSACTION_PREPARED)",
        "door.py:3: self.transactions.prepare(…)",
        "door.py:4: 'TRAN_MSG' in props",
        "door.py:4: header.sys_flag & 12 == TRANSACTION_PREPARED",
        "door.py:5: self.messaging.stage_halves(…)",
    ]
    use_case = tmp_path / "use_case.py"
    use_case.write_text(
        "Checker = Callable[[int], bool]\n"
        "class Send:\n"
        "    def __init__(self, store, fence: Fence | None, on_sent: Callable[[str], None],\n"
        "                 checker: Checker, *, wait: 'Callable[[], None] | None' = None,\n"
        "                 count: int = 0) -> None: ...\n"
        "    def run(self, then: Callable[[], None]) -> None: ...\n"
    )
    assert callable_collaborators(use_case, tmp_path) == [
        "use_case.py:Send.on_sent",
        "use_case.py:Send.checker",
        "use_case.py:Send.wait",
    ]
    fence = tmp_path / "fence.py"
    fence.write_text(
        "class Fence(Protocol):\n    def check_accepting(self): ...\n    def other(self): ...\n"
    )
    assert _fence_methods(fence) == {"check_accepting", "other"}
    assert _fence_methods(door) is None
