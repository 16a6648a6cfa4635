"""The pure core stays pure (STYLE.md): ``iop_edge/config/`` and ``iop_edge/pool/`` import no
I/O, network, metrics or clock module and never read the clock or open a file.

Checked on the source with ``ast``, so it also holds for code paths no test runs.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import iop_edge.config
import iop_edge.pool

POOL_DIR = Path(iop_edge.pool.__file__).parent
PURE_DIRS = (Path(iop_edge.config.__file__).parent, POOL_DIR)

FORBIDDEN_MODULES = frozenset(
    {
        "aiohttp",
        "anyio",
        "asyncio",
        "datetime",
        "httpx",
        "io",
        "os",
        "pathlib",
        "prometheus_client",
        "selectors",
        "socket",
        "structlog",
        "subprocess",
        "threading",
        "time",
        "trio",
        "uvloop",
        "watchfiles",
    }
)
CLOCK_CALLS = frozenset(
    {"monotonic", "monotonic_ns", "perf_counter", "perf_counter_ns", "time", "time_ns", "now"}
)
FORBIDDEN_BUILTINS = frozenset({"open", "__import__", "input"})


def impurities(source: str, filename: str = "<source>") -> list[str]:
    """Every forbidden import or clock/file call in ``source``, as ``file:line: what``."""
    problems = []
    for node in ast.walk(ast.parse(source, filename)):
        where = f"{filename}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [node.module]
        else:
            modules = []
        for module in modules:
            if module.split(".")[0] in FORBIDDEN_MODULES:
                problems.append(f"{where}: imports {module}")
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr in CLOCK_CALLS:
                problems.append(f"{where}: calls .{func.attr}()")
            if isinstance(func, ast.Name) and func.id in FORBIDDEN_BUILTINS | CLOCK_CALLS:
                problems.append(f"{where}: calls {func.id}()")
    return problems


def test_pool_package_has_modules_to_check() -> None:
    names = {path.name for path in POOL_DIR.glob("*.py")}
    assert {"__init__.py", "policy.py", "scheduler.py"} <= names


@pytest.mark.parametrize("package", PURE_DIRS, ids=lambda p: p.name)
def test_pure_packages_import_no_io_or_clock_module_and_never_read_the_clock(
    package: Path,
) -> None:
    problems = [
        problem
        for path in sorted(package.glob("*.py"))
        for problem in impurities(path.read_text(encoding="utf-8"), path.name)
    ]
    assert problems == []


def test_purity_check_catches_forbidden_imports_and_clock_calls() -> None:
    source = "\n".join(
        [
            "import asyncio",
            "import os.path",
            "from time import monotonic",
            "from prometheus_client import Counter",
            "import socket as s",
            "from anyio import sleep",
            "import aiohttp",
            "def f(clock, t):",
            "    monotonic()",
            "    t.perf_counter()",
            "    clock.now()",
            "    open('x')",
        ]
    )
    assert impurities(source) == [
        "<source>:1: imports asyncio",
        "<source>:2: imports os.path",
        "<source>:3: imports time",
        "<source>:4: imports prometheus_client",
        "<source>:5: imports socket",
        "<source>:6: imports anyio",
        "<source>:7: imports aiohttp",
        "<source>:9: calls monotonic()",
        "<source>:10: calls .perf_counter()",
        "<source>:11: calls .now()",
        "<source>:12: calls open()",
    ]


def test_purity_check_accepts_pure_code() -> None:
    assert impurities("import heapq\nfrom collections import deque\nx = deque()\n") == []
