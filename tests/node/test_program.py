"""The ``iop-node`` command line (design §3, §6), run as an operator runs it: a subprocess of the
console script. Flags win over ``$IOP_NODE_EDGE`` / ``$IOP_NODE_TOKEN_FILE``; a usage error
exits 2 naming the flag (or variable) and its value; a token file that cannot be used exits 1
with a message naming the file and never the token; SIGTERM exits 0, with ``READY`` and
``STOPPING`` sent to systemd's notify socket. Against the stub edge: a request served and
drained on SIGTERM, and exit 2 on a 401 and on another protocol version, both versions named."""

from __future__ import annotations

import asyncio
import signal
import socket
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trustme

from iop_edge import __version__
from iop_edge.link.protocol import Kind
from iop_edge.node.options import NodeOptions
from iop_edge.node.program import OptionsError, main, parse_options
from iop_edge.testing.fake_openai import FakeBehavior, FakeOpenAI
from iop_edge.testing.node_process import iop_node, node_environment, node_process
from tests.helpers.adapters import chat
from tests.helpers.edge_stub import EdgeStub, edge_stub, fake_payload

TOKEN = "iopn_s3cr3t-node-token-never-shown"
CLOSED = "http://127.0.0.1:9"  # nothing listens on the discard port: every dial is refused


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    path.chmod(0o600)
    return path


def run_node(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``iop-node ARGS`` that is expected to exit by itself (a refusal at start)."""
    return subprocess.run(
        [iop_node(), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=node_environment(env),
    )


def test_version_and_help_name_the_program_and_its_exit_codes():
    version = run_node("--version")
    assert (version.returncode, version.stdout.strip()) == (0, f"iop-node {__version__}")
    usage = run_node("--help")
    assert usage.returncode == 0
    text = " ".join(usage.stdout.split())
    for words in ("--edge URL", "--token-file FILE", "--ca-file FILE", "$IOP_NODE_EDGE"):
        assert words in text
    assert "2 a usage error or a permanent refusal" in text


async def test_the_flags_win_over_the_environment(tmp_path, token_file):
    """``--edge`` over ``$IOP_NODE_EDGE``; ``--token-file`` over ``$IOP_NODE_TOKEN_FILE`` (the
    variable's file does not exist: a node that read it would exit 1)."""
    env = {"IOP_NODE_EDGE": "http://127.0.0.1:7", "IOP_NODE_TOKEN_FILE": str(tmp_path / "gone")}
    async with node_process("--edge", CLOSED, "--token-file", str(token_file), env=env) as node:
        started = await node.wait_for_log("node_starting")
        assert started["edge"] == CLOSED
        assert await node.terminate() == 0
    assert TOKEN not in node.output


async def test_the_environment_alone_is_enough(token_file):
    env = {"IOP_NODE_EDGE": CLOSED, "IOP_NODE_TOKEN_FILE": str(token_file)}
    async with node_process(env=env) as node:
        started = await node.wait_for_log("node_starting")
        assert (started["edge"], started["drain_timeout"]) == (CLOSED, 30.0)
        assert await node.terminate() == 0


async def test_a_token_file_flag_that_cannot_be_read_is_named_even_when_the_variable_is_fine(
    tmp_path, token_file
):
    missing = tmp_path / "missing-token"
    env = {"IOP_NODE_TOKEN_FILE": str(token_file)}
    done = run_node("--edge", CLOSED, "--token-file", str(missing), env=env)
    assert done.returncode == 1
    assert done.stderr == (
        f"iop-node: the token file {missing} (--token-file) cannot be read: "
        "No such file or directory\n"
    )


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        (
            [],
            {},
            "iop-node: no edge given: pass --edge URL or set $IOP_NODE_EDGE",
        ),
        (
            ["--edge", "ftp://edge.example:7600"],
            {},
            "iop-node: --edge 'ftp://edge.example:7600': the edge URL must start with one of "
            "https://, http://, wss://, ws://",
        ),
        (
            [],
            {"IOP_NODE_EDGE": "edge.example:7600"},
            "iop-node: $IOP_NODE_EDGE 'edge.example:7600': the edge URL must start with",
        ),
        (
            ["--edge", "https://edge.example:76000"],
            {},
            "iop-node: --edge 'https://edge.example:76000' is not a URL: Port out of range",
        ),
        (
            ["--edge", "https://edge.example:7600/?token=x"],
            {},
            "iop-node: --edge 'https://edge.example:7600/?token=x': the edge URL takes no "
            "user, query or fragment",
        ),
        (
            ["--edge", CLOSED],
            {},
            "iop-node: no token file given: pass --token-file FILE or set $IOP_NODE_TOKEN_FILE",
        ),
        (
            ["--edge", CLOSED, "--token-file", "{token}", "--drain-timeout", "-1"],
            {},
            "iop-node: --drain-timeout '-1' is not a number of seconds >= 0",
        ),
        (
            ["--edge", CLOSED, "--token-file", "{token}", "--drain-timeout", "soon"],
            {},
            "iop-node: --drain-timeout 'soon' is not a number of seconds >= 0",
        ),
        (
            ["--edge", CLOSED, "--token-file", "{token}", "--ca-file", "ca.pem"],
            {},
            "iop-node: --ca-file ca.pem is for an edge dialled over TLS, but the edge URL "
            f"'{CLOSED}' is not https://",
        ),
        (
            ["--edge", CLOSED, "--token-file", "{token}", "--log-level", "loud"],
            {},
            "iop-node: error: argument --log-level: invalid choice: 'loud'",
        ),
        (
            ["--edge", CLOSED, "--token-file", "{token}", "--config", "node.yaml"],
            {},
            "iop-node: error: unrecognized arguments: --config node.yaml",
        ),
    ],
)
def test_a_usage_error_exits_2_naming_the_option_and_its_value(
    args: list[str], env: dict[str, str], expected: str, token_file: Path
) -> None:
    done = run_node(*(a.replace("{token}", str(token_file)) for a in args), env=env)
    assert done.returncode == 2, done.stderr
    assert expected in done.stderr
    assert TOKEN not in done.stderr


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"", "is empty"),
        (b"  \n", "is empty"),
        (TOKEN.encode() + b" second-word\n", "holds something other than one token"),
        (TOKEN.encode() + b"\xff\n", "holds something other than one token"),
        (TOKEN.encode() * 200, "is larger than 4096 bytes"),
    ],
)
def test_a_token_file_that_is_not_one_token_exits_1_without_showing_it(
    tmp_path: Path, content: bytes, problem: str
) -> None:
    path = tmp_path / "token"
    path.write_bytes(content)
    done = run_node("--edge", CLOSED, "--token-file", str(path))
    assert done.returncode == 1
    assert done.stderr.startswith(f"iop-node: the token file {path} (--token-file) {problem}")
    assert TOKEN not in done.stderr
    assert "second-word" not in done.stderr


def test_a_token_file_that_cannot_be_read_exits_1(tmp_path: Path) -> None:
    """A directory where the file should be: unreadable whoever runs the suite (root reads a
    mode-000 file)."""
    done = run_node("--edge", CLOSED, env={"IOP_NODE_TOKEN_FILE": str(tmp_path)})
    assert done.returncode == 1
    assert done.stderr == (
        f"iop-node: the token file {tmp_path} ($IOP_NODE_TOKEN_FILE) cannot be read: "
        "Is a directory\n"
    )


def test_a_ca_file_that_cannot_be_used_exits_1_without_showing_the_token(
    tmp_path: Path, token_file: Path
) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("not a certificate\n")
    edge = "https://edge.example:7600"
    done = run_node("--edge", edge, "--token-file", str(token_file), "--ca-file", str(ca))
    assert done.returncode == 1
    assert done.stderr.startswith(f"iop-node: the CA file {ca} (--ca-file) cannot be used: ")
    assert TOKEN not in done.stderr
    missing = run_node(
        "--edge", edge, "--token-file", str(token_file), "--ca-file", str(tmp_path / "no.pem")
    )
    assert missing.returncode == 1
    assert "(--ca-file) cannot be used: No such file or directory" in missing.stderr


async def test_sigterm_exits_0_after_ready_and_stopping_reach_systemd(tmp_path, token_file):
    """Under systemd (``Type=notify``): ``READY=1`` once the options are valid, ``STOPPING=1``
    on SIGTERM, exit 0 — on a real Unix datagram socket, as systemd listens."""
    notify = tmp_path / "notify"
    systemd = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    systemd.bind(str(notify))
    systemd.setblocking(False)
    try:
        env = {"NOTIFY_SOCKET": str(notify)}
        async with node_process("--edge", CLOSED, "--token-file", str(token_file), env=env) as node:
            await node.wait_for_log("node_starting")
            ready = await received(systemd)
            assert ready.split("\n")[0] == "READY=1"
            assert f"STATUS=dialing {CLOSED}" in ready.split("\n")
            assert await node.terminate() == 0
            messages: list[str] = []
            while not any(m.startswith("STOPPING=1") for m in messages):
                messages.append(await received(systemd))
    finally:
        systemd.close()


async def received(systemd: socket.socket) -> str:
    """The next datagram sent to the fake systemd socket."""
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(20):
        data = await loop.sock_recv(systemd, 4096)
    return data.decode()


async def test_python_m_iop_edge_node_is_the_same_program(token_file):
    command = (sys.executable, "-m", "iop_edge.node")
    async with node_process(
        "--edge", CLOSED, "--token-file", str(token_file), command=command
    ) as node:
        await node.wait_for_log("node_starting")
        assert await node.terminate() == 0


def test_the_options_hide_the_token_from_repr(token_file):
    options = parse_options(["--edge", CLOSED, "--token-file", str(token_file)], environ={})
    assert options.token == TOKEN
    assert TOKEN not in repr(options)
    assert TOKEN not in str(options)
    assert options == NodeOptions(edge=CLOSED, token=TOKEN, token_file=token_file)
    assert options.link_url == f"{CLOSED}/link"
    assert not options.tls


def test_the_link_url_and_tls_follow_the_edge_url(token_file):
    options = parse_options(
        ["--edge", "https://edge.example:7600/", "--token-file", str(token_file)], environ={}
    )
    assert (options.link_url, options.tls) == ("https://edge.example:7600/link", True)
    behind = parse_options(
        ["--edge", "WSS://proxy.example/iop", "--token-file", str(token_file)], environ={}
    )
    assert (behind.link_url, behind.tls) == ("WSS://proxy.example/iop/link", True)


def test_options_errors_carry_their_exit_code(tmp_path):
    with pytest.raises(OptionsError, match="no edge given") as usage:
        parse_options([], environ={})
    assert usage.value.exit_code == 2
    with pytest.raises(OptionsError, match="cannot be read") as unreadable:
        parse_options(["--edge", CLOSED, "--token-file", str(tmp_path / "x")], environ={})
    assert unreadable.value.exit_code == 1


def test_an_empty_variable_counts_as_unset(token_file):
    with pytest.raises(OptionsError, match="no edge given"):
        parse_options(["--token-file", str(token_file)], environ={"IOP_NODE_EDGE": ""})


# -- against an edge: the real process on a real link ------------------------------------------


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as server:
        yield server


async def test_a_node_serves_the_edge_and_drains_on_sigterm(tmp_path, token_file, fake):
    """The whole life as systemd sees it: READY, STATUS once connected, a request served over
    the link, SIGTERM → GOAWAY{draining}, the request in flight finished, STOPPING, exit 0."""
    notify = tmp_path / "notify"
    systemd = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    systemd.bind(str(notify))
    systemd.setblocking(False)
    stub = EdgeStub(TOKEN, fake_payload(fake.base_url))
    try:
        async with edge_stub(stub):
            env = {"NOTIFY_SOCKET": str(notify)}
            args = ("--edge", stub.url, "--token-file", str(token_file))
            async with node_process(*args, env=env) as node:
                link = await stub.next_link()
                assert link.hello.pid == node.process.pid
                connected = await node.wait_for_log("node_connected")
                assert (connected["node_id"], connected["generation"]) == ("n1", "g1")
                messages = [await received(systemd) for _ in range(2)]
                assert messages[0].startswith("READY=1")
                assert messages[1] == f"STATUS=connected to {stub.url} as node n1 (payload g1)"
                fake.enqueue(FakeBehavior(hold=True))
                stream = await link.request(chat("in flight at SIGTERM"), provider="p")
                await fake.wait_in_flight(1)
                node.process.send_signal(signal.SIGTERM)
                goaway = await link.control.get()
                assert (goaway.kind, goaway.meta) == (Kind.GOAWAY, {"reason": "draining"})
                fake.release()
                [reply] = await link.answer(stream)
                assert reply.kind is Kind.RESP_REPLY
                assert await node.exited() == 0
                assert (await received(systemd)).startswith("STOPPING=1")
            assert TOKEN not in node.output
    finally:
        systemd.close()


async def test_an_unknown_token_exits_2_saying_so(tmp_path, fake):
    stub = EdgeStub("iopn_the-edge-knows-another", fake_payload(fake.base_url))
    wrong = tmp_path / "token"
    wrong.write_text(TOKEN)
    async with edge_stub(stub):
        async with node_process(
            "--edge", stub.url, "--token-file", str(wrong), expect_exit=2
        ) as node:
            assert await node.exited() == 2
        [refused] = node.events("node_refused")
        assert "does not know this node's token (HTTP 401)" in refused["message"]
        assert str(wrong) in refused["message"]
        assert stub.unauthorized == 1
        assert TOKEN not in node.output


@pytest.mark.parametrize(
    ("welcome", "refuse", "said"),
    [
        (
            2,
            None,
            "the edge speaks link protocol 2; this iop-node speaks 1: upgrade the older of "
            "iop-edge and iop-node",
        ),
        (
            1,
            2,
            "iop-node speaks link protocol 1; this edge speaks 2: upgrade the older of "
            "iop-edge and iop-node",
        ),
    ],
    ids=["welcome", "refused"],
)
async def test_another_protocol_version_exits_2_naming_both(
    token_file: Path, fake: FakeOpenAI, welcome: int, refuse: int | None, said: str
) -> None:
    """The edge's WELCOME names version 2, or the edge (of version 2) refuses the node's
    HELLO with REFUSED{protocol}."""
    stub = EdgeStub(
        TOKEN, fake_payload(fake.base_url), welcome_protocol=welcome, refuse_protocol=refuse
    )
    async with edge_stub(stub):
        args = ("--edge", stub.url, "--token-file", str(token_file))
        async with node_process(*args, expect_exit=2) as node:
            assert await node.exited() == 2
    [refused] = node.events("node_refused")
    assert said in refused["message"]


async def test_over_tls_the_node_trusts_its_ca_file_and_retries_without_it(tmp_path, fake):
    """An edge whose certificate a private CA issued (trustme): without --ca-file the node
    logs the verification failure and keeps trying (it is not permanent); with it, it
    connects."""
    ca = trustme.CA()
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server)
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    stub = EdgeStub(TOKEN, fake_payload(fake.base_url))
    async with edge_stub(stub, tls=server):
        assert stub.url.startswith("https://127.0.0.1:")
        args = ("--edge", stub.url, "--token-file", str(token_file))
        async with node_process(*args) as untrusting:
            failed = await untrusting.wait_for_log("node_link_failed")
            assert "TLS verification of the edge failed" in failed["error"]
            assert "certificate verify failed" in failed["error"]
            await untrusting.wait_for_log("node_link_failed", after=1)  # (it tries again)
            assert await untrusting.terminate() == 0
        assert stub.hellos == []
        async with node_process(*args, "--ca-file", str(ca_file)) as trusting:
            link = await stub.next_link()
            assert link.hello.pid == trusting.process.pid
            await trusting.wait_for_log("node_connected")


def test_main_returns_the_exit_code_of_an_options_error(tmp_path, capsys, monkeypatch):
    """In-process (what the subprocesses above run): the error on stderr, its exit code back."""
    monkeypatch.delenv("IOP_NODE_EDGE", raising=False)
    monkeypatch.delenv("IOP_NODE_TOKEN_FILE", raising=False)
    assert main(["--token-file", str(tmp_path / "token")]) == 2
    assert capsys.readouterr().err == (
        "iop-node: no edge given: pass --edge URL or set $IOP_NODE_EDGE\n"
    )
    assert main(["--edge", CLOSED, "--token-file", str(tmp_path / "token")]) == 1
    assert "cannot be read: No such file or directory" in capsys.readouterr().err
