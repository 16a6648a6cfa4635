"""The architecture table of ``docs/architecture.md`` is the layer plan, and the code keeps it.

The table has one row per room: the modules or packages it holds (first column, as
``iop_edge/x.py`` or ``iop_edge/x/``), its job (second column, which names each module of a
package room as ``name.py``) and the rooms of ``iop_edge`` it may import at runtime (third
column: each as a backticked dotted name relative to the package, ``errors``, ``pool``,
``runtime.logs``…, or starting with the word *everything* for the wiring). Third-party
libraries are named in plain text there; the pure core's third-party allow-list is
``tests/test_purity.py``'s.

Checked here, on the source (the parser and graph of ``tests/helpers/imports.py``, so code no test
runs is covered too): every module of the package is in exactly one room; every module of a
package room is named in its row; every runtime import of a module stays in its own room or one
its row allows; and the table names nothing that does not exist.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers.imports import (
    PACKAGE,
    PACKAGE_DIR,
    SourceModule,
    enclosing_packages,
    import_targets,
    package_modules,
    runtime_imports,
)

TABLE = PACKAGE_DIR.parent / "docs" / "architecture.md"
EVERYTHING = "everything"
TICKED = re.compile(r"`([^`]+)`")


@dataclass(frozen=True)
class Room:
    """One row of the table: the modules it holds (dotted, a package covers its submodules),
    the module file names its job names, and what it may import (dotted; ``None``: anything)."""

    holds: tuple[str, ...]
    named: frozenset[str]
    may_import: frozenset[str] | None
    line: int

    def covers(self, module: str) -> bool:
        return any(within(module, held) for held in self.holds)


def within(module: str, room: str) -> bool:
    return module == room or module.startswith(f"{room}.")


def dotted(entry: str) -> str:
    """``iop_edge/api/`` → ``iop_edge.api``; ``iop_edge/daemon.py`` → ``iop_edge.daemon``."""
    path = entry.strip().removesuffix("/").removesuffix(".py")
    return path.replace("/", ".")


def read_rooms(text: str) -> Iterator[Room]:
    """The rows of the first table whose header starts with ``| room |``."""
    in_table = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("| room |"):
            in_table = True
            continue
        if not in_table:
            continue
        if not line.startswith("|"):
            return
        if set(line) <= set("|- "):
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        assert len(cells) == 3, f"docs/architecture.md:{number}: a row has three cells: {line}"
        room, job, imports = cells
        holds = tuple(dotted(entry) for entry in TICKED.findall(room))
        assert holds, f"docs/architecture.md:{number}: a room names its modules in backticks"
        named = frozenset(name for name in TICKED.findall(job) if name.endswith(".py"))
        allowed = (
            None
            if imports.startswith(EVERYTHING)
            else frozenset(f"{PACKAGE}.{name}" for name in TICKED.findall(imports))
        )
        yield Room(holds, named, allowed, number)


@pytest.fixture(scope="module")
def rooms() -> list[Room]:
    found = list(read_rooms(TABLE.read_text(encoding="utf-8")))
    assert len(found) > 10, "the architecture table was not found in docs/architecture.md"
    return found


MODULES = {m.name: m for m in package_modules()}


def room_of(module: str, rooms: list[Room]) -> Room:
    [room] = [room for room in rooms if room.covers(module)]
    return room


def test_every_module_is_in_exactly_one_room(rooms):
    problems = []
    for name in MODULES:
        holding = [room.line for room in rooms if room.covers(name)]
        if len(holding) != 1 and name != PACKAGE:
            problems.append(f"{name}: in the rows at lines {holding or 'none'}")
    assert not problems, "docs/architecture.md:\n" + "\n".join(problems)


def test_every_module_of_a_package_room_is_named_in_its_row(rooms):
    problems = []
    for room in rooms:
        for held in room.holds:
            module = MODULES.get(held)
            if module is None or not module.is_package:
                continue
            files = {
                path.name
                for path in module.path.parent.rglob("*.py")
                if path.name not in {"__init__.py", "__main__.py"}
            }
            problems += [f"line {room.line}: {held} has {f}, not named" for f in files - room.named]
            problems += [
                f"line {room.line}: names {f}, which {held} does not have"
                for f in room.named - files
                if len(room.holds) == 1
            ]
    assert not problems, "docs/architecture.md:\n" + "\n".join(sorted(problems))


def test_the_table_names_only_modules_that_exist(rooms):
    stale = [
        f"line {room.line}: {name}"
        for room in rooms
        for name in (*room.holds, *(room.may_import or ()))
        if name not in MODULES
    ]
    assert not stale, "docs/architecture.md names what the package does not have:\n" + "\n".join(
        stale
    )


def import_problems(modules: dict[str, SourceModule], rooms: list[Room]) -> list[str]:
    """Every runtime import of ``modules`` that its room's row does not allow."""
    problems = []
    for name, module in modules.items():
        if name == PACKAGE:
            continue
        room = room_of(name, rooms)
        if room.may_import is None:
            continue
        for imp in runtime_imports(module.source, name, is_package=module.is_package):
            for target in import_targets(imp, MODULES):
                if target == PACKAGE or room.covers(target) or target in enclosing_packages(name):
                    continue
                if not any(within(target, allowed) for allowed in room.may_import):
                    problems.append(f"{module.path.name}:{imp.line}: {name} imports {target}")
    return problems


def test_every_module_imports_only_what_its_room_allows(rooms):
    problems = import_problems(MODULES, rooms)
    assert not problems, (
        "imports the architecture table (docs/architecture.md) does not allow:\n"
        + "\n".join(problems)
    )


def test_nothing_but_tests_and_benches_imports_the_testing_package():
    importers = [
        name
        for name, module in MODULES.items()
        if not within(name, f"{PACKAGE}.testing")
        for imp in runtime_imports(module.source, name, is_package=module.is_package)
        if within(imp.module, f"{PACKAGE}.testing")
    ]
    assert not importers


def test_the_checker_catches_a_forbidden_import(rooms):
    """The checks above can fail: a pure scheduler module that imported the HTTP surface, or an
    adapter that imported admission, is reported; the same imports from the wiring are not."""
    modules = {
        "iop_edge.pool.scheduler": SourceModule(
            "iop_edge.pool.scheduler", Path("scheduler.py"), "from iop_edge.api import server\n"
        ),
        "iop_edge.adapters.cli": SourceModule(
            "iop_edge.adapters.cli", Path("cli.py"), "import iop_edge.admission\n"
        ),
        "iop_edge.daemon": SourceModule(
            "iop_edge.daemon", Path("daemon.py"), "from iop_edge.api import server\n"
        ),
    }
    assert import_problems(modules, rooms) == [
        "scheduler.py:1: iop_edge.pool.scheduler imports iop_edge.api.server",
        "cli.py:1: iop_edge.adapters.cli imports iop_edge.admission",
    ]
    rows = "\n".join(
        ["| room | job | may import |", "| --- | --- | --- |", "| `iop_edge/x.py` | j | `a` |"]
    )
    [parsed] = read_rooms(rows)
    assert parsed.holds == ("iop_edge.x",)
    assert parsed.may_import == frozenset({"iop_edge.a"})


def test_table_path_is_the_docs_page():
    assert Path(__file__).resolve().parents[1] / "docs" / "architecture.md" == TABLE


def test_no_module_binds_a_logger_at_import():
    """structlog caches a logger on its first use with the configuration of that moment: one
    bound at import keeps the first stream and level for the life of the process, so a later
    ``configure_logging`` (the daemon's, a test's) never reaches it. Loggers are got where they
    are used, or bound per instance."""
    bound = []
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if (
                isinstance(node, ast.Assign | ast.AnnAssign)
                and isinstance(node.value, ast.Call)
                and getattr(node.value.func, "id", getattr(node.value.func, "attr", "")).endswith(
                    "get_logger"
                )
            ):
                bound.append(f"{path.relative_to(PACKAGE_DIR.parent)}:{node.lineno}")
    assert bound == []
