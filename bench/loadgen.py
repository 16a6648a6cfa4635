"""Closed-loop HTTP load generator for OpenAI chat completions (or Anthropic Messages, or OpenAI
Responses); prints one JSON object.

``--concurrency N`` workers share one keep-alive aiohttp session (uvloop) and each sends
``POST {base_url}/chat/completions`` back to back for ``--warmup`` + ``--duration`` seconds.
Only requests that start after the warm-up and finish before the end of the window count.
``--api messages`` sends ``POST {base_url}/messages`` instead (Anthropic's body, the same prompt
and ``max_tokens``; the token as ``x-api-key``, with ``anthropic-version``); ``--api
responses`` sends ``POST {base_url}/responses`` (the prompt as ``input``, ``max_output_tokens``,
and ``store: false`` unless ``--store``).

A request succeeds only when the status is 200 and the body is complete: for a non-streaming
request a JSON object with ``choices`` (Messages: ``content``; Responses: ``output`` and
``status: completed``); for a stream, no ``data: {"error"...`` event (Messages: no ``event:
error``; Responses: no ``event: error`` nor ``event: response.failed``) and an end in ``data:
[DONE]`` (Messages: the ``message_stop`` event; Responses: a whole ``response.completed`` event
as the last one). Anything else is an error, counted by kind (``http_502``, ``bad_body``,
``stream_error_event``, ``stream_truncated``, ``stream_not_completed`` (a Responses stream whose
last event is another, ``response.incomplete`` say), ``disconnected``, ``timeout``, ...).

Latency is the time to the full response (non-streaming) or the end of the stream (streaming);
``ttfb`` is the time to the response headers (non-streaming) or the first body chunk
(streaming). Output fields: ``requests`` (successes in the window), ``errors`` (by kind),
``rps``, ``finished_rps`` (successes that *ended* in the window, whenever they started, per
second: the throughput, which ``rps`` understates when a request lasts a good part of the
window), ``latency_ms`` and ``ttfb_ms`` (p50/p90/p99/max/mean), ``total_completed`` (every
request finished, warm-up included, for per-request CPU figures) and ``client_cpu_s``.

``--engine wrk`` drives the same requests with wrk (one thread, C, much cheaper per request
than this Python client, so more of a shared core is left to the upstream) through a Lua
script that applies the same success rules to each response body; it reports no ``ttfb``, and
its durations are whole seconds. The warm-up is a separate wrk run first.

``--also-base-url URL`` (repeatable; the Python engine) spreads the workers over several
targets, ``--base-url`` and each of these in turn (worker *i* sends to URL *i* mod *n*, so
``-c 24`` over three URLs is eight workers on each), one closed loop and one window over them
all: the load of a client in front of several replicas. The output then has ``urls`` and
``finished_rps_by_url``.

``--fake-behavior QUERY`` puts a ``[[fake:QUERY]]`` directive before the prompt: the fake
upstreams of ``iop_edge.testing`` (behind any proxy that passes the conversation on) then answer
as told, ``chunks=500`` say (with ``--max-tokens`` at least as large).

``--park N --model GROUP`` instead opens N requests that are expected to wait (a model group
whose one slot is held), prints ``{"parked": N}`` once all were sent, and keeps them open until
SIGTERM; used for the pending-requests scaling run.

Example::

    python bench/loadgen.py --base-url http://127.0.0.1:8080/v1 --model m -c 16 --stream
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson


@dataclass(frozen=True)
class ApiRules:
    """What one API's requests look like and what makes an answer complete."""

    path: str
    """Appended to ``--base-url``."""
    error_marks: tuple[bytes, ...]
    """Bytes that only an error event carries."""
    body_key: str
    """A key a complete non-streamed answer has, with a non-empty value."""
    stream_end: bytes = b""
    """How a complete stream ends, byte for byte (when its last event is always the same)."""
    last_event: bytes = b""
    """Else the name of the event a complete stream ends with (``event: <name>``), whole."""
    body_status: str | None = None
    """The ``status`` a complete non-streamed answer has, if it has one."""


APIS: dict[str, ApiRules] = {
    "chat": ApiRules(
        "/chat/completions", (b'data: {"error"',), "choices", stream_end=b"data: [DONE]\n\n"
    ),
    "messages": ApiRules(
        "/messages",
        (b"event: error\n",),
        "content",
        stream_end=b'event: message_stop\ndata: {"type":"message_stop"}\n\n',
    ),
    # An event's data is one line of JSON, which escapes newlines: `event: x\n` is an event's.
    "responses": ApiRules(
        "/responses",
        (b"event: error\n", b"event: response.failed\n"),
        "output",
        last_event=b"response.completed",
        body_status="completed",
    ),
}
ANTHROPIC_VERSION = "2023-06-01"
PROMPT = (
    "Summarise the admission policy of an edge proxy in one sentence for the operators of a "
    "small shared GPU cluster, please."
)


@dataclass
class WorkerStats:
    """What the workers measured (shared; one event loop, so no locks)."""

    latencies: list[float] = field(default_factory=list)
    ttfbs: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    completed_total: int = 0
    finished_in_window: int = 0
    """Successes that ended inside the window, whenever they started."""
    finished_by_url: dict[str, int] = field(default_factory=dict)
    """The same, by the URL they were sent to."""
    first_error: str | None = None


def _percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p90": None, "p99": None, "max": None, "mean": None}
    ordered = sorted(values)

    def rank(fraction: float) -> float:
        index = min(len(ordered) - 1, max(0, round(fraction * len(ordered) + 0.5) - 1))
        return round(ordered[index] * 1000, 3)

    return {
        "p50": rank(0.50),
        "p90": rank(0.90),
        "p99": rank(0.99),
        "max": round(ordered[-1] * 1000, 3),
        "mean": round(sum(ordered) / len(ordered) * 1000, 3),
    }


def _error_kind(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "disconnected"
    if isinstance(exc, aiohttp.ClientPayloadError):
        return "stream_truncated"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return "connect"
    if isinstance(exc, aiohttp.ClientOSError):
        return "socket"
    return type(exc).__name__


async def one_request(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    headers: dict[str, str],
    stream: bool,
    rules: ApiRules,
) -> tuple[str | None, float | None, str]:
    """Send one request; return (error kind or None, ttfb seconds, detail for the first error),
    the answer judged by ``rules`` (see the module docstring)."""
    started = time.perf_counter()
    async with session.post(url, data=body, headers=headers) as response:
        ttfb: float | None = time.perf_counter() - started
        if response.status != 200:
            text = await response.read()
            return f"http_{response.status}", ttfb, text[:300].decode(errors="replace")
        if not stream:
            raw = await response.read()
            try:
                parsed = orjson.loads(raw)
            except orjson.JSONDecodeError:
                return "bad_body", ttfb, raw[:300].decode(errors="replace")
            if not isinstance(parsed, dict) or not parsed.get(rules.body_key):
                return "bad_body", ttfb, raw[:300].decode(errors="replace")
            if rules.body_status is not None and parsed.get("status") != rules.body_status:
                return "bad_body", ttfb, raw[:300].decode(errors="replace")
            return None, ttfb, ""
        ttfb = None
        tail = b""
        keep = max(len(mark) for mark in (rules.stream_end, *rules.error_marks)) + 16
        last = LastEvent() if rules.last_event else None
        async for chunk in response.content.iter_any():
            if ttfb is None:
                ttfb = time.perf_counter() - started
            window = tail + chunk
            if any(mark in window for mark in rules.error_marks):
                return "stream_error_event", ttfb, window[-300:].decode(errors="replace")
            tail = window[-keep:]
            if last is not None:
                last.feed(chunk)
        if not tail.endswith(rules.stream_end or b"\n\n"):
            return "stream_truncated", ttfb, tail.decode(errors="replace")
        if last is not None and last.name != rules.last_event:
            return "stream_not_completed", ttfb, f"the last event was {last.name!r}"
        return None, ttfb, ""


class LastEvent:
    """The name of the last ``event: <name>`` line of a stream read in chunks of any size.

    An event's data is one line of JSON (which escapes newlines), so ``\nevent: `` starts an
    event's name line and nothing else.
    """

    __slots__ = ("_carry", "name")

    _MARK = b"\nevent: "

    def __init__(self) -> None:
        self.name: bytes | None = None
        self._carry = b"\n"  # (the stream's first line starts a line too)

    def feed(self, chunk: bytes) -> None:
        """Read the next chunk."""
        data = self._carry + chunk
        at = data.rfind(self._MARK)
        if at >= 0:
            end = data.find(b"\n", at + len(self._MARK))
            if end < 0:  # the name goes on in the next chunk
                self._carry = data[at:]
                return
            self.name = data[at + len(self._MARK) : end]
        # (a mark cut by the chunk's end is at most its length less one byte)
        self._carry = data[-(len(self._MARK) - 1) :]


async def _worker(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    headers: dict[str, str],
    stream: bool,
    rules: ApiRules,
    window: tuple[float, float],
    stats: WorkerStats,
) -> None:
    start_window, end_window = window
    while True:
        started = time.perf_counter()
        if started >= end_window:
            return
        try:
            kind, ttfb, detail = await one_request(session, url, body, headers, stream, rules)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            kind, ttfb, detail = _error_kind(exc), None, repr(exc)
        finished = time.perf_counter()
        stats.completed_total += 1
        if kind is not None and stats.first_error is None:
            stats.first_error = f"{kind}: {detail}"
        if finished > end_window:
            continue
        if kind is None and finished >= start_window:
            stats.finished_in_window += 1
            stats.finished_by_url[url] = stats.finished_by_url.get(url, 0) + 1
        if started < start_window:
            continue
        if kind is None:
            stats.latencies.append(finished - started)
            if ttfb is not None:
                stats.ttfbs.append(ttfb)
        else:
            stats.errors[kind] = stats.errors.get(kind, 0) + 1
            if kind in ("connect",):
                await asyncio.sleep(0.01)  # do not spin on a dead target


def load_prompt(options: argparse.Namespace) -> str:
    """The prompt sent: :data:`PROMPT`, after the ``--fake-behavior`` directive if any."""
    if options.fake_behavior:
        return f"[[fake:{options.fake_behavior}]] {PROMPT}"
    return PROMPT


def request_urls(options: argparse.Namespace) -> list[str]:
    """Where the requests go: ``--base-url``, then each ``--also-base-url``, with the API's
    path."""
    bases = [options.base_url, *(options.also_base_url or ())]
    return [base.rstrip("/") + APIS[options.api].path for base in bases]


def request_parts(options: argparse.Namespace, prompt: str) -> tuple[str, bytes, dict[str, str]]:
    """The URL (of ``--base-url``), body and headers of the request ``options`` describe,
    asking for ``prompt``."""
    url = options.base_url.rstrip("/") + APIS[options.api].path
    payload: dict[str, Any] = {"model": options.model}
    if options.api == "responses":
        payload["input"] = prompt
        payload["max_output_tokens"] = options.max_tokens
        payload["store"] = options.store
    else:
        # The same body for both APIs: Messages' form of this one user message is chat's.
        payload["messages"] = [{"role": "user", "content": prompt}]
        payload["max_tokens"] = options.max_tokens
    if options.stream:
        payload["stream"] = True
    headers = {"Content-Type": "application/json"}
    if options.api == "messages":
        headers["anthropic-version"] = ANTHROPIC_VERSION
        if options.token:
            headers["x-api-key"] = options.token  # what ANTHROPIC_API_KEY sends
    elif options.token:
        headers["Authorization"] = f"Bearer {options.token}"
    return url, orjson.dumps(payload), headers


async def run_load(options: argparse.Namespace) -> dict[str, Any]:
    """Run the closed loop and return the summary."""
    url, body, headers = request_parts(options, load_prompt(options))
    urls = request_urls(options)
    connector = aiohttp.TCPConnector(limit=options.concurrency, limit_per_host=0)
    timeout = aiohttp.ClientTimeout(total=options.request_timeout)
    stats = WorkerStats()
    cpu_before = resource.getrusage(resource.RUSAGE_SELF)
    async with aiohttp.ClientSession(
        connector=connector, timeout=timeout, skip_auto_headers=("User-Agent",)
    ) as session:
        now = time.perf_counter()
        window = (now + options.warmup, now + options.warmup + options.duration)
        workers = [
            asyncio.create_task(
                _worker(
                    session,
                    urls[index % len(urls)],
                    body,
                    headers,
                    options.stream,
                    APIS[options.api],
                    window,
                    stats,
                )
            )
            for index in range(options.concurrency)
        ]
        # Bounded: each worker stops issuing at the window end; one request may still run.
        done, pending = await asyncio.wait(
            workers, timeout=options.warmup + options.duration + options.request_timeout + 5
        )
        for task in pending:
            task.cancel()
        for task in done:
            task.result()
    cpu_after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    errors_total = sum(stats.errors.values())
    spread: dict[str, Any] = {}
    if len(urls) > 1:
        spread["urls"] = urls
        spread["finished_rps_by_url"] = [
            round(stats.finished_by_url.get(each, 0) / options.duration, 2) for each in urls
        ]
    return {
        "engine": "python",
        "api": options.api,
        "store": options.store,
        "url": url,
        "stream": options.stream,
        "concurrency": options.concurrency,
        "duration_s": options.duration,
        "warmup_s": options.warmup,
        "requests": len(stats.latencies),
        "errors": dict(sorted(stats.errors.items())),
        "errors_total": errors_total,
        "first_error": stats.first_error,
        "rps": round(len(stats.latencies) / options.duration, 1),
        "finished_rps": round(stats.finished_in_window / options.duration, 2),
        "latency_ms": _percentiles(stats.latencies),
        "ttfb_ms": _percentiles(stats.ttfbs),
        "total_completed": stats.completed_total,
        "client_cpu_s": round(cpu, 3),
        **spread,
    }


_WRK_SCRIPT = """
wrk.method = "POST"
wrk.body = BODY
for name, value in pairs(HEADERS) do wrk.headers[name] = value end
local threads = {}
function setup(thread) table.insert(threads, thread) end
function init(args) ok = 0; bad_body = 0; first = "" end
function response(status, headers, body)
  if status ~= 200 then
    if first == "" then first = "http_" .. status .. ": " .. string.sub(body, 1, 200) end
    return
  end
  local good
  if STREAM then
    good = string.sub(body, -14) == "data: [DONE]\\n\\n"
      and not string.find(body, 'data: {"error"', 1, true)
  else
    good = string.find(body, '"choices"', 1, true) ~= nil
  end
  if good then ok = ok + 1 else
    bad_body = bad_body + 1
    if first == "" then first = "bad_body: " .. string.sub(body, -200) end
  end
end
function done(summary, latency, requests)
  local ok, bad, first = 0, 0, ""
  for _, t in ipairs(threads) do
    ok = ok + t:get("ok"); bad = bad + t:get("bad_body")
    if first == "" then first = t:get("first") end
  end
  local e = summary.errors
  io.write(string.format(
    'WRKJSON {"requests":%d,"ok":%d,"bad_body":%d,"connect":%d,"read":%d,"write":%d,' ..
    '"timeout":%d,"status":%d,"p50":%d,"p90":%d,"p99":%d,"max":%d,"mean":%f,"first":"%s"}\\n',
    summary.requests, ok, bad, e.connect, e.read, e.write, e.timeout, e.status,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max,
    latency.mean, (string.gsub(first, '[%c"\\\\]', " "))))
end
"""


def _lua_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _wrk_once(
    script: str, url: str, concurrency: int, seconds: int, timeout: float
) -> dict[str, Any]:
    wrk = shutil.which("wrk")
    if wrk is None:
        raise SystemExit("loadgen: --engine wrk needs wrk (apt-get install wrk)")
    argv = [wrk, "-t1", f"-c{concurrency}", f"-d{seconds}s", f"--timeout={int(timeout)}s"]
    result = subprocess.run(
        [*argv, "-s", script, url],
        capture_output=True,
        text=True,
        check=False,
        timeout=seconds + timeout + 30,
    )
    for line in result.stdout.splitlines():
        if line.startswith("WRKJSON "):
            parsed: dict[str, Any] = orjson.loads(line[8:])
            return parsed
    raise RuntimeError(f"wrk printed no summary ({result.returncode}): {result.stderr[-500:]}")


def run_wrk(options: argparse.Namespace) -> dict[str, Any]:
    """Run the load with wrk (see the module docstring) and return the same summary."""
    url, body, headers = request_parts(options, load_prompt(options))
    lua_headers = ", ".join(f"[{_lua_string(k)}] = {_lua_string(v)}" for k, v in headers.items())
    script_text = (
        f"BODY = {_lua_string(body.decode())}\nHEADERS = {{{lua_headers}}}\n"
        f"STREAM = {'true' if options.stream else 'false'}\n" + _WRK_SCRIPT
    )
    duration = max(1, math.ceil(options.duration))
    with tempfile.NamedTemporaryFile("w", suffix=".lua") as script:
        script.write(script_text)
        script.flush()
        warm = {"requests": 0}
        if options.warmup > 0:
            warm = _wrk_once(
                script.name,
                url,
                options.concurrency,
                max(1, math.ceil(options.warmup)),
                options.request_timeout,
            )
        main = _wrk_once(script.name, url, options.concurrency, duration, options.request_timeout)
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    errors = {
        "bad_body": main["bad_body"],
        "connect": main["connect"],
        "read": main["read"],
        "write": main["write"],
        "timeout": main["timeout"],
        "http_status": main["status"],
    }
    errors = {k: v for k, v in errors.items() if v}
    latency = {key: round(main[key] / 1000, 3) for key in ("p50", "p90", "p99", "max")}
    latency["mean"] = round(main["mean"] / 1000, 3)
    ok = main["ok"]
    return {
        "engine": "wrk",
        "api": options.api,
        "url": url,
        "stream": options.stream,
        "concurrency": options.concurrency,
        "duration_s": duration,
        "warmup_s": options.warmup,
        "requests": ok,
        "errors": errors,
        "errors_total": sum(errors.values()),
        "first_error": main["first"] or None,
        "rps": round(ok / duration, 1),
        "finished_rps": round(ok / duration, 2),  # (wrk counts what ended in its run)
        "latency_ms": latency,
        "ttfb_ms": _percentiles([]),
        "total_completed": warm["requests"] + main["requests"],
        "client_cpu_s": round(usage.ru_utime + usage.ru_stime, 3),
    }


async def park(options: argparse.Namespace) -> None:
    """Open ``--park`` requests that wait in the target's queue; hold them until told to stop."""
    url, body, headers = request_parts(options, "[[fake:hold=true]] park this request")
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    sent = 0
    outcomes: dict[str, int] = {}

    async def one() -> None:
        nonlocal sent
        try:
            async with session.post(url, data=body, headers=headers) as response:
                key = f"http_{response.status}"
                await response.read()
        except asyncio.CancelledError:
            raise
        except (aiohttp.ClientError, OSError) as exc:
            key = _error_kind(exc)
        outcomes[key] = outcomes.get(key, 0) + 1

    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        tasks = []
        for _ in range(options.park):
            tasks.append(asyncio.create_task(one()))
            sent += 1
            if sent % 500 == 0:
                await asyncio.sleep(0.05)  # let connections open in batches, not all at once
        await asyncio.sleep(1.0)
        print(orjson.dumps({"parked": sent, "finished_early": outcomes}).decode(), flush=True)
        await stop.wait()
        print(f"outcomes before stop: {outcomes}", file=sys.stderr, flush=True)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def build_parser() -> argparse.ArgumentParser:
    """The command line of the load generator."""
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Counts a non-200 status or a broken stream as an error, never a success.",
    )
    parser.add_argument("--base-url", required=True, help="OpenAI base URL, http://HOST:PORT/v1")
    parser.add_argument(
        "--also-base-url",
        action="append",
        metavar="URL",
        help="another base URL (repeatable): the workers are spread evenly over --base-url "
        "and these (the Python engine)",
    )
    parser.add_argument("--model", required=True)
    parser.add_argument("--token", help="bearer token sent as Authorization")
    parser.add_argument("-c", "--concurrency", type=int, default=1)
    parser.add_argument("--duration", type=float, default=5.0, help="measured seconds")
    parser.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds first")
    parser.add_argument("--stream", action="store_true", help="ask for SSE streaming")
    parser.add_argument(
        "--api",
        choices=tuple(APIS),
        default="chat",
        help="chat: /chat/completions; messages: Anthropic's /messages; responses: OpenAI's "
        "/responses",
    )
    parser.add_argument(
        "--store",
        action="store_true",
        help="with --api responses: store: true (the edge keeps each response); else false",
    )
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument(
        "--fake-behavior",
        metavar="QUERY",
        default="",
        help="a [[fake:QUERY]] directive before the prompt (chunks=500: a fake upstream of "
        "iop_edge.testing streams 500 chunks)",
    )
    parser.add_argument("--request-timeout", type=float, default=30.0, help="seconds")
    parser.add_argument(
        "--engine", choices=("python", "wrk"), default="python", help="who sends the load"
    )
    parser.add_argument("--park", type=int, default=0, help="open N waiting requests instead")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the load (or park requests) and print JSON on stdout."""
    options = build_parser().parse_args(argv)
    if options.concurrency < 1 or options.duration <= 0 or options.warmup < 0:
        print("loadgen: need --concurrency >= 1, --duration > 0, --warmup >= 0", file=sys.stderr)
        return 2
    if options.store and options.api != "responses":
        print("loadgen: --store is a field of --api responses", file=sys.stderr)
        return 2
    if options.also_base_url and (options.engine == "wrk" or options.park):
        print("loadgen: --also-base-url spreads the Python engine's load only", file=sys.stderr)
        return 2
    if options.engine == "wrk" and options.api != "chat":
        # wrk's Lua body checks know chat's stream only
        print("loadgen: --engine wrk sends chat only; use --engine python", file=sys.stderr)
        return 2
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is installed with iop-edge
        runner = asyncio.run
    else:
        runner = uvloop.run
    if options.park:
        with contextlib.suppress(KeyboardInterrupt):
            runner(park(options))
        return 0
    summary = run_wrk(options) if options.engine == "wrk" else runner(run_load(options))
    print(orjson.dumps(summary).decode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
