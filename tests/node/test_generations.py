"""PayloadCache (design §6): one AdapterSet per payload generation, reused for an equal
generation, closed after its last user releases it."""

from __future__ import annotations

import pytest

from iop_edge.adapters import AdapterSet
from iop_edge.config import load_config
from iop_edge.config.payload import NodeConfigPayload, node_payload
from iop_edge.node.generations import PayloadCache, UnknownGeneration
from tests.helpers.adapters import config_text


def payload(base_url: str = "http://127.0.0.1:9") -> NodeConfigPayload:
    config = load_config(
        config_text(
            [{"name": "api", "type": "openai_compat", "base_url": base_url}],
            [{"id": "p", "type": "openai_compat", "adapter": "api"}],
        )
    )
    return node_payload(config, "n1")


class Recorded:
    """The sets a cache built, and how often each was closed."""

    def __init__(self) -> None:
        self.built: list[AdapterSet] = []
        self.closes: dict[int, int] = {}

    def build(self, source: NodeConfigPayload) -> AdapterSet:
        recorder = self

        class Counted(AdapterSet):
            async def aclose(self) -> None:
                recorder.closes[id(self)] = recorder.closes.get(id(self), 0) + 1
                await super().aclose()

        built = AdapterSet.from_payload(source)
        counted = Counted(
            built.node_id, {}, {"p": built.for_provider("p")}, {"api": built.for_adapter("api")}
        )
        self.built.append(counted)
        return counted

    def closed(self, adapters: AdapterSet) -> int:
        return self.closes.get(id(adapters), 0)


async def test_an_equal_generation_reuses_the_set_and_the_last_release_closes_it():
    recorded = Recorded()
    cache = PayloadCache(build=recorded.build)
    first = cache.acquire("g1", payload())
    again = cache.acquire("g1", None)  # the edge omits the payload of a generation we have
    assert again is first
    assert len(recorded.built) == 1
    assert (cache.generations, cache.users("g1")) == (("g1",), 2)
    await cache.release("g1")
    assert recorded.closed(first) == 0  # the other user (a link, or a request) still runs on it
    await cache.release("g1")
    assert recorded.closed(first) == 1
    assert (cache.generations, cache.users("g1")) == ((), 0)


async def test_a_new_generation_builds_a_second_set_beside_the_first():
    recorded = Recorded()
    cache = PayloadCache(build=recorded.build)
    old = cache.acquire("g1", payload())
    new = cache.acquire("g2", payload("http://127.0.0.1:10"))
    assert new is not old
    assert list(cache.generations) == ["g1", "g2"]
    await cache.release("g1")  # the old link's last request finished
    assert (recorded.closed(old), recorded.closed(new)) == (1, 0)
    assert cache.generations == ("g2",)
    await cache.release("g2")
    assert recorded.closed(new) == 1


async def test_a_generation_closed_once_is_built_again_when_acquired_later():
    recorded = Recorded()
    cache = PayloadCache(build=recorded.build)
    cache.acquire("g1", payload())
    await cache.release("g1")
    with pytest.raises(UnknownGeneration, match="generation 'g1' without its payload"):
        cache.acquire("g1", None)
    rebuilt = cache.acquire("g1", payload())
    assert rebuilt is recorded.built[1]
    await cache.aclose()
    assert recorded.closed(rebuilt) == 1
    assert cache.generations == ()


async def test_a_payload_that_does_not_build_leaves_nothing_held():
    def refuse(source: NodeConfigPayload) -> AdapterSet:
        raise ValueError("adapter 'api': no such backend here")

    cache = PayloadCache(build=refuse)
    with pytest.raises(ValueError, match="no such backend"):
        cache.acquire("g1", payload())
    assert (cache.generations, cache.users("g1")) == ((), 0)


async def test_a_release_without_an_acquire_is_a_bug_it_names():
    cache = PayloadCache()
    with pytest.raises(ValueError, match="generation 'g9' released more often"):
        await cache.release("g9")


async def test_the_default_build_is_the_adapter_sets_own():
    cache = PayloadCache()
    adapters = cache.acquire("g1", payload())
    assert isinstance(adapters, AdapterSet)
    assert adapters.node_id == "n1"
    assert adapters.for_provider("p").native_apis == frozenset()
    await cache.release("g1")
