"""The handover channel in one process (:mod:`iop_edge.handover`): two admission schedulers,
old and new, talk over a real Unix socketpair. New counts old's held slots before it serves,
frees one for each release old reports, and frees the rest when old goes away.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess

from iop_edge.admission import AdmissionScheduler
from iop_edge.api.record import RequestRecord
from iop_edge.handover.channel import Channel, DrainTally, Predecessor, Successor, held_leases
from iop_edge.testing.clock import FakeClock
from tests.helpers import wait_for
from tests.helpers.pool import pool, provider


def in_flight(scheduler: AdmissionScheduler) -> dict[str, tuple[int, int]]:
    stats = scheduler.statistics()
    return {p.provider_id: (p.in_flight, p.long_in_flight) for p in stats.providers}


async def test_new_counts_olds_slots_until_old_releases_them_or_goes_away() -> None:
    policy = pool([provider("a", capacity=2, long=1), provider("b", capacity=1)])
    old = AdmissionScheduler(policy)
    new = AdmissionScheduler(policy)
    general = await old.admit("m")
    long = await old.admit("m", long_context=True)
    third = await old.admit("m")
    # per provider and kind: a holds two general slots, b the long one
    assert sorted(held_leases(old)) == [["n1", "a", False, 2], ["n1", "b", True, 1]]
    ours, theirs = socket.socketpair()
    process = subprocess.Popen(["true"])
    successor = Successor(process, await Channel.open(ours))
    clock = FakeClock(100.0)
    predecessor = Predecessor(await Channel.open(theirs), new, clock)
    taking = asyncio.create_task(predecessor.take_over(4242, "http://127.0.0.1:1", "s3cret"))
    assert await successor.wait_ready(5)
    assert (successor.pid, successor.openai_url, successor.secret) == (
        4242,
        "http://127.0.0.1:1",
        "s3cret",
    )
    successor.hand_over(old, elapsed=0.75)  # the restart began 0.75 s ago in old
    await taking
    assert in_flight(new) == in_flight(old)
    assert (predecessor.inherited, predecessor.held, predecessor.pid) == (3, 3, os.getpid())
    clock.advance(0.25)  # new takes 0.25 s more to accept
    predecessor.serving()
    assert predecessor.duration == 1.0
    assert await successor.wait_serving(5)
    general.release()  # old reports it: new frees that slot
    await wait_for(lambda: in_flight(new) == in_flight(old))
    assert predecessor.held == 2
    successor.channel.close()  # old went away: new frees the rest
    await wait_for(lambda: sum(n for n, _ in in_flight(new).values()) == 0)
    assert predecessor.held == 0
    long.release()
    third.release()
    await predecessor.aclose()
    process.wait()
    assert new.statistics().inherited == 3


def test_the_drain_tally_counts_what_old_finished_relayed_and_cut() -> None:
    tally = DrainTally()
    for code, stream in [
        ("ok", True),
        ("ok", False),
        ("upstream_error", False),
        ("relayed", True),
        ("drain_timeout", True),
        ("drain_timeout", False),
    ]:
        tally.observe(RequestRecord("r", "chat", 0.0, stream=stream, code=code))
    assert tally == DrainTally(finished=3, finished_streams=1, relayed=1, cut=2, cut_streams=1)
