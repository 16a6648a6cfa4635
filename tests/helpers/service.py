"""``iop-edge serve`` as a service, as systemd or an operator runs it: the daemon as a
subprocess read through its JSON log (:class:`Served`), its config file, a chat request and
its admin status over HTTP, the successor a handover leaves behind, and the settings of the
shipped systemd unit. Shared by the stop, signal, handover, activation, thin-parent and
secret-rotation tests."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp

from tests.helpers import BOUND, IOP_EDGE, dump

STARTUP = 10.0
"""Seconds the daemon may take to log ``listening`` before the run is declared broken: a bound
that makes a broken run fail instead of hang, not a rule. Measured: 0.4-0.5 s from the start
of ``iop-edge serve`` (the interpreter, the imports, the listeners); the bound is some 20 times
that, for a loaded machine running the suite."""

HUP_PACE = 0.005
"""Seconds between two SIGHUPs of a burst."""

HELLO = [{"role": "user", "content": "hello edge"}]
"""The conversation of :func:`chat`."""


def events(text: str, name: str | None = None) -> list[dict[str, Any]]:
    """The JSON events of a log (every one, or those named ``name``)."""
    found = []
    for line in text.splitlines():
        with contextlib.suppress(ValueError):
            event = json.loads(line)
            if isinstance(event, dict) and (name is None or event.get("event") == name):
                found.append(event)
    return found


class Served:
    """``iop-edge serve`` running as a subprocess; its stderr is read line by line in a thread
    so that the test can wait for an event while the daemon keeps writing."""

    def __init__(
        self,
        config: Path,
        *args: str,
        wrap: Callable[[list[str]], list[str]] = list,
        pass_fds: tuple[int, ...] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        # ``wrap`` may put a launcher in front of the command (the socket-activation shim).
        # A session of its own: :meth:`close` kills the whole group — the thin parent, its
        # servers, a successor — whatever the test left running.
        self.process = subprocess.Popen(
            wrap([IOP_EDGE, "serve", "--config", str(config), *args]),
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            pass_fds=pass_fds,
            env=env,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self.changed = threading.Condition()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            with self.changed:
                self.lines.append(line)
                self.changed.notify_all()

    @property
    def log(self) -> str:
        """The log so far."""
        with self.changed:
            return "".join(self.lines)

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        """The events logged so far (those named ``name``)."""
        return events(self.log, name)

    def wait_event(self, name: str, timeout: float = BOUND) -> dict[str, Any]:
        """The first event ``name``, once it is logged (AssertionError with the log when it
        is not within ``timeout`` or the process ends first)."""
        marker = f'"event":"{name}"'
        deadline = time.monotonic() + timeout
        with self.changed:
            while True:
                for line in self.lines:
                    if marker in line:
                        return dict(json.loads(line))
                left = deadline - time.monotonic()
                if left <= 0 or not self.reader.is_alive():
                    raise AssertionError(
                        f"no {name!r} event (exit code {self.process.poll()}):\n"
                        + "".join(self.lines)
                    )
                self.changed.wait(left)

    def has_logged(self, name: str) -> bool:
        """Whether the event ``name`` was logged."""
        marker = f'"event":"{name}"'
        with self.changed:
            return any(marker in line for line in self.lines)

    def exit_code(self, timeout: float = BOUND) -> int:
        """Wait for the process to end (the whole log read); its exit code."""
        code = self.process.wait(timeout)
        self.reader.join(timeout)
        return code

    def close(self) -> None:
        """Kill what the test left running of the process's group; release the pipe."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        self.reader.join(BOUND)
        assert self.process.stderr is not None
        self.process.stderr.close()


@contextlib.contextmanager
def served(config: Path, *args: str, **options: Any) -> Iterator[Served]:
    """A :class:`Served` daemon, killed afterwards if the test left it running."""
    daemon = Served(config, *args, **options)
    try:
        yield daemon
    finally:
        daemon.close()


def third_party_code_loaded(pid: int) -> bool:
    """Whether process ``pid`` has mapped an extension module of a third-party package (the
    YAML parser, aiohttp, ...): the interpreter has started and ``iop_edge`` is importing."""
    try:
        maps = Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False
    return any("/site-packages/" in line and ".so" in line for line in maps.splitlines())


def write_config(directory: Path, doc: dict[str, Any]) -> Path:
    """``directory/edge.yaml`` holding ``doc``, with JSON logs."""
    path = directory / "edge.yaml"
    path.write_text(dump({**doc, "logging": {"format": "json"}}))
    return path


async def chat(session: aiohttp.ClientSession, url: str) -> tuple[int, dict[str, Any]]:
    """POST one chat completion for the model ``chat``; the status and the JSON answer."""
    async with session.post(
        url + "/v1/chat/completions", json={"model": "chat", "messages": HELLO}
    ) as response:
        return response.status, await response.json(content_type=None)


def unit_settings(text: str) -> dict[str, list[str]]:
    """``Section.Key`` → every value it is given, in order, of a systemd unit file."""
    settings: dict[str, list[str]] = {}
    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        settings.setdefault(f"{section}.{key.strip()}", []).append(value.strip())
    return settings


JSON = {"Content-Type": "application/json"}
"""The header of a JSON request body."""


@contextlib.contextmanager
def successor_stopped(pid: list[int]) -> Iterator[None]:
    """Whatever the test does, stop the process that took over (not our child)."""
    try:
        yield
    finally:
        for each in pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(each, signal.SIGKILL)


async def status(console: str) -> dict[str, Any]:
    """The admin status over a new connection (a kept-alive one may still reach the old
    process for a moment after a handover)."""
    async with aiohttp.ClientSession() as session, session.get(console + "/admin/status") as r:
        return dict(await r.json())
