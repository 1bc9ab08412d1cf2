"""The layout's rules (docs/design.md §9), checked on the code's own imports.

Every project module belongs to one layer; a module imports only from its own
layer or from a lower one, never upward; no two project modules import each
other in a circle; only ``shared_host_manager/nova/`` imports nova; the
protocol core imports no I/O, no clock and no randomness.  Inside
``shared_host_manager/nova/`` the decision core, the drop-in, the replay of its
decisions and the test harness import one way only (``NOVA_PARTS``).  Imports inside
functions count: a lazy upward import is still an upward dependency.
"""

from __future__ import annotations

import ast
import os
import sys

import pytest

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("protocol", "transport", "compute_reporter", "shared_host_manager", "simulator", "shm_cli")

#: lowest first; a module's layer is the longest prefix that matches its name
LAYERS: list[tuple[str, ...]] = [
    ("protocol",),
    # transport.updatelog: the update log's files, which a reporter writes as well
    ("transport",),
    ("compute_reporter",),
    ("shared_host_manager", "shared_host_manager.conf", "shared_host_manager.cache",
     "shared_host_manager.service"),
    ("shared_host_manager.decision",),
    ("shared_host_manager.updatelog",),
    # nova/ in four parts, each importing only from itself and the parts below (NOVA_PARTS)
    ("shared_host_manager.nova.core",),
    ("shared_host_manager.nova",),
    ("shared_host_manager.nova.replay",),
    ("shared_host_manager.nova.testing",),
    ("simulator",),
    ("shm_cli",),
]

#: nova/'s parts (a module's part is the longest prefix that matches its name) and the parts
#: each may import: the core at the bottom, the drop-in on it, replay and the test harness on
#: the drop-in, neither on the other
NOVA_PARTS: dict[str, tuple[str, frozenset[str]]] = {
    "shared_host_manager.nova.core": ("core", frozenset({"core"})),
    # the vector forms of nova's filters and weighers, one module per module of nova's
    "shared_host_manager.nova.core.forms": ("core", frozenset({"core"})),
    "shared_host_manager.nova.core.forms.filters": ("core", frozenset({"core"})),
    "shared_host_manager.nova.core.forms.weights": ("core", frozenset({"core"})),
    "shared_host_manager.nova": ("drop-in", frozenset({"core", "drop-in"})),
    "shared_host_manager.nova.replay": ("replay", frozenset({"core", "drop-in", "replay"})),
    "shared_host_manager.nova.testing": ("testing", frozenset({"core", "drop-in", "testing"})),
}

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


def _package_of(path: str) -> str:
    """The package a file's relative imports start from."""
    rel = os.path.relpath(path, TOP)[:-3].replace(os.sep, ".")
    return rel[: -len(".__init__")] if rel.endswith(".__init__") else rel.rpartition(".")[0]


def _imports(path: str) -> list[tuple[str, int]]:
    """(imported module, line) for every import in the file, at any depth: at module level,
    inside functions and classes, absolute or relative."""
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:  # "from . import x", "from ..core import y"
                base = _package_of(path).split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join([*base, module] if module else base)
            subs = [f"{module}.{alias.name}" for alias in node.names]
            if all(sub in MODULES for sub in subs):  # "from pkg import module": the modules
                found.extend((sub, node.lineno) for sub in subs)
            else:
                found.append((module, node.lineno))
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


def _nova_part(module: str) -> str | None:
    matches = [p for p in NOVA_PARTS if module == p or module.startswith(p + ".")]
    return NOVA_PARTS[max(matches, key=len)][0] if matches else None


def test_nova_parts_import_one_way():
    """The core imports neither the drop-in, replay nor the test harness; the drop-in imports
    neither replay nor the harness; replay and the harness not each other."""
    wrong = []
    for module, path in MODULES.items():
        part = _nova_part(module)
        if part is None:
            continue
        allowed = next(a for p, a in NOVA_PARTS.values() if p == part)
        for name, line in _imports(path):
            target = _project(name)
            if target is None or target == module:
                continue
            target_part = _nova_part(target)
            if target_part is not None and target_part not in allowed:
                wrong.append(f"{os.path.relpath(path, TOP)}:{line}: {module} ({part}) imports "
                             f"{target} ({target_part})")
    assert not wrong, "imports against nova/'s direction:\n" + "\n".join(wrong)


def test_every_nova_module_has_a_part():
    """A module added to nova/ lands in one of the four parts; a new subpackage needs a row in
    NOVA_PARTS (and in LAYERS)."""
    subpackages = {m for m in MODULES if m.startswith("shared_host_manager.nova.")
                   and os.path.basename(MODULES[m]) == "__init__.py"}
    known = set(NOVA_PARTS) | {"shared_host_manager.nova.wsgi"}
    assert subpackages <= known, f"nova/ subpackages without a part: {sorted(subpackages - known)}"


#: what a reporter process loads (a compute node runs it without the scheduler's code): none
#: of it may reach shared_host_manager, directly or through another module
REPORTER_PROCESS = ("compute_reporter", "shm_cli.reporter")


def test_the_reporter_process_imports_nothing_of_the_scheduler_package():
    graph = _graph()
    starts = [m for m in MODULES if any(m == p or m.startswith(p + ".") for p in REPORTER_PROCESS)]
    via: dict[str, str | None] = {m: None for m in starts}
    todo = list(starts)
    while todo:
        module = todo.pop()
        parents = [module.rsplit(".", i)[0] for i in range(1, module.count(".") + 1)]
        for target in [*graph[module], *(p for p in parents if p in MODULES)]:
            if target not in via:  # importing a module runs its packages' __init__ first
                via[target] = module
                todo.append(target)
    reached = []
    for module in sorted(via):
        if module == "shared_host_manager" or module.startswith("shared_host_manager."):
            chain = [module]
            while (importer := via[chain[-1]]) is not None:
                chain.append(importer)
            reached.append(" <- ".join(chain))
    assert not reached, "the reporter's process imports the scheduler package:\n" + "\n".join(reached)


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


PLANTED_IN_NOVA = [
    # (the planted module, what it imports, at module level or in a function)
    ("shared_host_manager.nova.core.planted", "from shared_host_manager.nova import host_manager\n"),
    ("shared_host_manager.nova.core.planted",
     "def f():\n    from shared_host_manager.nova.testing import fixtures\n    return fixtures\n"),
    ("shared_host_manager.nova.core.planted", "from ..replay import steps\n"),
    ("shared_host_manager.nova.planted",
     "def f():\n    from shared_host_manager.nova.replay.steps import StepReplayer\n"
     "    return StepReplayer\n"),
    ("shared_host_manager.nova.planted", "import shared_host_manager.nova.testing.simulation\n"),
    ("shared_host_manager.nova.replay.planted", "from shared_host_manager.nova.testing import fixtures\n"),
    ("shared_host_manager.nova.testing.planted",
     "def f():\n    from shared_host_manager.nova.replay import steps\n    return steps\n"),
]


@pytest.mark.slow
def test_a_planted_import_against_novas_direction_is_caught(tmp_path, monkeypatch):
    """The nova rules can fail: each planted import is reported, at module level, in a function,
    absolute or relative; and the layers' rule reports the upward ones as well."""
    for i, (module, source) in enumerate(PLANTED_IN_NOVA):
        package, _, name = module.rpartition(".")
        folder = tmp_path.joinpath(str(i), *package.split("."))
        folder.mkdir(parents=True)
        planted = folder / f"{name}.py"
        planted.write_text(source)
        monkeypatch.setattr(sys.modules[__name__], "TOP", str(tmp_path / str(i)))
        monkeypatch.setitem(MODULES, module, str(planted))
        try:
            test_nova_parts_import_one_way()
        except AssertionError as exc:
            assert f"{module} (" in str(exc), (module, str(exc))
        else:
            raise AssertionError(f"{module} importing against nova/'s direction went unnoticed: "
                                 f"{source!r}")
        if not module.startswith("shared_host_manager.nova.testing"):  # testing sits above replay
            try:
                test_imports_only_run_downward()
            except AssertionError as exc:
                assert f"{module} imports" in str(exc), (module, str(exc))
            else:
                raise AssertionError(f"{module}'s upward import went unnoticed: {source!r}")
        monkeypatch.undo()


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
