"""The one stream relay of the HTTP adapters: an upstream's lines in, the client's frames out.

:func:`relay_lines` reads the 200 response of a streamed POST
(:func:`iop_edge.adapters.upstream_http.post_for_stream`) and owns everything but the stream
format: batching what arrived together into one write, the bounds of its
:class:`~iop_edge.adapters.deadlines.Exchange` (the first write meets the first-token bound;
the idle bound counts each wait for the network, not the time a write waits for the client),
failure mapping, and releasing the connection after a clean end only. Each adapter gives only a
:class:`LineTranslator` (``openai_compat``: SSE, ``ollama``: NDJSON).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator
from typing import Final, Protocol

import aiohttp

from iop_edge.adapters.base import UpstreamStream, Usage
from iop_edge.adapters.deadlines import Exchange
from iop_edge.adapters.upstream_http import (
    HttpTarget,
    ResponseTooLarge,
    connection_closed,
    connection_protocol,
    exchange_failure,
)

__all__ = ["MAX_BATCH_BYTES", "MAX_FRAME_BYTES", "LineTranslator", "relay_lines"]

MAX_FRAME_BYTES: Final = 4 * 1024 * 1024
"""Cap on one line of an upstream stream (an SSE line or an NDJSON object)."""

#: Frames that arrived together are relayed in one write up to this size: a burst of small
#: frames costs one system call, while a slow client still pushes back within about one frame.
MAX_BATCH_BYTES: Final = 16 * 1024


class LineTranslator(Protocol):
    """One upstream stream format (SSE, NDJSON): turns its lines into the client's frames.

    :func:`relay_lines` owns everything else — batching, the deadline, failure mapping, and
    releasing or closing the connection — so an adapter gives only this.

    A translator may also have ``translate_read(read: bytes, frames: list[bytes]) -> None``,
    which appends the frames of a network read's whole lines (``read`` ends in ``\\n``) at
    once, stopping at the line that sets :attr:`done` (the SSE translator relays runs of
    ordinary events that way); a read is then one write, however large.
    """

    done: bool
    """Set by :meth:`translate` on the line that ends the answer; nothing is read after it."""

    unfinished: str
    """The reason in the ``upstream_error`` when the body ends before :attr:`done`."""

    def translate(self, line: bytes) -> bytes:
        """The frames (possibly ``b""``) for one line of the body, without its ``\\n`` (a
        ``\\r`` stays). Raises for a line that breaks the protocol (an AdapterError is raised
        as is)."""
        ...


def relay_lines(
    response: aiohttp.ClientResponse,
    target: HttpTarget,
    url: str,
    exchange: Exchange,
    translator: LineTranslator,
    usage: Usage,
    first: bytes = b"",
) -> UpstreamStream:
    """Relay the 200 ``response`` of a streamed POST through ``translator`` as an
    :class:`UpstreamStream` whose frames start with ``first`` (an adapter's own opening frame,
    sent with the upstream's first frames, never alone); ``usage`` is the object the
    translator fills. See :func:`_relay` for the rules."""
    frames = _relay(response, target, url, exchange, translator, first)
    protocol = connection_protocol(response)

    async def close() -> None:
        exchange.end()
        response.close()
        # Runs the generator's cleanup if it is suspended; one running in another task fails
        # on its own now that the connection is closed.
        with contextlib.suppress(RuntimeError):
            await frames.aclose()
        if not translator.done:  # (a stream read to its end went back to the pool)
            await connection_closed(protocol)

    return UpstreamStream(
        status=200, frames=frames, usage=usage, closer=close, timed_out=exchange.timed_out
    )


async def _relay(
    response: aiohttp.ClientResponse,
    target: HttpTarget,
    url: str,
    exchange: Exchange,
    translator: LineTranslator,
    first: bytes,
) -> AsyncGenerator[bytes, None]:
    """The frames of a streamed answer, line by line through ``translator``.

    - Each read from the network is split into its whole lines at once (the rest waits for the
      next read; one line is capped at :data:`MAX_FRAME_BYTES`), and the frames translated from
      them are yielded as one write, cut at :data:`MAX_BATCH_BYTES` (a write per event was most
      of a streamed request's CPU, and an ``await`` per line a tenth of it).
    - ``exchange`` (from :func:`post_for_stream`) bounds it all, and ends with it: the first
      write meets the first-token bound; the idle bound counts each wait for the network, not
      the time a write waits for the client.
    - A failure yields what was translated before it (it is still the client's; ``first``
      alone is not), then raises the mapped :class:`~iop_edge.errors.AdapterError` (the
      timeout of the bound that passed, once one has); an end before
      :attr:`LineTranslator.done` is such a failure. Nothing marks the answer finished then:
      the translator's ending frames come only with :attr:`LineTranslator.done`.
    - A stream read to its end goes back to the pool; anything else closes the connection.
    """
    ready: list[bytes] = [first] if first else []  # translated, not yet yielded
    held = len(ready)  # ``first``, which waits for the upstream's first frames
    size = len(first)
    content = response.content
    partial = b""  # the start of a line whose end has not arrived
    translate = translator.translate
    translate_read = getattr(translator, "translate_read", None)
    try:
        while True:
            if len(ready) > held:
                exchange.yielding()
                yield b"".join(ready)  # then wait for the network
                exchange.waiting()
                ready.clear()
                size = held = 0
            chunk = await content.readany()
            if not chunk:
                if partial:  # the last line, without its newline
                    frame = translate(partial)
                    if frame:
                        ready.append(frame)
                    if translator.done:
                        exchange.yielding()
                        yield b"".join(ready)
                        return
                raise target.broken(url, translator.unfinished)
            if partial:
                chunk = partial + chunk
            end = chunk.rfind(b"\n") + 1
            partial = chunk[end:]
            if len(partial) > MAX_FRAME_BYTES:
                raise ResponseTooLarge(
                    f"a line of the stream exceeds the {MAX_FRAME_BYTES}-byte limit"
                )
            if not end:
                continue
            whole = chunk[:end]
            if translate_read is not None:
                translate_read(whole, ready)
                if translator.done:
                    exchange.yielding()
                    yield b"".join(ready)
                    return
                continue
            lines = whole.split(b"\n")
            lines.pop()  # (the empty rest after the last newline)
            for line in lines:
                frame = translate(line)
                if frame:
                    ready.append(frame)
                    size += len(frame)
                    if size >= MAX_BATCH_BYTES:
                        exchange.yielding()
                        yield b"".join(ready)
                        exchange.waiting()
                        ready.clear()
                        size = held = 0
                if translator.done:
                    exchange.yielding()
                    yield b"".join(ready)
                    return
    except Exception as exc:
        if len(ready) > held:
            exchange.yielding()
            yield b"".join(ready)
        failure = exchange_failure(exchange, target, url, exc)
        if failure is exc:
            raise
        raise failure from exc
    finally:
        exchange.end()
        (response.release if translator.done else response.close)()
