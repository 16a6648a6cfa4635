"""A provider that goes down and comes back (issue 12): :class:`FlappingUpstream`, a fake
OpenAI upstream stopped and started again on the same port, on demand or on a schedule;
``tests/reliability/test_flapping.py`` drives it step by step, ``bench/soak.py`` on a clock."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Literal

from iop_edge.testing.fake_behavior import DEFAULT_BEHAVIOR, FakeBehavior
from iop_edge.testing.fake_openai import FakeOpenAI

FlapState = Literal["down", "up"]
"""What :class:`FlappingUpstream` just did: stopped its fake, or started a new one."""


class FlappingUpstream:
    """A fake OpenAI upstream on a fixed loopback port that goes down and comes back: a box
    that dies (every connection dropped, then nothing listens: connections are refused) and
    is started again at the same address, so the edge's config never changes.

    :meth:`up` starts a new :class:`FakeOpenAI` on the port (the first one picks a free port,
    kept from then on) and returns it: its counters are the requests of this up phase only.
    :meth:`down` stops it. :meth:`flap` runs a down/up schedule. Use as an async context
    manager: it starts up, and is stopped on exit.
    """

    def __init__(self, behavior: FakeBehavior = DEFAULT_BEHAVIOR) -> None:
        self.behavior = behavior
        self.port = 0
        self.fake: FakeOpenAI | None = None
        """The fake of the current up phase; ``None`` while down."""
        self.downs = 0
        self.ups = 0

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT/v1``, the same whether it is up or down (after the first
        :meth:`up`)."""
        if not self.port:
            raise RuntimeError("the flapping upstream was never started: it has no port yet")
        return f"http://127.0.0.1:{self.port}/v1"

    async def up(self) -> FakeOpenAI:
        """Start a new fake on the port and return it (already listening)."""
        if self.fake is not None:
            raise RuntimeError(f"the flapping upstream on port {self.port} is already up")
        fake = FakeOpenAI(behavior=self.behavior, port=self.port)
        await fake.start()
        self.port = fake.port
        self.fake = fake
        self.ups += 1
        return fake

    async def down(self) -> FakeOpenAI:
        """Stop the fake (requests it holds are cut, connections closed); return it, stopped,
        for its counters. The port refuses connections until :meth:`up`."""
        fake, self.fake = self.fake, None
        if fake is None:
            raise RuntimeError(f"the flapping upstream on port {self.port} is already down")
        await fake.close()
        self.downs += 1
        return fake

    async def flap(
        self,
        down_s: float,
        up_s: float,
        cycles: int,
        on_change: Callable[[FlapState, int, FakeOpenAI], None] | None = None,
    ) -> None:
        """``cycles`` times: down for ``down_s`` seconds, then up for ``up_s``; after each
        change ``on_change(state, cycle, fake)`` is told (the fake just stopped, or just
        started). Each phase lasts its length from the moment it began (the stop or start
        included), so the schedule does not drift. The durations are the schedule itself (a
        soak's rhythm), never a synchronisation: a test calls :meth:`down` and :meth:`up`."""
        loop = asyncio.get_running_loop()
        began = loop.time()
        phases: tuple[tuple[FlapState, float], ...] = (("down", down_s), ("up", up_s))
        for cycle in range(cycles):
            for state, seconds in phases:
                fake = await (self.down() if state == "down" else self.up())
                if on_change is not None:
                    on_change(state, cycle, fake)
                began += seconds
                await asyncio.sleep(max(began - loop.time(), 0))

    async def __aenter__(self) -> FlappingUpstream:
        await self.up()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.fake is not None:
            await self.down()
