"""Live reload end to end: a real daemon watching a real temp directory (SPEC §4, issue 6)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from iop_edge.config import parse_config
from iop_edge.daemon import Daemon
from iop_edge.supervisor import RefreshRecord, Supervisor, SupervisorOptions
from iop_edge.testing.fake_behavior import FakeBehavior
from iop_edge.testing.fake_openai import FakeOpenAI
from tests.api.conftest import wait_for


def doc_for(fake: FakeOpenAI | None = None, *, capacity: int = 2, **root: Any) -> dict[str, Any]:
    """A config with the echo model (cat) and, with a fake, the model ``chat`` on it."""
    adapters: list[dict[str, Any]] = [{"name": "shell", "type": "cli", "command": "cat"}]
    providers: list[dict[str, Any]] = [
        {
            "id": "cat",
            "type": "cli",
            "category": "cli",
            "adapter": "shell",
            "models": ["echo"],
            "capacity": capacity,
        },
    ]
    models: list[dict[str, Any]] = [
        {"id": "echo", "context_window_tokens": 4096, "providers": ["cat"]}
    ]
    if fake is not None:
        adapters.append({"name": "oa", "type": "openai_compat", "base_url": fake.base_url})
        providers.append(
            {
                "id": "up",
                "type": "openai_compat",
                "category": "api",
                "adapter": "oa",
                "models": ["fake-model"],
                "capacity": capacity,
            }
        )
        models.append({"id": "chat", "context_window_tokens": 4096, "providers": ["up"]})
    doc = {
        "openai": {"listen": "127.0.0.1:0"},
        "metrics": {"listen": "127.0.0.1:0"},
        "console": {"listen": "127.0.0.1:0"},
        "provider_pool": {"max_queue": 8, "queue_timeout_ms": 30000},
        "models": models,
        "nodes": [{"id": "local", "adapters": adapters, "providers": providers}],
    }
    doc.update(root)
    return doc


def dump(doc: dict[str, Any]) -> str:
    return yaml.safe_dump(doc, sort_keys=False)


class Edge:
    """A running daemon on a config file, with every finished refresh queued for the test."""

    def __init__(self, daemon: Daemon, path: Path) -> None:
        self.daemon = daemon
        self.path = path
        self.records: asyncio.Queue[RefreshRecord] = asyncio.Queue()
        assert daemon.supervisor is not None
        daemon.supervisor._listeners.append(self.records.put_nowait)

    @property
    def supervisor(self) -> Supervisor:
        assert self.daemon.supervisor is not None
        return self.daemon.supervisor

    async def next_record(self) -> RefreshRecord:
        return await asyncio.wait_for(self.records.get(), timeout=15)

    def capacity(self, provider: str = "cat") -> int:
        stats = self.daemon.scheduler.statistics()
        return next(p.capacity for p in stats.providers if p.provider_id == provider)

    async def metrics(self) -> dict[str, float]:
        async with aiohttp.ClientSession() as session, session.get(self.daemon.metrics_url) as r:
            text = await r.text()
        return {
            f"{s.name}{sorted(s.labels.items())}" if s.labels else s.name: s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }


@contextlib.asynccontextmanager
async def edge_on(tmp_path: Path, doc: dict[str, Any], **options: Any) -> AsyncIterator[Edge]:
    path = tmp_path / "edge.yaml"
    path.write_text(dump(doc))
    daemon = Daemon(
        parse_config(yaml.safe_load(path.read_text())),
        config_path=path,
        supervisor_options=SupervisorOptions(debounce=0.05, settle=0.3, poll_interval=3600),
        **options,
    )
    await daemon.start()
    try:
        yield Edge(daemon, path)
    finally:
        await daemon.stop()


def rename_save(path: Path, text: str) -> None:
    tmp = path.with_name(".edge.yaml.swp")
    tmp.write_text(text)
    os.replace(tmp, path)


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
        config_path=path,
        supervisor_options=SupervisorOptions(debounce=0.05, settle=0.3, poll_interval=3600),
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


async def test_a_half_written_file_is_never_applied(tmp_path):
    async with edge_on(tmp_path, doc_for()) as edge:
        text = dump(doc_for(capacity=6))
        with open(edge.path, "w") as handle:
            handle.write(text[: len(text) // 2])  # the editor is still writing
            handle.flush()
            await asyncio.sleep(0.1)  # the watcher sees a broken file ...
            handle.write(text[len(text) // 2 :])  # ... which is complete before it settles
        record = await edge.next_record()
        assert record.result.result == "applied"
        assert edge.capacity() == 6
        assert edge.supervisor.last_success_at == record.at


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


async def test_the_admin_api_and_the_cli_report_the_same_refresh(tmp_path):
    async with edge_on(tmp_path, doc_for()) as edge:
        edge.path.write_text(dump(doc_for(capacity=5, logging={"level": "debug"})))
        console = edge.daemon.console_url
        async with aiohttp.ClientSession() as session:
            async with session.post(console + "/admin/config/refresh?mode=dry_run") as r:
                dry = await r.json()
            assert (dry["mode"], dry["result"]) == ("dry_run", "restart_required")
            assert edge.capacity() == 2  # a dry run applies nothing
            async with session.post(console + "/admin/config/refresh?mode=bogus") as r:
                assert (await r.json())["result"] == "rejected"
        cli = await asyncio.create_subprocess_exec(
            str(Path(sys.executable).with_name("iop-edge")),
            "config",
            "refresh",
            "--apply",
            "--console",
            console,
            "--json",
            stdout=asyncio.subprocess.PIPE,
        )
        out, _ = await cli.communicate()
        assert cli.returncode == 3
        applied = json.loads(out)
        assert (applied["mode"], applied["result"]) == ("apply", "restart_required")
        assert edge.capacity() == 5
        async with aiohttp.ClientSession() as session, session.get(console + "/admin/status") as r:
            status = await r.json()
        assert status["config"]["hash"] == edge.supervisor.running_hash
        assert [p["path"] for p in status["config"]["restart_pending"]] == ["logging.level"]
        assert status["config"]["last_refresh"]["trigger"] == "api"
        (cat,) = status["providers"]
        assert (cat["node"], cat["id"], cat["status"], cat["capacity"]) == (
            "local",
            "cat",
            "active",
            5,
        )


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


async def test_metrics_parse_and_have_every_metric_of_the_spec(tmp_path):
    async with FakeOpenAI() as fake, edge_on(tmp_path, doc_for(fake)) as edge:
        async with openai.AsyncOpenAI(
            base_url=edge.daemon.openai_url, api_key="x", max_retries=0
        ) as client:
            await client.chat.completions.create(
                model="chat", messages=[{"role": "user", "content": "count these words"}]
            )
            stream = await client.chat.completions.create(
                model="chat", messages=[{"role": "user", "content": "hi"}], stream=True
            )
            async for _ in stream:
                pass
            with pytest.raises(openai.NotFoundError):
                await client.chat.completions.create(
                    model="nope", messages=[{"role": "user", "content": "x"}]
                )
        fake.enqueue(FakeBehavior(status=500))
        async with openai.AsyncOpenAI(
            base_url=edge.daemon.openai_url, api_key="x", max_retries=0
        ) as client:
            with pytest.raises(openai.InternalServerError):
                await client.chat.completions.create(
                    model="chat", messages=[{"role": "user", "content": "x"}]
                )
        async with aiohttp.ClientSession() as session, session.get(edge.daemon.metrics_url) as r:
            text = await r.text()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    expected = {
        "iop_edge_requests": "counter",
        "iop_edge_request_duration_seconds": "histogram",
        "iop_edge_time_to_first_token_seconds": "histogram",
        "iop_edge_queue_depth": "gauge",
        "iop_edge_queue_wait_seconds": "histogram",
        "iop_edge_admission_rejected": "counter",
        "iop_edge_provider_in_flight": "gauge",
        "iop_edge_provider_capacity": "gauge",
        "iop_edge_provider_enabled": "gauge",
        "iop_edge_upstream_errors": "counter",
        "iop_edge_tokens": "counter",
        "iop_edge_config_info": "gauge",
        "iop_edge_config_last_reload_successful": "gauge",
        "iop_edge_config_last_reload_success_timestamp_seconds": "gauge",
        "iop_edge_config_reloads": "counter",
        "iop_edge_config_restart_pending": "gauge",
    }
    assert {name: families[name].type for name in expected} == expected
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in families.values()
        for s in family.samples
    }

    def requests(model: str, code: str) -> float:
        labels = (("code", code), ("model", model), ("token_ref", "anonymous"))
        return samples[("iop_edge_requests_total", labels)]

    assert requests("chat", "ok") == 2
    assert requests("(unknown)", "model_not_found") == 1  # an unknown id is never a label
    assert requests("chat", "upstream_error") == 1
    assert (
        samples[
            (
                "iop_edge_upstream_errors_total",
                (("kind", "http_500"), ("node", "local"), ("provider", "up")),
            )
        ]
        == 1
    )
    assert (
        samples[
            (
                "iop_edge_tokens_total",
                (("direction", "prompt"), ("model", "chat"), ("token_ref", "anonymous")),
            )
        ]
        >= 3
    )
    assert (
        samples[
            (
                "iop_edge_provider_capacity",
                (("kind", "general"), ("node", "local"), ("provider", "up")),
            )
        ]
        == 2
    )
    assert samples[("iop_edge_provider_enabled", (("node", "local"), ("provider", "up")))] == 1
    assert samples[("iop_edge_request_duration_seconds_count", (("model", "chat"),))] == 3
