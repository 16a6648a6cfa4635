"""The translation core stays pure (issue 27): it is a layer of tests/test_purity.py's table, and
importing it loads no event loop, HTTP library, clock-reading or other iop_edge module."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.test_imports import SHELL_ONLY, package_modules
from tests.test_purity import LAYERS, clock_and_file_calls, layer_violations, within

LAYER = "iop_edge.translate"


def translate_modules() -> list[str]:
    return [m.name for m in package_modules() if within(m.name, [LAYER])]


def test_the_translation_core_is_a_layer_of_the_purity_table_with_modules_in_it():
    assert LAYERS[LAYER] - {"orjson", LAYER, "iop_edge.errors"} <= LAYERS["iop_edge.errors"]
    assert {
        f"{LAYER}.{name}"
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
        if within(m.name, [LAYER])
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
    assert sorted(m for m in edge if not within(m, [LAYER, "iop_edge.errors"])) == ["iop_edge"]
