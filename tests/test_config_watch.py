"""The config watcher (issue 25 item 1; :mod:`iop_edge.config_watch`): a file written in place
is judged only once its writer closes it, and only the names that can change what the config
path resolves to count.

A real daemon watches a real temp directory with inotify; every test looks only at public
views (the refresh records, ``Supervisor.runs`` / ``reads`` / ``watch_statistics()``, the log,
the OpenAI surface). The writer is the test itself, holding the file open between two writes
for as long as it likes, so no outcome depends on timing: the settle window is ``sleep(0)``,
and the ``settle_limit`` bound on a held-open file is a wait the test releases by hand (or
never: then only the writer's close can end it).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest

from iop_edge.config import parse_config
from iop_edge.config.refresh import refresh
from iop_edge.config_watch import watched_names
from iop_edge.daemon import Daemon
from iop_edge.options import ServeOptions
from iop_edge.runtime.logs import flush_logs
from iop_edge.supervisor import SupervisorOptions
from tests.helpers import Edge, doc_for, dump, rename_save, wait_for

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify: Linux")

LIMIT = 10.0
"""``settle_limit`` in these tests: the bound on a file held open for writing."""


class BoundSleep:
    """The supervisor's sleep seam: the settle window passes at once (``sleep(0)``), and a
    wait of ``LIMIT`` (the bound on a writer's close) lasts until the test calls
    :meth:`release` — or for ever, if it never does: then only the close ends it."""

    def __init__(self) -> None:
        self.calls: list[float] = []
        self.waiting = 0  # bound waits now pending
        self._gate = asyncio.Event()

    async def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)
        if seconds < LIMIT:
            await asyncio.sleep(0)
            return
        self.waiting += 1
        try:
            await self._gate.wait()
            self._gate.clear()
        finally:
            self.waiting -= 1

    def release(self) -> None:
        self._gate.set()


def edge_doc(*extra_models: str, capacity: int = 2) -> dict[str, Any]:
    """:func:`tests.helpers.doc_for` plus ``extra_models`` (each served by ``cat``), with
    ``models`` written last: a file cut after one model entry is still a valid config."""
    doc = doc_for(capacity=capacity)
    models = doc.pop("models")
    models += [{"id": m, "context_window_tokens": 4096, "providers": ["cat"]} for m in extra_models]
    doc["models"] = models
    return doc


@contextlib.asynccontextmanager
async def watched(
    path: Path, doc: dict[str, Any], sleep: BoundSleep | None = None, **options: Any
) -> AsyncIterator[Edge]:
    """A daemon on the config file at ``path`` (written from ``doc`` unless it exists), its
    directory watched; once the watch's first look at the file is over (so every later read
    comes from what the test does)."""
    if not path.exists():
        path.write_text(dump(doc))
    options = {"settle": 0.0, "settle_limit": LIMIT, "poll_interval": 3600, **options}
    daemon = Daemon(
        parse_config(doc),
        ServeOptions(
            config_path=path,
            supervisor_options=SupervisorOptions(sleep=sleep or BoundSleep(), **options),
        ),
    )
    await daemon.start()
    try:
        edge = Edge(daemon, path)
        await wait_for(lambda: edge.supervisor.reads == 1)
        yield edge
    finally:
        await daemon.stop()


def events(log: io.StringIO, name: str) -> list[dict[str, Any]]:
    flush_logs()
    lines = (json.loads(line) for line in log.getvalue().splitlines())
    return [line for line in lines if line["event"] == name]


async def models(edge: Edge) -> list[str]:
    async with openai.AsyncOpenAI(
        base_url=edge.daemon.openai_url, api_key="x", max_retries=0
    ) as client:
        return sorted([m.id async for m in client.models.list()])


async def ask(edge: Edge, model: str) -> str:
    async with openai.AsyncOpenAI(
        base_url=edge.daemon.openai_url, api_key="x", max_retries=0
    ) as client:
        reply = await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "ping"}]
        )
    return (reply.choices[0].message.content or "").strip()


# --- a file held open for writing ------------------------------------------------------------


async def test_a_save_in_two_parts_held_open_is_never_applied_half_written(tmp_path):
    """Issue 25 item 1: an in-place save whose writer holds the file open between its two
    parts (0.6 s apart in the field; here as long as the test likes), the first part being a
    valid config that drops the model ``second``. Nothing is judged while the file is open —
    no refresh result for the half file, no settle window, only the ``settle_limit`` bound
    waiting — and ``second`` answers throughout; after the close, one refresh applies the
    whole file. Before, the settle window ran out between the parts, the half file was
    applied, and ``second`` answered 404 until the second part came."""
    sleep = BoundSleep()
    before = edge_doc("second")
    complete = dump(edge_doc("second", "third"))
    first_part = complete[: complete.index("\n- id: second") + 1]
    alone = refresh(parse_config(before), first_part, mode="dry_run").result
    assert (alone.result, [e.path for e in alone.report]) == ("applied", ["models[second]"])

    async with watched(tmp_path / "edge.yaml", before, sleep) as edge:
        assert edge.supervisor.watch_statistics().backend == "inotify"
        with open(edge.path, "w") as handle:  # truncate, then write in two parts
            handle.write(first_part)
            handle.flush()
            # the worker waits for the close (or a refresh of the half file came: the defect)
            await wait_for(lambda: sleep.waiting == 1 or not edge.records.empty())
            assert edge.records.empty()
            assert edge.supervisor.watch_statistics().open_for_writing == ("edge.yaml",)
            assert sleep.calls == [LIMIT]  # no settle window: only the bound on the close
            assert await models(edge) == ["echo", "second"]
            assert await ask(edge, "second") == "ping"
            assert edge.supervisor.runs == 0
            handle.write(complete[len(first_part) :])
        record = await edge.next_record()
        assert (record.trigger, record.result.result) == ("file", "applied")
        assert [e.path for e in record.result.report] == ["models[third]"]
        assert await models(edge) == ["echo", "second", "third"]
        assert await ask(edge, "third") == "ping"
        assert edge.supervisor.watch_statistics().open_for_writing == ()
        # the close ended the bound's wait; then the settle window ran, once
        assert (sleep.waiting, sleep.calls) == (0, [LIMIT, 0.0])
        await edge.supervisor.refresh("api")  # the only other record: the file was taken once
        assert (await edge.next_record()).trigger == "api"
        assert edge.records.empty()
        assert edge.supervisor.runs == 2
        assert edge.daemon.scheduler.statistics().rejected_total == 0  # no 404 for `second`


async def test_a_file_held_open_past_the_settle_limit_is_rejected_unread(tmp_path, log_stream):
    """Issue 25 item 1: a writer that never closes the file within ``settle_limit`` gets it
    rejected without being loaded (the classifier never runs), naming the cause; the periodic
    check leaves the file alone while it is open; once the writer closes it, it is judged
    and applied."""
    sleep = BoundSleep()
    calls = []

    def classify(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs.get("mode"))
        return refresh(*args, **kwargs)

    async with watched(tmp_path / "edge.yaml", edge_doc(), sleep, classify=classify) as edge:
        with open(edge.path, "w") as handle:
            handle.write(dump(edge_doc(capacity=3)))
            handle.flush()
            await wait_for(lambda: sleep.waiting == 1)
            sleep.release()  # settle_limit has passed, the file still open
            record = await edge.next_record()
            assert (record.trigger, record.result.result) == ("file", "rejected")
            assert [(e.path, e.message) for e in record.result.errors] == [
                (
                    "",
                    f"{edge.path}: the file was still open for writing {LIMIT:g} s after it "
                    "changed (its writer never closed it), so it was not loaded; it is judged "
                    "once its writer closes it",
                )
            ]
            assert calls == []
            assert edge.capacity() == 2
        record = await edge.next_record()  # closed: judged now
        assert (record.trigger, record.result.result) == ("file", "applied")
        assert edge.capacity() == 3
        assert calls == ["apply"]
    [rejected, applied] = events(log_stream, "config_refresh")
    assert (rejected["level"], applied["level"]) == ("warning", "info")


async def test_a_sighup_does_not_wait_behind_a_file_being_written(tmp_path):
    """A SIGHUP while the supervisor waits for a writer's close is served at once (the
    operator asked: its refresh reads the file as it is), and the close then finds nothing
    new. Without this, the signal waited behind the file for up to ``settle_limit``."""
    sleep = BoundSleep()
    async with watched(tmp_path / "edge.yaml", edge_doc(), sleep) as edge:
        with open(edge.path, "w") as handle:
            handle.write(dump(edge_doc(capacity=3)))
            handle.flush()
            await wait_for(lambda: sleep.waiting == 1)
            edge.supervisor.request("signal")  # what the daemon's SIGHUP handler does
            record = await edge.next_record()
            assert (record.trigger, record.result.result) == ("signal", "applied")
            assert edge.capacity() == 3
            await wait_for(lambda: sleep.waiting == 0)  # the wait for the close gave way
        await edge.supervisor.refresh("api")
        assert (await edge.next_record()).trigger == "api"
        assert edge.records.empty()
        assert edge.supervisor.runs == 2


# --- which names count -------------------------------------------------------------------


async def test_writes_to_other_files_in_the_directory_trigger_no_read(tmp_path):
    """Issue 25 item 1: a log file written beside the config (appended, truncated, rotated
    by rename), a temp file created and deleted: no read of the config, no refresh. A save of
    the config after them is read exactly twice (the settle window's two reads) and applied
    once. Before, every event in the directory made the supervisor read the config."""
    async with watched(tmp_path / "edge.yaml", edge_doc()) as edge:
        log = tmp_path / "edge.log"
        for n in range(20):
            with open(log, "a") as handle:
                handle.write(f"line {n}\n")
        os.replace(log, tmp_path / "edge.log.1")
        log.write_text("fresh\n")
        (tmp_path / "scratch.tmp").write_text("x")
        (tmp_path / "scratch.tmp").unlink()
        (tmp_path / "sub").mkdir()
        rename_save(edge.path, dump(edge_doc(capacity=3)))  # events come in order: this last
        record = await edge.next_record()
        assert (record.trigger, record.result.result) == ("file", "applied")
        assert edge.supervisor.reads == 1 + 2  # the first look, then the settle window's two
        assert edge.supervisor.runs == 1
        stats = edge.supervisor.watch_statistics()
        assert stats.names == ("edge.yaml",)
        assert stats.events == 1  # the rename into place
        assert stats.ignored >= 20 + 6  # every other event (the kernel may merge a few)


@pytest.mark.parametrize("inotify", [True, False], ids=["inotify", "watchfiles"])
async def test_a_configmap_swap_is_applied_once_and_the_chain_followed_anew(tmp_path, inotify):
    """Issue 25 item 1: a Kubernetes ConfigMap (``edge.yaml -> ..data/edge.yaml``, ``..data ->
    ..<timestamp>``) swapped twice: each swap is applied exactly once, the watched names
    follow the chain to the new timestamp directory, and the old directory's removal counts
    for nothing — with inotify and with the watchfiles fallback."""
    config_dir = tmp_path / "cm"
    config_dir.mkdir()

    def version(stamp: str, capacity: int) -> None:
        folder = config_dir / stamp
        folder.mkdir()
        (folder / "edge.yaml").write_text(dump(edge_doc(capacity=capacity)))

    def swap(stamp: str, old: str) -> None:  # what the kubelet does
        (config_dir / "..data_tmp").symlink_to(stamp)
        os.replace(config_dir / "..data_tmp", config_dir / "..data")
        for child in (config_dir / old).iterdir():
            child.unlink()
        (config_dir / old).rmdir()

    version("..2026_11_30_a", 2)
    (config_dir / "..data").symlink_to("..2026_11_30_a")
    path = config_dir / "edge.yaml"
    path.symlink_to("..data/edge.yaml")
    assert watched_names(path) == {"edge.yaml", "..data", "..2026_11_30_a"}
    async with watched(path, edge_doc(), inotify=inotify, debounce=0.05) as edge:
        expected = "inotify" if inotify else "watchfiles"
        assert edge.supervisor.watch_statistics().backend == expected
        swaps = [("..2026_11_30_b", "..2026_11_30_a", 5), ("..2026_11_30_c", "..2026_11_30_b", 7)]
        for stamp, old, capacity in swaps:
            version(stamp, capacity)
            swap(stamp, old)
            record = await edge.next_record()
            assert (record.trigger, record.result.result) == ("file", "applied")
            assert edge.capacity() == capacity
            await edge.supervisor.refresh("api")  # the only other record: taken once
            assert (await edge.next_record()).trigger == "api"
            assert edge.records.empty()
            names = edge.supervisor.watch_statistics().names
            assert set(names) == {"..data", stamp, "edge.yaml"}
        assert edge.supervisor.generation == 3


async def test_a_symlink_in_the_directory_is_followed_and_its_old_target_forgotten(tmp_path):
    """Issue 25 item 1: ``edge.yaml -> current.yaml`` in the same directory: an in-place save
    of ``current.yaml`` held open is waited for like the file's own; after ``edge.yaml`` is
    swapped to ``next.yaml`` (a rename), writes to ``current.yaml`` count no more."""
    sleep = BoundSleep()
    (tmp_path / "current.yaml").write_text(dump(edge_doc()))
    path = tmp_path / "edge.yaml"
    path.symlink_to("current.yaml")
    async with watched(path, edge_doc(), sleep) as edge:
        assert edge.supervisor.watch_statistics().names == ("current.yaml", "edge.yaml")
        with open(tmp_path / "current.yaml", "w") as handle:
            handle.write(dump(edge_doc(capacity=3)))
            handle.flush()
            await wait_for(lambda: sleep.waiting == 1 or not edge.records.empty())
            assert edge.records.empty()
            assert edge.supervisor.watch_statistics().open_for_writing == ("current.yaml",)
        record = await edge.next_record()
        assert (record.result.result, edge.capacity()) == ("applied", 3)

        (tmp_path / "next.yaml").write_text(dump(edge_doc(capacity=4)))
        (tmp_path / "edge.yaml.new").symlink_to("next.yaml")
        os.replace(tmp_path / "edge.yaml.new", path)
        record = await edge.next_record()
        assert (record.result.result, edge.capacity()) == ("applied", 4)
        assert edge.supervisor.watch_statistics().names == ("edge.yaml", "next.yaml")
        # Counted in the order inotify reports them (a refresh's own re-reads may trail a
        # record, so the read count is no measure here): once the record for next.yaml's save
        # is in, every event before it was judged.
        before = edge.supervisor.watch_statistics()
        (tmp_path / "current.yaml").write_text(dump(edge_doc(capacity=9)))  # not the config
        rename_save(tmp_path / "next.yaml", dump(edge_doc(capacity=5)))
        record = await edge.next_record()
        assert (record.result.result, edge.capacity()) == ("applied", 5)
        after = edge.supervisor.watch_statistics()
        assert after.events == before.events + 1  # next.yaml renamed into place, nothing else
        assert after.ignored > before.ignored  # current.yaml's writes, the editor's temp file
        assert edge.records.empty()


def test_watched_names_follow_the_chain_within_the_directory(tmp_path):
    """The names that can change what a config path resolves to: its own, every link of its
    chain in its directory (relative, absolute, through ``..``), the directories the chain
    passes through there, and ``..data`` when present; nothing outside the directory, and a
    link loop ends."""
    conf = tmp_path / "conf"
    conf.mkdir()
    elsewhere = tmp_path / "srv"
    elsewhere.mkdir()
    (elsewhere / "real.yaml").write_text("x")
    assert watched_names(conf / "edge.yaml") == {"edge.yaml"}  # not there (yet)
    (conf / "edge.yaml").write_text("x")
    assert watched_names(conf / "edge.yaml") == {"edge.yaml"}
    (conf / "a.yaml").symlink_to(conf / "b.yaml")  # absolute
    (conf / "b.yaml").symlink_to("../srv/real.yaml")  # out of the directory
    assert watched_names(conf / "a.yaml") == {"a.yaml", "b.yaml"}
    (conf / "..data").symlink_to("stamp")
    assert watched_names(conf / "edge.yaml") == {"edge.yaml", "..data"}
    (conf / "loop1").symlink_to("loop2")
    (conf / "loop2").symlink_to("loop1")
    assert watched_names(conf / "loop1") == {"loop1", "loop2", "..data"}
