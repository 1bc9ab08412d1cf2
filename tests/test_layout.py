"""The layout's rules (docs/design.md §9), checked on the code's own imports.

Every project module belongs to one layer; a module imports only from its own
layer or from a lower one, never upward; no two project modules import each
other in a circle; only ``shared_host_manager/nova/`` imports nova; the
protocol core imports no I/O, no clock and no randomness.  Imports inside
functions count: a lazy upward import is still an upward dependency.
"""

from __future__ import annotations

import ast
import os
import sys

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("protocol", "transport", "compute_reporter", "shared_host_manager", "simulator", "shm_cli")

#: lowest first; a module's layer is the longest prefix that matches its name
LAYERS: list[tuple[str, ...]] = [
    ("protocol",),
    ("transport",),
    ("compute_reporter",),
    ("shared_host_manager", "shared_host_manager.conf", "shared_host_manager.cache",
     "shared_host_manager.service"),
    ("shared_host_manager.decision",),
    ("shared_host_manager.updatelog",),
    ("shared_host_manager.nova",),
    ("simulator",),
    ("shm_cli",),
]

#: what the sans-IO core may import from outside itself (time is an argument there)
PROTOCOL_ALLOWED = {
    "__future__", "typing", "collections", "dataclasses", "enum", "heapq", "itertools", "math",
    "hashlib", "hmac", "zlib", "reprlib", "msgpack",
    # change feeds are held weakly (ReceiverMachine.change_feed): memory, not I/O
    "weakref",
}


def _modules() -> dict[str, str]:
    """module name -> file path, for every module of the project's packages."""
    out = {}
    for package in PACKAGES:
        for root, _dirs, files in os.walk(os.path.join(TOP, package)):
            for name in files:
                if not name.endswith(".py"):
                    continue
                path = os.path.join(root, name)
                rel = os.path.relpath(path, TOP)[:-3].replace(os.sep, ".")
                out[rel[: -len(".__init__")] if rel.endswith(".__init__") else rel] = path
    return out


MODULES = _modules()


def _imports(path: str) -> list[tuple[str, int]]:
    """(imported module, line) for every import in the file, at any depth."""
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            subs = [f"{node.module}.{alias.name}" for alias in node.names]
            if all(sub in MODULES for sub in subs):  # "from pkg import module": the modules
                found.extend((sub, node.lineno) for sub in subs)
            else:
                found.append((node.module, node.lineno))
    return found


def _project(name: str) -> str | None:
    """The project module ``name`` refers to (a package's __init__ for a package), or None."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def _layer(module: str) -> int:
    best, layer = -1, -1
    for i, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, layer = len(prefix), i
    assert layer >= 0, f"{module} is in no layer: add it to LAYERS"
    return layer


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for module, path in MODULES.items():
        for name, _line in _imports(path):
            target = _project(name)
            if target is not None and target != module:
                graph[module].add(target)
    return graph


def test_every_module_has_a_layer():
    for module in MODULES:
        _layer(module)


def test_imports_only_run_downward():
    upward = []
    for module, path in MODULES.items():
        for name, line in _imports(path):
            target = _project(name)
            if target is None or target == module:
                continue
            if _layer(target) > _layer(module):
                upward.append(f"{os.path.relpath(path, TOP)}:{line}: {module} imports {target}")
    assert not upward, "imports that run upward:\n" + "\n".join(upward)


def test_no_import_circle():
    graph = _graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []
    counter = [0]
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10000))

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    assert not circles, f"import circles: {circles}"


def test_only_the_nova_package_imports_nova():
    outside = []
    for module, path in MODULES.items():
        if module.startswith("shared_host_manager.nova"):
            continue
        for name, line in _imports(path):
            if name == "nova" or name.startswith("nova."):
                outside.append(f"{os.path.relpath(path, TOP)}:{line}: {name}")
    assert not outside, "nova imported outside shared_host_manager/nova/:\n" + "\n".join(outside)


def test_the_protocol_core_does_no_io():
    bad = []
    for module, path in MODULES.items():
        if _layer(module) != 0:
            continue
        for name, line in _imports(path):
            top = name.partition(".")[0]
            if top != "protocol" and top not in PROTOCOL_ALLOWED:
                bad.append(f"{os.path.relpath(path, TOP)}:{line}: {name}")
    assert not bad, "the protocol core imports:\n" + "\n".join(bad)


def test_eventlet_is_imported_only_where_an_operator_asks_for_it():
    allowed = {"shm_cli.common"}  # [DEFAULT] concurrency_backend = eventlet
    bad = [f"{module}: {name}" for module, path in MODULES.items() if module not in allowed
           for name, _ in _imports(path) if name.partition(".")[0] == "eventlet"]
    assert not bad, bad


def test_a_planted_upward_import_is_caught(tmp_path, monkeypatch):
    """The rules can fail: a protocol module importing the scheduler side is reported."""
    planted = tmp_path / "planted.py"
    planted.write_text("from shared_host_manager.cache import HostStateCache\n")
    monkeypatch.setitem(MODULES, "protocol.planted", str(planted))
    try:
        test_imports_only_run_downward()
    except AssertionError as exc:
        assert "protocol.planted imports shared_host_manager.cache" in str(exc)
    else:
        raise AssertionError("an upward import went unnoticed")
