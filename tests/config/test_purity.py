"""config/ and pool/ stay pure: no asyncio, I/O, network, metrics or clock (STYLE.md)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "iop_edge"
FORBIDDEN_MODULES = {
    "asyncio",
    "anyio",
    "socket",
    "aiohttp",
    "uvloop",
    "prometheus_client",
    "time",
    "os",
    "pathlib",
    "subprocess",
    "watchfiles",
    "structlog",
    "threading",
    "datetime",
}
FORBIDDEN_CALLS = {"open", "print", "input"}


def imported_modules(tree: ast.AST) -> set[str]:
    found = set()
    for item in ast.walk(tree):
        if isinstance(item, ast.Import):
            found |= {alias.name.split(".")[0] for alias in item.names}
        elif isinstance(item, ast.ImportFrom) and item.module and item.level == 0:
            found.add(item.module.split(".")[0])
    return found


@pytest.mark.parametrize(
    "module", sorted(str(p.relative_to(PACKAGE)) for p in (PACKAGE / "config").glob("*.py"))
)
def test_config_modules_are_pure(module):
    tree = ast.parse((PACKAGE / module).read_text())
    assert imported_modules(tree) & FORBIDDEN_MODULES == set()
    calls = {
        node.func.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    }
    assert calls & FORBIDDEN_CALLS == set()
