"""The layout of the tests and benchmarks (issue 26): test modules share code only through
:mod:`tests.helpers` (fixtures through ``conftest.py``, which pytest finds by itself), and
``bench/`` imports nothing from ``tests/`` — what the benchmarks share with the tests lives in
``iop_edge.testing``.

Read from the source with ``ast``: every import statement counts, wherever it is (inside a
function, under ``if TYPE_CHECKING:``), relative ones resolved against the importing module.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers import ROOT

SHARED = "tests.helpers"
"""The one package of ``tests`` that other test modules may import."""


def module_name(path: Path, root: Path = ROOT) -> str:
    """The dotted name of the module at ``path`` (``tests/api/conftest.py`` →
    ``tests.api.conftest``; a package's ``__init__.py`` is the package)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(source: str, module: str, *, is_package: bool = False) -> list[str]:
    """Every module ``source`` imports, absolute: ``import a.b`` → ``a.b``; ``from a import b``
    → ``a.b`` (``b`` may be a module; a name of ``a`` then still names ``a`` by its prefix);
    relative imports resolved against the package of ``module``."""
    package = module if is_package else module.rpartition(".")[0]
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            found += [f"{target}.{alias.name}" for alias in node.names]
    return found


def is_shared(module: str) -> bool:
    """Whether ``module`` (or a name in it) is :mod:`tests.helpers` or part of it."""
    return module == SHARED or module.startswith(f"{SHARED}.")


def is_of_tests(module: str) -> bool:
    """Whether ``module`` (or a name in it) belongs to the ``tests`` package."""
    return module == "tests" or module.startswith("tests.")


def imports_across_tests(path: Path, root: Path = ROOT) -> list[str]:
    """What the module at ``path`` imports from ``tests`` other than :mod:`tests.helpers`."""
    name = module_name(path, root)
    imported = imported_modules(
        path.read_text(encoding="utf-8"), name, is_package=path.name == "__init__.py"
    )
    return [m for m in imported if is_of_tests(m) and not is_shared(m)]


def test_test_modules_share_code_only_through_tests_helpers() -> None:
    """No test module, conftest or helper imports another test module or a conftest."""
    paths = sorted((ROOT / "tests").rglob("*.py"))
    # (the walk reached the suite: a wrong root would find nothing and pass)
    assert {"tests.conftest", "tests.helpers", "tests.api.conftest", __name__} <= {
        module_name(path) for path in paths
    }
    found = {module_name(path): wrong for path in paths if (wrong := imports_across_tests(path))}
    assert found == {}


def test_bench_imports_nothing_from_tests() -> None:
    """The benchmarks run without the test suite: what they share with it is in
    ``iop_edge.testing``."""
    paths = [
        path
        for path in sorted((ROOT / "bench").rglob("*.py"))
        if ".venv" not in path.relative_to(ROOT).parts
    ]
    assert ROOT / "bench" / "soak.py" in paths  # (the walk reached the benchmarks)
    found = {
        str(path.relative_to(ROOT)): wrong
        for path in paths
        if (
            wrong := [
                m
                for m in imported_modules(path.read_text(encoding="utf-8"), path.stem)
                if is_of_tests(m)
            ]
        )
    }
    assert found == {}


def test_the_check_sees_absolute_relative_and_nested_imports(tmp_path: Path) -> None:
    """Guards the two tests above against passing on a checker that sees nothing."""
    module = tmp_path / "tests" / "api" / "test_x.py"
    module.parent.mkdir(parents=True)
    module.write_text(
        "from tests.api.conftest import TOKEN\n"
        "from .conftest import edge_doc\n"
        "from .. import test_handover\n"
        "from tests.helpers import BOUND\n"
        "from tests.helpers.api import TOKENS\n"
        "from tests import helpers\n"
        "import tests.test_imports\n"
        "def later():\n"
        "    from tests.reliability.harness import closed_port\n"
    )
    assert imports_across_tests(module, tmp_path) == [
        "tests.api.conftest.TOKEN",
        "tests.api.conftest.edge_doc",
        "tests.test_handover",
        "tests.test_imports",
        "tests.reliability.harness.closed_port",
    ]
