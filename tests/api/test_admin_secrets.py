"""Issue 25 item 1: the admin API never shows a value the daemon took from its environment or
a file — not through a candidate's dry run (``iop-edge config refresh --candidate``), not in
a refresh of its own file, not in ``/admin/status``, not in the log — whatever field the
value lands in. A console without an admin token expands no reference of a candidate at all.

A real daemon with real sockets; its running config takes a URL and a display name from its
environment, so the running config's own secrets are looked for too.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from iop_edge.config_file import load_config_file
from iop_edge.daemon import Daemon
from iop_edge.options import ServeOptions
from iop_edge.supervisor import SupervisorOptions
from iop_edge.testing.fake_openai import FakeOpenAI

ADMIN_TOKEN = "iop_admin-secrets-test-5e0c1d"
#: The candidate's secret: a valid identifier, so a candidate with it in an id still loads.
SECRET = "s3cret-Candidate-9f4e1c"
#: A long secret that is no identifier: a message quotes it cut short (``'sk-...``).
LONG_SECRET = "sk-" + "Zq8+/w" * 16
#: The running config's own: a display name, and (per test) the upstream URL.
RUNNING_LABEL = "Running-Label-d41d8cd98f"
SECRET_FILE_TEXT = "file-held-secret-77aa19"


def running_doc(url_ref: str, *, token: bool) -> dict[str, Any]:
    """A console (with or without an admin token), the model ``echo`` on ``cat`` and the
    model ``chat`` on an openai_compat upstream whose URL is ``url_ref`` (a reference)."""
    console: dict[str, Any] = {"listen": "127.0.0.1:0"}
    if token:
        console["admin_token_sha256"] = hashlib.sha256(ADMIN_TOKEN.encode()).hexdigest()
    return {
        "openai": {"listen": "127.0.0.1:0"},
        "metrics": {"enabled": False},
        "console": console,
        "models": [
            {"id": "echo", "context_window_tokens": 4096, "providers": ["cat"]},
            {
                "id": "chat",
                "display_name": "${RUNNING_LABEL}",
                "context_window_tokens": 4096,
                "providers": ["up"],
            },
        ],
        "nodes": [
            {
                "id": "n1",
                "adapters": [
                    {"name": "shell", "type": "cli", "command": "cat"},
                    {"name": "oa", "type": "openai_compat", "base_url": url_ref},
                ],
                "providers": [
                    {"id": "cat", "type": "cli", "category": "cli", "models": ["echo"]},
                    {
                        "id": "up",
                        "type": "openai_compat",
                        "category": "api",
                        "adapter": "oa",
                        "models": ["fake-model"],
                    },
                ],
            }
        ],
    }


@contextlib.asynccontextmanager
async def secret_edge(
    tmp_path: Path, env: dict[str, str], *, token: bool
) -> AsyncIterator[tuple[Daemon, dict[str, str]]]:
    """A daemon started from a file with references, as ``serve`` starts one; and the
    headers a client of its console sends."""
    path = tmp_path / "edge.yaml"
    path.write_text(yaml.safe_dump(running_doc("${RUNNING_URL}", token=token)))
    daemon = Daemon(
        load_config_file(str(path), env),
        ServeOptions(
            config_path=path,
            env=env,
            watch=False,
            supervisor_options=SupervisorOptions(poll_interval=3600),
        ),
    )
    await daemon.start()
    try:
        yield daemon, ({"Authorization": f"Bearer {ADMIN_TOKEN}"} if token else {})
    finally:
        await daemon.stop()


async def post(daemon: Daemon, headers: dict[str, str], path: str, **kw: Any) -> bytes:
    """The raw answer of a POST (the bytes are searched: a value may hide in any field)."""
    async with (
        aiohttp.ClientSession() as session,
        session.post(daemon.console_url + path, headers=headers, **kw) as response,
    ):
        assert response.status == 200, await response.text()
        return await response.read()


async def judge(daemon: Daemon, headers: dict[str, str], doc: dict[str, Any]) -> bytes:
    body = {"candidate": yaml.safe_dump(doc), "source": "candidate.yaml"}
    return await post(daemon, headers, "/admin/config/refresh?mode=dry_run", json=body)


def entries(answer: bytes) -> dict[str, tuple[Any, Any]]:
    return {e["path"]: (e["old"], e["new"]) for e in json.loads(answer)["report"]}


async def test_a_candidate_judged_with_the_admin_token_shows_no_value_from_the_environment(
    tmp_path: Path, fake_oa: FakeOpenAI, log_stream: io.StringIO
) -> None:
    """With the token, a candidate's references are expanded (a token holder could restart
    the daemon with any config) and every expanded value is ``<redacted>`` wherever it lands:
    ``edge.id``, a display name, a node alias, a URL, a provider id (and so the changed ids),
    a value that fails a rule (the message quotes it, even cut short). The running config's
    own expanded values (URL, display name) are hidden in the report's ``old`` values too.
    A refresh of the daemon's file hides them in its result, in ``/admin/status`` and in the
    ``config_refresh`` log line; and what a live change took from the environment stays
    hidden in later reports."""
    running_url = fake_oa.base_url + "?tenant=running-url-secret"
    env = {
        "SECRET": SECRET,
        "LONG_SECRET": LONG_SECRET,
        "RUNNING_URL": running_url,
        "RUNNING_LABEL": RUNNING_LABEL,
    }
    hidden = (SECRET, LONG_SECRET[:12], fake_oa.base_url, RUNNING_LABEL)
    async with secret_edge(tmp_path, env, token=True) as (daemon, token):
        candidate = running_doc("http://${SECRET}.example:8000/v1", token=True)
        candidate["edge"] = {"id": "${SECRET}"}
        candidate["models"][0]["display_name"] = "Team ${SECRET}"
        candidate["models"][0]["providers"].append("${SECRET}")
        candidate["models"][1]["display_name"] = "Chat"
        node = candidate["nodes"][0]
        node["alias"] = "${SECRET}"
        node["providers"].append(
            {"id": "${SECRET}", "type": "cli", "category": "cli", "models": ["echo"]}
        )
        answer = await judge(daemon, token, candidate)
        result = json.loads(answer)
        assert result["result"] == "restart_required"
        # (the new provider comes with a restart: the live part alone would refer to it)
        assert [e["path"] for e in result["errors"]] == ["models[echo].providers[<redacted>]"]
        assert [text for text in hidden if text.encode() in answer] == []
        report = entries(answer)
        assert report["edge.id"] == ("edge", "<redacted>")
        assert report["models[echo].display_name"] == (None, "Team <redacted>")
        assert report["models[chat].display_name"] == ("<redacted>", "Chat")
        assert report["nodes[n1].alias"] == (None, "<redacted>")
        assert report["nodes[n1].adapters[oa].base_url"] == (
            "<redacted>",
            "http://<redacted>.example:8000/v1",
        )
        assert "nodes[n1].providers[<redacted>]" in report
        assert result["changed_providers"] == ["<redacted>"]

        # A value that fails a rule: the messages would quote it.
        candidate = running_doc("${RUNNING_URL}", token=True)
        candidate["edge"] = {"id": "${LONG_SECRET}"}
        candidate["nodes"][0]["providers"][0]["category"] = "${SECRET}"
        answer = await judge(daemon, token, candidate)
        result = json.loads(answer)
        assert result["result"] == "rejected"
        assert [e["path"] for e in result["errors"]] == [
            "edge.id",
            "nodes[n1].providers[cat].category",
        ]
        assert [text for text in hidden if text.encode() in answer] == []
        assert all("<redacted>" in e["message"] for e in result["errors"]), result["errors"]

        # The daemon's own file, refreshed: a restart-class change and a live one.
        applied = running_doc("${RUNNING_URL}", token=True)
        applied["edge"] = {"id": "${SECRET}"}
        applied["models"][0]["display_name"] = "${SECRET}"
        (tmp_path / "edge.yaml").write_text(yaml.safe_dump(applied))
        answer = await post(daemon, token, "/admin/config/refresh?mode=apply")
        assert json.loads(answer)["result"] == "restart_required"
        assert [text for text in hidden if text.encode() in answer] == []
        async with (
            aiohttp.ClientSession() as session,
            session.get(daemon.console_url + "/admin/status", headers=token) as response,
        ):
            status = await response.read()
        pending = json.loads(status)["config"]["restart_pending"]
        assert pending == [{"path": "edge.id", "old": "edge", "new": "<redacted>"}]
        assert [text for text in hidden if text.encode() in status] == []

        # The live change took SECRET into the running config: a later report hides it.
        candidate = running_doc("${RUNNING_URL}", token=True)
        candidate["models"][0]["display_name"] = "plain"
        answer = await judge(daemon, token, candidate)
        assert entries(answer)["models[echo].display_name"] == ("<redacted>", "plain")
        assert [text for text in hidden if text.encode() in answer] == []

    log = log_stream.getvalue()
    [line] = [json.loads(x) for x in log.splitlines() if '"config_refresh"' in x]
    assert {c["path"]: c["new"] for c in line["changes"]}["edge.id"] == "<redacted>"
    assert [text for text in hidden if text in log] == []


async def test_a_console_without_a_token_expands_no_reference_of_a_candidate(
    tmp_path: Path, fake_oa: FakeOpenAI, log_stream: io.StringIO
) -> None:
    """Without ``console.admin_token_sha256`` any local process may ask for a dry run: each
    ``${VAR}``, ``${VAR:-default}`` and ``${file:}`` of a candidate is a problem saying why
    and what to do, one per reference, and no value is read. A candidate without references
    is still judged, and the running config's own values stay hidden in its report."""
    secret_file = tmp_path / "key"
    secret_file.write_text(SECRET_FILE_TEXT + "\n")
    running_url = fake_oa.base_url + "?tenant=running-url-secret"
    env = {"SECRET": SECRET, "RUNNING_URL": running_url, "RUNNING_LABEL": RUNNING_LABEL}
    hidden = (SECRET, SECRET_FILE_TEXT, fake_oa.base_url, RUNNING_LABEL)
    async with secret_edge(tmp_path, env, token=False) as (daemon, no_token):
        candidate = running_doc("${RUNNING_URL}", token=False)
        candidate["edge"] = {"id": "${SECRET}"}
        candidate["models"][0]["display_name"] = "${SECRET:-fallback}"
        candidate["nodes"][0]["alias"] = f"${{file:{secret_file}}}"
        answer = await judge(daemon, no_token, candidate)
        result = json.loads(answer)
        assert result["result"] == "rejected"
        assert [(e["path"], e["message"].split(":", 1)[0]) for e in result["errors"]] == [
            ("edge.id", "${SECRET} is not expanded"),
            ("models[echo].display_name", "${SECRET"),  # (the message goes on: ":-fallback}")
            ("models[chat].display_name", "${RUNNING_LABEL} is not expanded"),
            ("nodes[n1].adapters[oa].base_url", "${RUNNING_URL} is not expanded"),
            ("nodes[n1].alias", "${file"),
        ]
        message = result["errors"][0]["message"]
        assert message == (
            "${SECRET} is not expanded: this console has no admin token "
            "(console.admin_token_sha256), so a candidate's variables and files are not read "
            "from the daemon's environment; set console.admin_token_sha256 (iop-edge token "
            "admin) and send the token, or judge the candidate offline: iop-edge config "
            "refresh --offline RUNNING.yaml --candidate FILE, in a shell that has the variables"
        )
        assert result["errors"][4]["message"].startswith(f"${{file:{secret_file}}} is not")
        assert [text for text in hidden if text.encode() in answer] == []

        # Without references a candidate works without a token; old values stay hidden.
        candidate = running_doc("http://127.0.0.1:9/v1", token=False)
        candidate["models"][1]["display_name"] = "Chat"
        answer = await judge(daemon, no_token, candidate)
        assert json.loads(answer)["result"] == "restart_required"
        report = entries(answer)
        assert report["nodes[n1].adapters[oa].base_url"] == ("<redacted>", "http://127.0.0.1:9/v1")
        assert report["models[chat].display_name"] == ("<redacted>", "Chat")
        assert [text for text in hidden if text.encode() in answer] == []
    assert [text for text in hidden if text in log_stream.getvalue()] == []
