"""The pure core stays pure (STYLE.md, issue 11): a layer allow-list, checked on the source.

Each module of a layer imports only what its row allows (a module name allows its submodules):

=================== ==============================================================================
layer               may import at runtime
=================== ==============================================================================
``iop_edge.errors`` the pure standard library (``PURE_STDLIB``)
``iop_edge.pool``   the pure standard library, ``iop_edge.pool``, ``iop_edge.errors``
``iop_edge.config`` the pure standard library, ``pydantic``, ``yaml``, ``orjson`` (canonical JSON
                    for the config hash), ``iop_edge.config``, ``iop_edge.pool`` (the config →
                    scheduler policy mapping), ``iop_edge.errors``
``iop_edge.         the pure standard library, ``orjson``, ``iop_edge.translate``,
translate``         ``iop_edge.errors`` (the API surfaces' translation core, issue 27)
=================== ==============================================================================

The pure standard library is an explicit list: computation on values, no event loop, socket,
thread, process, file, environment, clock or randomness (so not ``asyncio``, ``os``, ``io``,
``pathlib``, ``time``, ``datetime``, ``random``, ``uuid``, ``sys``, ``logging``...). ``pool`` is
below ``config``: the scheduler knows nothing of the file format. ``errors`` is in the table
because both layers import it. Beyond imports, these layers never read the clock or open a file.

Imports inside functions count; imports under ``if TYPE_CHECKING:`` do not (they never run).
The reload path (``supervisor``, ``admission``, ``config/``, ``pool/``) does not reach ``api/``,
directly or through another module. Checked with ``ast``, so it also holds for code paths no
test runs; the parser and the import graph are those of ``tests/test_imports.py``.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

from tests.helpers.imports import (
    PACKAGE_DIR,
    SHELL_ONLY,
    Import,
    package_graph,
    package_modules,
    runtime_imports,
)

PURE_STDLIB = frozenset(
    {
        "__future__",
        "abc",
        "base64",
        "bisect",
        "collections",
        "contextlib",
        "copy",
        "dataclasses",
        "decimal",
        "difflib",
        "enum",
        "fractions",
        "functools",
        "graphlib",
        "hashlib",
        "heapq",
        "ipaddress",
        "itertools",
        "json",
        "keyword",
        "math",
        "numbers",
        "operator",
        "re",
        "reprlib",
        "string",
        "textwrap",
        "types",
        "typing",
        "unicodedata",
        "urllib.parse",
    }
)
LAYERS: Mapping[str, frozenset[str]] = {
    "iop_edge.errors": PURE_STDLIB,
    "iop_edge.pool": PURE_STDLIB | {"iop_edge.pool", "iop_edge.errors"},
    "iop_edge.config": PURE_STDLIB
    | {"pydantic", "yaml", "orjson", "iop_edge.config", "iop_edge.pool", "iop_edge.errors"},
    "iop_edge.translate": PURE_STDLIB | {"orjson", "iop_edge.translate", "iop_edge.errors"},
}
# Never allowed in any layer: the allow-lists are checked against this as well, so that widening
# one by mistake fails here rather than in review.
IMPURE = frozenset(
    {
        "aiohttp",
        "anyio",
        "asyncio",
        "concurrent",
        "datetime",
        "httpx",
        "importlib",
        "io",
        "logging",
        "multiprocessing",
        "os",
        "pathlib",
        "prometheus_client",
        "random",
        "secrets",
        "selectors",
        "shutil",
        "signal",
        "socket",
        "structlog",
        "subprocess",
        "sys",
        "tempfile",
        "threading",
        "time",
        "trio",
        "urllib.request",
        "uuid",
        "uvloop",
        "watchfiles",
        "iop_edge.adapters",
        "iop_edge.api",
        "iop_edge.daemon",
        "iop_edge.supervisor",
    }
)
CLOCK_CALLS = frozenset(
    {"monotonic", "monotonic_ns", "perf_counter", "perf_counter_ns", "time", "time_ns", "now"}
)
FORBIDDEN_BUILTINS = frozenset({"open", "__import__", "input"})

RELOAD_PATH = ("iop_edge.supervisor", "iop_edge.admission", "iop_edge.config", "iop_edge.pool")
HTTP_PACKAGE = "iop_edge.api"


def within(module: str, names: Iterable[str]) -> bool:
    """``module`` is one of ``names`` or a submodule of one."""
    return any(module == name or module.startswith(f"{name}.") for name in names)


def layer_of(module: str) -> str | None:
    """The row of the table that governs ``module``, if any."""
    return next((layer for layer in LAYERS if within(module, [layer])), None)


def disallowed(imp: Import, allowed: frozenset[str]) -> list[str]:
    """The modules ``imp`` imports that ``allowed`` does not cover. ``from pkg import name``
    passes if ``pkg`` is allowed or every ``pkg.name`` is (``from urllib import parse``)."""
    if within(imp.module, allowed):
        return []
    if imp.names and any(a.startswith(f"{imp.module}.") for a in allowed):
        candidates = [f"{imp.module}.{name}" for name in imp.names]
        return [c for c in candidates if not within(c, allowed)]
    return [imp.module]


def layer_violations(source: str, module: str, *, is_package: bool = False) -> list[str]:
    """Every runtime import of ``module`` outside its layer's allow-list, as ``line: what``."""
    layer = layer_of(module)
    assert layer is not None, f"{module} is in no layer of the table"
    return [
        f"{imp.line}: imports {bad}, which {layer} may not import"
        for imp in runtime_imports(source, module, is_package=is_package)
        for bad in disallowed(imp, LAYERS[layer])
    ]


def clock_and_file_calls(source: str) -> list[str]:
    """Every call that reads the clock or opens a file, as ``line: what``."""
    problems = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in CLOCK_CALLS:
            problems.append(f"{node.lineno}: calls .{func.attr}()")
        if isinstance(func, ast.Name) and func.id in FORBIDDEN_BUILTINS | CLOCK_CALLS:
            problems.append(f"{node.lineno}: calls {func.id}()")
    return problems


def layered_modules() -> list[tuple[str, Path, str, bool]]:
    return [
        (m.name, m.path, m.source, m.is_package)
        for m in package_modules()
        if layer_of(m.name) is not None
    ]


def where(path: Path) -> str:
    return path.relative_to(PACKAGE_DIR.parent).as_posix()


def test_every_layer_has_modules_to_check() -> None:
    """Guards the checks below against passing on nothing (a moved or renamed package)."""
    names = {name for name, *_ in layered_modules()}
    assert {"iop_edge.errors", "iop_edge.pool", "iop_edge.pool.scheduler"} <= names
    assert {"iop_edge.config", "iop_edge.config.load", "iop_edge.config.schema"} <= names
    assert {"iop_edge.translate", "iop_edge.translate.events"} <= names


def test_config_pool_and_errors_import_only_what_their_layer_allows() -> None:
    problems = [
        f"{where(path)}:{problem}"
        for name, path, source, is_package in layered_modules()
        for problem in layer_violations(source, name, is_package=is_package)
    ]
    assert problems == []


def test_config_pool_and_errors_never_read_the_clock_or_open_a_file() -> None:
    problems = [
        f"{where(path)}:{problem}"
        for _, path, source, _ in layered_modules()
        for problem in clock_and_file_calls(source)
    ]
    assert problems == []


def chains_into(graph: Mapping[str, set[str]], starts: Iterable[str], target: str) -> list[str]:
    """The shortest import chain from ``starts`` to each module of ``target`` they reach, as
    ``a -> b -> target.x`` (breadth first over ``graph``)."""
    came_from: dict[str, str | None] = dict.fromkeys(sorted(starts))
    frontier = list(came_from)
    while frontier:
        following = []
        for node in frontier:
            for succ in sorted(graph.get(node, set()) - came_from.keys()):
                came_from[succ] = node
                following.append(succ)
        frontier = following
    chains = []
    for module in sorted(m for m in came_from if within(m, [target])):
        chain: list[str] = []
        step: str | None = module
        while step is not None:
            chain.append(step)
            step = came_from[step]
        chains.append(" -> ".join(reversed(chain)))
    return chains


def test_the_reload_path_does_not_pass_through_the_http_package() -> None:
    """Issue 11: supervisor → refresh → scheduler never imports ``api/``, even indirectly."""
    graph = package_graph()
    starts = [m for m in graph if within(m, RELOAD_PATH)]
    assert {"iop_edge.supervisor", "iop_edge.admission", "iop_edge.pool.scheduler"} <= set(starts)
    assert chains_into(graph, starts, HTTP_PACKAGE) == []


def test_chains_into_reports_indirect_paths() -> None:
    graph = {
        "supervisor": {"config_file", "systemd"},
        "config_file": {"api.catalog"},
        "systemd": set(),
        "daemon": {"api"},
    }
    assert chains_into(graph, ["supervisor"], "api") == ["supervisor -> config_file -> api.catalog"]
    assert chains_into(graph, ["systemd"], "api") == []


def test_no_module_takes_the_config_to_scheduler_mapping_from_the_http_package() -> None:
    """Issue 11: ``pool_policy`` and ``completions_group`` live in the config core, so the
    daemon's reload callback (which maps each new config to a scheduler policy) does not reach
    into ``api/`` for them."""
    problems = [
        f"{where(m.path)}:{imp.line}: imports {name} from {imp.module}"
        for m in package_modules()
        if not within(m.name, [HTTP_PACKAGE])
        for imp in runtime_imports(m.source, m.name, is_package=m.is_package)
        if within(imp.module, [HTTP_PACKAGE])
        for name in imp.names
        if name in {"pool_policy", "completions_group"}
    ]
    assert problems == []


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_allow_lists_name_real_modules_and_nothing_impure(layer: str) -> None:
    allowed = LAYERS[layer]
    unknown = sorted(
        name
        for name in allowed
        if not name.startswith("iop_edge")
        and name.split(".")[0] not in sys.stdlib_module_names | {"pydantic", "yaml", "orjson"}
    )
    assert unknown == []
    assert sorted(name for name in IMPURE if within(name, allowed)) == []


def test_layer_check_catches_every_kind_of_forbidden_import() -> None:
    source = "\n".join(
        [
            "from __future__ import annotations",
            "import asyncio",
            "import os.path",
            "from time import monotonic",
            "from prometheus_client import Counter",
            "import socket as s",
            "from urllib import parse, request",
            "import pydantic",
            "from iop_edge.config import schema",
            "from ..api import errors",
            "from typing import TYPE_CHECKING",
            "if TYPE_CHECKING:",
            "    from iop_edge.adapters import Adapter",
            "def f():",
            "    import aiohttp",
        ]
    )
    assert layer_violations(source, "iop_edge.pool.slots") == [
        "2: imports asyncio, which iop_edge.pool may not import",
        "3: imports os.path, which iop_edge.pool may not import",
        "4: imports time, which iop_edge.pool may not import",
        "5: imports prometheus_client, which iop_edge.pool may not import",
        "6: imports socket, which iop_edge.pool may not import",
        "7: imports urllib.request, which iop_edge.pool may not import",
        "8: imports pydantic, which iop_edge.pool may not import",
        "9: imports iop_edge.config, which iop_edge.pool may not import",
        "10: imports iop_edge.api, which iop_edge.pool may not import",
        "15: imports aiohttp, which iop_edge.pool may not import",
    ]


def test_layer_check_accepts_what_the_table_allows() -> None:
    source = "\n".join(
        [
            "import heapq",
            "import urllib.parse",
            "from collections.abc import Mapping",
            "from urllib import parse",
            "import yaml",
            "from pydantic import BaseModel",
            "from iop_edge.pool import PoolPolicy",
            "from iop_edge import errors",
            "from . import schema",
            "from .schema import EdgeConfig",
        ]
    )
    assert layer_violations(source, "iop_edge.config.policy") == []
    assert layer_violations("from iop_edge.errors import ConfigError\n", "iop_edge.pool") == []


def test_clock_check_catches_clock_reads_and_file_opens() -> None:
    source = (
        "def f(clock, t):\n    monotonic()\n    t.perf_counter()\n    clock.now()\n    open('x')\n"
    )
    assert clock_and_file_calls(source) == [
        "2: calls monotonic()",
        "3: calls .perf_counter()",
        "4: calls .now()",
        "5: calls open()",
    ]
    assert clock_and_file_calls("from collections import deque\nx = deque()\n") == []


# --- the translation core (issue 27) is a pure layer too ----------------------------------

TRANSLATE = "iop_edge.translate"


def translate_modules() -> list[str]:
    return [m.name for m in package_modules() if within(m.name, [TRANSLATE])]


def test_the_translation_core_is_a_layer_of_the_purity_table_with_modules_in_it():
    assert LAYERS[TRANSLATE] - {"orjson", TRANSLATE, "iop_edge.errors"} <= LAYERS["iop_edge.errors"]
    assert {
        f"{TRANSLATE}.{name}"
        for name in (
            "events",
            "chat_events",
            "chat_request",
            "sse",
            "messages_request",
            "messages_reply",
            "messages_stream",
            "anthropic_errors",
            "count_tokens",
        )
    } <= set(translate_modules())


def test_the_translation_core_imports_only_its_layer_and_reads_no_clock_or_file():
    problems = [
        f"{m.name}:{problem}"
        for m in package_modules()
        if within(m.name, [TRANSLATE])
        for problem in layer_violations(m.source, m.name, is_package=m.is_package)
        + clock_and_file_calls(m.source)
    ]
    assert problems == []


def test_importing_the_translation_core_loads_no_shell_library_and_no_other_edge_module():
    script = textwrap.dedent(
        f"""
        import importlib, sys
        for name in {translate_modules()!r}:
            importlib.import_module(name)
        print("\\n".join(sorted(sys.modules)))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 0, done.stderr
    loaded = set(done.stdout.split())
    assert sorted(m for m in loaded if m.split(".")[0] in SHELL_ONLY) == []
    edge = {m for m in loaded if m.startswith("iop_edge")}
    assert sorted(m for m in edge if not within(m, [TRANSLATE, "iop_edge.errors"])) == ["iop_edge"]
