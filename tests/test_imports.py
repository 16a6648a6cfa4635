"""No runtime import cycle in ``iop_edge`` (issue 11), and the pure core loads alone.

The runtime import graph is read from the source with ``ast`` (:mod:`tests.helpers.imports`,
shared with ``tests/test_purity.py``), so it also covers modules and code paths that no test
imports.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.helpers.imports import (
    SHELL_ONLY,
    enclosing_packages,
    find_cycles,
    import_graph,
    package_graph,
    package_modules,
    show_cycle,
)


def test_the_package_has_no_runtime_import_cycle() -> None:
    """Issue 11, done when: no runtime import cycle in iop_edge (type-only imports aside)."""
    cycles = [show_cycle(cycle) for cycle in find_cycles(package_graph())]
    assert cycles == [], "runtime import cycles:\n" + "\n".join(cycles)


def test_the_graph_covers_the_package() -> None:
    """Guards the test above against passing on an empty or wrongly named graph."""
    graph = package_graph()
    assert {"iop_edge", "iop_edge.daemon", "iop_edge.pool.scheduler", "iop_edge.config"} <= set(
        graph
    )
    assert "iop_edge.supervisor" in graph["iop_edge.daemon"]
    assert "iop_edge.pool.policy" in graph["iop_edge.pool.scheduler"]
    # `from iop_edge.config import ConfigError, ...`: a name of the package, so its __init__.
    assert "iop_edge.config" in graph["iop_edge.config_file"]


def graph_of(**sources: str) -> dict[str, set[str]]:
    """Graph of made-up modules: keyword ``p__a`` is module ``p.a``; a module with submodules
    is a package."""
    names = {key.replace("__", "."): textwrap.dedent(text) for key, text in sources.items()}
    packages = {parent for name in names for parent in enclosing_packages(name)}
    return import_graph({name: (text, name in packages) for name, text in names.items()})


def test_graph_counts_lazy_imports_and_skips_type_only_ones() -> None:
    graph = graph_of(
        p="",
        p__a="""
            from typing import TYPE_CHECKING
            if TYPE_CHECKING:
                from p.b import B
            else:
                import p.c
            def build():
                from p.d import make
            """,
        p__b="",
        p__c="",
        p__d="",
    )
    assert graph["p.a"] == {"p.c", "p.d"}


def test_graph_resolves_relative_imports_and_submodule_names() -> None:
    graph = graph_of(
        p="from . import a\nfrom .a import thing\n",
        p__a="from . import b\nfrom .b import name\n",
        p__b="",
        p__sub="",
        p__sub__x="from ..b import y\nfrom .. import a\nfrom . import z\nfrom p import sub\n",
        p__sub__z="",
    )
    assert graph["p"] == {"p.a"}
    assert graph["p.a"] == {"p.b"}
    # Named explicitly, an enclosing package is an edge: its __init__ may still be running.
    assert graph["p.sub.x"] == {"p.a", "p.b", "p.sub.z", "p.sub"}


def test_importing_a_submodule_runs_the_init_of_a_package_that_is_not_the_importers() -> None:
    graph = graph_of(p="", p__a="import p.q.r\n", p__q="import p.a\n", p__q__r="")
    assert graph["p.a"] == {"p.q", "p.q.r"}
    assert find_cycles(graph) == [["p.a", "p.q", "p.a"]]


def test_a_package_init_re_exporting_its_modules_is_no_cycle() -> None:
    graph = graph_of(p="from p.a import A\n", p__a="from p import b\n", p__b="B = 1\n")
    assert find_cycles(graph) == []


def test_find_cycles_reports_each_cycle_once_from_its_smallest_module() -> None:
    graph = {
        "base": {"registry"},
        "registry": {"base", "cli"},
        "cli": {"base"},
        "loop": {"loop"},
        "leaf": set(),
        "x": {"y"},
        "y": {"z"},
        "z": {"x", "leaf"},
    }
    assert [show_cycle(c) for c in find_cycles(graph)] == [
        "base -> registry -> base",
        "loop -> loop",
        "x -> y -> z -> x",
    ]


# Loaded by the HTTP shell only; the pure core must not pull them in, even indirectly.
PURE_CORE = ("iop_edge.config", "iop_edge.pool")


def in_pure_core(module: str) -> bool:
    """Whether ``module`` is one of the pure packages or a module of one."""
    return any(module == p or module.startswith(f"{p}.") for p in PURE_CORE)


def test_importing_the_pure_core_loads_no_event_loop_http_or_api_module() -> None:
    """In a fresh interpreter, importing every module of config/ and pool/ loads neither asyncio
    nor aiohttp (nor the other shell libraries), and of iop_edge only config/, pool/ and errors."""
    # (a package or a module in it: iop_edge.config_file and iop_edge.config_watch are not)
    core = [m.name for m in package_modules() if in_pure_core(m.name)]
    script = textwrap.dedent(
        f"""
        import importlib, sys
        for name in {core!r}:
            importlib.import_module(name)
        print("\\n".join(sorted(sys.modules)))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 0, done.stderr
    loaded = set(done.stdout.split())
    assert set(core) <= loaded
    assert sorted(m for m in loaded if m.split(".")[0] in SHELL_ONLY) == []
    allowed = {"iop_edge", "iop_edge.errors"}
    assert (
        sorted(
            m
            for m in loaded
            if m.startswith("iop_edge.") and m not in allowed and not in_pure_core(m)
        )
        == []
    )
