"""The admin API's trust rules (issue 10 item 7): the optional admin token, no browser origin,
loopback ``Host`` names without a token, JSON POST bodies — and its clients, ``iop-edge status``
and ``iop-edge config refresh``, sending the token from ``$IOP_EDGE_ADMIN_TOKEN`` or a file."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from iop_edge.api.admin import MAX_CANDIDATE_BODY
from iop_edge.config import parse_config
from iop_edge.config_file import MAX_FILE_BYTES
from iop_edge.daemon import Daemon
from iop_edge.options import ServeOptions
from iop_edge.supervisor import SupervisorOptions
from tests.helpers import doc_for, dump, edge_on

ADMIN_TOKEN = "iop_admin-test-7f3c2a9e51d84b06"
IOP_EDGE = str(Path(sys.executable).with_name("iop-edge"))


def admin_doc(**console: Any) -> dict[str, Any]:
    return {
        "openai": {"listen": "127.0.0.1:0"},
        "metrics": {"enabled": False},
        "console": {"listen": "127.0.0.1:0", **console},
        "models": [{"id": "echo", "context_window_tokens": 4096, "providers": ["cat"]}],
        "nodes": [
            {
                "id": "n1",
                "adapters": [{"name": "shell", "type": "cli", "command": "cat"}],
                "providers": [{"id": "cat", "type": "cli", "category": "cli", "models": ["echo"]}],
            }
        ],
    }


@contextlib.asynccontextmanager
async def admin_edge(tmp_path: Path, doc: dict[str, Any], **options: Any) -> AsyncIterator[Daemon]:
    path = tmp_path / "edge.yaml"
    path.write_text(yaml.safe_dump(doc))
    daemon = Daemon(
        parse_config(doc),
        ServeOptions(
            config_path=path,
            watch=False,
            supervisor_options=SupervisorOptions(debounce=0.05, settle=0.05, poll_interval=3600),
            **options,
        ),
    )
    await daemon.start()
    try:
        yield daemon
    finally:
        await daemon.stop()


async def call(
    daemon: Daemon, method: str, path: str, headers: dict[str, str] | None = None, **kw: Any
) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as session,
        session.request(method, daemon.console_url + path, headers=headers, **kw) as response,
    ):
        assert response.content_type == "application/json"
        return response.status, await response.json()


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def guarded_doc() -> dict[str, Any]:
    return admin_doc(admin_token_sha256=hashlib.sha256(ADMIN_TOKEN.encode()).hexdigest())


async def test_with_an_admin_token_every_admin_request_needs_it(tmp_path, guarded_doc):
    async with admin_edge(tmp_path, guarded_doc) as daemon:
        for method, path in (("GET", "/admin/status"), ("POST", "/admin/config/refresh")):
            for headers in ({}, bearer("wrong"), {"Authorization": ADMIN_TOKEN}):
                status, body = await call(daemon, method, path, headers)
                assert status == 401, (method, path, headers)
                assert body["error"]["code"] == "invalid_admin_token"
                assert body["error"]["type"] == "authentication_error"
                assert ADMIN_TOKEN not in json.dumps(body)
            status, body = await call(daemon, method, path, bearer(ADMIN_TOKEN))
            assert status == 200, body
        status, body = await call(daemon, "GET", "/admin/nothing-here")
        assert status == 401  # unknown paths are behind the token too
        # with a token the Host rule is off: the console may be reached by any name
        headers = {**bearer(ADMIN_TOKEN), "Host": "edge-1.example.net:7601"}
        assert (await call(daemon, "GET", "/admin/status", headers))[0] == 200


async def test_without_a_token_only_loopback_host_names_reach_the_admin_api(tmp_path):
    async with admin_edge(tmp_path, admin_doc()) as daemon:
        assert (await call(daemon, "GET", "/admin/status"))[0] == 200
        for path, method in (("/admin/status", "GET"), ("/admin/config/refresh", "POST")):
            status, body = await call(daemon, method, path, {"Host": "rebound.example:7601"})
            assert status == 403
            assert body["error"]["code"] == "host_not_allowed"
            assert "console.admin_token_sha256" in body["error"]["message"]
        assert daemon.supervisor.last is None  # the refused refresh never ran


@pytest.mark.parametrize("with_token", [False, True])
async def test_the_admin_api_answers_no_browser_origin(tmp_path, guarded_doc, with_token):
    """A page cannot apply a refresh, even a cross-origin POST that needs no preflight."""
    doc = guarded_doc if with_token else admin_doc()
    auth = bearer(ADMIN_TOKEN) if with_token else {}
    async with admin_edge(tmp_path, doc) as daemon:
        for origin in ("https://evil.example", "http://127.0.0.1:7601", "null"):
            status, body = await call(
                daemon, "POST", "/admin/config/refresh?mode=apply", {**auth, "Origin": origin}
            )
            assert (status, body["error"]["code"]) == (403, "origin_not_allowed")
            assert "answers no web page" in body["error"]["message"]
        assert daemon.supervisor.last is None


async def test_a_form_post_to_the_admin_api_is_415(tmp_path):
    """An HTML form (no Origin sent by an old browser, or a same-site page) cannot apply a
    refresh: its body is not JSON. A bodyless POST — what the CLI sends — works."""
    async with admin_edge(tmp_path, admin_doc()) as daemon:
        for content_type, data in (
            ("application/x-www-form-urlencoded", b""),
            ("text/plain", b"mode=apply"),
            ("multipart/form-data; boundary=b", b"--b--"),
        ):
            status, body = await call(
                daemon,
                "POST",
                "/admin/config/refresh?mode=apply",
                {"Content-Type": content_type},
                data=data,
            )
            assert (status, body["error"]["code"]) == (415, "unsupported_media_type")
            assert repr(content_type) in body["error"]["message"]
        assert daemon.supervisor.last is None
        status, body = await call(daemon, "POST", "/admin/config/refresh?mode=apply")
        assert (status, body["result"]) == (200, "applied")


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if k != "IOP_EDGE_ADMIN_TOKEN"}
    environment.update(env or {})
    return subprocess.run(
        [IOP_EDGE, *args], capture_output=True, text=True, env=environment, timeout=60
    )


async def test_the_cli_sends_the_admin_token_from_the_environment_or_a_file(tmp_path, guarded_doc):
    token_file = tmp_path / "admin-token"
    token_file.write_text(ADMIN_TOKEN + "\n")
    async with admin_edge(tmp_path, guarded_doc) as daemon:
        url = daemon.console_url

        async def run(
            *args: str, env: dict[str, str] | None = None
        ) -> subprocess.CompletedProcess[str]:
            return await asyncio.to_thread(cli, *args, env=env)

        refused = await run("status", "--console", url)
        assert refused.returncode == 1
        assert "refused the request with HTTP 401" in refused.stderr
        assert "IOP_EDGE_ADMIN_TOKEN" in refused.stderr
        wrong = await run("status", "--console", url, env={"IOP_EDGE_ADMIN_TOKEN": "nope"})
        assert wrong.returncode == 1
        assert "Incorrect admin token" in wrong.stderr
        ok = await run(
            "status", "--json", "--console", url, env={"IOP_EDGE_ADMIN_TOKEN": ADMIN_TOKEN}
        )
        assert ok.returncode == 0, ok.stderr
        assert json.loads(ok.stdout)["edge"] == "edge"
        from_file = await run("status", "--console", url, "--admin-token-file", str(token_file))
        assert from_file.returncode == 0, from_file.stderr
        refresh = await run(
            "config", "refresh", "--apply", "--json", "--console", url,
            "--admin-token-file", str(token_file),
        )  # fmt: skip
        assert refresh.returncode == 0, refresh.stderr
        assert json.loads(refresh.stdout)["result"] == "applied"
        refused = await run("config", "refresh", "--console", url)
        assert refused.returncode == 1
        assert "HTTP 401" in refused.stderr
        missing = await run("status", "--console", url, "--admin-token-file", str(tmp_path / "x"))
        assert missing.returncode == 1
        assert "cannot read the admin token file" in missing.stderr
    assert ADMIN_TOKEN not in ok.stdout + ok.stderr + refused.stderr


def test_token_admin_prints_a_token_once_and_its_console_hash():
    result = cli("token", "admin", "--json")
    assert result.returncode == 0
    data = json.loads(result.stdout)
    digest = data["console"]["admin_token_sha256"]
    assert digest == hashlib.sha256(data["token"].encode()).hexdigest()
    text = cli("token", "admin")
    assert text.returncode == 0
    assert "admin_token_sha256: " in text.stdout


@pytest.mark.parametrize(("listen", "warned"), [("0.0.0.0:0", True), ("127.0.0.1:0", False)])
async def test_a_metrics_listener_off_loopback_is_warned_about_at_start(
    tmp_path, log_stream, listen, warned
):
    doc = admin_doc()
    doc["metrics"] = {"listen": listen}
    async with admin_edge(tmp_path, doc):
        events = [json.loads(line) for line in log_stream.getvalue().splitlines()]
    found = [e for e in events if e["event"] == "metrics_not_loopback"]
    assert bool(found) is warned
    if warned:
        assert found[0]["level"] == "warning"
        assert found[0]["listen"] == listen
        assert "no authentication" in found[0]["message"]


async def test_the_admin_api_and_the_cli_report_the_same_refresh(tmp_path):
    async with edge_on(tmp_path, doc_for()) as edge:
        edge.path.write_text(dump(doc_for(capacity=5, logging={"level": "debug"})))
        console = edge.daemon.console_url
        async with aiohttp.ClientSession() as session:
            async with session.post(console + "/admin/config/refresh?mode=dry_run") as r:
                dry = await r.json()
            assert (dry["mode"], dry["result"]) == ("dry_run", "restart_required")
            assert edge.capacity() == 2  # a dry run applies nothing
            async with session.post(console + "/admin/config/refresh?mode=bogus") as r:
                assert (await r.json())["result"] == "rejected"
        cli = await asyncio.create_subprocess_exec(
            str(Path(sys.executable).with_name("iop-edge")),
            "config",
            "refresh",
            "--apply",
            "--console",
            console,
            "--json",
            stdout=asyncio.subprocess.PIPE,
        )
        out, _ = await cli.communicate()
        assert cli.returncode == 3
        applied = json.loads(out)
        assert (applied["mode"], applied["result"]) == ("apply", "restart_required")
        assert edge.capacity() == 5
        async with aiohttp.ClientSession() as session, session.get(console + "/admin/status") as r:
            status = await r.json()
        assert status["config"]["hash"] == edge.supervisor.running_hash
        assert [p["path"] for p in status["config"]["restart_pending"]] == ["logging.level"]
        assert status["config"]["last_refresh"]["trigger"] == "api"
        (cat,) = status["providers"]
        assert (cat["node"], cat["id"], cat["status"], cat["capacity"]) == (
            "local",
            "cat",
            "active",
            5,
        )


# --- a candidate judged by the running daemon (issue 15) -------------------------------------


def candidate_doc(capacity: int = 1, **root: Any) -> dict[str, Any]:
    doc = admin_doc(admin_token_sha256=hashlib.sha256(ADMIN_TOKEN.encode()).hexdigest())
    doc["nodes"][0]["providers"][0]["capacity"] = capacity
    doc.update(root)
    return doc


def report(result: dict[str, Any]) -> list[tuple[str, str, Any, Any, bool]]:
    return [(e["path"], e["class"], e["old"], e["new"], e["applied"]) for e in result["report"]]


async def test_a_candidate_in_the_body_is_judged_against_the_live_state_not_the_file(tmp_path):
    """``mode=dry_run`` with ``{"candidate": TEXT}``: TEXT is compared with what runs (not with
    the file on disk, which here holds an unapplied edit), ``${VAR}`` is expanded from the
    daemon's environment (a console with an admin token; the value is shown redacted), and
    nothing is applied, recorded, or read from the file."""
    token = bearer(ADMIN_TOKEN)
    async with admin_edge(tmp_path, candidate_doc(), env={"TEAM_LABEL": "Echo (prod)"}) as daemon:
        path = tmp_path / "edge.yaml"
        path.write_text(yaml.safe_dump(candidate_doc(capacity=7)))  # saved, never applied
        on_disk = path.read_bytes()
        candidate = candidate_doc(capacity=3, logging={"level": "debug"})
        candidate["models"][0]["display_name"] = "${TEAM_LABEL}"
        text = yaml.safe_dump(candidate)
        status, result = await call(
            daemon,
            "POST",
            "/admin/config/refresh?mode=dry_run",
            token,
            json={"candidate": text, "source": "staging/edge.yaml"},
        )
        assert status == 200, result
        assert (result["mode"], result["result"], result["errors"]) == (
            "dry_run",
            "restart_required",
            [],
        )
        assert report(result) == [
            ("logging.level", "restart", "info", "debug", False),
            ("models[echo].display_name", "live", None, "<redacted>", False),
            ("nodes[n1].providers[cat].capacity", "live", 1, 3, False),
            ("nodes[n1].providers[cat].long_context_capacity", "live", 1, 3, False),
        ]
        assert result["config_hash"] == daemon.supervisor.running_hash
        caps = [p.capacity for p in daemon.scheduler.statistics().providers]
        assert caps == [1]
        assert daemon.supervisor.last is None  # a dry run leaves no record
        assert daemon.supervisor.generation == 1
        assert path.read_bytes() == on_disk
        # The file is still judged as new by a refresh of it: the candidate was not taken for it.
        status, from_file = await call(daemon, "POST", "/admin/config/refresh?mode=dry_run", token)
        assert report(from_file) == [
            ("nodes[n1].providers[cat].capacity", "live", 1, 7, False),
            ("nodes[n1].providers[cat].long_context_capacity", "live", 1, 7, False),
        ]
        # A broken candidate is rejected with the errors of `config validate`, named by source.
        status, bad = await call(
            daemon,
            "POST",
            "/admin/config/refresh",
            token,
            json={"candidate": "models: [\n", "source": "staging/edge.yaml"},
        )
        assert (status, bad["result"]) == (200, "rejected")
        assert bad["errors"][0]["message"].startswith("staging/edge.yaml:2:1: YAML syntax error")
        # An unset variable is reported as the daemon sees it (its environment, not the client's).
        candidate["models"][0]["display_name"] = "${NOT_IN_THE_DAEMONS_ENV}"
        status, unset = await call(
            daemon,
            "POST",
            "/admin/config/refresh",
            token,
            json={"candidate": yaml.safe_dump(candidate)},
        )
        assert unset["result"] == "rejected"
        assert unset["errors"][0]["path"] == "models[echo].display_name"
        assert "NOT_IN_THE_DAEMONS_ENV" in unset["errors"][0]["message"]


async def test_a_candidate_with_mode_apply_is_refused_and_nothing_runs(tmp_path):
    async with admin_edge(tmp_path, candidate_doc()) as daemon:
        text = yaml.safe_dump(candidate_doc(capacity=3))
        status, body = await call(
            daemon,
            "POST",
            "/admin/config/refresh?mode=apply",
            bearer(ADMIN_TOKEN),
            json={"candidate": text},
        )
        assert (status, body["error"]["code"], body["error"]["param"]) == (
            400,
            "invalid_request_error",
            "mode",
        )
        assert "judged with mode=dry_run only" in body["error"]["message"]
        assert "mode='apply'" in body["error"]["message"]
        assert (daemon.supervisor.last, daemon.supervisor.runs) == (None, 0)
        assert [p.capacity for p in daemon.scheduler.statistics().providers] == [1]


@pytest.mark.parametrize(
    ("data", "param", "says"),
    [
        (b"{not json", None, "not valid JSON"),
        (b'["models: []"]', None, "is a JSON list"),
        (b'{"candidate": "x", "mode": "apply"}', "mode", "Unknown field 'mode'"),
        (b'{"source": "a.yaml"}', "candidate", "(got nothing)"),
        (b'{"candidate": {"models": []}}', "candidate", "(got a JSON dict)"),
        (b'{"candidate": "x", "source": "a\\nb"}', "source", "printable name"),
        (b'{"candidate": "x", "source": "' + b"a" * 1025 + b'"}', "source", "1024 characters"),
    ],
    ids=["not-json", "a-list", "unknown-field", "no-candidate", "not-text", "control", "long"],
)
async def test_a_malformed_candidate_body_is_400_naming_the_field(tmp_path, data, param, says):
    async with admin_edge(tmp_path, candidate_doc()) as daemon:
        status, body = await call(
            daemon,
            "POST",
            "/admin/config/refresh?mode=dry_run",
            {"Content-Type": "application/json", **bearer(ADMIN_TOKEN)},
            data=data,
        )
        assert (status, body["error"]["code"], body["error"]["param"]) == (
            400,
            "invalid_request_error",
            param,
        )
        assert says in body["error"]["message"]
        assert daemon.supervisor.runs == 0


async def test_a_candidate_is_held_to_the_config_files_size_limit(tmp_path):
    """A candidate over 4 MiB is rejected as a file of that size would be; a body over
    ``MAX_CANDIDATE_BODY`` is refused (413) before it is read whole."""
    async with admin_edge(tmp_path, candidate_doc()) as daemon:
        padding = "#" * (MAX_FILE_BYTES + 1 - len("models: []\n")) + "\n"
        text = "models: []\n" + padding[1:]
        assert len(text.encode()) == MAX_FILE_BYTES + 1
        body = json.dumps({"candidate": text, "source": "big.yaml"}).encode()
        status, result = await call(
            daemon,
            "POST",
            "/admin/config/refresh",
            {"Content-Type": "application/json", **bearer(ADMIN_TOKEN)},
            data=io.BytesIO(body),
        )
        assert (status, result["result"]) == (200, "rejected")
        assert result["errors"][0]["message"] == (
            f"cannot read config big.yaml: it is {MAX_FILE_BYTES + 1:,} bytes; a config file may "
            f"be at most 4 MiB ({MAX_FILE_BYTES:,} bytes)"
        )
        huge = b'{"candidate": "' + b"#" * MAX_CANDIDATE_BODY + b'"}'
        status, body = await call(
            daemon,
            "POST",
            "/admin/config/refresh",
            {"Content-Type": "application/json", **bearer(ADMIN_TOKEN)},
            data=io.BytesIO(huge),
        )
        assert (status, body["error"]["code"]) == (413, "request_too_large")
        assert f"larger than {MAX_CANDIDATE_BODY:,} bytes" in body["error"]["message"]


async def test_refresh_candidate_from_the_cli_says_would_apply_and_uses_the_daemons_env(tmp_path):
    """``iop-edge config refresh --candidate FILE``: the daemon judges FILE (its ``${VAR}``
    from the daemon's environment: the CLI's has none; shown redacted); the table says what
    *would* happen; ``--apply`` with ``--candidate`` is a usage error; the daemon's file is
    untouched."""
    async with admin_edge(tmp_path, candidate_doc(), env={"TEAM_LABEL": "prod"}) as daemon:
        url = daemon.console_url
        live = candidate_doc(capacity=3)
        live["models"][0]["display_name"] = "${TEAM_LABEL}"
        (tmp_path / "live.yaml").write_text(yaml.safe_dump(live))
        (tmp_path / "restart.yaml").write_text(yaml.safe_dump(candidate_doc(edge={"id": "x"})))
        on_disk = (tmp_path / "edge.yaml").read_bytes()

        async def run(*args: str) -> subprocess.CompletedProcess[str]:
            return await asyncio.to_thread(
                cli,
                "config",
                "refresh",
                "--console",
                url,
                *args,
                env={"TEAM_LABEL": "", "IOP_EDGE_ADMIN_TOKEN": ADMIN_TOKEN},
            )

        result = await run("--candidate", str(tmp_path / "live.yaml"))
        assert result.returncode == 0, result.stderr
        lines = result.stdout.splitlines()
        assert lines[0] == "result: would apply (dry run: nothing was applied)"
        header = next(line for line in lines if line.startswith("CLASS"))
        assert header.split()[:3] == ["CLASS", "WOULD", "APPLY"]
        row = next(line for line in lines if "display_name" in line)
        assert row.split() == ["live", "yes", "models[echo].display_name", "-", "<redacted>"]
        restart = await run("--dry-run", "--candidate", str(tmp_path / "restart.yaml"), "--json")
        assert restart.returncode == 3
        assert json.loads(restart.stdout)["report"][0]["path"] == "edge.id"
        refused = await run("--apply", "--candidate", str(tmp_path / "live.yaml"))
        assert refused.returncode == 2
        assert "--candidate is judged as a dry run only" in refused.stderr
        missing = await run("--candidate", str(tmp_path / "nope.yaml"))
        assert missing.returncode == 1
        assert f"cannot read config {tmp_path / 'nope.yaml'}" in missing.stderr
        assert [p.capacity for p in daemon.scheduler.statistics().providers] == [1]
        assert (tmp_path / "edge.yaml").read_bytes() == on_disk
        assert daemon.supervisor.last is None
