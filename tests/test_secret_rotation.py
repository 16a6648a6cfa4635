"""Issue 25 item 2: a rotated secret takes effect with ``iop-edge restart`` — real processes.

``iop-edge serve --env-file FILE`` reads FILE for ``${VAR}``, and ``${file:/path}`` reads a
file, at every load: the new process of a handover runs the same command line and reads both
again, so the upstream gets the new key without a gap. Before the handover, a refresh reports
the changed secret as a restart-class change, redacted. No key reaches the log.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path

import aiohttp

from iop_edge.testing.fake_openai import FakeOpenAI
from tests.helpers import BOUND, IOP_EDGE, doc_for
from tests.helpers.service import JSON, chat, served, status, successor_stopped, write_config

OLD_KEY, NEW_KEY = "sk-old-0a9c77e1", "sk-new-5f31b2d4"
OLD_FILE, NEW_FILE = "file-old-e3b0c442", "file-new-98fc1c14"


def sent(fake: FakeOpenAI) -> tuple[str | None, str | None]:
    """The credentials of the last chat request the upstream received."""
    last = [r for r in fake.requests if r.path == "/v1/chat/completions"][-1]
    return last.headers.get("Authorization"), last.headers.get("X-Key")


async def test_a_restart_takes_a_rotated_env_file_key_and_file_secret_without_a_gap(
    tmp_path: Path,
) -> None:
    env_file = tmp_path / "iop-edge.env"
    env_file.write_text(f"# secrets\nAPI_KEY='{OLD_KEY}'\n")
    key_file = tmp_path / "x-key"
    key_file.write_text(OLD_FILE + "\n")
    async with FakeOpenAI() as fake:
        doc = doc_for(fake)
        doc["nodes"][0]["adapters"][1]["headers"] = {
            "Authorization": "Bearer ${API_KEY}",
            "X-Key": f"${{file:{key_file}}}",
        }
        config = write_config(tmp_path, doc)
        environment = {k: v for k, v in os.environ.items() if k != "API_KEY"}
        new_pid: list[int] = []
        with (
            served(config, "--no-parent", "--env-file", str(env_file), env=environment) as old,
            successor_stopped(new_pid),
        ):
            listening = old.wait_event("listening")
            url, console = listening["openai"], listening["console"]
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=BOUND)) as s:
                assert (await chat(s, url))[0] == 200
                before = sent(fake)
                env_file.write_text(f"API_KEY={NEW_KEY}\n")
                key_file.write_text(NEW_FILE + "\n")
                async with s.post(console + "/admin/config/refresh", headers=JSON) as response:
                    dry = await response.json()
                restart = await asyncio.to_thread(
                    subprocess.run,
                    [IOP_EDGE, "restart", "--console", console, "--json"],
                    capture_output=True,
                    text=True,
                    timeout=BOUND,
                )
                assert restart.returncode == 0, restart.stdout + restart.stderr
                new_pid.append(int(json.loads(restart.stdout)["pid"]))
                assert await asyncio.to_thread(old.process.wait, BOUND) == 0
                assert (await status(console))["pid"] == new_pid[0]
                assert (await chat(s, url))[0] == 200
                after = sent(fake)
            log = old.log  # (both processes write to the one stderr)
    assert before == (f"Bearer {OLD_KEY}", OLD_FILE)
    assert (
        dry["result"],
        [(e["path"], e["class"], e["old"], e["new"]) for e in dry["report"]],
    ) == (
        "restart_required",
        [
            (
                "nodes[local].adapters[oa].headers.Authorization",
                "restart",
                "<redacted>",
                "<redacted>",
            ),
            ("nodes[local].adapters[oa].headers.X-Key", "restart", "<redacted>", "<redacted>"),
        ],
    )
    assert after == (f"Bearer {NEW_KEY}", NEW_FILE)
    assert [s for s in (OLD_KEY, NEW_KEY, OLD_FILE, NEW_FILE) if s in log] == []


def test_serve_refuses_a_bad_env_file_naming_its_line(tmp_path: Path) -> None:
    config = write_config(tmp_path, doc_for())
    env_file = tmp_path / "iop-edge.env"
    env_file.write_text("GOOD=1\nexport BAD sk-not-shown\n")
    result = subprocess.run(
        [IOP_EDGE, "serve", "--config", str(config), "--env-file", str(env_file)],
        capture_output=True,
        text=True,
        timeout=BOUND,
    )
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"iop-edge serve: the env file {env_file} is not usable:",
        f"{env_file}:2: not a KEY=VALUE line (a variable name, '=', its value; a comment "
        "starts with #)",
    ]
