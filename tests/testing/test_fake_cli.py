"""The fake CLI agent, run as a real subprocess in each output format and failure mode."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

COMMAND = [sys.executable, "-m", "iop_edge.testing.fake_cli"]


def run(*args: str, prompt: str = "hello fake world") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*COMMAND, *args], input=prompt, capture_output=True, text=True, timeout=30, check=False
    )


def exited_within(pid: int, timeout: float) -> bool:
    """Wait (event-driven, via a pidfd) until process ``pid`` ends; False if still alive."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        readable, _, _ = select.select([pidfd], [], [], timeout)
        return bool(readable)
    finally:
        os.close(pidfd)


@pytest.fixture
def group() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Started agents, each in its own session; their process groups are killed at the end."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
        for stream in (process.stdin, process.stdout, process.stderr):
            if stream is not None:
                stream.close()


def spawn(group: list[subprocess.Popen[bytes]], *args: str) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(
        [*COMMAND, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    group.append(process)
    return process


def test_text_format_echoes_the_prompt() -> None:
    """`text` writes the prompt back, stripped, and exits 0."""
    result = run(prompt="  hello fake world\n")
    assert (result.returncode, result.stdout, result.stderr) == (0, "hello fake world", "")


def test_json_format_has_result_and_usage() -> None:
    """`json` writes one object with `result` (or `content`) and word-count usage."""
    result = run("--format", "json", "--reply", "one two")
    assert json.loads(result.stdout) == {
        "result": "one two",
        "usage": {"prompt_tokens": 3, "completion_tokens": 2},
    }
    content = run("--format", "json", "--json-field", "content")
    assert json.loads(content.stdout)["content"] == "hello fake world"


def test_stream_json_is_one_object_per_line() -> None:
    """`stream-json` writes a `content` object per chunk, then a `result` object with usage."""
    result = run("--format", "stream-json", "--chunks", "2", prompt="abcd")
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert lines == [
        {"type": "content", "content": "ab"},
        {"type": "content", "content": "cd"},
        {"type": "result", "usage": {"prompt_tokens": 1, "completion_tokens": 2}},
    ]


def test_non_zero_exit_with_stderr_message() -> None:
    """`--exit-code` with `--stderr` fails with that status and message and no answer."""
    result = run("--exit-code", "3", "--stderr", "model crashed")
    assert (result.returncode, result.stdout, result.stderr) == (3, "", "model crashed\n")


def test_directive_in_prompt_adds_options() -> None:
    """A `[[fake-cli: ...]]` directive in the prompt acts as extra command-line options."""
    result = run("--format", "json", prompt="hi [[fake-cli: --exit-code 4 --stderr 'no luck']]")
    assert (result.returncode, result.stderr) == (4, "no luck\n")
    echoed = run(prompt="keep [[fake-cli: --format text]] this")
    assert echoed.stdout == "keep  this"


def test_flood_writes_exactly_n_bytes() -> None:
    """`--flood N` writes N bytes to stdout."""
    result = subprocess.run(
        [*COMMAND, "--flood", "200000"], input=b"", capture_output=True, timeout=30, check=False
    )
    assert result.returncode == 0
    assert result.stdout == b"x" * 200_000


def test_hang_after_first_chunk(group: list[subprocess.Popen[bytes]]) -> None:
    """`--hang-after 1` writes one stream-json chunk and then never ends on its own."""
    process = spawn(group, "--format", "stream-json", "--hang-after", "1")
    assert process.stdin is not None
    assert process.stdout is not None
    process.stdin.write(b"first second")
    process.stdin.close()
    assert json.loads(process.stdout.readline()) == {"type": "content", "content": "first "}
    assert not exited_within(process.pid, 0.2)


def test_killing_the_group_ends_the_hanging_child(
    group: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    """`--hang --spawn-child` leaves two processes in one group; killing the group ends both."""
    pid_file = tmp_path / "child.pid"
    process = spawn(group, "--hang", "--spawn-child", "--pid-file", str(pid_file))
    assert process.stderr is not None
    assert process.stdin is not None
    line = process.stderr.readline().decode()
    assert line.startswith("fake-cli child pid ")
    child = int(line.rsplit(" ", 1)[1])
    assert int(pid_file.read_text()) == child
    assert os.getpgid(child) == os.getpgid(process.pid) == process.pid
    process.stdin.close()

    os.killpg(process.pid, signal.SIGKILL)
    assert process.wait(timeout=10) == -signal.SIGKILL
    assert exited_within(child, 10)


def test_ignore_sigterm_needs_sigkill(group: list[subprocess.Popen[bytes]]) -> None:
    """`--ignore-sigterm` survives SIGTERM to its group; only SIGKILL ends it."""
    process = spawn(group, "--hang", "--ignore-sigterm", "--spawn-child")
    assert process.stderr is not None
    process.stderr.readline()  # the child pid line: both are running and SIGTERM is ignored
    os.killpg(process.pid, signal.SIGTERM)
    assert not exited_within(process.pid, 0.2)
    os.killpg(process.pid, signal.SIGKILL)
    assert process.wait(timeout=10) == -signal.SIGKILL


def test_start_up_imports_nothing_heavy() -> None:
    """The agent's module imports only the standard library (no aiohttp, orjson, asyncio)."""
    probe = (
        "import sys, iop_edge.testing.fake_cli; "
        "print(sorted({'aiohttp', 'orjson', 'asyncio', 'pydantic'} & set(sys.modules)))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=30, check=True
    )
    assert result.stdout.strip() == "[]"
