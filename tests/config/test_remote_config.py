"""Remote nodes in the config: ``listen.tls``, ``bootstrap``, ``nodes[].token_hash_sha256``, and
the rules that relate them (docs/configuration.md, "Remote nodes")."""

from __future__ import annotations

from typing import Any

import pytest

from iop_edge.config.validate import config_warnings
from iop_edge.tokens import token_hash
from tests.helpers.config import HASH_A, HASH_B, base_doc, load, node, problem_at, problems

TLS = {"cert_file": "/etc/iop-edge/edge.pem", "key_file": "/etc/iop-edge/edge.key"}
HASH_C = "c" * 64


def remote_doc(address: str = "127.0.0.1:7600", **bootstrap: Any) -> dict[str, Any]:
    """base_doc() with its node remote (a token hash) and a second, local node."""
    doc = base_doc()
    node(doc)["token_hash_sha256"] = HASH_A
    doc["nodes"].append(
        {"id": "here", "adapters": [{"name": "sh", "type": "cli", "command": "cat"}]}
    )
    doc["listen"] = {"address": address}
    if bootstrap:
        doc["bootstrap"] = bootstrap
    return doc


# --- schema ---------------------------------------------------------------------------------


def test_defaults_open_no_listener_and_ping_every_two_seconds():
    config = load(base_doc())
    assert (config.listen.address, config.listen.tls) == ("127.0.0.1:7600", None)
    assert (config.bootstrap.enabled, config.bootstrap.heartbeat_ms) == (None, 2000)
    assert (config.remote_nodes, config.node_listener_enabled) == ((), False)


def test_a_node_is_remote_exactly_when_it_sets_a_token_hash():
    config = load(remote_doc())
    assert [(n.id, n.remote) for n in config.nodes] == [("gpu-1", True), ("here", False)]
    assert [n.id for n in config.remote_nodes] == ["gpu-1"]
    assert config.nodes[0].token_hash_sha256 == HASH_A


@pytest.mark.parametrize(
    ("enabled", "remote", "opens"),
    [
        (None, False, False),
        (None, True, True),
        (True, False, True),
        (True, True, True),
        (False, False, False),
    ],
)
def test_the_node_listener_opens_when_enabled_or_by_default_when_a_node_is_remote(
    enabled, remote, opens
):
    doc = remote_doc() if remote else base_doc()
    if enabled is not None:
        doc["bootstrap"] = {"enabled": enabled}
    assert load(doc).node_listener_enabled is opens


def test_heartbeat_is_bounded_with_the_reason():
    doc = base_doc()
    doc["bootstrap"] = {"heartbeat_ms": 99}
    assert problem_at(doc, "bootstrap.heartbeat_ms") == (
        "99 is below 100; heartbeat_ms must be >= 100 (faster pings cost traffic and CPU on "
        "both sides)"
    )
    doc["bootstrap"] = {"heartbeat_ms": 60_001}
    assert problem_at(doc, "bootstrap.heartbeat_ms") == (
        "60001 is above 60000; heartbeat_ms must be <= 60000 (a silent link is declared dead "
        "after three of them)"
    )
    doc["bootstrap"] = {"heartbeat_ms": "2000"}
    assert "is invalid" in problem_at(doc, "bootstrap.heartbeat_ms")
    for edge in (100, 60_000):
        doc["bootstrap"] = {"heartbeat_ms": edge}
        assert load(doc).bootstrap.heartbeat_ms == edge


def test_bootstrap_enabled_is_a_strict_boolean():
    doc = base_doc()
    doc["bootstrap"] = {"enabled": "yes"}
    assert "is invalid" in problem_at(doc, "bootstrap.enabled")


def test_listen_tls_needs_both_files_named():
    doc = base_doc()
    doc["listen"] = {"tls": {"cert_file": " ", "key_file": "k.pem"}}
    assert problem_at(doc, "listen.tls.cert_file") == (
        "' ' is empty; cert_file must be a non-empty string"
    )
    doc["listen"] = {"tls": {"cert_file": "c.pem"}}
    assert problem_at(doc, "listen.tls.key_file") == "required key 'key_file' is missing"
    doc["listen"] = {"tls": {**TLS, "ca_file": "x"}}
    assert "unknown key 'ca_file'" in problem_at(doc, "listen.tls.ca_file")
    doc["listen"] = {"tls": TLS}
    assert load(doc).listen.tls is not None


# --- validation rule 1: bootstrap is no longer reserved -------------------------------------


def test_bootstrap_enabled_true_loads_without_any_remote_node():
    doc = base_doc()
    doc["bootstrap"] = {"enabled": True}
    config = load(doc)
    assert config.bootstrap.enabled is True
    assert config.node_listener_enabled


# --- rule 2: off loopback, the node listener needs TLS --------------------------------------

OFF_LOOPBACK_MESSAGE = (
    "'0.0.0.0:7600' is not a loopback address and listen.tls is not set, but the node "
    "listener opens there ({why}); nodes send their token and receive provider credentials "
    "over it, so off loopback it needs TLS (set listen.tls.cert_file and listen.tls.key_file) "
    "or a loopback address such as 127.0.0.1:7600"
)


def test_an_open_node_listener_off_loopback_without_tls_is_refused_naming_why():
    assert problem_at(remote_doc("0.0.0.0:7600"), "listen.address") == OFF_LOOPBACK_MESSAGE.format(
        why="nodes[gpu-1] is remote"
    )
    doc = base_doc()
    doc["listen"] = {"address": "0.0.0.0:7600"}
    doc["bootstrap"] = {"enabled": True}
    assert problem_at(doc, "listen.address") == OFF_LOOPBACK_MESSAGE.format(
        why="bootstrap.enabled is true"
    )


def test_tls_or_loopback_or_a_closed_listener_lets_any_address_load():
    with_tls = remote_doc("0.0.0.0:7600")
    with_tls["listen"]["tls"] = TLS
    assert load(with_tls).listen.tls is not None
    assert load(remote_doc("[::1]:7600")).node_listener_enabled
    closed = base_doc()  # no remote node: the listener does not open, its address is unused
    closed["listen"] = {"address": "0.0.0.0:7600"}
    assert not load(closed).node_listener_enabled


# --- rule 3: bootstrap.enabled false with a remote node -------------------------------------


def test_a_remote_node_with_bootstrap_disabled_is_refused_at_its_token():
    doc = remote_doc("0.0.0.0:7600", enabled=False)  # off loopback: no listener, no TLS error
    found = {p.path: p.message for p in problems(doc)}
    assert found == {
        "nodes[gpu-1].token_hash_sha256": "is set, so the node is remote, but "
        "bootstrap.enabled is false, so the node listener never opens and its agent cannot "
        "connect; remove bootstrap.enabled (or set it true), or remove token_hash_sha256 to run "
        "the node's adapters in the edge process"
    }


# --- rule 4: one token, one role ------------------------------------------------------------


def test_node_token_hashes_are_unique_among_nodes():
    doc = remote_doc()
    node(doc, 1)["token_hash_sha256"] = HASH_A.upper()  # the same digest, written otherwise
    assert problem_at(doc, "nodes[here].token_hash_sha256") == (
        "the same hash as nodes[gpu-1].token_hash_sha256; a token has one role, so each remote "
        "node needs a token of its own (make one with `iop-edge token node --node here`)"
    )
    node(doc, 1)["token_hash_sha256"] = HASH_B
    assert [n.id for n in load(doc).remote_nodes] == ["gpu-1", "here"]


def test_a_node_token_is_no_principal_token_and_not_the_admin_token():
    doc = remote_doc()
    doc["openai"] = {
        "principal_tokens": [
            {"token_ref": "app", "token_hash_sha256": HASH_A, "principal_ref": "team"}
        ]
    }
    node(doc, 1)["token_hash_sha256"] = HASH_C
    doc["console"] = {"admin_token_sha256": HASH_C}
    found = {p.path: p.message for p in problems(doc)}
    rule = "; a token has one role, so each remote node needs a token of its own"
    assert found == {
        "nodes[gpu-1].token_hash_sha256": "the same hash as "
        "openai.principal_tokens[app].token_hash_sha256" + rule + " (make one with "
        "`iop-edge token node --node gpu-1`)",
        "nodes[here].token_hash_sha256": "the same hash as console.admin_token_sha256"
        + rule
        + " (make one with `iop-edge token node --node here`)",
    }
    # no message shows the secret's digest
    assert not [m for m in found.values() if HASH_A in m or HASH_C in m]


def test_every_remote_node_problem_is_reported_at_once():
    doc = remote_doc("0.0.0.0:7600")
    node(doc, 1)["token_hash_sha256"] = HASH_A
    doc["bootstrap"] = {"heartbeat_ms": 1}
    assert {p.path for p in problems(doc)} == {"bootstrap.heartbeat_ms"}  # schema first
    doc["bootstrap"] = {"enabled": True}
    assert {p.path for p in problems(doc)} == {"listen.address", "nodes[here].token_hash_sha256"}


def test_a_real_token_hash_makes_a_node_remote():
    doc = base_doc()
    node(doc)["token_hash_sha256"] = token_hash("iopn_example")
    assert load(doc).nodes[0].remote


# --- rule 5: listen.tls with nothing to serve is a warning ----------------------------------


def test_listen_tls_without_a_listener_to_serve_is_a_warning_not_an_error():
    doc = base_doc()
    doc["listen"] = {"tls": TLS}
    [warning] = config_warnings(load(doc))
    assert (warning.path, warning.message) == (
        "listen.tls",
        "is set but the node listener does not open: no node is remote (none sets "
        "token_hash_sha256) and bootstrap.enabled is not true; the certificate and key are "
        "not used",
    )
    doc["bootstrap"] = {"enabled": False}
    [warning] = config_warnings(load(doc))
    assert "does not open: bootstrap.enabled is false;" in warning.message


def test_no_warning_when_tls_serves_or_is_absent():
    with_tls = remote_doc()
    with_tls["listen"]["tls"] = TLS
    assert config_warnings(load(with_tls)) == ()
    assert config_warnings(load(remote_doc())) == ()
    assert config_warnings(load(base_doc())) == ()
