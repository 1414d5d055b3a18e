"""The import graph of engine/, kernels/, control/ and dashboard/: no circle, and calls only
downward between the layers.

Every import counts: at the top of a module, under `if TYPE_CHECKING:`, and inside a
function. A circle closed only by a late or type-only import is still a circle (two
modules that each need the other, one of them in the wrong file), so the graph is built
from the source with the standard library's `ast`, importing nothing. Three rules:

1. no import circle, anywhere in the four packages;
2. engine/ and kernels/ never import control/ or dashboard/ (the engine imports no web,
   metrics or database code; control/ adapts the engine's plain records);
3. each engine/ folder imports only what its `__init__.py` says it may.

The checker's own tests plant a circle (and a forbidden import) in a temporary package.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "kernels", "control", "dashboard")
LOWER, UPPER = ("engine", "kernels"), ("control", "dashboard")

# What each engine/ folder may import besides itself (prefixes of module names; imports of
# anything outside the four packages, the standard library and third parties, are free).
_BOTTOM = ("engine.config", "engine.request", "engine.records", "engine.errors",
           "engine.logprobs")
ENGINE_FOLDERS: dict[str, tuple[str, ...]] = {
    "engine.config": (),
    "engine.kv": ("engine.config", "engine.request"),
    "engine.lanes": _BOTTOM,
    "engine.calibration": _BOTTOM,
    "engine.scheduling": (*_BOTTOM, "engine.lanes", "engine.kv", "engine.calibration"),
    "engine.execution": (*_BOTTOM, "engine.models", "engine.structured", "kernels"),
    "engine.output": _BOTTOM,
    "engine.models": ("engine.config", "kernels"),
}

Edge = tuple[str, str, int]  # (importing module, imported module, line)


def module_files(root: Path, packages: Iterable[str]) -> dict[str, Path]:
    """Dotted module name -> source file, for every .py file under the packages."""
    modules = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _known(name: str, modules: dict[str, Path]) -> str | None:
    """The longest prefix of `name` that is one of `modules` (None: not ours)."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def _base(module: str, path: Path, node: ast.ImportFrom) -> str:
    """The absolute package a `from ... import` names (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    package = module.split(".")
    if path.name != "__init__.py":
        package.pop()  # a module's relative imports start from its package
    package = package[:len(package) - (node.level - 1)]
    return ".".join(package + ([node.module] if node.module else []))


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> list[Edge]:
    """Every import in the file (any depth: functions and TYPE_CHECKING blocks too), as
    edges to our modules. `from pkg import name` is an edge to pkg.name when that is a
    module, else to pkg."""
    edges = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str | None] = []
        if isinstance(node, ast.Import):
            targets = [_known(alias.name, modules) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _base(module, path, node)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                targets.append(full if full in modules else _known(base, modules))
        edges += [(module, t, node.lineno) for t in targets if t is not None and t != module]
    return edges


def build_graph(root: Path, packages: Iterable[str]) -> dict[str, list[Edge]]:
    """Module -> its import edges, over every module of `packages` under `root`."""
    modules = module_files(root, packages)
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def strongly_connected(graph: dict[str, list[Edge]]) -> list[list[str]]:
    """Tarjan's components of more than one module (iterative: no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(graph[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for _, target, _ in edges:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(graph.get(target, []))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def one_cycle(graph: dict[str, list[Edge]], component: list[str]) -> list[Edge]:
    """A shortest circle through the component's first module, as its edges."""
    members, start = set(component), component[0]
    came_from: dict[str, Edge] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for edge in graph[node]:
                target = edge[1]
                if target == start:
                    path = [edge]
                    while path[0][0] != start:
                        path.insert(0, came_from[path[0][0]])
                    return path
                if target in members and target not in came_from:
                    came_from[target] = edge
                    following.append(target)
        frontier = following
    raise AssertionError(f"no circle in {component}")


def describe(cycle: list[Edge]) -> str:
    return " -> ".join(f"{a} (line {line})" for a, _, line in cycle) + f" -> {cycle[0][0]}"


def circles(graph: dict[str, list[Edge]]) -> list[str]:
    return [describe(one_cycle(graph, c)) for c in strongly_connected(graph)]


def upward_imports(graph: dict[str, list[Edge]], lower: Iterable[str],
                   upper: Iterable[str]) -> list[str]:
    """Imports of an `upper` package's module by a `lower` package's module."""
    def within(name: str, packages: Iterable[str]) -> bool:
        return any(name == p or name.startswith(p + ".") for p in packages)

    return [f"{a} imports {b} (line {line})" for edges in graph.values()
            for a, b, line in edges if within(a, lower) and within(b, upper)]


def folder_violations(graph: dict[str, list[Edge]],
                      folders: dict[str, tuple[str, ...]]) -> list[str]:
    """Imports by a module of one of `folders` of one of our modules it may not import."""
    def under(name: str, prefix: str) -> bool:
        return name == prefix or name.startswith(prefix + ".")

    bad = []
    for edges in graph.values():
        for a, b, line in edges:
            for folder, allowed in folders.items():
                if under(a, folder) and not under(b, folder) and not any(
                        under(b, p) for p in allowed):
                    bad.append(f"{a} imports {b} (line {line}): {folder} may import"
                               f" {', '.join(allowed) or 'nothing else of the engine'}")
    return bad


# ---- the repository ------------------------------------------------------------------
def test_no_import_circle():
    found = circles(build_graph(ROOT, PACKAGES))
    assert not found, "import circles:\n" + "\n".join(found)


def test_the_engine_and_the_kernels_never_import_control_or_the_dashboard():
    found = upward_imports(build_graph(ROOT, PACKAGES), LOWER, UPPER)
    assert not found, "\n".join(found)


def test_each_engine_folder_imports_only_what_its_docstring_allows():
    graph = build_graph(ROOT, PACKAGES)
    assert {f for f in ENGINE_FOLDERS if f in graph} == set(ENGINE_FOLDERS)  # all exist
    found = folder_violations(graph, ENGINE_FOLDERS)
    assert not found, "\n".join(found)


def test_the_graph_sees_the_engine_whole():
    """Guards the checker against passing by seeing nothing: the engine's own layers."""
    graph = build_graph(ROOT, PACKAGES)
    targets = {b for _, b, _ in graph["engine.engine"]}
    assert {"engine.scheduling.scheduler", "engine.lanes.admission", "engine.reports",
            "engine.fault_isolation", "engine.config"} <= targets
    assert "engine.scheduling.state" in {b for _, b, _ in graph["engine.scheduling.new_prefills"]}


# ---- the checker, on planted packages ------------------------------------------------
def _plant(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_checker_finds_a_circle_closed_only_inside_a_function(tmp_path):
    _plant(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "from pkg.b import helper\n",
        "pkg/b.py": "def helper():\n    from pkg import a  # late: still a circle\n",
        "pkg/c.py": "import pkg.a\n",  # leads into the circle, is not part of it
    })
    graph = build_graph(tmp_path, ["pkg"])
    assert strongly_connected(graph) == [["pkg.a", "pkg.b"]]
    assert circles(graph) == ["pkg.a (line 1) -> pkg.b (line 2) -> pkg.a"]


def test_the_checker_finds_a_circle_under_type_checking_and_relative_imports(tmp_path):
    _plant(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/sub/__init__.py": "from .x import X\n",
        "pkg/sub/x.py": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                         "    from ..y import Y\nclass X: ...\n"),
        "pkg/y.py": "from pkg.sub import X\nclass Y: ...\n",
    })
    graph = build_graph(tmp_path, ["pkg"])
    assert strongly_connected(graph) == [["pkg.sub", "pkg.sub.x", "pkg.y"]]


def test_the_checker_passes_a_tree_without_circles(tmp_path):
    _plant(tmp_path, {
        "pkg/__init__.py": "from pkg.low import VALUE\n",
        "pkg/low.py": "VALUE = 1\n",
        "pkg/high.py": "import os\nfrom pkg import low\nfrom pkg.low import VALUE\n",
    })
    graph = build_graph(tmp_path, ["pkg"])
    assert circles(graph) == []
    assert {b for _, b, _ in graph["pkg.high"]} == {"pkg.low"}  # os is not ours


def test_the_checker_finds_an_upward_import_and_a_folder_rule_broken(tmp_path):
    _plant(tmp_path, {
        "engine/__init__.py": "",
        "engine/kv/__init__.py": "",
        "engine/kv/blocks.py": "def f():\n    from engine.lanes import queue\n",
        "engine/lanes/__init__.py": "",
        "engine/lanes/queue.py": "from control.api import routes\n",
        "control/__init__.py": "",
        "control/api/__init__.py": "",
        "control/api/routes.py": "import engine.kv.blocks\n",
    })
    graph = build_graph(tmp_path, ["engine", "control"])
    assert upward_imports(graph, ["engine"], ["control"]) == [
        "engine.lanes.queue imports control.api.routes (line 1)"]
    assert [v.split(":")[0] for v in folder_violations(graph, {"engine.kv": ()})] == [
        "engine.kv.blocks imports engine.lanes.queue (line 2)"]
    assert len(circles(graph)) == 1
