"""Benchmark: the stored responses of ``/v1/responses`` under a soak — is memory bounded by
``openai.responses_store.max_bytes``?

Stores ``--responses`` (100,000) responses into one
:class:`~iop_edge.api.responses_store.ResponsesStore` with ``max_bytes`` 64 MiB, as the edge
does after each answer: the Response object's JSON (``--response-bytes``, 2 KiB, a completed
response with one message of output text) and its conversation (the user's input message and
the assistant's output message, about 2 KiB of JSON more). ``max_items`` is set to its largest
allowed value (1,000,000; ``--max-items``) so that ``max_bytes`` is the bound that holds; the
ttl (1 h) never passes (the store's clock moves 1 ms a put). Each response is built just before
its put, so the bench holds nothing but the store.

Reports the process's resident memory (``VmRSS`` of ``/proc/self/status``, after a
``gc.collect()``) before the store is made, as it fills, and after the last put, next to the
store's :meth:`~iop_edge.api.responses_store.ResponsesStore.statistics`; and the wall-clock µs
per ``put`` (encoding the items to JSON included), per ``get`` of a held response (its items
decoded) and per ``get`` of an unknown id. Writes ``bench/results/responses-store-<time>.json``;
exit status 1 if the RSS grew after the store was full by more than ``--slack-mib``.

Run: ``.venv/bin/python bench/bench_responses_store.py [--responses 100000]``
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import random
import sys
import time
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from iop_edge.api.responses_store import ResponsesStore
from iop_edge.config.schema import (
    DEFAULT_RESPONSES_MAX_BYTES,
    DEFAULT_RESPONSES_TTL_MS,
    MAX_RESPONSES_ITEMS,
)
from iop_edge.testing.clock import FakeClock

RESULTS = Path(__file__).resolve().parent / "results"
MIB = 2**20
PROMPT = "Summarise the attached design note in three bullet points, then list open questions."


def rss_kib() -> int:
    """The process's resident set size in KiB (``VmRSS``), after a full collection."""
    gc.collect()
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status (this benchmark needs Linux)")


def response_id_of(n: int) -> str:
    """The id of response ``n``, the length of an id the edge makes."""
    return f"resp_{n:032x}"


def conversation(n: int, response_bytes: int) -> tuple[str, bytes, list[dict[str, Any]]]:
    """Response ``n``: its id, its JSON of ``response_bytes`` bytes, and its items."""
    response_id = response_id_of(n)
    message_id = f"msg_{n:032x}"
    shell: dict[str, Any] = {
        "id": response_id,
        "object": "response",
        "created_at": 1_767_225_600 + n,
        "status": "completed",
        "model": "bench-model",
        "output": [
            {
                "type": "message",
                "id": message_id,
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "", "annotations": []}],
            }
        ],
        "usage": {"input_tokens": 31, "output_tokens": 412, "total_tokens": 443},
    }
    text_length = response_bytes - len(orjson.dumps(shell))
    text = (f"{n:08d} " * (text_length // 9 + 1))[:text_length]
    shell["output"][0]["content"][0]["text"] = text
    response = orjson.dumps(shell)
    items = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": PROMPT}]},
        shell["output"][0],
    ]
    return response_id, response, items


def soak(responses: int, response_bytes: int, max_bytes: int, max_items: int) -> dict[str, Any]:
    """Fill a store with ``responses`` responses; the figures of the run."""
    clock = FakeClock()
    before = rss_kib()
    store = ResponsesStore(
        max_items=max_items,
        max_bytes=max_bytes,
        ttl=DEFAULT_RESPONSES_TTL_MS / 1000,
        clock=clock,
    )
    samples: list[tuple[int, int, int, int]] = []  # (puts, items held, bytes held, RSS KiB)
    every = max(1, responses // 10)
    put_seconds = 0.0
    full_at: int | None = None
    for n in range(1, responses + 1):
        response_id, response, items = conversation(n, response_bytes)
        clock.advance(0.001)
        started = time.perf_counter()
        store.put(response_id, "bench", response, items)
        put_seconds += time.perf_counter() - started
        if full_at is None and store.statistics().evicted:
            full_at = n
            stats = store.statistics()
            samples.append((n, stats.items, stats.bytes, rss_kib()))
        if n % every == 0:
            stats = store.statistics()
            samples.append((n, stats.items, stats.bytes, rss_kib()))
    after = rss_kib()
    stats = store.statistics()

    held = [response_id_of(n) for n in range(responses - stats.items + 1, responses + 1)]
    random.Random(28).shuffle(held)
    found = 0
    started = time.perf_counter()
    for response_id in held:
        found += store.get(response_id, "bench") is not None
    get_hit = (time.perf_counter() - started) / len(held)
    if found != len(held):
        raise RuntimeError(f"{len(held) - found} of the newest {len(held)} responses are gone")
    unknown = [f"resp_unknown_{n}" for n in range(len(held))]
    started = time.perf_counter()
    for response_id in unknown:
        store.get(response_id, "bench")
    get_miss = (time.perf_counter() - started) / len(unknown)
    entry_bytes = stats.bytes / stats.items if stats.items else 0.0
    return {
        "responses": responses,
        "response_bytes": response_bytes,
        "entry_bytes": entry_bytes,
        "rss_before_kib": before,
        "rss_after_kib": after,
        "rss_full_kib": next((s[3] for s in samples if s[0] == full_at), None),
        "full_at": full_at,
        "samples": samples,
        "statistics": asdict(stats),
        "put_us": put_seconds / responses * 1e6,
        "get_hit_us": get_hit * 1e6,
        "get_miss_us": get_miss * 1e6,
        "gets": len(held),
    }


def headline(result: dict[str, Any]) -> str:
    """The run as Markdown: memory, then the cost per operation."""
    stats = result["statistics"]
    before, after = result["rss_before_kib"], result["rss_after_kib"]
    growth = (after - before) * 1024
    overhead = (growth - stats["bytes"]) / stats["items"] if stats["items"] else 0.0
    lines = [
        f"{result['responses']:,} responses of {result['response_bytes']:,} bytes "
        f"({result['entry_bytes']:,.0f} bytes an entry with its items), max_bytes "
        f"{stats['max_bytes'] / MIB:g} MiB, max_items {stats['max_items']:,}",
        "",
        "| figure | value |",
        "| --- | ---: |",
        f"| RSS before the store | {before / 1024:.1f} MiB |",
        f"| RSS when the store first evicted (put {result['full_at']:,}) | "
        f"{(result['rss_full_kib'] or 0) / 1024:.1f} MiB |",
        f"| RSS after the last put | {after / 1024:.1f} MiB |",
        f"| RSS growth / bytes the store counts | {growth / MIB:.1f} / "
        f"{stats['bytes'] / MIB:.1f} MiB ({overhead:,.0f} bytes uncounted an entry) |",
        f"| held: items / bytes | {stats['items']:,} / {stats['bytes']:,} |",
        f"| stored / evicted (lru) / expired / too large | {stats['stored']:,} / "
        f"{stats['evicted']:,} / {stats['expired']:,} / {stats['too_large']:,} |",
        f"| put (items encoded) | {result['put_us']:.2f} µs |",
        f"| get of a held response (items decoded), {result['gets']:,} | "
        f"{result['get_hit_us']:.2f} µs |",
        f"| get of an unknown id | {result['get_miss_us']:.2f} µs |",
    ]
    return "\n".join(lines)


def main() -> int:
    """Run the soak, print the tables, write the JSON; 1 if memory grew past the full store."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--responses", type=int, default=100_000, help="responses stored")
    parser.add_argument("--response-bytes", type=int, default=2048, help="each response's JSON")
    parser.add_argument(
        "--max-bytes", type=int, default=DEFAULT_RESPONSES_MAX_BYTES, help="the store's bound"
    )
    parser.add_argument(
        "--max-items",
        type=int,
        default=MAX_RESPONSES_ITEMS,
        help="the store's other bound (default: the largest allowed, so max_bytes holds)",
    )
    parser.add_argument(
        "--slack-mib",
        type=float,
        default=8.0,
        help="RSS growth allowed after the store is full (the allocator's own churn)",
    )
    parser.add_argument("--output", type=Path, default=RESULTS, help="where the run's JSON goes")
    args = parser.parse_args()
    result = soak(args.responses, args.response_bytes, args.max_bytes, args.max_items)
    text = headline(result)
    print(f"Python {platform.python_version()}\n\n{text}\n")
    print("| puts | items held | MiB held | RSS MiB |\n| ---: | ---: | ---: | ---: |")
    for puts, items, held, rss in result["samples"]:
        print(f"| {puts:,} | {items:,} | {held / MIB:.1f} | {rss / 1024:.1f} |")
    growth_after_full = (result["rss_after_kib"] - (result["rss_full_kib"] or 0)) / 1024
    bounded = result["full_at"] is None or growth_after_full <= args.slack_mib
    print(
        f"\nRSS after the store was full grew {growth_after_full:.1f} MiB "
        f"({'within' if bounded else 'past'} the {args.slack_mib:g} MiB slack)"
    )
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    args.output.mkdir(parents=True, exist_ok=True)
    path = args.output / f"responses-store-{stamp}.json"
    meta = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
    }
    document = {"meta": meta, "figures": result, "headline_markdown": text}
    path.write_text(json.dumps(document, indent=2) + "\n")
    print(f"wrote {path}")
    return 0 if bounded else 1


if __name__ == "__main__":
    sys.exit(main())
