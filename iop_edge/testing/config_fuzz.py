"""The config fuzzer: Hypothesis-drawn candidate files saved over a running edge's config
while SDK load flows — shared by ``tests/reliability`` (small) and ``bench/soak.py``
(full size). Needs the ``test`` extra (``hypothesis``, ``openai``).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import openai
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from iop_edge.config import ConfigError, load_config
from iop_edge.config.refresh import RefreshResult
from iop_edge.testing.leaks import leaks, settled, wait_for
from iop_edge.testing.reload_storm import (
    SteadyLoad,
    WatchedEdge,
    dump,
    error_names_a_path,
    records_since,
    rename_save,
)
from iop_edge.testing.strategies import mutate, mutated_docs


@st.composite
def near_misses(draw: st.DrawFn, base: dict[str, Any]) -> str:
    """YAML text of ``base`` (the running config) with one to three edits of the kinds
    :func:`tests.strategies.mutated_docs` makes (a key deleted, a value replaced by an
    arbitrary YAML value, an unknown key added, a list item duplicated), or a text-level break
    (truncated, a duplicated line, a stray bracket) — what an operator's slip looks like."""
    text = dump(mutate(draw, copy.deepcopy(base)))
    lines = text.splitlines(keepends=True)
    breakage = draw(st.sampled_from(["none", "none", "truncate", "duplicate_line", "bracket"]))
    if breakage == "truncate":
        text = text[: draw(st.integers(0, max(len(text) - 1, 0)))]
    elif breakage == "duplicate_line" and lines:
        at = draw(st.integers(0, len(lines) - 1))
        text = "".join([*lines[: at + 1], lines[at], *lines[at + 1 :]])
    elif breakage == "bracket" and lines:
        at = draw(st.integers(0, len(lines) - 1))
        text = "".join([*lines[:at], lines[at].rstrip("\n") + " [\n", *lines[at + 1 :]])
    return text


def fuzz_texts(
    base: dict[str, Any], count: int, *, derandomize: bool = True, seed: int | None = None
) -> list[str]:
    """Up to ``count`` distinct candidate files, drawn by Hypothesis: half unrelated mutated
    documents (:func:`tests.strategies.mutated_docs`), half near misses of ``base``.

    Drawn up front (the daemon runs on one event loop for the whole run, which Hypothesis'
    per-example runner cannot share); derandomized for the test suite, seeded for the soak.
    """
    seen: set[str] = {dump(base)}
    unrelated = _collect(mutated_docs().map(dump), count // 2, seen, derandomize, seed)
    near = _collect(near_misses(base).filter(_invalid), count - count // 2, seen, derandomize, seed)
    return [text for pair in zip(unrelated, near, strict=False) for text in pair] + (
        unrelated[len(near) :] + near[len(unrelated) :]
    )


def _invalid(text: str) -> bool:
    """Whether the loader refuses ``text`` (near misses are kept only then: a valid one could
    legitimately take the load's model away, and the fuzzer asserts zero failed requests)."""
    try:
        load_config(text)
    except ConfigError:
        return True
    return False


def _collect(
    strategy: st.SearchStrategy[str],
    count: int,
    seen: set[str],
    derandomize: bool,
    seed: int | None,
) -> list[str]:
    found: list[str] = []

    @settings(
        max_examples=count,
        derandomize=derandomize,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
        deadline=None,
    )
    @given(strategy)
    def collect(text: str) -> None:
        if text not in seen:
            seen.add(text)
            found.append(text)

    if seed is not None and not derandomize:
        collect = hypothesis_seed(seed)(collect)
    collect()
    return found


@dataclass
class FuzzReport:
    """What the config fuzzer did and saw."""

    candidates: int = 0
    rejected: int = 0
    applied: int = 0
    restart_required: int = 0
    unnamed_errors: list[str] = field(default_factory=list)
    running_changed_on_rejection: int = 0
    requests_ok: int = 0
    request_failures: list[str] = field(default_factory=list)
    leaks: dict[str, int] = field(default_factory=dict)
    still_serving: bool = False


async def run_config_fuzz(
    edge: WatchedEdge, texts: Sequence[str], load: SteadyLoad, *, restore: str
) -> FuzzReport:
    """Save each candidate to the watched file while ``load`` flows and wait for the daemon's
    verdict; after an accepted candidate, save ``restore`` (the base file) again so the next
    one is judged against the same running config. Stops the load and checks for leaks."""
    report = FuzzReport()
    for text in texts:
        before = len(edge.records)
        hash_before = edge.supervisor.running_hash
        rename_save(edge.path, text)
        await wait_for(records_since(edge, before))
        result: RefreshResult = edge.records[before].result
        report.candidates += 1
        if result.result == "rejected":
            report.rejected += 1
            if edge.supervisor.running_hash != hash_before:
                report.running_changed_on_rejection += 1
            for error in result.errors:
                if not error_names_a_path(error.path, error.message):
                    report.unnamed_errors.append(f"{error.message!r} for {text[:80]!r}")
        else:
            report.applied += result.result == "applied"
            report.restart_required += result.result == "restart_required"
            again = len(edge.records)
            rename_save(edge.path, restore)
            await wait_for(records_since(edge, again))
        await load.progress(1)
    await load.stop()
    report.requests_ok, report.request_failures = load.ok, list(load.failures)
    with contextlib.suppress(AssertionError):
        await settled(edge.daemon)
    report.leaks = {k: v for k, v in leaks(edge.daemon).items() if v}
    async with openai.AsyncOpenAI(
        base_url=edge.daemon.openai_url, api_key="x", max_retries=0
    ) as client:
        reply = await client.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "still here"}]
        )
        report.still_serving = reply.choices[0].message.content == "still here"
    return report
