"""The stored responses of ``/v1/responses`` (issue 28, "State"): bounded by items and bytes
with the least recently used out first, expiring ``ttl`` after being stored on the injected
clock, visible only to their owner, and reconfigurable live."""

from __future__ import annotations

import dataclasses
from types import MappingProxyType
from typing import Any

import orjson
import pytest

from iop_edge.api.responses_store import ResponsesStore, ResponsesStoreStatistics, StoredResponse
from iop_edge.testing.clock import FakeClock

OWNER = "team"
#: The conversation of a stored response: the input items, then the output items.
ITEMS: tuple[dict[str, Any], ...] = (
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
    {
        "type": "message",
        "id": "msg_1",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": "Hello!", "annotations": []}],
    },
)
ITEMS_SIZE = len(orjson.dumps(ITEMS))


def response(response_id: str, pad: int = 0) -> bytes:
    """A Response object's JSON as a client gets it (``pad`` more bytes of text)."""
    return orjson.dumps({"id": response_id, "object": "response", "output_text": "x" * pad})


def make(
    clock: FakeClock | None = None,
    *,
    max_items: int = 100,
    max_bytes: int = 10**6,
    ttl: float = 60.0,
) -> ResponsesStore:
    return ResponsesStore(
        max_items=max_items, max_bytes=max_bytes, ttl=ttl, clock=clock or FakeClock()
    )


def held(store: ResponsesStore, *ids: str, owner: str = OWNER) -> list[str]:
    """Which of ``ids`` the store still answers for ``owner`` (each a use: keep the order)."""
    return [i for i in ids if store.get(i, owner) is not None]


def test_a_stored_response_comes_back_as_it_was_stored() -> None:
    clock = FakeClock(start=5.0)
    store = make(clock)
    body = response("resp_1")
    store.put("resp_1", OWNER, body, ITEMS)
    assert store.get("resp_1", OWNER) == StoredResponse(
        response_id="resp_1", owner=OWNER, response=body, items=ITEMS, created=5.0
    )


def test_an_unknown_id_is_none() -> None:
    assert make().get("resp_nope", OWNER) is None


def test_neither_the_putter_nor_a_getter_can_change_what_is_stored() -> None:
    store = make()
    items = [{"type": "message", "role": "user", "content": "Hi"}]
    store.put("resp_1", OWNER, response("resp_1"), items)
    items[0]["content"] = "changed after put"
    got = store.get("resp_1", OWNER)
    assert got is not None
    got.items[0]["content"] = "changed by a reader"
    again = store.get("resp_1", OWNER)
    assert again is not None
    assert again.items == ({"type": "message", "role": "user", "content": "Hi"},)


def test_read_only_mappings_and_sequences_are_stored_as_json() -> None:
    store = make()
    store.put("resp_1", OWNER, b"{}", (MappingProxyType({"parts": (1, 2)}),))
    got = store.get("resp_1", OWNER)
    assert got is not None
    assert got.items == ({"parts": [1, 2]},)


def test_an_item_that_is_not_json_is_refused() -> None:
    with pytest.raises(TypeError):
        make().put("resp_1", OWNER, b"{}", [{"when": object()}])


def test_the_size_of_an_entry_is_its_response_and_its_items_as_json() -> None:
    store = make()
    body = response("resp_1", pad=100)
    store.put("resp_1", OWNER, body, ITEMS)
    assert store.statistics().bytes == len(body) + ITEMS_SIZE


# --- bounds ----------------------------------------------------------------------------------


def test_past_max_items_the_least_recently_stored_goes_first() -> None:
    store = make(max_items=3)
    for n in range(1, 5):
        store.put(f"resp_{n}", OWNER, response(f"resp_{n}"), ITEMS)
    assert held(store, "resp_1", "resp_2", "resp_3", "resp_4") == ["resp_2", "resp_3", "resp_4"]
    assert (store.statistics().items, store.statistics().evicted) == (3, 1)


def test_a_get_makes_a_response_the_most_recently_used() -> None:
    store = make(max_items=3)
    for n in range(1, 4):
        store.put(f"resp_{n}", OWNER, response(f"resp_{n}"), ITEMS)
    assert store.get("resp_1", OWNER) is not None
    store.put("resp_4", OWNER, response("resp_4"), ITEMS)
    assert held(store, "resp_1", "resp_2", "resp_3", "resp_4") == ["resp_1", "resp_3", "resp_4"]


def test_another_owner_s_get_does_not_count_as_a_use() -> None:
    store = make(max_items=2)
    store.put("resp_1", OWNER, b"{}", [])
    store.put("resp_2", OWNER, b"{}", [])
    assert store.get("resp_1", "intruder") is None
    store.put("resp_3", OWNER, b"{}", [])
    assert held(store, "resp_1", "resp_2", "resp_3") == ["resp_2", "resp_3"]


def test_past_max_bytes_the_least_recently_used_go_until_the_bytes_fit() -> None:
    size = len(response("resp_1", pad=100)) + 2  # "[]"
    store = make(max_bytes=3 * size)
    for n in range(1, 4):
        store.put(f"resp_{n}", OWNER, response(f"resp_{n}", pad=100), [])
    assert store.statistics().bytes == 3 * size
    # One entry the size of two evicts the two least recently used.
    store.get("resp_1", OWNER)
    store.put("resp_big", OWNER, b"x" * (2 * size - 2), [])
    assert held(store, "resp_1", "resp_2", "resp_3", "resp_big") == ["resp_1", "resp_big"]
    stats = store.statistics()
    assert (stats.items, stats.bytes, stats.evicted) == (2, 3 * size, 2)


def test_an_entry_larger_than_max_bytes_is_not_stored_and_is_counted() -> None:
    store = make(max_bytes=100)
    store.put("resp_small", OWNER, b"x" * 98, [])  # exactly 100: fits
    store.put("resp_big", OWNER, b"x" * 99, [])
    assert held(store, "resp_small", "resp_big") == ["resp_small"]
    stats = store.statistics()
    assert (stats.items, stats.bytes, stats.stored, stats.too_large, stats.evicted) == (
        1,
        100,
        1,
        1,
        0,
    )


def test_storing_an_id_again_replaces_it() -> None:
    store = make()
    store.put("resp_1", OWNER, b"old", [])
    store.put("resp_1", OWNER, b"newer", [])
    got = store.get("resp_1", OWNER)
    assert got is not None
    assert got.response == b"newer"
    assert (store.statistics().items, store.statistics().bytes) == (1, len(b"newer") + 2)


# --- ttl -------------------------------------------------------------------------------------


def test_a_response_expires_ttl_after_it_was_stored() -> None:
    clock = FakeClock()
    store = make(clock, ttl=60.0)
    store.put("resp_1", OWNER, b"{}", [])
    clock.advance(59.999)
    assert store.get("resp_1", OWNER) is not None
    clock.advance(0.001)
    assert store.get("resp_1", OWNER) is None
    stats = store.statistics()
    assert (stats.items, stats.bytes, stats.expired) == (0, 0, 1)


def test_a_use_does_not_extend_the_ttl() -> None:
    clock = FakeClock()
    store = make(clock, ttl=60.0)
    store.put("resp_1", OWNER, b"{}", [])
    for _ in range(5):
        clock.advance(10.0)
        assert store.get("resp_1", OWNER) is not None
    clock.advance(10.0)
    assert store.get("resp_1", OWNER) is None


def test_a_put_sweeps_the_expired_responses_oldest_first() -> None:
    """Expired entries hold their memory (and count) until a put sweeps them, however
    recently they were used; the sweep stops at the first live one."""
    clock = FakeClock()
    store = make(clock, ttl=60.0)
    store.put("resp_1", OWNER, b"{}", [])
    clock.advance(10.0)
    store.put("resp_2", OWNER, b"{}", [])
    clock.advance(10.0)
    store.put("resp_3", OWNER, b"{}", [])
    store.get("resp_1", OWNER)  # the most recently used now, still the oldest
    clock.advance(50.0)  # resp_1 and resp_2 have expired (at 60 s and 70 s), not resp_3
    assert store.statistics().items == 3
    store.put("resp_4", OWNER, b"{}", [])
    stats = store.statistics()
    assert (stats.items, stats.expired, stats.evicted) == (2, 2, 0)
    assert held(store, "resp_3", "resp_4") == ["resp_3", "resp_4"]


def test_an_expired_response_is_none_for_its_owner_and_cannot_be_deleted() -> None:
    clock = FakeClock()
    store = make(clock, ttl=1.0)
    store.put("resp_1", OWNER, b"{}", [])
    clock.advance(1.0)
    assert store.delete("resp_1", OWNER) is False
    assert store.statistics().expired == 1


# --- owners ----------------------------------------------------------------------------------


def test_another_owner_gets_none_exactly_as_for_an_unknown_id() -> None:
    store = make()
    store.put("resp_1", OWNER, b"{}", ITEMS)
    assert store.get("resp_1", "other-team") is None
    assert store.get("resp_1", "other-team") == store.get("resp_unknown", "other-team")
    assert store.get("resp_1", OWNER) is not None


def test_another_owner_cannot_delete_and_the_owner_can_once() -> None:
    store = make()
    store.put("resp_1", OWNER, b"{}", [])
    assert store.delete("resp_1", "other-team") is False
    assert store.get("resp_1", OWNER) is not None
    assert store.delete("resp_1", OWNER) is True
    assert store.get("resp_1", OWNER) is None
    assert store.delete("resp_1", OWNER) is False
    assert (store.statistics().items, store.statistics().bytes) == (0, 0)


def test_a_delete_is_not_counted_as_an_eviction_or_an_expiry() -> None:
    store = make()
    store.put("resp_1", OWNER, b"{}", [])
    store.delete("resp_1", OWNER)
    stats = store.statistics()
    assert (stats.stored, stats.evicted, stats.expired, stats.too_large) == (1, 0, 0, 0)


# --- reconfigure -----------------------------------------------------------------------------


def test_lowering_max_items_shrinks_at_once_least_recently_used_first() -> None:
    store = make(max_items=5)
    for n in range(1, 6):
        store.put(f"resp_{n}", OWNER, b"{}", [])
    store.get("resp_1", OWNER)
    store.reconfigure(max_items=2, max_bytes=10**6, ttl=60.0)
    stats = store.statistics()
    assert (stats.items, stats.max_items, stats.evicted) == (2, 2, 3)
    assert held(store, "resp_1", "resp_2", "resp_3", "resp_4", "resp_5") == ["resp_1", "resp_5"]


def test_lowering_max_bytes_drops_an_entry_too_large_alone_before_the_lru_order() -> None:
    """A large entry no longer allowed goes, not every smaller one used before it."""
    store = make(max_bytes=1000)
    store.put("resp_old", OWNER, b"x" * 98, [])  # 100 bytes
    store.put("resp_big", OWNER, b"x" * 498, [])  # 500 bytes
    store.put("resp_new", OWNER, b"x" * 98, [])
    store.reconfigure(max_items=100, max_bytes=400, ttl=60.0)
    assert held(store, "resp_old", "resp_big", "resp_new") == ["resp_old", "resp_new"]
    stats = store.statistics()
    assert (stats.bytes, stats.max_bytes, stats.evicted) == (200, 400, 1)


def test_lowering_max_bytes_evicts_until_the_bytes_fit() -> None:
    store = make(max_bytes=1000)
    for n in range(1, 6):
        store.put(f"resp_{n}", OWNER, b"x" * 98, [])  # 100 bytes each
    store.reconfigure(max_items=100, max_bytes=250, ttl=60.0)
    assert held(store, *(f"resp_{n}" for n in range(1, 6))) == ["resp_4", "resp_5"]
    assert store.statistics().evicted == 3


def test_a_shorter_ttl_applies_to_the_responses_held() -> None:
    clock = FakeClock()
    store = make(clock, ttl=60.0)
    store.put("resp_1", OWNER, b"{}", [])
    clock.advance(20.0)
    store.put("resp_2", OWNER, b"{}", [])
    clock.advance(15.0)
    store.reconfigure(max_items=100, max_bytes=10**6, ttl=30.0)  # resp_1 is 35 s old
    stats = store.statistics()
    assert (stats.items, stats.ttl, stats.expired, stats.evicted) == (1, 30.0, 1, 0)
    clock.advance(14.999)
    assert store.get("resp_2", OWNER) is not None
    clock.advance(0.001)
    assert store.get("resp_2", OWNER) is None


def test_raising_the_bounds_keeps_everything() -> None:
    store = make(max_items=2)
    store.put("resp_1", OWNER, b"{}", [])
    store.put("resp_2", OWNER, b"{}", [])
    store.reconfigure(max_items=3, max_bytes=10**7, ttl=120.0)
    store.put("resp_3", OWNER, b"{}", [])
    assert held(store, "resp_1", "resp_2", "resp_3") == ["resp_1", "resp_2", "resp_3"]
    assert store.statistics().evicted == 0


# --- statistics ------------------------------------------------------------------------------


def test_statistics_is_a_frozen_snapshot_of_the_store() -> None:
    clock = FakeClock()
    store = make(clock, max_items=2, max_bytes=1000, ttl=30.0)
    before = store.statistics()
    assert before == ResponsesStoreStatistics(
        items=0,
        bytes=0,
        max_items=2,
        max_bytes=1000,
        ttl=30.0,
        stored=0,
        evicted=0,
        expired=0,
        too_large=0,
    )
    for n in range(3):
        store.put(f"resp_{n}", OWNER, b"x" * 8, [])
    store.put("resp_big", OWNER, b"x" * 1000, [])
    clock.advance(30.0)
    store.get("resp_2", OWNER)
    assert store.statistics() == dataclasses.replace(
        before, items=1, bytes=10, stored=3, evicted=1, expired=1, too_large=1
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        before.items = 5  # type: ignore[misc]
    assert before.items == 0


def test_statistics_sweeps_nothing() -> None:
    """An expired entry still holds its memory until it is swept: the figures say so."""
    clock = FakeClock()
    store = make(clock, ttl=1.0)
    store.put("resp_1", OWNER, b"{}", [])
    clock.advance(5.0)
    assert (store.statistics().items, store.statistics().expired) == (1, 0)
    assert len(store) == 1
