"""The runtime import graph of ``iop_edge``, read from the source with ``ast``, so it also
covers modules and code paths that no test imports (shared by ``tests/test_imports.py``, no
runtime import cycle, and ``tests/test_purity.py``, the layers):

- an ``import`` counts wherever it is, at module level or inside a function (a lazy import inside
  a function is still a runtime dependency, only a late one), but not under ``if TYPE_CHECKING:``;
- relative imports are resolved against the importing module's package;
- ``from pkg import name`` is an edge to ``pkg.name`` when that is a module, else to ``pkg``;
- importing ``a.b.c`` also runs the ``__init__`` of ``a.b`` first, so that is an edge too, unless
  ``a.b`` encloses the importer (a package's own modules run while it is being imported: the
  ordinary ``__init__`` that re-exports its submodules is no cycle).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import iop_edge

PACKAGE = "iop_edge"


PACKAGE_DIR = Path(iop_edge.__file__).parent


@dataclass(frozen=True)
class Import:
    """One runtime import statement: ``import module`` (no names) or ``from module import names``,
    with ``module`` absolute."""

    line: int
    module: str
    names: tuple[str, ...] = ()


@dataclass(frozen=True)
class SourceModule:
    """A module of the package as read from disk: its dotted name, file and source."""

    name: str
    path: Path
    source: str

    @property
    def is_package(self) -> bool:
        return self.path.name == "__init__.py"


def is_type_checking_guard(test: ast.expr) -> bool:
    """``TYPE_CHECKING`` or ``typing.TYPE_CHECKING``: the guard of a type-only import block."""
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


def runtime_imports(source: str, module: str, *, is_package: bool = False) -> list[Import]:
    """Every import statement of ``source`` that runs at runtime, in source order, resolved to
    absolute module names; ``module`` is the dotted name of the module holding ``source``."""
    package = module if is_package else module.rpartition(".")[0]
    imports: list[Import] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and is_type_checking_guard(node.test):
            for branch in node.orelse:  # the ``else:`` of a type-only block does run
                visit(branch)
            return
        if isinstance(node, ast.Import):
            imports.extend(Import(node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            imports.append(Import(node.lineno, target, tuple(a.name for a in node.names)))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(source, f"<{module}>"))
    return imports


def package_modules(directory: Path = PACKAGE_DIR, name: str = PACKAGE) -> list[SourceModule]:
    """Every module of the package under ``directory``, sorted by dotted name."""
    modules = []
    for path in directory.rglob("*.py"):
        parts = [name, *path.relative_to(directory).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        modules.append(SourceModule(".".join(parts), path, path.read_text(encoding="utf-8")))
    return sorted(modules, key=lambda m: m.name)


def import_targets(imp: Import, known: Iterable[str]) -> set[str]:
    """The modules of ``known`` that ``imp`` names: ``pkg.name`` for each ``name`` that is a
    submodule, ``pkg`` itself for the other names (and for a plain ``import pkg``)."""
    known = set(known)
    targets = set()
    submodules = {f"{imp.module}.{name}" for name in imp.names} & known
    if len(submodules) < len(imp.names) or not imp.names:
        targets.add(imp.module)
    targets |= submodules
    return targets & known


def enclosing_packages(module: str) -> Iterator[str]:
    """``a.b.c`` → ``a``, ``a.b``: the packages Python imports before ``module``."""
    parts = module.split(".")
    for end in range(1, len(parts)):
        yield ".".join(parts[:end])


def import_graph(sources: Mapping[str, tuple[str, bool]]) -> dict[str, set[str]]:
    """Runtime import graph over ``sources`` (name → (source, is_package)): each module → the
    modules of ``sources`` it makes Python import (see the module docstring)."""
    graph: dict[str, set[str]] = {}
    for name, (source, is_package) in sources.items():
        own = set(enclosing_packages(name)) | ({name} if is_package else set())
        edges: set[str] = set()
        for imp in runtime_imports(source, name, is_package=is_package):
            for target in import_targets(imp, sources):
                edges.add(target)
                edges |= {p for p in enclosing_packages(target) if p in sources} - own
        edges.discard(name)  # an __init__ importing a name it defines itself: no dependency
        graph[name] = edges
    return graph


def package_graph() -> dict[str, set[str]]:
    """The runtime import graph of ``iop_edge``."""
    return import_graph({m.name: (m.source, m.is_package) for m in package_modules()})


def find_cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """One cycle per strongly connected component that has one (Tarjan), as ``[a, b, ..., a]``
    starting from the component's smallest name; sorted, so the output is deterministic."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph.get(node, ())):
            if succ not in index:
                connect(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            components.append(component)

    for node in sorted(graph):
        if node not in index:
            connect(node)

    cycles = []
    for component in components:
        start = min(component)
        if len(component) == 1 and start not in graph.get(start, ()):
            continue
        cycles.append(shortest_cycle(graph, start, component))
    return sorted(cycles)


def shortest_cycle(graph: Mapping[str, Iterable[str]], start: str, within: set[str]) -> list[str]:
    """The shortest path ``start → ... → start`` inside ``within`` (breadth first)."""
    parent: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for succ in sorted(set(graph.get(node, ())) & within):
                if succ == start:
                    path = [start]
                    while node != start:
                        path.append(node)
                        node = parent[node]
                    return [start, *reversed(path[1:]), start]
                if succ not in parent:
                    parent[succ] = node
                    following.append(succ)
        frontier = following
    raise AssertionError(f"{start} is on no cycle inside {sorted(within)}")


def show_cycle(cycle: list[str]) -> str:
    return " -> ".join(cycle)


#: libraries of the shell: importing the pure core must load none of them
SHELL_ONLY = (
    "asyncio",
    "aiohttp",
    "anyio",
    "uvloop",
    "watchfiles",
    "prometheus_client",
    "structlog",
    "redis",
)
