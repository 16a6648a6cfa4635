"""The handover channel in one process (:mod:`iop_edge.handover`): two admission schedulers,
old and new, talk over a real Unix socketpair. New counts old's held slots before it serves,
frees one for each release old reports, and frees the rest when old goes away.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess

from iop_edge.admission import AdmissionScheduler
from iop_edge.handover import Channel, Predecessor, Successor, held_leases
from tests.helpers import wait_for
from tests.pool.builders import pool, provider


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
    predecessor = Predecessor(await Channel.open(theirs), new)
    taking = asyncio.create_task(predecessor.take_over(4242, "http://127.0.0.1:1", "s3cret"))
    assert await successor.wait_ready(5)
    assert (successor.pid, successor.openai_url, successor.secret) == (
        4242,
        "http://127.0.0.1:1",
        "s3cret",
    )
    successor.hand_over(old)
    await taking
    assert in_flight(new) == in_flight(old)
    assert predecessor.inherited == 3
    predecessor.serving()
    assert await successor.wait_serving(5)
    general.release()  # old reports it: new frees that slot
    await wait_for(lambda: in_flight(new) == in_flight(old))
    successor.channel.close()  # old went away: new frees the rest
    await wait_for(lambda: sum(n for n, _ in in_flight(new).values()) == 0)
    long.release()
    third.release()
    await predecessor.aclose()
    process.wait()
    assert new.statistics().inherited == 3
