"""The package's import graph has no cycle: no two modules import each other, and no chain of imports
leads from one subpackage back to itself.

Every import counts, wherever it is written: at module level, inside a function (a "lazy" import), under
``if TYPE_CHECKING:``; relative imports are resolved. A subpackage is ``simulator.X`` with everything below
it; a top-level module (``simulator/quick.py``) is a package of its own.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import simulator

ROOT = Path(simulator.__file__).parent

KNOWN_CYCLE_IMPORTS: dict[tuple[str, str], str] = {
    # Imports (importer -> imported) that close a cycle and are accepted for now, each with why, so that
    # any new cycle fails the test. Delete an entry once its import is gone (the last test says which).
}


def module_name(path: Path, root: Path) -> str:
    """The dotted name of a module file under the package folder `root`."""
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules(root: Path) -> dict[str, Path]:
    return {module_name(path, root): path for path in sorted(root.rglob("*.py"))}


def imported_names(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Every module of the package that the module `name` imports, anywhere in its file."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            for alias in node.names:
                submodule = f"{origin}.{alias.name}"
                found.add(submodule if submodule in modules else origin)
    return {n for n in found if n in modules and n != name}


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the package's modules it imports."""
    modules = all_modules(root)
    return {name: imported_names(name, path, modules) for name, path in modules.items()}


def subpackage(module: str) -> str:
    """`simulator.pipeline.live` -> `live`; `simulator.scenario` -> `scenario`; `simulator` -> `simulator`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def mutual_pairs(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    return sorted((a, b) for a, targets in graph.items() for b in targets if a < b and a in graph.get(b, ()))


def package_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one subpackage (Tarjan), each sorted."""
    edges: dict[str, set[str]] = defaultdict(set)
    for a, targets in graph.items():
        for b in targets:
            if subpackage(a) != subpackage(b):
                edges[subpackage(a)].add(subpackage(b))
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted({subpackage(m) for m in graph}):
        if node not in index:
            visit(node)
    return sorted(groups)


def edges_within(graph: dict[str, set[str]], group: list[str]) -> list[str]:
    """The module imports that cross between the subpackages of `group` (to say what makes a cycle)."""
    members = set(group)
    return sorted(f"{a} -> {b}" for a, targets in graph.items() for b in targets
                  if subpackage(a) != subpackage(b) and subpackage(a) in members and subpackage(b) in members)


def without_known(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    return {a: {b for b in targets if (a, b) not in KNOWN_CYCLE_IMPORTS} for a, targets in graph.items()}


def test_the_scan_sees_lazy_type_checking_and_relative_imports(tmp_path):
    package = tmp_path / "simulator"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("from . import leaf\n")
    (package / "sub" / "leaf.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..top import Thing\n"
        "def later():\n    from .. import other\n    import simulator.sub\n")
    for name in ("top", "other"):
        (package / f"{name}.py").write_text("")
    graph = import_graph(package)
    assert graph["simulator.sub"] == {"simulator.sub.leaf"}
    assert graph["simulator.sub.leaf"] == {"simulator.top", "simulator.other", "simulator.sub"}
    assert mutual_pairs(graph) == [("simulator.sub", "simulator.sub.leaf")]
    assert package_cycles({"simulator.a.x": {"simulator.b.y"}, "simulator.b.y": {"simulator.c"},
                           "simulator.c": {"simulator.a.z"}, "simulator.a.z": set()}) == [["a", "b", "c"]]


def test_no_two_modules_import_each_other():
    pairs = mutual_pairs(without_known(import_graph()))
    assert not pairs, "modules that import each other: " + "; ".join(f"{a} <-> {b}" for a, b in pairs)


def test_no_import_cycle_between_subpackages():
    graph = without_known(import_graph())
    cycles = package_cycles(graph)
    assert not cycles, "subpackages in a cycle:\n" + "\n".join(
        " / ".join(group) + ":\n    " + "\n    ".join(edges_within(graph, group)) for group in cycles)


def test_every_known_cycle_import_still_exists():
    graph = import_graph()
    gone = [f"{a} -> {b} ({why})" for (a, b), why in KNOWN_CYCLE_IMPORTS.items() if b not in graph.get(a, ())]
    assert not gone, "no longer imported, delete from KNOWN_CYCLE_IMPORTS: " + "; ".join(gone)
