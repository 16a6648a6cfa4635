"""The supervisor reads a config source (issue 26): watching is the source's job, refreshing
the supervisor's; each reload hashes its configs once; ``statistics()`` is a frozen snapshot
that renders ``/admin/status``'s config part.

The supervisor runs alone here, on a source the test feeds by hand (no file watch, no
timing), or on the fixed source of a config given without a file: every refresh is one the
test caused, and is awaited as an event.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
from pathlib import Path
from typing import Any

import pytest

import iop_edge.config.refresh as refresh_module
import iop_edge.supervisor as supervisor_module
from iop_edge.config import load_config, parse_config
from iop_edge.config.refresh import config_hash
from iop_edge.config.schema import EdgeConfig
from iop_edge.config_file import ConfigSnapshot
from iop_edge.config_source import GIVEN_CONFIG, FixedConfigSource
from iop_edge.errors import ConfigError, ConfigProblem
from iop_edge.runtime.logs import get_logger
from iop_edge.seams import ConfigSource
from iop_edge.supervisor import RefreshRecord, Supervisor, SupervisorStatistics
from tests.helpers import doc_for, dump
from tests.helpers.hand_source import HandSource


def start_with(path: Path, running: EdgeConfig, source: HandSource) -> Supervisor:
    """A supervisor on ``source`` (typed as the seam: nothing else of it is used)."""
    seam: ConfigSource = source
    supervisor = Supervisor(
        path, running, apply=lambda config: None, env={}, log=get_logger(), source=seam
    )
    supervisor.start()
    return supervisor


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "edge.yaml"


async def test_the_supervisor_refreshes_the_snapshots_its_source_yields(path: Path) -> None:
    """Each snapshot the source yields is refreshed under its own trigger and handed back as
    taken; a file snapshot holding the content taken last is not run again (a signal's is); a
    refresh the API asks for reads the source then; stop stops the source."""
    source = HandSource(path, dump(doc_for()))
    supervisor = start_with(path, parse_config(doc_for()), source)
    records: asyncio.Queue[RefreshRecord] = asyncio.Queue()
    supervisor.add_listener(records.put_nowait)
    try:
        assert (source.started, supervisor.watching) == (True, True)
        source.push(dump(doc_for(capacity=3)), "signal")
        record = await asyncio.wait_for(records.get(), timeout=15)
        assert (record.trigger, record.result.result) == ("signal", "applied")
        assert [e.path for e in record.result.report] == [
            "nodes[local].providers[cat].capacity",
            "nodes[local].providers[cat].long_context_capacity",
        ]
        assert [s.trigger for s in source.taken] == ["signal"]
        assert supervisor.statistics().generation == 2

        source.push(dump(doc_for(capacity=3)), "file")  # what was just taken: not run
        source.push(dump(doc_for(capacity=3)), "signal")  # a signal always is
        record = await asyncio.wait_for(records.get(), timeout=15)
        assert (record.trigger, record.result.result, record.result.report) == (
            "signal",
            "applied",
            [],
        )
        assert [s.trigger for s in source.taken] == ["signal", "signal"]

        source.content = dump(doc_for(capacity=4))
        result = await supervisor.refresh("api")
        assert result.result == "applied"
        assert (await asyncio.wait_for(records.get(), timeout=15)).trigger == "api"
        assert [s.trigger for s in source.taken] == ["signal", "signal", "api"]
        stats = supervisor.statistics()
        assert (stats.generation, stats.runs, stats.reads) == (3, 3, 1)
        assert stats.running_hash == config_hash(parse_config(doc_for(capacity=4)))

        supervisor.request("signal")  # what the daemon's SIGHUP handler does: the source's
        assert source.requested == ["signal"]
        assert supervisor.watch_statistics().backend == "hand"
    finally:
        await supervisor.stop()
    assert source.stopped


@pytest.fixture
def hashed(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every config :func:`config_hash` is computed for, by the refresh or the supervisor."""
    calls: list[Any] = []

    def counting(config: EdgeConfig) -> str:
        calls.append(config)
        return config_hash(config)

    monkeypatch.setattr(refresh_module, "config_hash", counting)
    monkeypatch.setattr(supervisor_module, "config_hash", counting)
    return calls


async def test_a_reload_hashes_each_config_once_and_never_the_running_one_again(
    path: Path, hashed: list[Any]
) -> None:
    """A reload that applies a live change hashes the candidate and the config to run after
    it, once each; the running config's hash is known and not computed again, and the
    supervisor takes the new one from the result. A reload with nothing to apply hashes the
    candidate alone."""
    running = parse_config(doc_for())
    source = HandSource(path, dump(doc_for(capacity=3)))
    supervisor = start_with(path, running, source)
    try:
        hashed.clear()  # (the start hashed the running config: once per process)
        result = await supervisor.refresh("api")
        assert result.result == "applied"
        assert len(hashed) == 2
        assert all(config is not running for config in hashed)
        assert supervisor.running is hashed[0]  # the config after the refresh, ...
        assert supervisor.running_hash == result.config_hash == config_hash(supervisor.running)
        assert result.candidate_hash == config_hash(hashed[1])  # ... then the candidate

        hashed.clear()
        again = await supervisor.refresh("api")  # the same file: nothing changes
        assert (again.result, again.report) == ("applied", [])
        assert len(hashed) == 1
        assert again.config_hash == supervisor.running_hash
    finally:
        await supervisor.stop()


def test_a_snapshot_carries_its_trigger_and_the_digest_made_with_it() -> None:
    """The digest is the content's (the path and the trigger aside), fixed when the snapshot
    is made; an unreadable file's is its problem."""
    snapshot = ConfigSnapshot("edge.yaml", b"models: []\n", None, "signal")
    assert snapshot.trigger == "signal"
    assert snapshot.digest == hashlib.sha256(b"models: []\n").hexdigest()
    assert snapshot.digest == ConfigSnapshot("other", b"models: []\n", None).digest
    assert "digest" not in repr(snapshot)
    with pytest.raises(dataclasses.FrozenInstanceError):
        snapshot.digest = "x"  # type: ignore[misc]
    error = ConfigError([ConfigProblem("", "cannot read config edge.yaml: it is a FIFO")])
    unreadable = ConfigSnapshot("edge.yaml", None, error)
    assert (unreadable.trigger, unreadable.digest) == ("file", f"unreadable: {error}")


async def test_statistics_is_a_frozen_snapshot_that_renders_the_status(path: Path) -> None:
    """``statistics()`` is read once and does not change under the reader; ``as_status()`` is
    the config part of ``/admin/status``, key for key."""
    source = HandSource(path, dump(doc_for(capacity=3)))
    supervisor = start_with(path, parse_config(doc_for()), source)
    try:
        before = supervisor.statistics()
        assert isinstance(before, SupervisorStatistics)
        with pytest.raises(dataclasses.FrozenInstanceError):
            before.generation = 5  # type: ignore[misc]
        await supervisor.refresh("api")
        after = supervisor.statistics()
        assert (before.generation, before.last, after.generation) == (1, None, 2)
        assert after.as_status() == {
            "path": str(path),
            "watch": True,
            "hash": supervisor.running_hash,
            "generation": 2,
            "loaded_at": supervisor.loaded_at,
            "restart_pending": [],
            "last_refresh": supervisor.last.to_json() if supervisor.last else None,
            "last_success_at": supervisor.last_success_at,
        }
        assert after.as_status()["last_refresh"]["trigger"] == "api"
        assert after.status_line() == supervisor_module.status_line(supervisor)
        assert after.status_line().startswith(f"serving config {after.running_hash[:12]}")
    finally:
        await supervisor.stop()


async def test_without_a_file_the_source_is_the_config_given_and_a_refresh_finds_it_unchanged(
    hashed: list[Any],
) -> None:
    """A supervisor without a config file (``path`` None) reads a ``FixedConfigSource``: no
    watch, no path, and every read yields the running config's own snapshot — its effective
    config as YAML, which loads back to the same config even where a value holds a ``$`` or
    came from the environment. So a refresh (asked for, or a SIGHUP's) answers as a refresh of
    an unchanged file does: ``applied``, no change, errors or restart pending, the same hash
    and generation, and the running config is still the one given."""
    doc = doc_for()
    doc["models"][0]["display_name"] = "costs $$5, not $${PRICE}: ${WHO}"
    running = parse_config(doc, env={"WHO": "team-a"})
    assert running.models[0].display_name == "costs $5, not ${PRICE}: team-a"
    supervisor = Supervisor(None, running, apply=lambda config: None, env={}, log=get_logger())
    records: asyncio.Queue[RefreshRecord] = asyncio.Queue()
    supervisor.add_listener(records.put_nowait)
    supervisor.start()
    try:
        assert (supervisor.watching, supervisor.watch_statistics().backend) == (False, "")
        running_hash = supervisor.running_hash
        hashed.clear()
        result = await supervisor.refresh("api")
        assert (result.result, result.report, result.errors) == ("applied", [], [])
        assert result.config_hash == result.candidate_hash == running_hash
        assert len(hashed) == 1  # the candidate alone: nothing was applied

        supervisor.request("signal")  # what the daemon's SIGHUP handler does
        supervisor.request("signal")  # coalesced with the one before
        assert (await asyncio.wait_for(records.get(), timeout=15)).trigger == "api"
        record = await asyncio.wait_for(records.get(), timeout=15)
        assert (record.trigger, record.result.result, record.result.report) == (
            "signal",
            "applied",
            [],
        )
        stats = supervisor.statistics()
        assert (stats.path, stats.watching, stats.generation, stats.runs, stats.reads) == (
            None,
            False,
            1,
            2,
            2,
        )
        assert (stats.running_hash, stats.restart_pending) == (running_hash, ())
        assert supervisor.running is running
        assert records.empty()
        assert repr(supervisor).startswith("<Supervisor without a config file serving config ")
    finally:
        await supervisor.stop()


async def test_a_fixed_source_yields_the_config_it_holds_as_a_file_would() -> None:
    """Each read is the same content (one digest), under the trigger that asked, and loads to
    the config held; the source never watches, whatever ``start`` is asked."""
    config = parse_config(doc_for(capacity=3))
    source = FixedConfigSource(config)
    seam: ConfigSource = source
    seam.start(watch=True)
    first, second = await seam.read("api"), await seam.read("signal")
    assert (first.path, first.trigger, second.trigger) == (GIVEN_CONFIG, "api", "signal")
    assert first.digest == second.digest
    assert seam.unchanged(first)
    assert load_config(first.text()) == config
    assert (seam.path, seam.watching, seam.reads) == (None, False, 2)
    seam.request("file")
    seam.request("signal")  # outranks the file event it coalesces with
    snapshot = await asyncio.wait_for(anext(aiter(seam)), timeout=15)
    assert (snapshot.trigger, snapshot.digest) == ("signal", first.digest)
    await seam.stop()
