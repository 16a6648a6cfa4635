"""The seam a remote node plugs into (issue 29, design §1): ``AdapterSet``, a local node's
executors, is an ``ExecutorSet`` — mypy checks the assignment below, and the test the members'
kinds, so that ``NodeAdapters`` can hold local and remote nodes alike."""

from __future__ import annotations

import inspect

from iop_edge.adapters.base import ExecutorSet
from iop_edge.adapters.registry import AdapterSet


def local_set(adapters: AdapterSet) -> ExecutorSet:
    return adapters  # (mypy: an AdapterSet is an ExecutorSet)


def test_an_adapter_set_has_every_member_of_the_seam_with_its_kind():
    members = {
        name: member
        for name, member in vars(ExecutorSet).items()
        if not name.startswith("_") and callable(member)
    }
    assert set(members) == {"for_provider", "for_adapter", "probe", "statistics", "aclose"}
    for name, member in members.items():
        implemented = getattr(AdapterSet, name)
        assert inspect.iscoroutinefunction(implemented) == inspect.iscoroutinefunction(member)
        assert list(inspect.signature(implemented).parameters) == list(
            inspect.signature(member).parameters
        )
    assert "node_id" in ExecutorSet.__annotations__
