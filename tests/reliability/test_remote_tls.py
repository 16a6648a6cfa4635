"""The node link over TLS with a private CA (issue 29 items 1, 3, 9, 11), with real processes on
127.0.0.1: ``iop-edge serve`` whose node listener serves ``listen.tls`` — a certificate for
``127.0.0.1`` and ``localhost`` issued by a test CA (``trustme``) — and ``iop-node``
subprocesses. A node given that CA with ``--ca-file`` connects and serves; a node that trusts
only the system's CAs, or another CA, says the edge's certificate failed verification and why,
keeps retrying (a certificate can be fixed without restarting the agent), never reaches the
edge's handshake, and exits 0 on SIGTERM. No log line of either process holds the token.

(A node listener off loopback without TLS is refused when the config loads:
``tests/config/test_remote_config.py``.)
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import openai
import pytest
import pytest_asyncio
import trustme

from iop_edge.testing.edge_process import EdgeProcess, edge_at_rest, edge_status, log_events
from iop_edge.testing.fake_openai import FakeOpenAI
from iop_edge.testing.node_process import node_process
from tests.helpers import dump
from tests.helpers.remote_e2e import (
    joined_node,
    node_status,
    remote_node,
    serving_edge,
    write_token,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")

TOKEN: Final = "iopn_tls-node-0e5b7d92c4a1f368"


@dataclass
class TlsEdge:
    """The edge serving its node listener over TLS, the test CA's certificate (``ca_file``),
    another CA's (``other_ca_file``) and the node's token file."""

    edge: EdgeProcess
    ca_file: Path
    other_ca_file: Path
    token_file: Path


def tls_doc(base_url: str, cert_file: Path, key_file: Path) -> dict[str, Any]:
    """Remote node ``gpu`` (provider ``gpu-oa`` at ``base_url``, model ``chat``), its node
    listener on 127.0.0.1 over TLS."""
    adapter = {"name": "oa", "type": "openai_compat", "base_url": base_url}
    provider = {
        "id": "gpu-oa",
        "type": "openai_compat",
        "category": "local_inference",
        "adapter": "oa",
        "models": ["fake-model"],
    }
    return {
        "openai": {"listen": "127.0.0.1:0"},
        "metrics": {"listen": "127.0.0.1:0"},
        "console": {"listen": "127.0.0.1:0"},
        "listen": {
            "address": "127.0.0.1:0",
            "tls": {"cert_file": str(cert_file), "key_file": str(key_file)},
        },
        "models": [{"id": "chat", "context_window_tokens": 4096, "providers": ["gpu-oa"]}],
        "nodes": [remote_node("gpu", TOKEN, [adapter], [provider])],
    }


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def tls(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[TlsEdge]:
    """One edge for the module, its certificate chain and key in PEM files as an operator
    keeps them; its whole log never holds the token."""
    directory = tmp_path_factory.mktemp("remote-tls")
    ca = trustme.CA()
    issued = ca.issue_cert("127.0.0.1", "localhost")
    cert_file = directory / "edge.pem"
    cert_file.write_bytes(b"".join(blob.bytes() for blob in issued.cert_chain_pems))
    key_file = directory / "edge.key"
    issued.private_key_pem.write_to_path(str(key_file))
    key_file.chmod(0o600)
    ca_file = directory / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    other_ca_file = directory / "other-ca.pem"
    trustme.CA().cert_pem.write_to_path(str(other_ca_file))
    async with FakeOpenAI() as fake:
        config = directory / "edge.yaml"
        config.write_text(dump(tls_doc(fake.base_url, cert_file, key_file)))
        async with serving_edge(config) as edge:
            yield TlsEdge(edge, ca_file, other_ca_file, write_token(directory, TOKEN))
    assert TOKEN not in "".join(edge.lines)


async def test_a_node_trusting_the_edges_ca_serves_over_tls(tls: TlsEdge) -> None:
    """Issue 29 items 1, 3 and 11: the node listener is ``https://``; ``iop-node
    --ca-file CA`` connects to it, and a request is served through the node."""
    edge = tls.edge
    assert edge.addresses["nodes"].startswith("https://127.0.0.1:")
    async with (
        joined_node(edge, "gpu", tls.token_file, "--ca-file", str(tls.ca_file)) as node,
        openai.AsyncOpenAI(
            base_url=edge.addresses["openai"] + "/v1", api_key="unused", max_retries=0
        ) as client,
    ):
        answer = await client.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "over TLS"}]
        )
        assert answer.choices[0].message.content == "over TLS"
        [connected] = node.events("node_connected")
        assert connected["edge"] == edge.addresses["nodes"]
    await edge_at_rest(edge)
    assert TOKEN not in node.output


@pytest.mark.parametrize("trust", ["system CAs", "another CA"])
async def test_a_node_that_does_not_trust_the_certificate_says_so_and_never_connects(
    tls: TlsEdge, trust: str
) -> None:
    """Issue 29 items 3 and 11: without ``--ca-file`` (the system's CAs), or with another CA,
    the node logs that TLS verification of the edge failed, naming the problem (the
    certificate's issuer is unknown), and tries again (not a permanent refusal: it does not
    exit); the edge never gets as far as the node's handshake (no link up, the node stays
    disconnected, no token sent); SIGTERM ends the node with 0."""
    edge = tls.edge
    links_up = len(log_events(edge, "node_link_up"))
    args = ["--edge", edge.addresses["nodes"], "--token-file", str(tls.token_file)]
    if trust == "another CA":
        args += ["--ca-file", str(tls.other_ca_file)]
    async with node_process(*args) as node:
        failed = await node.wait_for_log("node_link_failed")
        assert failed["error"].startswith("TLS verification of the edge failed: ")
        assert (
            "certificate verify failed: unable to get local issuer certificate" in (failed["error"])
        )
        await node.wait_for_log("node_link_failed", after=1)
        assert node.process.poll() is None
        assert await node.terminate() == 0
    assert node.events("node_refused") == []
    assert not node_status(await edge_status(edge), "gpu")["connected"]
    assert len(log_events(edge, "node_link_up")) == links_up
    assert TOKEN not in node.output
