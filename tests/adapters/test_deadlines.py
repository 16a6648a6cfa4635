"""One deadline per upstream exchange (issue 16): :class:`Deadlines` and :class:`Exchange`
through the real POST helpers, against the fake OpenAI server on 127.0.0.1.

The deadlines run on a fake clock the test moves (issue 26): an exchange fails exactly at its
own deadline, never a millisecond before (:func:`tests.helpers.pass_deadline`), and no test
waits for one; what is waited for is awaited on events.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import orjson
import pytest

from iop_edge.adapters import AdapterSet
from iop_edge.adapters.base import UpstreamReply, Usage
from iop_edge.adapters.relay import relay_lines
from iop_edge.adapters.upstream_http import (
    Deadlines,
    HttpBackend,
    HttpTarget,
    post_for_body,
    post_for_stream,
    static_headers,
)
from iop_edge.errors import AdapterError
from iop_edge.testing.clock import FakeClock
from iop_edge.testing.fake_behavior import FakeBehavior
from iop_edge.testing.fake_openai import FakeOpenAI
from tests.helpers import pass_deadline, wait_for

TIMEOUT_MS = 300
BODY = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
STREAM_BODY = orjson.dumps(
    {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
)


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as server:
        yield server


@pytest.fixture
async def backend() -> AsyncIterator[HttpBackend]:
    backend = HttpBackend("api")
    yield backend
    await backend.aclose()


def target_of(fake: FakeOpenAI, clock: FakeClock | None = None) -> HttpTarget:
    return HttpTarget(
        "openai_compat provider 'p1'", fake.base_url, static_headers(None), TIMEOUT_MS, clock
    )


class Lines:
    """A pass-through LineTranslator that ends at ``data: [DONE]``."""

    unfinished = "the stream ended before data: [DONE]"

    def __init__(self) -> None:
        self.done = False

    def translate(self, line: bytes) -> bytes:
        if line.startswith(b"data: [DONE]"):
            self.done = True
        return line + b"\n" if line else b""


async def test_a_body_stalled_after_the_head_times_out_at_the_exchange_deadline(
    fake: FakeOpenAI, backend: HttpBackend
) -> None:
    clock = FakeClock()
    target = target_of(fake, clock)
    url = target.url("chat/completions")
    fake.enqueue(FakeBehavior(fault="stall", fault_after=1))
    due = clock.now() + TIMEOUT_MS / 1000
    head_came = lambda: target.deadlines.statistics().answered == 1  # noqa: E731
    deadline = asyncio.create_task(pass_deadline(clock, due, head_came))
    with pytest.raises(AdapterError) as caught:
        await post_for_body(backend, target, url, BODY, {})
    await deadline  # the exchange failed at its deadline, not before
    assert clock.now() == due
    assert (caught.value.code, caught.value.status) == ("upstream_timeout", 504)
    assert caught.value.failover is False  # the head had come: nothing fails over
    assert f"request_timeout_ms={TIMEOUT_MS}" in str(caught.value)
    assert len(target.deadlines) == 0
    async with asyncio.timeout(5):
        await fake.wait_until(lambda: fake.cancelled == 1 and fake.in_flight == 0)


async def test_a_head_that_never_comes_times_out_and_may_fail_over(
    fake: FakeOpenAI, backend: HttpBackend
) -> None:
    clock = FakeClock()
    target = target_of(fake, clock)
    url = target.url("chat/completions")
    fake.behavior = FakeBehavior(hold=True)
    for sent, attempt in enumerate(
        (
            post_for_body(backend, target, url, BODY, {}),
            post_for_stream(backend, target, url, STREAM_BODY, {}),
        ),
        start=1,
    ):
        due = clock.now() + TIMEOUT_MS / 1000
        arrived = lambda sent=sent: fake.total_requests == sent  # noqa: E731
        deadline = asyncio.create_task(pass_deadline(clock, due, arrived))
        with pytest.raises(AdapterError) as caught:
            await attempt
        await deadline
        assert (caught.value.code, caught.value.failover) == ("upstream_timeout", True)
    # the task that timed out was not left cancelled: it goes on awaiting
    await asyncio.sleep(0)
    assert asyncio.current_task() is not None
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]
    assert len(target.deadlines) == 0


async def test_each_exchange_gets_its_own_deadline_on_the_shared_timer(
    fake: FakeOpenAI, backend: HttpBackend
) -> None:
    """The timer is armed for the oldest exchange; when that one finishes in time, the next one
    still gets its full time, and fails at (never before) its own deadline."""
    clock = FakeClock()
    target = target_of(fake, clock)
    url = target.url("chat/completions")
    fake.enqueue(FakeBehavior(hold=True), FakeBehavior(fault="stall", fault_after=1))
    first = asyncio.create_task(post_for_body(backend, target, url, BODY, {}))
    async with asyncio.timeout(5):
        await fake.wait_in_flight(1)
    clock.advance(0.1)  # the second starts later: its deadline is its own
    second_started = clock.now()
    second = asyncio.create_task(post_for_body(backend, target, url, BODY, {}))
    async with asyncio.timeout(5):
        await fake.wait_in_flight(2)
    assert len(target.deadlines) == 2
    fake.release()  # the first answers in time
    answer = await first
    assert isinstance(answer, bytes)
    assert b"choices" in answer
    assert clock.armed == [TIMEOUT_MS / 1000]  # the timer, armed for the first, stays
    async with asyncio.timeout(5):
        await wait_for(lambda: target.deadlines.statistics().answered == 1)  # second's head
    clock.advance_to(TIMEOUT_MS / 1000)  # the first's time: the timer re-arms for the second
    due = second_started + TIMEOUT_MS / 1000
    assert (clock.armed, second.done()) == ([due], False)
    deadline = asyncio.create_task(pass_deadline(clock, due))
    with pytest.raises(AdapterError) as caught:
        async with asyncio.timeout(5):  # (a timer not re-armed would leave it waiting)
            await second
    await deadline
    assert caught.value.code == "upstream_timeout"
    assert clock.now() == due
    assert len(target.deadlines) == 0


async def test_an_outside_cancellation_stays_a_cancellation(
    fake: FakeOpenAI, backend: HttpBackend
) -> None:
    target = target_of(fake)
    fake.behavior = FakeBehavior(hold=True)
    task = asyncio.create_task(
        post_for_body(backend, target, target.url("chat/completions"), BODY, {})
    )
    async with asyncio.timeout(5):
        await fake.wait_in_flight(1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(target.deadlines) == 0


async def test_every_way_an_exchange_ends_forgets_it(
    fake: FakeOpenAI, backend: HttpBackend
) -> None:
    target = target_of(fake)
    url = target.url("chat/completions")
    # an answer, an error status, a stream read to its end, a stream closed unread
    assert isinstance(await post_for_body(backend, target, url, BODY, {}), bytes)
    fake.enqueue(FakeBehavior(status=503))
    assert isinstance(await post_for_body(backend, target, url, BODY, {}), UpstreamReply)
    for read in (True, False):
        opened = await post_for_stream(backend, target, url, STREAM_BODY, {})
        assert not isinstance(opened, UpstreamReply)
        response, exchange = opened
        assert len(target.deadlines) == 1
        stream = relay_lines(response, target, url, exchange, Lines(), Usage())
        async with stream:
            if read:
                relayed = b"".join([frame async for frame in stream.frames])
                assert relayed.endswith(b"data: [DONE]\n")
        assert len(target.deadlines) == 0


def test_a_loop_closed_with_the_timer_armed_does_not_stop_the_next_loops_deadlines() -> None:
    deadlines = Deadlines(50)

    async def first() -> None:
        deadlines.start().end()  # the timer stays armed on this loop, which then closes

    async def second() -> None:
        exchange = deadlines.start()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.get_running_loop().create_future()  # only the deadline ends this
        assert exchange.expired
        assert exchange.timed_out()  # the cancellation was the deadline's, and is withdrawn
        assert len(deadlines) == 0

    asyncio.run(first())
    asyncio.run(asyncio.wait_for(second(), timeout=10))


async def test_a_health_check_without_an_answer_fails_at_its_timeout_on_the_clock(
    fake: FakeOpenAI, sets: Callable[..., AdapterSet]
) -> None:
    """A provider's health check is bounded by its ``timeout_ms`` on the executors' clock: the
    probe of a listing that does not come in time is unhealthy exactly then, naming the bound;
    one that answers is healthy."""
    clock = FakeClock()
    adapter_set = sets(
        [{"name": "a", "type": "openai_compat", "base_url": fake.base_url}],
        [
            {
                "id": "p1",
                "type": "openai_compat",
                "adapter": "a",
                "health_check": {"timeout_ms": 500},
            }
        ],
        clock,
    )
    assert await adapter_set.probe("p1") == (True, None)
    fake.listing = FakeBehavior(latency=60.0)
    arrived = lambda: len(fake.requests) == 2  # noqa: E731
    deadline = asyncio.create_task(pass_deadline(clock, 0.5, arrived))
    healthy, reason = await adapter_set.probe("p1")
    await deadline
    assert healthy is False
    assert reason == (
        f"openai_compat provider 'p1' (adapter 'a'): the health check GET {fake.base_url}/models "
        "did not answer within 500 ms"
    )
