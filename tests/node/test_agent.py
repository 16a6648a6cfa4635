"""NodeAgent (design §2, §6) in the test's own loop against the stub edge: the handshake, a call
served, the SIGTERM drain (requests finish, or are cancelled at the drain timeout), the exits
on a permanent refusal (401, another protocol version either way, superseded), a payload that
does not build, the redial after a handover (the old link finishing its request on its own
generation) and after a lost link, and STATS every five heartbeats on the injected clock. The
program's own subprocess, exit codes and messages are in test_program.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from iop_edge import __version__
from iop_edge.link.calls import reply_from
from iop_edge.link.handshake import Refused
from iop_edge.link.protocol import CLOSE_NORMAL, PROTOCOL_VERSION, Frame, Kind
from iop_edge.node.agent import NodeAgent
from iop_edge.node.options import NodeOptions
from iop_edge.runtime.logs import get_logger
from iop_edge.runtime.systemd import Notifier
from iop_edge.seams import Clock
from iop_edge.testing.clock import FakeClock
from iop_edge.testing.fake_openai import FakeBehavior, FakeOpenAI
from tests.helpers import wait_for
from tests.helpers.adapters import chat, reply_json
from tests.helpers.edge_stub import EdgeStub, StubLink, edge_stub, fake_payload

TOKEN = "iopn_agent-test-token"


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as server:
        yield server


@pytest.fixture
async def stub(fake: FakeOpenAI) -> AsyncIterator[EdgeStub]:
    async with edge_stub(EdgeStub(TOKEN, fake_payload(fake.base_url))) as served:
        yield served


def agent_for(
    stub: EdgeStub, *, token: str = TOKEN, drain_timeout: float = 30.0, clock: Clock | None = None
) -> NodeAgent:
    """An agent dialling ``stub``; its backoff draws 0 (every redial at once)."""
    options = NodeOptions(edge=stub.url, token=token, drain_timeout=drain_timeout)
    return NodeAgent(
        options,
        log=get_logger("test"),
        notifier=Notifier({}),
        clock=clock,
        random=lambda: 0.0,
        handle_signals=False,
    )


async def exit_code(run: asyncio.Task[int]) -> int:
    async with asyncio.timeout(20):
        return await run


async def control(link: StubLink, kind: Kind) -> Frame:
    """The next frame of ``kind`` the node sent on stream 0."""
    async with asyncio.timeout(20):
        while True:
            frame = await link.control.get()
            if frame.kind is kind:
                return frame


async def test_the_agent_says_hello_serves_and_drains_on_stop(stub, fake):
    agent = agent_for(stub)
    run = asyncio.create_task(agent.run())
    link = await stub.next_link()
    assert link.hello.protocol == PROTOCOL_VERSION
    assert (link.hello.agent, link.hello.have) == (__version__, ())
    assert link.ack == {"generation": "g1"}
    await agent.connected.wait()
    stream = await link.request(chat("served by the node"), provider="p")
    [reply] = await link.answer(stream)
    assert reply_json(reply_from(reply.meta, reply.data))["choices"][0]["message"]["content"] == (
        "served by the node"
    )
    agent.stop()
    goaway = await control(link, Kind.GOAWAY)
    assert goaway.meta == {"reason": "draining"}
    assert await exit_code(run) == 0
    await link.closed.wait()
    assert link.close_reason is not None
    assert (link.close_reason.code, link.close_reason.reason) == (CLOSE_NORMAL, "drained")
    assert link.violations == []


async def test_stop_lets_a_request_in_flight_finish(stub, fake):
    agent = agent_for(stub)
    run = asyncio.create_task(agent.run())
    link = await stub.next_link()
    fake.enqueue(FakeBehavior(hold=True))
    stream = await link.request(chat("finish me"), provider="p")
    await fake.wait_in_flight(1)
    agent.stop()
    await control(link, Kind.GOAWAY)
    fake.release()
    [reply] = await link.answer(stream)
    assert reply.kind is Kind.RESP_REPLY
    assert await exit_code(run) == 0
    assert fake.cancelled == 0


async def test_the_drain_timeout_cancels_what_is_left(stub, fake):
    agent = agent_for(stub, drain_timeout=0.0)
    run = asyncio.create_task(agent.run())
    link = await stub.next_link()
    fake.enqueue(FakeBehavior(hold=True))
    stream = await link.request(chat("too slow", stream=True), provider="p")
    await fake.wait_in_flight(1)
    agent.stop()
    [terminal] = await link.answer(stream)
    assert terminal.meta["type"] == "cancelled"
    assert await exit_code(run) == 0
    async with asyncio.timeout(20):
        await fake.wait_until(lambda: fake.cancelled == 1)


async def test_an_unknown_token_exits_2_without_dialling_again(stub):
    agent = agent_for(stub, token="iopn_not-this-one")
    assert await exit_code(asyncio.create_task(agent.run())) == 2
    assert stub.unauthorized == 1
    assert stub.hellos == []


@pytest.mark.parametrize(("welcome", "refuse"), [(2, None), (1, 2)], ids=["welcome", "refused"])
async def test_another_protocol_version_exits_2(
    fake: FakeOpenAI, welcome: int, refuse: int | None
) -> None:
    """The node reads another version in WELCOME, or the edge refuses the node's: either way
    the node stops for good (the messages naming both versions: test_program.py)."""
    versions = EdgeStub(
        TOKEN, fake_payload(fake.base_url), welcome_protocol=welcome, refuse_protocol=refuse
    )
    async with edge_stub(versions) as stub:
        assert await exit_code(asyncio.create_task(agent_for(stub).run())) == 2
        assert stub.acks == []


async def test_a_payload_that_does_not_build_is_refused_in_the_ack_and_exits_1(fake):
    broken = fake_payload(fake.base_url).model_dump(mode="json")
    broken["adapters"][0]["type"] = "telepathy"
    stub = EdgeStub(TOKEN, fake_payload(fake.base_url), payload_json=broken)
    async with edge_stub(stub):
        assert await exit_code(asyncio.create_task(agent_for(stub).run())) == 1
    [ack] = stub.acks
    assert ack["generation"] == "g1"
    assert "payload generation 'g1' does not build on this node" in ack["error"]
    assert "telepathy" in ack["error"]


async def test_superseded_on_the_current_link_exits_2(stub):
    agent = agent_for(stub)
    run = asyncio.create_task(agent.run())
    link = await stub.next_link()
    refused = Refused("superseded", "a newer link of node n1 replaced this one")
    await link.link.send(Frame(Kind.REFUSED, meta=refused.to_meta()))
    assert await exit_code(run) == 2


async def test_a_handover_dials_again_at_once_and_the_old_link_finishes(stub, fake):
    """GOAWAY{handover}: a new link at once, which reuses the generation's adapters (HELLO
    lists it, so the edge sends no payload); the request on the old link completes there."""
    agent = agent_for(stub)
    run = asyncio.create_task(agent.run())
    old = await stub.next_link()
    fake.enqueue(FakeBehavior(hold=True))
    held = await old.request(chat("begun before"), provider="p")
    await fake.wait_in_flight(1)
    await old.go_away("handover")
    new = await stub.next_link()
    assert new.hello.have == ("g1",)
    assert agent.links == 2
    fresh = await new.request(chat("after"), provider="p")
    assert (await new.answer(fresh))[0].kind is Kind.RESP_REPLY
    fake.release()
    [finished] = await old.answer(held)
    assert reply_json(reply_from(finished.meta, finished.data))["choices"][0]["message"][
        "content"
    ] == ("begun before")
    await old.link.close(CLOSE_NORMAL, "idle after the handover")
    await wait_for(lambda: agent.links == 1)
    assert list(agent.cache.generations) == ["g1"]  # (still held by the new link)
    agent.stop()
    assert await exit_code(run) == 0
    assert list(agent.cache.generations) == []


async def test_a_lost_link_is_dialled_again_and_its_adapters_released(stub):
    agent = agent_for(stub)
    run = asyncio.create_task(agent.run())
    first = await stub.next_link()
    await first.link.close(1001, "stopping")
    second = await stub.next_link()
    assert second.hello.have == ()  # the lost link's generation was closed with it
    assert second.ack == {"generation": "g1"}
    agent.stop()
    assert await exit_code(run) == 0


async def test_stats_go_every_five_heartbeats(fake):
    clock = FakeClock()
    stub = EdgeStub(TOKEN, fake_payload(fake.base_url), heartbeat_ms=1000)
    async with edge_stub(stub):
        agent = agent_for(stub, clock=clock)
        run = asyncio.create_task(agent.run())
        link = await stub.next_link()
        for _ in range(5):
            # A heartbeat's time passes; a probe answered keeps the link alive in it.
            clock.advance(1.0)
            await link.answer(await link.probe("p"))
        stats = await control(link, Kind.STATS)
        assert stats.meta == {
            "adapters": [
                {"name": "api", "backend": "http", "live_process_groups": 0, "kills_pending": 0}
            ],
            "in_flight": 0,
        }
        agent.stop()
        assert await exit_code(run) == 0
