"""Hostile clients, careless operators and odd upstreams against a live daemon (issue 10):
the 115 attacks' findings replayed against ``iop-edge serve`` as a subprocess, as an attacker
would send them — raw bytes on sockets, files swapped under the daemon's feet.

- malformed credentials, browser cross-origin requests, DNS rebinding, form posts: each gets
  its documented refusal;
- connection attacks (slowloris, idle keep-alive, a connection flood, clients that stop
  reading a stream) and odd requests (admin API from a page, upstream statuses no framework
  sends), one table each against one daemon: what the client sees, then that the daemon is
  unharmed — at rest by ``/admin/status`` (nothing in flight or queued, every admission
  released once), no process left, a normal request answered, no refresh run;
- config file attacks on the watched file while the daemon serves: each refused (a half-written
  save only judged whole), requests answered throughout, a later good save applied, a clean
  exit; ``config validate`` refuses the same files in one line each.

Every test reads the daemon's whole stderr: no line may hold any part of a credential or of
the prompt. Waits are on the daemon's state, its log lines, or a socket's close; each one is
bounded (:data:`~iop_edge.testing.leaks.BOUND`), so a regression fails instead of hanging.
"""

# ruff: noqa: E501 - the case tables read best one row per line

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import os
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest

from iop_edge.config import load_config, parse_config
from iop_edge.daemon import Daemon
from iop_edge.options import ServeOptions
from iop_edge.supervisor import SupervisorOptions
from iop_edge.testing.leaks import children_of
from tests.helpers import BOUND, FAKE_CLI, dump, process_gone, rename_save, wait_for
from tests.helpers.reliability import (
    EdgeProcess,
    config_validate,
    edge_at_rest,
    edge_metrics,
    edge_process,
    edge_status,
    log_events,
    raw_answer,
    raw_exchange,
    raw_request,
    read_answer,
    read_until_closed,
    slowloris,
    split_save,
    stalled_reader,
    swap_in_fifo,
    until_closed,
    wait_for_log,
)
from tests.helpers.upstreams import ThreadedUpstream, silent_upstream

# Distinctive secrets: the test looks for these texts in every log line.
TOKEN = "iop_hostile-principal-5d1f0c9e7a2b4c68"
PROVIDER_SECRET = "sk-hostile-provider-83a6e2f1b9c04d57"
ADMIN_TOKEN = "iop_hostile-admin-2c7e9b14f0a3d865"
# The prompt of every request the hostile edge gets: no log line may hold it either.
PROMPT_SECRET = "prompt-secret-7b3e91c04d2a"
SECRETS = (TOKEN, PROVIDER_SECRET, ADMIN_TOKEN, PROMPT_SECRET)


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def guarded_doc(**openai: Any) -> dict[str, Any]:
    """An edge with a principal token, provider-auth forwarding, an admin token, and the
    ``echo`` model on the fake agent."""
    return {
        "openai": {
            "listen": "127.0.0.1:0",
            "principal_tokens": [
                {"token_ref": "app", "principal_ref": "team-a", "token_hash_sha256": sha256(TOKEN)}
            ],
            "provider_auth": {"enabled": True, "required": False},
            **openai,
        },
        "metrics": {"enabled": False},
        "console": {"listen": "127.0.0.1:0", "admin_token_sha256": sha256(ADMIN_TOKEN)},
        "models": [{"id": "echo", "context_window_tokens": 4096, "providers": ["agent"]}],
        "nodes": [
            {
                "id": "n1",
                "adapters": [{"name": "shell", "type": "cli", "command": FAKE_CLI[0]}],
                "providers": [
                    {
                        "id": "agent",
                        "type": "cli",
                        "category": "cli",
                        "adapter": "shell",
                        "models": ["echo"],
                        "args": [*FAKE_CLI[1:], "--format", "text"],
                        "output_format": "text",
                    }
                ],
            }
        ],
    }


CHAT = orjson.dumps({"model": "echo", "messages": [{"role": "user", "content": "hi"}]})
JSON = (b"Content-Type", b"application/json")
BEARER = b"Bearer " + TOKEN.encode()

# (id, listener, method, path, headers, status, code): every byte a pasted credential may
# carry. Bytes the HTTP parser itself refuses (controls, a bare CR) are its 400; the rest
# reach the edge, which refuses them as credentials (401), never with a 500.
CASES: list[tuple[str, str, str, str, list[tuple[bytes, bytes]], int, str | None]] = [
    ("nbsp-after-token", "openai", "POST", "/v1/chat/completions", [(b"Authorization", BEARER + b"\xa0"), JSON], 401, "invalid_api_key"),
    ("nbsp-before-token", "openai", "POST", "/v1/chat/completions", [(b"Authorization", b"Bearer \xa0" + TOKEN.encode()), JSON], 401, "invalid_api_key"),
    ("invalid-utf8-token", "openai", "POST", "/v1/chat/completions", [(b"Authorization", BEARER + b"\xff\xfe"), JSON], 401, "invalid_api_key"),
    ("utf8-nbsp-token", "openai", "POST", "/v1/chat/completions", [(b"Authorization", BEARER + b"\xc2\xa0"), JSON], 401, "invalid_api_key"),
    ("no-scheme-token", "openai", "POST", "/v1/chat/completions", [(b"Authorization", TOKEN.encode() + b"\xa0"), JSON], 401, "invalid_api_key"),
    ("nbsp-token-models", "openai", "GET", "/v1/models", [(b"Authorization", BEARER + b"\xa0")], 401, "invalid_api_key"),
    ("nbsp-token-model", "openai", "GET", "/v1/models/echo", [(b"Authorization", BEARER + b"\xa0")], 401, "invalid_api_key"),
    ("control-in-token", "openai", "POST", "/v1/chat/completions", [(b"Authorization", BEARER + b"\x01"), JSON], 400, None),
    ("nul-in-token", "openai", "GET", "/v1/models", [(b"Authorization", BEARER + b"\x00x")], 400, None),
    ("bare-cr-in-token", "openai", "GET", "/v1/models", [(b"Authorization", BEARER + b"\rx")], 400, None),
    ("token-in-bad-request-line", "openai", "GET", "/v1/models?key=" + TOKEN + "\x7f", [], 400, None),
    ("nbsp-provider-secret", "openai", "POST", "/v1/chat/completions", [(b"Authorization", BEARER), (b"X-IOP-Provider-Authorization", PROVIDER_SECRET.encode() + b"\xa0"), JSON], 401, "invalid_provider_auth"),
    ("invalid-utf8-provider-secret", "openai", "POST", "/v1/chat/completions", [(b"Authorization", BEARER), (b"X-IOP-Provider-Authorization", b"\xff" + PROVIDER_SECRET.encode()), JSON], 401, "invalid_provider_auth"),
    ("control-in-provider-secret", "openai", "POST", "/v1/chat/completions", [(b"Authorization", BEARER), (b"X-IOP-Provider-Authorization", PROVIDER_SECRET.encode() + b"\x02"), JSON], 400, None),
    ("nbsp-admin-token", "console", "GET", "/admin/status", [(b"Authorization", b"Bearer " + ADMIN_TOKEN.encode() + b"\xa0")], 401, "invalid_admin_token"),
    ("invalid-utf8-admin-token", "console", "POST", "/admin/config/refresh", [(b"Authorization", b"Bearer \xff" + ADMIN_TOKEN.encode())], 401, "invalid_admin_token"),
    ("control-in-admin-token", "console", "GET", "/admin/status", [(b"Authorization", b"Bearer " + ADMIN_TOKEN.encode() + b"\x03")], 400, None),
    ("del-in-token", "openai", "POST", "/v1/chat/completions", [(b"Authorization", BEARER + b"\x7f"), JSON], 400, None),
    ("latin1-token", "openai", "POST", "/v1/chat/completions", [(b"Authorization", BEARER + b"\xe9"), JSON], 401, "invalid_api_key"),
    ("emoji-token", "openai", "POST", "/v1/chat/completions", [(b"Authorization", BEARER + "\U0001f600".encode()), JSON], 401, "invalid_api_key"),
    ("tab-inside-token", "openai", "POST", "/v1/chat/completions", [(b"Authorization", b"Bearer " + TOKEN[:12].encode() + b"\t" + TOKEN[12:].encode()), JSON], 401, "invalid_api_key"),
    ("basic-scheme-token", "openai", "POST", "/v1/chat/completions", [(b"Authorization", b"Basic " + base64.b64encode(b"user:" + TOKEN.encode())), JSON], 401, "invalid_api_key"),
    ("oversized-token", "openai", "POST", "/v1/chat/completions", [(b"Authorization", BEARER + b"\xa0" * 9000), JSON], 400, None),
    ("duplicate-authorization", "openai", "POST", "/v1/chat/completions", [(b"Authorization", BEARER + b"\xa0"), (b"Authorization", BEARER), JSON], 401, "invalid_api_key"),
]  # fmt: skip


def secret_lines(edge: EdgeProcess) -> list[str]:
    """Log lines holding any part of a credential (its secret half is enough to leak it)."""
    fragments = [s[len(s) // 2 :] for s in SECRETS]
    return [line for line in edge.lines if any(f in line for f in fragments)]


async def test_malformed_credentials_are_refused_and_never_logged(tmp_path: Path) -> None:
    """Issue 10 item 2: a credential with a byte that is not printable ASCII (a pasted
    non-breaking space sent as 0xA0, invalid UTF-8) is a 401 with the credential's own code,
    never a 500; bytes the HTTP parser refuses are its 400; and no line of the daemon's log —
    its request lines, or anything aiohttp logs about a malformed request — holds any part of
    a token, the provider secret or the admin token."""
    config = tmp_path / "edge.yaml"
    config.write_text(dump(guarded_doc()))
    answers: dict[str, tuple[int, str | None]] = {}
    with edge_process(config) as edge:
        for case_id, listener, method, path, headers, _, _ in CASES:
            body = CHAT if method == "POST" and listener == "openai" else b""
            request = raw_request(method, path, headers, body)
            status, raw = await raw_exchange(*edge.host_port(listener), request)
            code = orjson.loads(raw)["error"]["code"] if status != 400 else None
            answers[case_id] = (status, code)
        # the well-formed credentials still work, after all that
        ok = raw_request("POST", "/v1/chat/completions", [(b"Authorization", BEARER), JSON], CHAT)
        assert (await raw_exchange(*edge.host_port("openai"), ok))[0] == 200
    assert answers == {case[0]: (case[5], case[6]) for case in CASES}
    assert secret_lines(edge) == []
    request_lines = [orjson.loads(line) for line in edge.lines if '"event":"request"' in line]
    refused = [line["code"] for line in request_lines if line["status"] == 401]
    # the POSTs and the two GETs of /v1/models: a refusal is logged like any request
    assert refused.count("invalid_api_key") == 12
    assert refused.count("invalid_provider_auth") == 2


# --- what a web page can make a browser send -----------------------------------------------

FORM = (b"Content-Type", b"application/x-www-form-urlencoded")
TEXT = (b"Content-Type", b"text/plain;charset=UTF-8")
EVIL = (b"Origin", b"http://evil.example")

# (id, listener, path, headers, body, Host, status, code) against an OPEN edge (no principal
# tokens) with a tokenless console: the loopback trust a page must not borrow.
BROWSER_CASES: list[tuple[str, str, str, list[tuple[bytes, bytes]], bytes, bytes, int, str]] = [
    ("cross-origin-chat-json", "openai", "/v1/chat/completions", [EVIL, JSON], CHAT, b"127.0.0.1", 403, "origin_not_allowed"),
    ("cross-origin-chat-text", "openai", "/v1/chat/completions", [EVIL, TEXT], CHAT, b"127.0.0.1", 403, "origin_not_allowed"),
    ("cross-origin-models", "openai", "/v1/models", [EVIL], b"", b"127.0.0.1", 403, "origin_not_allowed"),
    ("rebinding-chat", "openai", "/v1/chat/completions", [JSON], CHAT, b"rebind.evil.example:8080", 403, "host_not_allowed"),
    ("rebinding-models", "openai", "/v1/models", [], b"", b"rebind.evil.example", 403, "host_not_allowed"),
    ("form-chat", "openai", "/v1/chat/completions", [FORM], b"model=echo", b"127.0.0.1", 415, "unsupported_media_type"),
    ("text-chat", "openai", "/v1/chat/completions", [TEXT], CHAT, b"localhost", 415, "unsupported_media_type"),
    ("no-type-chat", "openai", "/v1/chat/completions", [], CHAT, b"localhost", 415, "unsupported_media_type"),
    ("cross-origin-refresh", "console", "/admin/config/refresh?mode=apply", [EVIL], b"", b"127.0.0.1", 403, "origin_not_allowed"),
    ("cross-origin-refresh-form", "console", "/admin/config/refresh?mode=apply", [EVIL, FORM], b"a=b", b"127.0.0.1", 403, "origin_not_allowed"),
    ("cross-origin-status", "console", "/admin/status", [EVIL], b"", b"127.0.0.1", 403, "origin_not_allowed"),
    ("rebinding-refresh", "console", "/admin/config/refresh?mode=apply", [], b"", b"rebind.evil.example:7601", 403, "host_not_allowed"),
    ("rebinding-status", "console", "/admin/status", [], b"", b"rebind.evil.example", 403, "host_not_allowed"),
    ("form-refresh", "console", "/admin/config/refresh?mode=apply", [FORM], b"mode=apply", b"127.0.0.1", 415, "unsupported_media_type"),
    ("empty-form-refresh", "console", "/admin/config/refresh?mode=apply", [FORM], b"", b"127.0.0.1", 415, "unsupported_media_type"),
]  # fmt: skip


async def test_what_a_web_page_can_send_runs_nothing(tmp_path: Path) -> None:
    """Issue 10 item 7: on the open loopback config a page could run the cli provider and
    read the answer (DNS rebinding), or apply a refresh (a cross-origin form). Each such
    request is refused with its JSON error — nothing is admitted, no refresh runs — while the
    same requests from a non-browser client on a loopback name are served."""
    doc = guarded_doc()
    del doc["openai"]["principal_tokens"]
    del doc["console"]["admin_token_sha256"]
    config = tmp_path / "edge.yaml"
    config.write_text(dump(doc))
    daemon = Daemon(
        parse_config(doc),
        ServeOptions(
            config_path=config,
            watch=False,
            supervisor_options=SupervisorOptions(poll_interval=3600),
        ),
    )
    await daemon.start()
    try:
        for case_id, listener, path, headers, body, host, status, code in BROWSER_CASES:
            port = daemon.listeners[listener].port
            request = raw_request(
                "POST" if body or "refresh" in path else "GET", path, headers, body, host=host
            )
            got, raw = await raw_exchange("127.0.0.1", port, request)
            error = orjson.loads(raw)["error"]
            assert (got, error["code"]) == (status, code), (case_id, error)
            assert set(error) == {"message", "type", "param", "code"}
        stats = daemon.scheduler.statistics()
        assert (stats.submitted, stats.admitted) == (0, 0)
        assert daemon.supervisor.last is None
        # the same surface, asked as the CLI and the SDK ask, answers
        ok = raw_request("POST", "/v1/chat/completions", [JSON], CHAT, host=b"localhost")
        assert (await raw_exchange("127.0.0.1", daemon.listeners["openai"].port, ok))[0] == 200
        refresh = raw_request("POST", "/admin/config/refresh?mode=apply")
        assert (await raw_exchange("127.0.0.1", daemon.listeners["console"].port, refresh))[
            0
        ] == 200
    finally:
        await daemon.stop()


# --- one daemon under connection and request attacks ---------------------------------------

# The connection limits of the hostile edge: small, so that each attack ends within the test.
HEADER_TIMEOUT = 0.3
KEEPALIVE_TIMEOUT = 0.3
WRITE_TIMEOUT = 0.3
MAX_CONNECTIONS = 8
# The event loop's timers run on a millisecond clock: one may fire a millisecond before its
# time as the test measures it. The lower bounds below allow for that, no more.
TIMER_SLACK = 0.005

HTML_PAGE = (
    b"<html><body><h1>502 Bad Gateway</h1><p>nginx at internal host 10.9.8.7</p></body></html>"
)
SSE_FRAME = (
    b"data: "
    + orjson.dumps({"choices": [{"index": 0, "delta": {"content": "x" * 65536}}]})
    + b"\n\n"
)


def raw_http(status_line: str, *headers: str, body: bytes = b"") -> bytes:
    """A raw upstream answer: ``status_line``, ``headers``, then ``body`` with its length."""
    head = [status_line, *headers]
    if body:
        head.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


# model → what its upstream answers: statuses no framework sends, and a proxy's HTML page.
ODD_UPSTREAMS: dict[str, bytes] = {
    "s101": raw_http("HTTP/1.1 101 Switching Protocols", "Upgrade: websocket", "Connection: Upgrade"),
    "s205": raw_http("HTTP/1.1 205 Reset Content", "Content-Type: application/json", body=b'{"id":"x","choices":[]}'),
    "s302": raw_http("HTTP/1.1 302 Found", "Location: http://127.0.0.1:9/v1/chat/completions", body=b"moved"),
    "s600": raw_http("HTTP/1.1 600 Beyond", "Content-Type: application/json", body=b"{}"),
    "html502": raw_http("HTTP/1.1 502 Bad Gateway", "Content-Type: text/html", body=HTML_PAGE),
}  # fmt: skip


def hostile_doc(upstreams: dict[str, str]) -> dict[str, Any]:
    """The edge under attack: a principal token, the small connection limits above, the admin
    API and metrics on loopback without a token, and one model per upstream (``upstreams``:
    model → base URL) besides ``echo`` (``cat``) and ``flood-cli`` (the fake agent printing
    without end)."""
    adapters: list[dict[str, Any]] = [{"name": "shell", "type": "cli", "command": "cat"}]
    providers: list[dict[str, Any]] = [
        {"id": "echo", "type": "cli", "category": "cli", "adapter": "shell", "models": ["echo"], "capacity": 4, "output_format": "text"},
        {"id": "flood-cli", "type": "cli", "category": "cli", "adapter": "shell", "models": ["flood-cli"], "command": FAKE_CLI[0], "args": [*FAKE_CLI[1:], "--format", "text", "--flood", str(2**40)], "output_format": "text"},
    ]  # fmt: skip
    for model, url in upstreams.items():
        adapters.append({"name": model, "type": "openai_compat", "base_url": url + "/v1"})
        providers.append(
            {
                "id": model,
                "type": "openai_compat",
                "category": "local_inference",
                "adapter": model,
                "models": ["fake-model"],
                "capacity": MAX_CONNECTIONS,
            }
        )
    return {
        "openai": {
            "listen": "127.0.0.1:0",
            "principal_tokens": [
                {"token_ref": "app", "principal_ref": "team-a", "token_hash_sha256": sha256(TOKEN)}
            ],
            "header_timeout_ms": int(HEADER_TIMEOUT * 1000),
            "keepalive_timeout_ms": int(KEEPALIVE_TIMEOUT * 1000),
            "write_timeout_ms": int(WRITE_TIMEOUT * 1000),
            "max_connections": MAX_CONNECTIONS,
        },
        "metrics": {"listen": "127.0.0.1:0"},
        "console": {"listen": "127.0.0.1:0"},
        "provider_pool": {"max_queue": 16, "queue_timeout_ms": 30000},
        "models": [
            {"id": p["id"], "context_window_tokens": 4096, "providers": [p["id"]]}
            for p in providers
        ],
        "nodes": [{"id": "n1", "adapters": adapters, "providers": providers}],
    }


@dataclass
class Hostile:
    """The daemon under attack and the upstreams a test looks at."""

    edge: EdgeProcess
    endless: ThreadedUpstream


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hostile]:
    """One ``iop-edge serve`` for every connection and request attack of the module (each
    test checks that its attack left it unharmed); it must exit 0 on SIGTERM at the end.
    Its upstreams run on threads: each test has its own event loop."""
    with contextlib.ExitStack() as stack:
        odd = {
            m: stack.enter_context(ThreadedUpstream.answering(raw))
            for m, raw in ODD_UPSTREAMS.items()
        }
        endless = stack.enter_context(ThreadedUpstream.endless(SSE_FRAME))
        urls = {model: upstream.base_url for model, upstream in odd.items()}
        urls.update(endless=endless.base_url, silent=stack.enter_context(silent_upstream()))
        config = tmp_path_factory.mktemp("hostile") / "edge.yaml"
        config.write_text(dump(hostile_doc(urls)))
        yield Hostile(stack.enter_context(edge_process(config)), endless)


def chat_request(
    model: str, request_id: str, *, stream: bool = False, keep_alive: bool = False
) -> bytes:
    """A well-formed chat request with the principal token, as raw bytes."""
    body = orjson.dumps(
        {
            "model": model,
            "messages": [{"role": "user", "content": f"{PROMPT_SECRET} {request_id}"}],
            "stream": stream,
        }
    )
    request = raw_request(
        "POST",
        "/v1/chat/completions",
        [(b"Authorization", BEARER), JSON, (b"X-Request-Id", request_id.encode())],
        body,
    )
    return (
        request.replace(b"Connection: close", b"Connection: keep-alive") if keep_alive else request
    )


async def assert_unharmed(edge: EdgeProcess) -> None:
    """After an attack: nothing held (slots, queue, admissions, processes), no refresh ran, a
    normal request is answered, and no log line holds a credential or the prompt."""
    status = await edge_at_rest(edge)
    assert status["config"]["last_refresh"] is None
    answer = await raw_answer(*edge.host_port("openai"), chat_request("echo", "after"))
    assert answer.status == 200, answer
    content = orjson.loads(answer.body)["choices"][0]["message"]["content"]
    assert content.strip() == f"{PROMPT_SECRET} after"
    await edge_at_rest(edge)
    assert secret_lines(edge) == []


def request_line(request_id: str) -> Callable[[dict[str, Any]], bool]:
    """A predicate: the request log line of ``request_id``."""
    return lambda line: line.get("request_id") == request_id


def guard_events(metrics: dict[str, float], event: str) -> float:
    """How many times the OpenAI listener's guard did ``event`` (``refused``,
    ``header_timeout``, ``write_stall``), from ``/metrics``."""
    return metrics[
        f'iop_edge_listener_connection_events_total{{event="{event}",listener="openai"}}'
    ]


def open_connections(metrics: dict[str, float]) -> float:
    """The OpenAI listener's open client connections, from ``/metrics``."""
    return metrics['iop_edge_listener_connections{listener="openai"}']


async def slowloris_connections(h: Hostile) -> None:
    """Four connections trickle a request head a byte at a time: each is closed, with no
    answer, once ``header_timeout_ms`` has passed since it opened (the guard counts four
    header timeouts); one rate-limited ``header_timeout`` warning says so; a new client is
    served while they are open."""
    before = guard_events(await edge_metrics(h.edge), "header_timeout")
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Padding: "
    attackers = [
        asyncio.create_task(slowloris(*h.edge.host_port("openai"), head, pace=0.02))
        for _ in range(4)
    ]
    async with asyncio.timeout(BOUND):
        while open_connections(await edge_metrics(h.edge)) < 4:
            await asyncio.sleep(0.005)
    served = await raw_answer(*h.edge.host_port("openai"), chat_request("echo", "meanwhile"))
    assert served.status == 200
    for trickled in await asyncio.gather(*attackers):
        assert trickled.received == b""
        assert trickled.seconds >= HEADER_TIMEOUT - TIMER_SLACK
        assert trickled.sent < 8190  # closed by the timeout, not by a header size limit
    assert guard_events(await edge_metrics(h.edge), "header_timeout") == before + 4
    warning = await wait_for_log(h.edge, "header_timeout")
    assert (warning["level"], warning["listener"], warning["count"]) == ("warning", "openai", 1)
    assert len(log_events(h.edge, "header_timeout")) == 1  # the other three are counted


async def slowloris_after_keepalive(h: Hostile) -> None:
    """A client sends one good request, then trickles the next head on the kept-alive
    connection: closed once ``keepalive_timeout_ms`` has passed, bytes or not."""
    head = b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Padding: "
    first = chat_request("echo", "before-trickle", keep_alive=True)
    trickled = await slowloris(*h.edge.host_port("openai"), head, pace=0.02, first=first)
    assert trickled.received == b""
    assert trickled.seconds >= KEEPALIVE_TIMEOUT - TIMER_SLACK  # counted from the answer's end


async def slow_body(h: Hostile) -> None:
    """A client sends a whole request head, then its body a byte at a time (R.U.D.Y.): the
    connection is closed once ``header_timeout_ms`` has passed since the handler began to
    wait for the body, with one ``body_timeout`` warning, and the request logs 408
    ``body_timeout`` (the edge cut it; the client did not leave); nothing reached the
    scheduler."""
    before = (await edge_status(h.edge))["counters"]["submitted"]
    headers = [(b"Authorization", BEARER), JSON, (b"X-Request-Id", b"slow-body")]
    announced = raw_request("POST", "/v1/chat/completions", headers, b" " * 4096)
    head = announced[: announced.index(b"\r\n\r\n") + 4]  # the 4 KiB body never comes
    trickled = await slowloris(
        *h.edge.host_port("openai"), b'{"model": "echo", ', pace=0.02, at_once=head
    )
    assert trickled.received == b""
    assert trickled.seconds >= HEADER_TIMEOUT - TIMER_SLACK
    warning = await wait_for_log(h.edge, "body_timeout")
    assert (warning["listener"], warning["count"]) == ("openai", 1)
    line = await wait_for_log(h.edge, "request", request_line("slow-body"))
    assert (line["status"], line["code"]) == (408, "body_timeout")  # the edge's cut, named
    assert "openai.header_timeout_ms" in line["error"]
    assert (await edge_status(h.edge))["counters"]["submitted"] == before


async def idle_keepalive(h: Hostile) -> None:
    """A client keeps its connection open after an answer and sends nothing: closed once
    ``keepalive_timeout_ms`` has passed."""
    loop = asyncio.get_running_loop()
    reader, writer = await asyncio.open_connection(*h.edge.host_port("openai"))
    try:
        asked_at = loop.time()  # before the answer's end, from which the edge counts
        writer.write(chat_request("echo", "then-idle", keep_alive=True))
        answer = await read_answer(reader)
        kept = answer.headers.get("connection", "keep-alive").lower()
        assert (answer.status, kept) == (200, "keep-alive")
        assert await until_closed(reader) == b""
        assert loop.time() - asked_at >= KEEPALIVE_TIMEOUT - TIMER_SLACK
    finally:
        writer.close()


async def connection_flood(h: Hostile) -> None:
    """Eight clients hold every connection of the listener (requests waiting on an upstream
    that never answers); four more are each answered ``503 too_many_connections`` with
    ``Retry-After`` at once, and one rate-limited ``connection_limit`` warning names the cap.
    Once the eight leave, their slots are released and new clients are served."""
    host, port = h.edge.host_port("openai")
    before = guard_events(await edge_metrics(h.edge), "refused")
    flood = []
    for index in range(MAX_CONNECTIONS):
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(chat_request("silent", f"flood-{index}"))
        flood.append((reader, writer))
    try:
        await wait_for_status(
            h.edge, lambda s: provider(s, "silent")["in_flight"] == MAX_CONNECTIONS
        )
        refused = [await raw_answer(host, port, raw_request("GET", "/healthz")) for _ in range(4)]
    finally:
        for _, writer in flood:
            writer.close()
    for answer in refused:
        assert (answer.status, answer.headers["retry-after"]) == (503, "1"), answer
        error = orjson.loads(answer.body)["error"]
        assert error["code"] == "too_many_connections"
        assert f"{MAX_CONNECTIONS} connections" in error["message"]
    assert guard_events(await edge_metrics(h.edge), "refused") == before + 4
    warning = await wait_for_log(h.edge, "connection_limit")
    assert (warning["listener"], warning["cap"], warning["count"]) == ("openai", MAX_CONNECTIONS, 1)
    assert len(log_events(h.edge, "connection_limit")) == 1  # rate-limited: the rest counted
    for index in range(MAX_CONNECTIONS):
        gone = await wait_for_log(h.edge, "request", request_line(f"flood-{index}"))
        assert (gone["status"], gone["code"]) == (499, "client_gone")


async def stalled_stream_openai(h: Hostile) -> None:
    """A client asks for a stream from an upstream that streams 64 KiB frames forever and
    never reads: once its writes have waited ``write_timeout_ms``, the exchange is aborted —
    upstream closed, slot released, the request line says 499 ``client_stalled``."""
    before = guard_events(await edge_metrics(h.edge), "write_stall")
    sock = stalled_reader(
        *h.edge.host_port("openai"), chat_request("endless", "stall-openai", stream=True)
    )
    try:
        line = await wait_for_log(h.edge, "request", request_line("stall-openai"))
        assert (line["status"], line["code"]) == (499, "client_stalled")
        await wait_for(lambda: h.endless.streams_open == 0)  # the upstream call was closed
        # what the client gets if it ever reads again: the stream's start, then the cut
        received, closed = await asyncio.to_thread(read_until_closed, sock)
        assert received.startswith(b"HTTP/1.1 200 OK\r\n")
        assert closed in ("eof", "reset")
    finally:
        sock.close()
    assert guard_events(await edge_metrics(h.edge), "write_stall") == before + 1


async def stalled_stream_cli(h: Hostile) -> None:
    """The same with a ``cli`` provider whose command prints without end: its process is
    killed (and reaped) when the stalled exchange is aborted."""
    before = guard_events(await edge_metrics(h.edge), "write_stall")
    sock = stalled_reader(
        *h.edge.host_port("openai"), chat_request("flood-cli", "stall-cli", stream=True)
    )
    commands: set[int] = set()  # the pids of the command, seen while it ran

    def stall_logged() -> bool:
        children = children_of(h.edge.process.pid)
        commands.update(pid for pid, cmdline in children.items() if "fake_cli" in cmdline)
        return any(request_line("stall-cli")(line) for line in log_events(h.edge, "request"))

    try:
        await wait_for(stall_logged)
        line = await wait_for_log(h.edge, "request", request_line("stall-cli"))
        assert (line["status"], line["code"]) == (499, "client_stalled")
        assert len(commands) == 1
        await wait_for(lambda: all(process_gone(pid) for pid in commands))
    finally:
        sock.close()
    assert guard_events(await edge_metrics(h.edge), "write_stall") == before + 1


def provider(status: dict[str, Any], provider_id: str) -> dict[str, Any]:
    """One provider's entry of ``/admin/status``."""
    return next(p for p in status["providers"] if p["id"] == provider_id)


async def wait_for_status(edge: EdgeProcess, predicate: Callable[[dict[str, Any]], bool]) -> None:
    """Poll ``/admin/status`` until ``predicate`` holds (bounded)."""
    async with asyncio.timeout(BOUND):
        while not predicate(await edge_status(edge)):
            await asyncio.sleep(0.01)


CONNECTION_ATTACKS: list[tuple[str, Callable[[Hostile], Awaitable[None]]]] = [
    ("slowloris-4-connections", slowloris_connections),
    ("slowloris-after-keepalive", slowloris_after_keepalive),
    ("slow-body", slow_body),
    ("idle-keepalive", idle_keepalive),
    ("connection-flood", connection_flood),
    ("stalled-stream-openai", stalled_stream_openai),
    ("stalled-stream-cli", stalled_stream_cli),
]


@pytest.mark.parametrize("attack", [pytest.param(a, id=i) for i, a in CONNECTION_ATTACKS])
async def test_a_hostile_connection_is_cut_and_the_edge_keeps_serving(
    hostile: Hostile, attack: Callable[[Hostile], Awaitable[None]]
) -> None:
    """Issue 10 items 3 and 4: idle, slow and flooding connections are bounded by the
    listener's timeouts and cap, a client that stops reading loses its exchange instead of
    holding a slot; the daemon stays unharmed (:func:`assert_unharmed`)."""
    await attack(hostile)
    await assert_unharmed(hostile.edge)


EVIL_HOST = b"rebind.evil.example:7601"

# (id, method, path, headers, body, Host, status, code): the admin API (no admin token, on
# loopback) as a web page reaches it. Each is refused before anything runs: no refresh.
ADMIN_ATTACKS: list[tuple[str, str, str, list[tuple[bytes, bytes]], bytes, bytes, int, str]] = [
    ("form-post-refresh", "POST", "/admin/config/refresh?mode=apply", [FORM], b"mode=apply", b"127.0.0.1", 415, "unsupported_media_type"),
    ("text-post-refresh", "POST", "/admin/config/refresh?mode=apply", [TEXT], b"{}", b"127.0.0.1", 415, "unsupported_media_type"),
    ("cross-origin-refresh", "POST", "/admin/config/refresh?mode=apply", [EVIL, JSON], b"{}", b"127.0.0.1", 403, "origin_not_allowed"),
    ("cross-origin-status", "GET", "/admin/status", [EVIL], b"", b"127.0.0.1", 403, "origin_not_allowed"),
    ("rebound-host-refresh", "POST", "/admin/config/refresh?mode=apply", [], b"", EVIL_HOST, 403, "host_not_allowed"),
    ("rebound-host-status", "GET", "/admin/status", [], b"", EVIL_HOST, 403, "host_not_allowed"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("method", "path", "headers", "body", "host", "status", "code"),
    [pytest.param(*row[1:], id=row[0]) for row in ADMIN_ATTACKS],
)
async def test_the_admin_api_refuses_what_a_web_page_sends(
    hostile: Hostile,
    method: str,
    path: str,
    headers: list[tuple[bytes, bytes]],
    body: bytes,
    host: bytes,
    status: int,
    code: str,
) -> None:
    """Issue 10 item 7: a form post, a cross-origin request or a rebound Host name gets its
    JSON refusal from the live admin API, and no refresh runs (:func:`assert_unharmed`)."""
    request = raw_request(method, path, headers, body, host=host)
    answer = await raw_answer(*hostile.edge.host_port("console"), request)
    error = orjson.loads(answer.body)["error"]
    assert (answer.status, error["code"]) == (status, code), error
    assert set(error) == {"message", "type", "param", "code"}
    await assert_unharmed(hostile.edge)


# (id, model, stream): upstreams answering what no framework sends (:data:`ODD_UPSTREAMS`).
# Each is a 502 ``upstream_error`` in the OpenAI envelope, before any stream frame.
UPSTREAM_ATTACKS: list[tuple[str, str, bool]] = [
    ("101-switching-protocols", "s101", False),
    ("101-switching-protocols-stream", "s101", True),
    ("205-reset-content", "s205", False),
    ("302-redirect", "s302", False),
    ("600-beyond-http", "s600", True),
    ("html-502-page", "html502", False),
    ("html-502-page-stream", "html502", True),
]


@pytest.mark.parametrize(
    ("case_id", "model", "stream"), [pytest.param(*row, id=row[0]) for row in UPSTREAM_ATTACKS]
)
async def test_an_odd_upstream_answer_is_a_json_502_and_its_page_stays_in_the_log(
    hostile: Hostile, case_id: str, model: str, stream: bool
) -> None:
    """Issue 10 item 9: an upstream status outside 200 and 400–599 (a 101 used to hang the
    client, a 205 became a 200, a 600 was relayed) is a 502 ``upstream_error``; an upstream's
    HTML error page is named in the request's log line, never shown to the client."""
    edge = hostile.edge
    answer = await raw_answer(
        *edge.host_port("openai"), chat_request(model, case_id, stream=stream)
    )
    error = orjson.loads(answer.body)["error"]
    assert (answer.status, error["code"]) == (502, "upstream_error"), error
    assert set(error) == {"message", "type", "param", "code"}
    assert answer.headers["content-type"].startswith("application/json")
    assert b"<html" not in answer.body
    assert b"10.9.8.7" not in answer.body
    line = await wait_for_log(edge, "request", request_line(case_id))
    assert (line["status"], line["code"], line["stream"]) == (502, "upstream_error", stream)
    if model == "html502":
        assert "nginx at internal host 10.9.8.7" in line["error"]
    await assert_unharmed(edge)


# --- config file attacks on the watched file ----------------------------------------------

PROMPT = 5.0
"""Seconds a request sent while the daemon reads a hostile file may take (a generous bound on
a ~20 ms request: the daemon used to read on its event loop, frozen 17 s by a 5 MB file and
for good by a FIFO)."""


def config_doc(max_queue: int = 16) -> dict[str, Any]:
    """Models ``echo`` and ``late`` (both ``cat``) behind a principal token. ``models`` comes
    last and ``late`` last in it, so the file cut before ``late``'s entry is a valid config
    that serves one model less."""
    providers = [
        {"id": m, "type": "cli", "category": "cli", "adapter": "shell", "models": [m], "output_format": "text"}
        for m in ("echo", "late")
    ]  # fmt: skip
    return {
        "openai": {
            "listen": "127.0.0.1:0",
            "principal_tokens": [
                {"token_ref": "app", "principal_ref": "team-a", "token_hash_sha256": sha256(TOKEN)}
            ],
        },
        "metrics": {"enabled": False},
        "console": {"listen": "127.0.0.1:0"},
        "provider_pool": {"max_queue": max_queue, "queue_timeout_ms": 30000},
        "nodes": [
            {
                "id": "n1",
                "adapters": [{"name": "shell", "type": "cli", "command": "cat"}],
                "providers": providers,
            }
        ],
        "models": [
            {"id": m, "context_window_tokens": 4096, "providers": [m]} for m in ("echo", "late")
        ],
    }


def nested_999_deep(doc: dict[str, Any]) -> bytes:
    # 999 flow levels: libyaml itself refuses the 1,000th, the Python loader used to overflow
    return (dump(doc) + "extra: " + "[" * 999 + "]" * 999 + "\n").encode()


def integer_2_pow_64(doc: dict[str, Any]) -> bytes:
    # a valid config otherwise: the config hash (orjson) used to raise TypeError on it
    return dump({**doc, "provider_pool": {**doc["provider_pool"], "max_queue": 2**64}}).encode()


def alias_bomb_9_levels(doc: dict[str, Any]) -> bytes:
    # 576 bytes that expand to 10^9 values ("billion laughs"; 8 levels took 2.4 GB and 50 s)
    levels = ['  a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    levels += [f"  a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    return (dump(doc) + "extra:\n" + "\n".join(levels) + "\n").encode()


def file_of_5_mb(doc: dict[str, Any]) -> bytes:
    # a list of 1.7 million numbers: the kind of file that took 17 s and 918 MB to load
    return (dump(doc) + "extra: [" + "0, " * (5 * 2**20 // 3) + "0]\n").encode()


def not_utf_8(doc: dict[str, Any]) -> bytes:
    return dump(doc).encode() + b"# caf\xe9 (saved as Latin-1)\n"


# (id, the file's bytes made from the good config — None: a FIFO with no writer —, a part of
# the error): what an attacker who can write the config directory, or a careless operator,
# saves.
CONFIG_ATTACKS: list[tuple[str, Callable[[dict[str, Any]], bytes] | None, str]] = [
    ("nested-999-deep", nested_999_deep, "is nested more than 64 levels deep"),
    ("integer-2**64", integer_2_pow_64, "provider_pool.max_queue: 18446744073709551616 is too large; integers must fit in 64 bits"),
    ("alias-bomb-9-levels", alias_bomb_9_levels, "expands to more than 1,000,000 YAML nodes"),
    ("file-of-5-MB", file_of_5_mb, "a config file may be at most 4 MiB"),
    ("not-utf-8", not_utf_8, "not valid UTF-8 at byte"),
    ("fifo-at-config-path", None, "it is a FIFO (named pipe), not a regular file"),
]  # fmt: skip


def save_attack(path: Path, make: Callable[[dict[str, Any]], bytes] | None) -> None:
    """Put the attack's file at ``path`` the way an editor saves (a rename over it)."""
    if make is None:
        swap_in_fifo(path)
        return
    tmp = path.with_name(f".{path.name}.swp")
    tmp.write_bytes(make(config_doc()))
    os.replace(tmp, path)


async def keep_asking(edge: EdgeProcess, model: str, refreshes: int) -> list[int]:
    """Ask ``model`` back to back, at least once, until the edge has logged more than
    ``refreshes`` ``config_refresh`` lines; the statuses. Each request must be answered within
    :data:`PROMPT` (the event loop is not frozen), the whole within :data:`BOUND`."""
    statuses: list[int] = []
    async with asyncio.timeout(BOUND):
        while not statuses or len(log_events(edge, "config_refresh")) <= refreshes:
            request = chat_request(model, f"ask-{len(statuses)}")
            try:
                async with asyncio.timeout(PROMPT):
                    answer = await raw_answer(*edge.host_port("openai"), request)
            except TimeoutError:
                raise AssertionError(f"a request took over {PROMPT} s: the daemon froze") from None
            statuses.append(answer.status)
    return statuses


async def test_config_file_attacks_are_refused_while_the_edge_serves(tmp_path: Path) -> None:
    """Issue 10 items 1, 5, 6 and 9: hostile files saved to the watched config — nesting past
    the parser, an integer past 64 bits, an alias bomb, 5 MB, a non-UTF-8 byte, a FIFO — are
    each rejected with a reason naming the rule, while a request sent during the read is
    answered promptly; the refresh path survives them all: a later good save is applied, a
    save written in two parts (its first part a valid config without ``late``) is judged only
    whole, ``late`` answering throughout; nothing leaks and SIGTERM still exits 0."""
    path = tmp_path / "edge.yaml"
    path.write_text(dump(config_doc()))
    verdicts: dict[str, tuple[set[int], str, bool]] = {}
    with edge_process(path) as edge:

        def refreshes() -> int:
            return len(log_events(edge, "config_refresh"))

        for case_id, make, reason in CONFIG_ATTACKS:
            seen = refreshes()
            save_attack(path, make)
            # requests sent while the daemon reads and judges the file are answered promptly
            statuses = await keep_asking(edge, "late", seen)
            verdict = await wait_for_log(edge, "config_refresh", after=seen)
            named = any(reason in error for error in verdict["errors"])
            verdicts[case_id] = (set(statuses), verdict["result"], named)
            assert verdict["generation"] == 1, verdict  # the running config did not change

        seen = refreshes()
        rename_save(path, dump(config_doc(max_queue=17)))
        applied = await wait_for_log(edge, "config_refresh", after=seen)
        assert (applied["result"], applied["generation"]) == ("applied", 2), applied

        whole = dump(config_doc(max_queue=18))
        cut = whole.rindex("- id: late")  # the entry of models[], the last in the file
        assert "late" not in [m.id for m in load_config(whole[:cut]).models]  # a valid half
        seen = refreshes()
        asking = asyncio.create_task(keep_asking(edge, "late", seen))
        # 0.2 s between the parts: past the file watcher's grouping of events (so the daemon
        # sees the first part alone: with 50 ms the old daemon mostly did not), and 0.3 s under
        # its 0.5 s settle (the margin for this thread being late on a loaded machine)
        await asyncio.to_thread(split_save, path, whole[:cut], whole[cut:], pause=0.2)
        judged = await wait_for_log(edge, "config_refresh", after=seen)
        statuses = await asking
        assert set(statuses) == {200}, statuses  # `late` never vanished
        assert (judged["result"], judged["generation"]) == ("applied", 3), judged
        assert [change["path"] for change in judged["changes"]] == ["provider_pool.max_queue"]

        status = await edge_at_rest(edge)
        assert status["queue"]["max_queue"] == 18
        answer = await raw_answer(*edge.host_port("openai"), chat_request("late", "at-the-end"))
        assert answer.status == 200
    assert verdicts == {case[0]: ({200}, "rejected", True) for case in CONFIG_ATTACKS}
    assert secret_lines(edge) == []


async def test_config_validate_refuses_each_hostile_file_in_one_line(tmp_path: Path) -> None:
    """Issue 10 items 1, 6 and 9: ``iop-edge config validate`` on each file of
    :data:`CONFIG_ATTACKS` exits 1 with one line naming the rule — no traceback, no hang (a
    FIFO is not opened) — the same verdict as ``serve``."""
    paths = {}
    for case_id, make, _ in CONFIG_ATTACKS:
        paths[case_id] = tmp_path / f"{case_id}.yaml"
        save_attack(paths[case_id], make)
    results = await asyncio.gather(*(config_validate(p) for p in paths.values()))
    outputs = dict(zip(paths, results, strict=True))
    # (exit code, lines, the rule named, a traceback) per file
    seen = {
        case_id: (code, output.count("\n"), reason in output, "Traceback" in output)
        for (case_id, _, reason), (code, output) in zip(CONFIG_ATTACKS, results, strict=True)
    }
    assert seen == {case[0]: (1, 1, True, False) for case in CONFIG_ATTACKS}, outputs
