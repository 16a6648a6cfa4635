"""The ``cli`` adapter: a chat answered by a command-line agent (SPEC §7).

**Process**: ``command`` with ``args`` (``mode`` and ``resume_args`` are not used: every call
sends the whole conversation), in its own process group, with a minimal environment —
:data:`~iop_edge.adapters.cli_process.INHERITED_ENV` taken from the daemon, then the ``env``
execution field — and the daemon's working directory. See
:mod:`iop_edge.adapters.cli_process` for how a group is stopped and the output caps.

**Prompt** (stdin, UTF-8, then closed): a conversation of one user message is that message's
text alone, so ``cat`` echoes it and an agent reads a plain request. Anything longer is one
block per message, ``role: text``, separated by blank lines (``system: Be brief.\\n\\nuser:
hi``). Content parts are reduced to their text. The prompt ends with a newline.

An assistant turn's reasoning (``reasoning_content``, a thinking block of the Anthropic
surface) is left out of the prompt, on purpose: plain text has no place for it apart from the
answer, so written out it would read as something the assistant said — the corruption of a
thinking block into text that the translation must never do — and the agent reasons afresh on
every run (Anthropic's own API likewise drops earlier turns' thinking from a model's context).
The turn's text and the rest of the conversation are rendered as usual.

**Output** (stdout), by ``output_format``:

- ``text`` (default): all of stdout is the answer, streamed as it arrives.
- ``json``: stdout is one JSON object; the answer is its ``result`` (else ``content``) string;
  ``usage`` is read when present (OpenAI ``prompt_tokens``/``completion_tokens`` or
  Anthropic ``input_tokens``/``output_tokens``); ``"is_error": true`` fails the call.
- ``stream-json``: one JSON object per line, relayed as it arrives. Understood shapes:

  - iop-edge's own: ``{"type": "content", "content": "..."}`` per chunk, then
    ``{"type": "result", "usage": {...}}``;
  - Claude Code (``claude -p --output-format stream-json --verbose``):
    ``{"type": "assistant", "message": {"content": [{"type": "text", "text": "..."}]}}`` per
    assistant message (its text parts are the chunk), ``stream_event`` lines with
    ``content_block_delta`` / ``text_delta`` (with ``--include-partial-messages``; the
    complete assistant messages are then not repeated), and a final ``{"type": "result",
    "result": "...", "usage": {"input_tokens", "output_tokens"}, "is_error": false}`` whose
    ``result`` is used only when no chunk came before.

  Other line types (``system``, ``user`` tool results...) are skipped; a line that is not a
  JSON object fails the call.

**Request id**: the edge's request id is in the command's environment as
``IOP_EDGE_REQUEST_ID`` (an agent can log it or pass it on).

**Fields**: every field but ``messages`` is checked by
:func:`iop_edge.adapters.fields.refusal`: a CLI honours none of the sampling, format or tool
fields, so a request that sets one is a 400 naming it, before the command starts.

**Usage**: what the command reports (``json``, ``stream-json``); when it reports none at all,
the edge's estimate, marked ``Usage.estimated``: the prompt's is the request's input estimate
(:func:`iop_edge.api.bodies.estimate_input_tokens`, the one that classes long-context
requests), the completion's ``ceil(UTF-8 bytes of the answer / 4)`` by the same rule.

**Length**: ``max_completion_tokens`` (else ``max_tokens``) is enforced by the edge: once the
answer's estimate (``ceil(UTF-8 bytes / 4)``, as above) reaches it, the answer is cut there (at
most ``4 * max_tokens`` bytes, on a character boundary), the edge stops reading, ends the
process group and answers with ``finish_reason: "length"`` and the estimated usage. Otherwise
the finish reason is ``stop``.

**Bounds**: ``request_timeout_ms`` bounds the whole run; a streamed call also has its
provider's ``first_token_timeout_ms`` (to the first piece of answer: a failure before any frame,
which fails over) and ``stream_idle_timeout_ms`` (each wait for the next piece), on the
executor's shared timers (:mod:`iop_edge.adapters.deadlines`).

A non-zero exit, a kill, a timeout or a malformed output is ``upstream_error`` (502) or
``upstream_timeout`` (504) carrying the tail of stderr; before any frame when the command fails
before its first output, from the frames otherwise — never after a finish chunk or ``[DONE]``,
which come only after a clean exit (or a cut at the length limit). Whenever the edge ends a
group (a failure, a cancel, a cut) the call returns only once the group is reaped.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from typing import Any

import orjson

from iop_edge.adapters.base import (
    NO_NATIVE_APIS,
    UpstreamCall,
    UpstreamReply,
    UpstreamStream,
    Usage,
)
from iop_edge.adapters.cli_process import CliRun, CliTracker
from iop_edge.adapters.deadlines import Deadlines, Exchange
from iop_edge.adapters.fields import refuse_unhonoured
from iop_edge.adapters.openai_format import (
    DONE_FRAME,
    ChatChunks,
    chat_completion,
    include_usage,
    message_text,
    read_usage,
    require_chat,
)
from iop_edge.errors import AdapterError
from iop_edge.seams import Clock

__all__ = ["REQUEST_ID_ENV", "CliExecutor", "OutputDecoder", "max_tokens_of", "render_prompt"]

REQUEST_ID_ENV = "IOP_EDGE_REQUEST_ID"
"""The environment variable that carries the edge's request id to the command."""


def render_prompt(messages: Sequence[Mapping[str, Any]]) -> str:
    """The conversation as the plain text a CLI reads on stdin (see the module docstring):
    each message's ``content`` only, so an assistant turn's ``reasoning_content`` stays out."""
    if len(messages) == 1 and messages[0].get("role") == "user":
        return message_text(messages[0].get("content")) + "\n"
    blocks = [f"{m.get('role')}: {message_text(m.get('content'))}" for m in messages]
    return "\n\n".join(blocks) + "\n"


class MalformedOutput(Exception):
    """The CLI's stdout does not fit its ``output_format``."""


class OutputDecoder:
    """Turns stdout bytes into answer pieces for one ``output_format``; collects usage."""

    def __init__(self, output_format: str, max_tokens: int | None = None) -> None:
        self.format = output_format
        self.usage = Usage()
        self.answer_bytes = 0  # UTF-8 bytes of the answer so far (the completion estimate)
        #: the most bytes of answer whose estimate is ``max_tokens`` (None: no limit) ...
        self.limit = None if max_tokens is None else 4 * max_tokens
        #: ... and whether the answer reached it (cut there: the rest is dropped)
        self.cut = False
        self._text = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending = bytearray()
        self._emitted = False
        self._deltas = False
        self._line = 0

    def feed(self, data: bytes) -> list[str]:
        """Pieces of answer completed by ``data`` (nothing once the answer was :attr:`cut`)."""
        if self.cut:
            return []
        if self.format == "text":
            piece = self._text.decode(data)
            if self.limit is None:
                self.answer_bytes += len(data)
                return [piece] if piece else []
            return self._admit([piece] if piece else [])
        self._pending += data
        if self.format == "json":
            return []
        pieces: list[str] = []
        while (end := self._pending.find(b"\n")) >= 0:
            line = bytes(self._pending[:end])
            del self._pending[: end + 1]
            pieces.extend(self._stream_line(line))
        return self._admit(pieces)

    def _admit(self, pieces: list[str]) -> list[str]:
        """``pieces`` counted into :attr:`answer_bytes`, up to :attr:`limit`: the piece that
        reaches it is cut there (on a character boundary) and the rest dropped."""
        limit = self.limit
        if limit is None:
            for piece in pieces:
                self.answer_bytes += len(piece) if piece.isascii() else len(piece.encode())
            return pieces
        kept: list[str] = []
        for piece in pieces:
            size = len(piece) if piece.isascii() else len(piece.encode())
            room = limit - self.answer_bytes
            if size >= room:
                if size > room:
                    piece = piece.encode()[: max(room, 0)].decode(errors="ignore")
                    size = len(piece.encode())
                self.answer_bytes += size
                self.cut = True
                if piece:
                    kept.append(piece)
                return kept
            self.answer_bytes += size
            kept.append(piece)
        return kept

    def estimate(self, prompt_tokens: int | None) -> None:
        """When the command reported no usage at all, or its answer was :attr:`cut` (what it
        reported is not what the client got), fill it in with the edge's estimate (see the
        module docstring) and mark it estimated."""
        usage = self.usage
        if self.cut or (usage.prompt_tokens is None and usage.completion_tokens is None):
            usage.prompt_tokens = prompt_tokens
            usage.completion_tokens = -(-self.answer_bytes // 4)
            usage.estimated = True

    def end(self) -> list[str]:
        """Pieces left when stdout ended."""
        if self.format == "text":
            piece = self._text.decode(b"", final=True)
            return self._admit([piece] if piece else [])
        if self.format == "json":
            pieces = self._json_object(bytes(self._pending))
        else:
            line, self._pending = bytes(self._pending), bytearray()
            pieces = self._stream_line(line)
        return self._admit(pieces)

    def _json_object(self, raw: bytes) -> list[str]:
        try:
            answer = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise MalformedOutput(f"stdout is not one JSON object ({exc})") from exc
        if not isinstance(answer, dict):
            raise MalformedOutput("stdout is JSON but not an object")
        read_usage(answer.get("usage"), self.usage)
        text = answer.get("result", answer.get("content"))
        if answer.get("is_error") is True:
            raise MalformedOutput(f"the command reported an error: {str(text)[:500]}")
        if not isinstance(text, str):
            raise MalformedOutput('the JSON object has no "result" or "content" string')
        return [text]

    def _stream_line(self, raw: bytes) -> list[str]:
        self._line += 1
        if not raw.strip():
            return []
        try:
            item = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise MalformedOutput(
                f"stdout line {self._line} is not JSON ({exc}): {raw[:200]!r}"
            ) from exc
        if not isinstance(item, dict):
            raise MalformedOutput(f"stdout line {self._line} is not a JSON object")
        pieces = self._pieces(item)
        if pieces:
            self._emitted = True
        return pieces

    def _pieces(self, item: dict[str, Any]) -> list[str]:
        kind = item.get("type")
        if kind == "content":
            content = item.get("content")
            return [content] if isinstance(content, str) and content else []
        if kind == "stream_event":
            event = item.get("event")
            delta = event.get("delta") if isinstance(event, dict) else None
            if isinstance(delta, dict) and delta.get("type") == "text_delta":
                self._deltas = True
                text = delta.get("text")
                return [text] if isinstance(text, str) and text else []
            return []
        if kind == "assistant" and not self._deltas:
            message = item.get("message")
            parts = message.get("content") if isinstance(message, dict) else None
            text = message_text(parts) if isinstance(parts, list | str) else ""
            return [text] if text else []
        if kind == "result":
            read_usage(item.get("usage"), self.usage)
            result = item.get("result")
            if item.get("is_error") is True:
                raise MalformedOutput(f"the command reported an error: {str(result)[:500]}")
            if not self._emitted and isinstance(result, str) and result:
                return [result]
        return []


def max_tokens_of(body: Mapping[str, Any]) -> int | None:
    """The answer's token limit: ``max_completion_tokens``, else ``max_tokens`` (None:
    neither)."""
    limit = body.get("max_completion_tokens")
    if limit is None:
        limit = body.get("max_tokens")
    return limit if type(limit) is int and limit >= 0 else None


class CliExecutor:
    """Runs chat calls through one command-line agent (see the module docstring)."""

    def __init__(
        self,
        tracker: CliTracker,
        label: str,
        argv: Sequence[str] | None,
        env: Mapping[str, str],
        output_format: str,
        timeout_ms: int,
        clock: Clock | None = None,
    ) -> None:
        self._tracker = tracker
        self._label = label
        self._argv = tuple(argv) if argv else None
        self._env = dict(env)
        self._format = output_format
        self._deadlines = Deadlines(timeout_ms, clock)

    @property
    def native_apis(self) -> frozenset[str]:
        """None: an agent's requests are translated to its prompt."""
        return NO_NATIVE_APIS

    def _timeout(self, run: CliRun, exchange: Exchange) -> AdapterError:
        return exchange.timeout_error(
            self._label, answered=not run.silent, after="; its process group was killed"
        )

    def _malformed(self, run: CliRun, exc: MalformedOutput) -> AdapterError:
        tail = run.stderr_tail()
        return AdapterError(
            "upstream_error",
            f"{self._label} gave an unusable answer: {exc}"
            + (f"; stderr ends with: {tail}" if tail else ""),
        )

    async def _start(self, call: UpstreamCall) -> tuple[CliRun, Exchange, OutputDecoder]:
        prompt = render_prompt(require_chat(call, self._label)).encode()
        refuse_unhonoured(call, "cli", self._label)
        if self._argv is None:
            raise AdapterError(
                "upstream_error",
                f"{self._label} has no command; set command on the provider or its adapter",
            )
        env = {**self._env, REQUEST_ID_ENV: call.request_id}
        run = await CliRun.start(self._argv, env, prompt, self._label, self._tracker)
        exchange = self._deadlines.start(call.bounds if call.stream else None)
        return run, exchange, OutputDecoder(self._format, max_tokens_of(call.body))

    @contextlib.asynccontextmanager
    async def _failures(self, run: CliRun, exchange: Exchange) -> AsyncIterator[None]:
        """The one place a run's failures are mapped: whatever ends the block early kills the
        run's group and waits until it is gone (the call ends, and its slot is released, only
        then), then a timeout or a malformed output is raised as its AdapterError and anything
        else (a cancellation, a closed stream) as itself."""
        try:
            yield
        except BaseException as exc:
            run.abort()
            timed_out = isinstance(exc, asyncio.CancelledError) and exchange.timed_out()
            exchange.end()
            await run.stopped()
            if timed_out:
                raise self._timeout(run, exchange) from None
            if isinstance(exc, MalformedOutput):
                raise self._malformed(run, exc) from exc
            raise

    @staticmethod
    async def _cut(run: CliRun, exchange: Exchange) -> None:
        """The answer reached ``max_tokens``: stop reading, end the group, wait until gone."""
        run.abort()
        exchange.end()
        await run.stopped()

    async def count_tokens(
        self,
        chat_body: dict[str, Any],
        target: str,
        headers: Mapping[str, str],
        request_id: str,
    ) -> int | None:
        """Always ``None``: a command-line agent has no tokenizer to ask (the edge estimates,
        as it does for a CLI's usage)."""
        return None

    async def complete(self, call: UpstreamCall) -> UpstreamReply:
        """Run the command to its end (or its answer to ``max_tokens``) and return its answer
        as a ``chat.completion``."""
        run, exchange, decoder = await self._start(call)
        pieces: list[str] = []
        async with self._failures(run, exchange):
            while chunk := await run.read():
                pieces.extend(decoder.feed(chunk))
                if decoder.cut:
                    break
            if decoder.cut:
                await self._cut(run, exchange)
            else:
                await run.finish()
                pieces.extend(decoder.end())
        exchange.end()
        decoder.estimate(call.estimated_prompt_tokens)
        finish = "length" if decoder.cut else "stop"
        body = chat_completion(
            call.request_id, call.answer_model, "".join(pieces), finish, decoder.usage
        )
        return UpstreamReply(200, body, decoder.usage)

    async def open_stream(self, call: UpstreamCall) -> UpstreamStream | UpstreamReply:
        """Start the command; the stream opens once it writes its first piece of answer.

        Waiting for that first output means a command that fails at once (bad arguments, a
        missing login) — or writes nothing within ``first_token_timeout_ms`` — is a failure
        before any frame, which may fail over. With ``output_format: json`` the whole answer
        is read first, as it only exists once the command ends.
        """
        run, exchange, decoder = await self._start(call)
        ready: list[str] = []
        ended = False
        async with self._failures(run, exchange):
            while not ready and not ended:
                chunk = await run.read()
                if chunk:
                    ready.extend(decoder.feed(chunk))
                    ended = self._format == "json" or decoder.cut
                else:
                    ended = True
            if decoder.cut:
                await self._cut(run, exchange)
            elif ended:
                while chunk := await run.read():
                    decoder.feed(chunk)
                await run.finish()
                ready.extend(decoder.end())
        chunks = ChatChunks(call.request_id, call.answer_model)
        frames = self._relay(
            run,
            exchange,
            decoder,
            chunks,
            ready,
            ended or decoder.cut,
            include_usage(call.body),
            call.estimated_prompt_tokens,
        )

        async def close() -> None:
            run.abort()
            exchange.end()
            with contextlib.suppress(RuntimeError):  # see relay.relay_lines
                await frames.aclose()
            await run.stopped()

        return UpstreamStream(
            status=200,
            frames=frames,
            usage=decoder.usage,
            closer=close,
            timed_out=exchange.timed_out,
        )

    async def _relay(
        self,
        run: CliRun,
        exchange: Exchange,
        decoder: OutputDecoder,
        chunks: ChatChunks,
        ready: list[str],
        ended: bool,
        with_usage: bool,
        prompt_tokens: int | None,
    ) -> AsyncGenerator[bytes, None]:
        # The finish chunk and [DONE] come only after a clean end (or a cut at max_tokens):
        # a failure raises out of the block before them.
        try:
            async with self._failures(run, exchange):
                exchange.yielding()
                yield chunks.role() + b"".join(map(chunks.content, ready))
                exchange.waiting()
                while not ended:
                    chunk = await run.read()
                    if chunk:
                        pieces = decoder.feed(chunk)
                        if pieces:
                            exchange.yielding()
                            yield b"".join(map(chunks.content, pieces))
                            exchange.waiting()
                        if decoder.cut:
                            await self._cut(run, exchange)
                            break
                        continue
                    ended = True
                    await run.finish()
                    pieces = decoder.end()
                    if pieces:
                        exchange.yielding()
                        yield b"".join(map(chunks.content, pieces))
                decoder.estimate(prompt_tokens)
                ending = chunks.finish("length" if decoder.cut else "stop")
                if with_usage:
                    ending += chunks.usage(decoder.usage)
                exchange.yielding()
                yield ending + DONE_FRAME
        finally:
            exchange.end()
