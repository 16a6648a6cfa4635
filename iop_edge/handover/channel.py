"""The handover's wire: the channel between the old and the new process, and the leases it
carries (``iop-edge restart``; the package :mod:`iop_edge.handover`).

The running process (old) starts the new one with the same program and arguments, passing its
listening sockets by the socket-activation convention (:mod:`iop_edge.runtime.activation`) and
one end of a private channel (a Unix socketpair; its descriptor in ``IOP_EDGE_HANDOVER_FD``).
Over the channel, newline-delimited JSON:

1. new → old ``{"type": "ready", "pid": N, "openai": URL, "secret": S}``: new loaded its
   config, built its adapters and bound the sockets, but does not accept yet.
2. old stops listening (connections wait in the kernel's backlog) and sends
   ``{"type": "leases", "pid": N, "elapsed": SECONDS, "leases": [[node, provider, long,
   count], ...]}``: its pid, how long ago the restart began, and the slots it still holds.
   From then on each lease it releases is sent as ``{"type": "released", "lease": [node,
   provider, long]}``. Old relays its waiting requests to ``URL`` with their age and
   ``S`` (:class:`iop_edge.handover.relay.HandoverRelay`).
3. new counts those slots as its own leases (:meth:`AdmissionScheduler.inherit`), starts
   accepting, says ``{"type": "serving"}``; old tells systemd the new main pid and drains.
4. When the channel closes (old exited), new releases what it still counts for old.

New shows the handover in ``/admin/status`` and ``iop_edge_handover_*``
(:class:`HandoverStatistics`); old logs what it finished, relayed and cut (:class:`DrainTally`)
as it exits. The steps of either side are driven by
:class:`iop_edge.handover.coordinator.HandoverCoordinator`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from typing import Any, Protocol

from iop_edge.admission import AdmissionScheduler, Lease
from iop_edge.pool import SlotLease
from iop_edge.seams import Clock

HANDOVER_FD_ENV = "IOP_EDGE_HANDOVER_FD"
HANDOVER_PRINCIPAL = "(handover)"
"""The principal the successor counts the old process's leases under."""

LeaseKind = tuple[str, str, bool]


class Channel:
    """Newline-delimited JSON messages over a connected stream socket."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, sock: socket.socket) -> Channel:
        reader, writer = await asyncio.open_unix_connection(sock=sock)
        return cls(reader, writer)

    def send(self, message: dict[str, Any]) -> None:
        if not self.writer.is_closing():
            self.writer.write(json.dumps(message).encode() + b"\n")

    async def receive(self) -> dict[str, Any] | None:
        """The next message, or ``None`` when the other side closed the channel."""
        line = await self.reader.readline()
        return dict(json.loads(line)) if line else None

    async def expect(self, kind: str, timeout: float) -> dict[str, Any] | None:
        """The next message if it is of type ``kind`` and comes within ``timeout``, else
        ``None`` (the other side closed, said something else, or was silent)."""
        try:
            async with asyncio.timeout(timeout):
                message = await self.receive()
        except TimeoutError:
            return None
        return message if message is not None and message.get("type") == kind else None

    def close(self) -> None:
        self.writer.close()


def lease_kind(lease: SlotLease) -> LeaseKind:
    return (lease.node_id, lease.provider_id, lease.long_context)


def held_leases(scheduler: AdmissionScheduler) -> list[list[Any]]:
    """The slots the scheduler's leases hold, per provider and kind: ``[node, provider, long,
    count]``."""
    held: list[list[Any]] = []
    for p in scheduler.statistics().providers:
        general = p.in_flight - p.long_in_flight
        if general:
            held.append([p.node_id, p.provider_id, False, general])
        if p.long_in_flight:
            held.append([p.node_id, p.provider_id, True, p.long_in_flight])
    return held


@dataclass(frozen=True, slots=True)
class HandoverStatistics:
    """The handover this process took over by (``/admin/status``, ``iop_edge_handover_*``)."""

    #: the process handed over from
    from_pid: int
    #: Unix time this process started accepting
    at: float
    #: seconds from the restart's start in the old process to this one accepting
    duration: float
    #: the old process's leases counted as held here when it handed over ...
    inherited_leases: int
    #: ... and those of them it still holds
    inherited_held: int
    #: requests the old process relayed here (it had queued them, or they came on a
    #: connection kept alive with it)
    relayed_requests: int
    #: whether the old process still runs (drains its requests); its channel is closed after
    old_running: bool


class EndedRequest(Protocol):
    """What the drain tally reads of a request that ended (the server's request record has
    it: the tally observes requests without this package importing the HTTP surface)."""

    @property
    def code(self) -> str:
        """How it ended: ``ok``, ``relayed``, ``drain_timeout``, an error code ..."""
        ...

    @property
    def stream(self) -> bool:
        """Whether it was a streaming request."""
        ...


@dataclass(slots=True)
class DrainTally:
    """What the old process finished after it handed over, by how (logged as it exits)."""

    finished: int = 0
    finished_streams: int = 0
    relayed: int = 0
    cut: int = 0
    cut_streams: int = 0

    def observe(self, record: EndedRequest) -> None:
        """Count one request that ended (a request observer of the server)."""
        if record.code == "relayed":
            self.relayed += 1
        elif record.code == "drain_timeout":
            self.cut += 1
            self.cut_streams += record.stream
        else:
            self.finished += 1
            self.finished_streams += record.stream


class Predecessor:
    """The successor's view of the old process: the leases it still holds, counted as ours."""

    def __init__(self, channel: Channel, scheduler: AdmissionScheduler, clock: Clock) -> None:
        self.channel = channel
        self.scheduler = scheduler
        self.clock = clock
        self.leases: dict[LeaseKind, list[Lease]] = {}
        self.inherited = 0
        #: the old process's pid, and how long the handover had taken when we got its leases
        self.pid = 0
        self._elapsed = 0.0
        self._leases_at = 0.0
        #: seconds from the restart's start (in old) to our accepting; Unix time of that
        self.duration = 0.0
        self.serving_since = 0.0
        self.old_running = True
        self._task: asyncio.Task[None] | None = None

    @classmethod
    async def connect(cls, fd: int, scheduler: AdmissionScheduler, clock: Clock) -> Predecessor:
        sock = socket.socket(fileno=fd)
        os.set_inheritable(fd, False)
        return cls(await Channel.open(sock), scheduler, clock)

    @property
    def held(self) -> int:
        """Leases still counted for the old process."""
        return sum(len(held) for held in self.leases.values())

    async def take_over(
        self, pid: int, openai_url: str, secret: str, timeout: float = 30.0
    ) -> None:
        """Say we are ready (with where old relays its waiting requests to, and the secret
        they carry); count the old process's leases once it stopped accepting."""
        self.channel.send({"type": "ready", "pid": pid, "openai": openai_url, "secret": secret})
        async with asyncio.timeout(timeout):  # (old silent that long: fail, do not guess)
            message = await self.channel.receive()
        if message is None or message.get("type") != "leases":
            return  # old is gone: nothing of it to count
        self._leases_at = self.clock.now()
        self.pid = int(message.get("pid", 0))
        self._elapsed = float(message.get("elapsed", 0.0))
        for node, provider, long, count in message["leases"]:
            kind: LeaseKind = (node, provider, bool(long))
            for _ in range(count):
                lease = self.scheduler.inherit(
                    (node, provider), long_context=bool(long), principal=HANDOVER_PRINCIPAL
                )
                if lease is not None:
                    self.leases.setdefault(kind, []).append(lease)
                    self.inherited += 1

    def serving(self) -> None:
        """Tell old we accept now; follow its releases until it exits."""
        self.duration = self._elapsed + (self.clock.now() - self._leases_at)
        self.serving_since = time.time()
        self.channel.send({"type": "serving"})
        self._task = asyncio.create_task(self._follow())

    async def _follow(self) -> None:
        try:
            while (message := await self.channel.receive()) is not None:
                if message.get("type") == "released":
                    node, provider, long = message["lease"]
                    held = self.leases.get((node, provider, bool(long)))
                    if held:
                        held.pop().release()
        finally:
            for held in self.leases.values():
                for lease in held:
                    lease.release()  # old exited: its requests are gone
            self.leases.clear()
            self.channel.close()
            self.old_running = False

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


class Successor:
    """Old's view of the new process: started, told our leases and releases."""

    def __init__(self, process: subprocess.Popen[bytes], channel: Channel) -> None:
        self.process = process
        self.channel = channel
        self.pid: int | None = None
        self.openai_url = ""
        self.secret = ""
        #: whether it was sent our leases: from then on old has stopped listening, and new
        #: serves (or is about to)
        self.committed = False
        #: how :meth:`abort` ended it, once it did
        self.aborted: str | None = None

    async def wait_ready(self, timeout: float) -> bool:
        """Whether new said it is ready within ``timeout`` (False: it failed or exited)."""
        message = await self.channel.expect("ready", timeout)
        if message is None:
            return False
        self.pid = int(message["pid"])
        self.openai_url = str(message["openai"])
        self.secret = str(message["secret"])
        return True

    def hand_over(self, scheduler: AdmissionScheduler, elapsed: float) -> None:
        """Send our held leases (with our pid and the ``elapsed`` seconds since the restart
        began), then every release as it happens (hooked before the snapshot, in the same
        tick: none is missed or counted twice)."""
        channel = self.channel

        def released(lease: SlotLease) -> None:
            node, provider, long = lease_kind(lease)
            channel.send({"type": "released", "lease": [node, provider, long]})

        scheduler.on_release = released
        self.committed = True
        channel.send(
            {
                "type": "leases",
                "pid": os.getpid(),
                "elapsed": elapsed,
                "leases": held_leases(scheduler),
            }
        )

    async def wait_serving(self, timeout: float) -> bool:
        """Whether new said it accepts within ``timeout``."""
        return await self.channel.expect("serving", timeout) is not None

    def abort(self) -> str | None:
        """Old stops during the handover: new must not serve on after it. Before it was
        sent the leases it has accepted nothing: it is killed. After, it serves (or is about
        to): it gets SIGTERM and drains what it took, as old does. Returns which (``killed``,
        ``stopped``, or ``exited`` when it had ended), or ``None`` when it was aborted before.
        """
        if self.aborted:
            return None
        if self.process.poll() is not None:
            self.aborted = "exited"
        elif self.committed:
            self.process.send_signal(signal.SIGTERM)
            self.aborted = "stopped"
        else:
            self.process.kill()
            self.aborted = "killed"
        return self.aborted


__all__ = [
    "HANDOVER_FD_ENV",
    "HANDOVER_PRINCIPAL",
    "Channel",
    "DrainTally",
    "EndedRequest",
    "HandoverStatistics",
    "Predecessor",
    "Successor",
    "held_leases",
]
