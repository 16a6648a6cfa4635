"""The production install (issue 15): ``make install PREFIX=...`` for real, the lock file CI
tests against, the licence, and the unit file's paths matching the installed layout."""

from __future__ import annotations

import ast
import hashlib
import json
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.helpers import ROOT
from tools.lock_runtime import render, runtime_pins

#: SHA-256 of the Apache License 2.0 as the ASF publishes it (LICENSE-2.0.txt).
APACHE_2_SHA256 = "c71d239df91726fc519c6eb72d318ec65820627232b2f796219e87dcf35d0ab4"
DEV_ONLY = {"pytest", "pytest-asyncio", "pytest-cov", "hypothesis", "openai", "ruff", "mypy"}


def lock_pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[name] = version
    return pins


def test_the_lock_pins_exactly_what_this_venv_runs():
    """``make setup`` installs with ``-c requirements.lock``: the suite runs against the pinned
    versions, the ones ``make install`` puts in production (``make lock`` rewrites the file)."""
    pins = runtime_pins()
    assert {"aiohttp", "pydantic", "pyyaml", "uvloop", "watchfiles"} <= pins.keys()
    assert not pins.keys() & DEV_ONLY
    assert lock_pins() == pins
    assert (ROOT / "requirements.lock").read_text() == render(pins)


def test_the_licence_is_apache_2_and_declared_as_an_spdx_expression():
    text = (ROOT / "LICENSE").read_bytes()
    assert hashlib.sha256(text).hexdigest() == APACHE_2_SHA256
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert (project["license"], project["license-files"]) == ("Apache-2.0", ["LICENSE"])


def test_anyio_is_neither_a_dependency_nor_imported():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not [d for d in project["dependencies"] if d.lower().startswith("anyio")]
    importers = []
    for path in sorted((ROOT / "iop_edge").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            if any(name.split(".")[0] == "anyio" for name in names):
                importers.append(str(path.relative_to(ROOT)))
    assert importers == []


def installed(prefix: Path) -> dict[str, str]:
    listing = subprocess.run(
        [str(prefix / "bin/python"), "-m", "pip", "list", "--format=json"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return {p["name"].lower().replace("_", "-"): p["version"] for p in json.loads(listing.stdout)}


def test_make_install_builds_a_runtime_only_venv_the_unit_file_runs(tmp_path):
    """``make install PREFIX=...`` (pip's cache makes it quick): iop-edge and exactly the
    locked runtime dependencies, no test or lint tool, no setuptools deprecation warning in
    the output, the licence in the metadata, the docs and deploy files under share/; the
    unit's paths, with /opt/iop-edge read as PREFIX, name what was installed, and
    ``systemd-analyze verify`` accepts it (when installed)."""
    prefix = tmp_path / "opt" / "iop-edge"
    done = subprocess.run(
        ["make", "-C", str(ROOT), "install", f"PREFIX={prefix}", f"PYTHON={sys.executable}"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "deprecat" not in output.lower(), output
    version = subprocess.run(
        [str(prefix / "bin/iop-edge"), "--version"], capture_output=True, text=True, check=True
    )
    assert version.stdout.strip() == "iop-edge 0.1.0"
    packages = installed(prefix)
    assert packages.pop("iop-edge") == "0.1.0"
    assert not packages.keys() & DEV_ONLY
    for tool in ("pytest", "ruff", "mypy"):
        assert not (prefix / "bin" / tool).exists()
    assert {n: v for n, v in packages.items() if n not in ("pip", "setuptools")} == lock_pins()
    license_expression = subprocess.run(
        [
            str(prefix / "bin/python"),
            "-c",
            "from importlib.metadata import metadata, files; m = metadata('iop-edge');"
            "print(m['License-Expression']);"
            "print(next(f for f in files('iop-edge') if f.name == 'LICENSE').locate())",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert license_expression[0] == "Apache-2.0"
    assert Path(license_expression[1]).read_bytes() == (ROOT / "LICENSE").read_bytes()
    share = prefix / "share/iop-edge"
    for name in (
        "README.md",
        "LICENSE",
        "docs/configuration.md",
        "deploy/iop-edge.service",
        "configs/edge.yaml",
    ):
        assert (share / name).is_file(), name
    valid = subprocess.run(
        [str(prefix / "bin/iop-edge"), "config", "validate", str(share / "configs/edge.yaml")],
        capture_output=True,
        text=True,
        env={},
        check=False,
    )
    assert valid.returncode == 0, valid.stderr
    unit = (ROOT / "deploy/iop-edge.service").read_text()
    paths = [word for word in unit.split() if "/opt/iop-edge" in word]
    assert paths == [
        "PREFIX=/opt/iop-edge",  # the install comment
        "Documentation=file:///opt/iop-edge/share/iop-edge/README.md",
        "ExecStart=/opt/iop-edge/bin/iop-edge",
    ]
    assert (prefix / "share/iop-edge/README.md").is_file()
    assert (prefix / "bin/iop-edge").is_file()
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed on this machine (the rest passed)")
    local = tmp_path / "iop-edge.service"
    local.write_text(unit.replace("/opt/iop-edge", str(prefix)))
    verify = subprocess.run(
        ["systemd-analyze", "verify", str(local)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert verify.returncode == 0, verify.stderr
    assert "iop-edge.service" not in verify.stderr
