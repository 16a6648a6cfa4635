"""Config rules of the trust boundary (issue 10 item 7): ``console.admin_token_sha256`` and a
non-loopback console, ``openai.allowed_origins``; ``config validate`` and ``serve`` agree."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers.config import HASH_A, base_doc, load, problem_at

IOP_EDGE = str(Path(sys.executable).with_name("iop-edge"))


@pytest.mark.parametrize("listen", ["0.0.0.0:7601", "10.1.2.3:7601", "[::]:7601", "edge:7601"])
def test_a_console_off_loopback_needs_an_admin_token(listen):
    doc = base_doc()
    doc["console"] = {"listen": listen}
    message = problem_at(doc, "console.listen")
    assert f"{listen!r} is not a loopback address" in message
    assert "console.admin_token_sha256 is not set" in message
    assert "iop-edge token admin" in message
    doc["console"]["admin_token_sha256"] = HASH_A.upper()
    assert load(doc).console.admin_token_sha256 == HASH_A  # normalized like token hashes
    doc["console"] = {"listen": listen, "enabled": False}
    assert load(doc).console.listen == listen  # a disabled console listens nowhere


@pytest.mark.parametrize("listen", ["127.0.0.1:7601", "127.8.8.8:1", "[::1]:7601", "localhost:1"])
def test_a_loopback_console_needs_no_admin_token(listen):
    doc = base_doc()
    doc["console"] = {"listen": listen}
    assert load(doc).console.admin_token_sha256 is None


def test_the_admin_token_is_a_sha256_hash_never_a_token():
    doc = base_doc()
    doc["console"] = {"admin_token_sha256": "iop_raw-admin-token"}
    message = problem_at(doc, "console.admin_token_sha256")
    assert "is not a SHA-256 hex digest" in message


def test_allowed_origins_are_stored_as_browsers_send_them():
    doc = base_doc()
    doc["openai"] = {
        "allowed_origins": [
            "https://Chat.Example.COM",
            "https://chat.example.com:443/",
            "http://localhost:3000",
            "http://[::1]:80",
        ]
    }
    assert load(doc).openai.allowed_origins == (
        "https://chat.example.com",
        "https://chat.example.com",
        "http://localhost:3000",
        "http://[::1]",
    )
    assert load(base_doc()).openai.allowed_origins == ()


def test_config_validate_and_serve_agree_on_a_non_loopback_console(tmp_path):
    doc = base_doc()
    doc["openai"] = {"listen": "127.0.0.1:0"}
    doc["console"] = {"listen": "0.0.0.0:0"}
    config = tmp_path / "edge.yaml"
    config.write_text(yaml.safe_dump(doc))
    validate = subprocess.run(
        [IOP_EDGE, "config", "validate", str(config)], capture_output=True, text=True, timeout=60
    )
    serve = subprocess.run(
        [IOP_EDGE, "serve", "--config", str(config)], capture_output=True, text=True, timeout=60
    )
    assert (validate.returncode, serve.returncode) == (1, 1)
    expected = "console.listen: '0.0.0.0:0' is not a loopback address"
    assert expected in validate.stderr
    assert expected in serve.stderr
