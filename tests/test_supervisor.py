"""Live reload end to end: a real daemon watching a real temp directory (SPEC §4, issue 6)."""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

import aiohttp
import openai
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from iop_edge.config import parse_config
from iop_edge.config.refresh import config_hash
from iop_edge.daemon import Daemon
from iop_edge.options import ServeOptions
from iop_edge.supervisor import RefreshRecord, SupervisorOptions
from iop_edge.testing.fake_behavior import FakeBehavior
from iop_edge.testing.fake_openai import FakeOpenAI
from tests.helpers import Edge, doc_for, dump, edge_on, rename_save, wait_for


def in_place_write(path: Path, text: str) -> None:
    with open(path, "w") as handle:  # truncate, then write: what many tools do
        handle.write(text)


def sed_in_place(path: Path, text: str) -> None:
    old = path.read_text()
    assert "capacity: 2" in old
    subprocess.run(["sed", "-i", "s/capacity: 2/capacity: 5/", str(path)], check=True)
    assert path.read_text() == text


def delete_and_recreate(path: Path, text: str) -> None:
    path.unlink()
    path.write_text(text)


SAVES = {
    "rename": rename_save,
    "in_place": in_place_write,
    "sed_i": sed_in_place,
    "delete_recreate": delete_and_recreate,
}


@pytest.mark.parametrize("save", list(SAVES), ids=list(SAVES))
async def test_each_editor_save_style_is_applied_exactly_once(tmp_path, save):
    async with edge_on(tmp_path, doc_for()) as edge:
        SAVES[save](edge.path, dump(doc_for(capacity=5)))
        record = await edge.next_record()
        assert (record.trigger, record.result.result) == ("file", "applied")
        assert [e.path for e in record.result.report] == [
            "nodes[local].providers[cat].capacity",
            "nodes[local].providers[cat].long_context_capacity",
        ]
        assert edge.capacity() == 5
        # an explicit refresh afterwards is the only other record: the save was taken once
        await edge.supervisor.refresh("api")
        assert (await edge.next_record()).trigger == "api"
        assert edge.records.empty()
        assert edge.supervisor.generation == 2


async def test_a_kubernetes_configmap_symlink_swap_is_seen(tmp_path):
    config_dir = tmp_path / "cm"
    config_dir.mkdir()
    first = config_dir / "..2026_11_30_a"
    first.mkdir()
    (first / "edge.yaml").write_text(dump(doc_for()))
    (config_dir / "..data").symlink_to(first.name)
    path = config_dir / "edge.yaml"
    path.symlink_to("..data/edge.yaml")
    daemon = Daemon(
        parse_config(yaml.safe_load(path.read_text())),
        ServeOptions(
            config_path=path,
            supervisor_options=SupervisorOptions(debounce=0.05, settle=0.3, poll_interval=3600),
        ),
    )
    await daemon.start()
    try:
        edge = Edge(daemon, path)
        second = config_dir / "..2026_11_30_b"
        second.mkdir()
        (second / "edge.yaml").write_text(dump(doc_for(capacity=7)))
        (config_dir / "..data_tmp").symlink_to(second.name)
        os.replace(config_dir / "..data_tmp", config_dir / "..data")  # the atomic swap
        record = await edge.next_record()
        assert (record.trigger, record.result.result) == ("file", "applied")
        assert edge.capacity() == 7
    finally:
        await daemon.stop()


async def test_valid_then_invalid_then_valid_keeps_serving_and_reports_each_step(tmp_path):
    async with (
        edge_on(tmp_path, doc_for()) as edge,
        openai.AsyncOpenAI(base_url=edge.daemon.openai_url, api_key="x", max_retries=0) as client,
    ):

        async def served() -> str:
            reply = await client.chat.completions.create(
                model="echo", messages=[{"role": "user", "content": "ping"}]
            )
            content = reply.choices[0].message.content
            assert content is not None
            return content.strip()

        rename_save(edge.path, dump(doc_for(capacity=3)))
        assert (await edge.next_record()).result.result == "applied"
        assert await served() == "ping"
        metrics = await edge.metrics()
        assert metrics["iop_edge_config_last_reload_successful"] == 1

        bad = doc_for(capacity=3)
        bad["nodes"][0]["providers"][0]["priority"] = -1
        rename_save(edge.path, dump(bad))
        record = await edge.next_record()
        assert record.result.result == "rejected"
        assert [(e.path, e.message) for e in record.result.errors] == [
            ("nodes[local].providers[cat].priority", "-1 is negative; priority must be >= 0")
        ]
        assert edge.capacity() == 3  # the running config stays
        assert await served() == "ping"
        metrics = await edge.metrics()
        assert metrics["iop_edge_config_last_reload_successful"] == 0
        rejected = "iop_edge_config_reloads_total[('result', 'rejected'), ('trigger', 'file')]"
        assert metrics[rejected] == 1

        rename_save(edge.path, dump(doc_for(capacity=4)))
        assert (await edge.next_record()).result.result == "applied"
        assert edge.capacity() == 4
        assert await served() == "ping"
        metrics = await edge.metrics()
        assert metrics["iop_edge_config_last_reload_successful"] == 1
        applied = "iop_edge_config_reloads_total[('result', 'applied'), ('trigger', 'file')]"
        assert metrics[applied] == 2


# A half-written file: tests/test_config_watch.py (a writer holding the file open between its
# parts) and tests/test_supervisor_hardening.py (two opens, within the settle window) drive the
# waits by hand, so no real time decides the outcome.


async def test_mixed_live_and_restart_then_revert_clears_restart_pending(tmp_path):
    async with edge_on(tmp_path, doc_for()) as edge:
        mixed = doc_for(capacity=3, logging={"level": "debug"})
        rename_save(edge.path, dump(mixed))
        record = await edge.next_record()
        assert record.result.result == "restart_required"
        assert edge.capacity() == 3
        assert [e.path for e in edge.supervisor.restart_pending] == ["logging.level"]
        assert (await edge.metrics())["iop_edge_config_restart_pending"] == 1

        rename_save(edge.path, dump(doc_for(capacity=3)))
        record = await edge.next_record()
        assert (record.result.result, record.result.report) == ("applied", [])
        assert edge.supervisor.restart_pending == []
        assert (await edge.metrics())["iop_edge_config_restart_pending"] == 0


async def test_a_burst_of_signals_and_saves_coalesces_and_ends_on_the_last_file(tmp_path):
    async with edge_on(tmp_path, doc_for()) as edge:
        for capacity in range(3, 9):
            rename_save(edge.path, dump(doc_for(capacity=capacity)))
            edge.supervisor.request("signal")
        records = [await edge.next_record()]
        while edge.capacity() != 8:
            records.append(await edge.next_record())
        assert len(records) < 12  # coalesced: far fewer runs than triggers
        assert edge.supervisor.runs == len(records)
        assert all(r.result.result == "applied" for r in records)


async def test_concurrent_api_refreshes_are_serialized(tmp_path):
    async with edge_on(tmp_path, doc_for()) as edge:
        rename_save(edge.path, dump(doc_for(capacity=5)))
        results = await asyncio.gather(*(edge.supervisor.refresh("api") for _ in range(5)))
        applied = [r for r in results if r.report]
        assert len(applied) == 1  # the first took the change; the rest found nothing new
        assert all(r.result == "applied" for r in results)
        assert edge.capacity() == 5
        assert edge.supervisor.generation == 2


async def test_raising_capacity_live_dispatches_waiting_requests_at_once(tmp_path):
    async with FakeOpenAI(behavior=FakeBehavior(hold=True)) as fake:
        async with (
            edge_on(tmp_path, doc_for(fake, capacity=1)) as edge,
            openai.AsyncOpenAI(
                base_url=edge.daemon.openai_url, api_key="x", max_retries=0
            ) as client,
        ):
            calls = [
                asyncio.create_task(
                    client.chat.completions.create(
                        model="chat", messages=[{"role": "user", "content": "hi"}]
                    )
                )
                for _ in range(3)
            ]
            await fake.wait_in_flight(1)
            await wait_for(lambda: edge.daemon.scheduler.statistics().queue_depth == 2)
            rename_save(edge.path, dump(doc_for(fake, capacity=3)))
            assert (await edge.next_record()).result.result == "applied"
            # the two queued requests were dispatched by the refresh itself
            assert edge.daemon.scheduler.statistics().queue_depth == 0
            await fake.wait_in_flight(3)
            fake.behavior = FakeBehavior()
            fake.release()
            replies = await asyncio.gather(*calls)
        assert len(replies) == 3


async def test_a_daemon_without_a_config_file_has_a_supervisor_that_finds_its_config_unchanged():
    """A daemon given its config without a file (embedded use, tests) has a supervisor all the
    same, on the config given (:class:`~iop_edge.config_source.FixedConfigSource`): its
    ``statistics()`` are readable (no path, no watch, generation 1, the running config's hash,
    which ``/metrics`` shows too); a SIGHUP and a refresh asked for answer as a refresh of an
    unchanged file does (``applied``, no change, the same hash and generation); and no console
    is bound, as before (its listen address would be taken without a file to find it by)."""
    config = parse_config(doc_for())
    daemon = Daemon(config)
    records: asyncio.Queue[RefreshRecord] = asyncio.Queue()
    daemon.supervisor.add_listener(records.put_nowait)
    await daemon.start()
    try:
        assert sorted(daemon.listeners) == ["metrics", "openai"]
        stats = daemon.supervisor.statistics()
        assert (stats.path, stats.watching, stats.generation, stats.last, stats.runs) == (
            None,
            False,
            1,
            None,
            0,
        )
        assert stats.running_hash == config_hash(config)

        daemon.supervisor.request("signal")  # what the daemon's SIGHUP handler does
        record = await asyncio.wait_for(records.get(), timeout=15)
        assert (record.trigger, record.result.result) == ("signal", "applied")
        assert (record.result.report, record.result.errors) == ([], [])
        assert record.result.config_hash == record.result.candidate_hash == stats.running_hash

        result = await daemon.supervisor.refresh("api")
        assert (result.result, result.report, result.config_hash) == (
            "applied",
            [],
            stats.running_hash,
        )
        after = daemon.supervisor.statistics()
        assert (after.generation, after.runs, after.reads) == (1, 2, 2)
        assert after.running_hash == stats.running_hash
        assert after.last is not None
        assert after.last.trigger == "api"
        assert daemon.supervisor.running is config

        async with aiohttp.ClientSession() as session, session.get(daemon.metrics_url) as r:
            text = await r.text()
        samples = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }
        assert samples[("iop_edge_config_info", (("hash", stats.running_hash),))] == 1
        assert samples[("iop_edge_config_last_reload_successful", ())] == 1
        for trigger in ("signal", "api"):
            key = (("result", "applied"), ("trigger", trigger))
            assert samples[("iop_edge_config_reloads_total", key)] == 1
    finally:
        await daemon.stop()
