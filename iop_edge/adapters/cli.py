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

The finish reason is always ``stop``. A non-zero exit, a kill, or a malformed output is
``upstream_error`` (502) carrying the tail of stderr; before any frame when the command fails
before its first output, from the frames otherwise.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
from collections.abc import AsyncGenerator, Iterator, Mapping, Sequence
from typing import Any

import orjson

from iop_edge.adapters.base import UpstreamCall, UpstreamReply, UpstreamStream, Usage
from iop_edge.adapters.cli_process import CliRun, CliTracker
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

__all__ = ["REQUEST_ID_ENV", "CliExecutor", "OutputDecoder", "render_prompt"]

REQUEST_ID_ENV = "IOP_EDGE_REQUEST_ID"
"""The environment variable that carries the edge's request id to the command."""


def render_prompt(messages: Sequence[Mapping[str, Any]]) -> str:
    """The conversation as the plain text a CLI reads on stdin (see the module docstring)."""
    if len(messages) == 1 and messages[0].get("role") == "user":
        return message_text(messages[0].get("content")) + "\n"
    blocks = [f"{m.get('role')}: {message_text(m.get('content'))}" for m in messages]
    return "\n\n".join(blocks) + "\n"


class MalformedOutput(Exception):
    """The CLI's stdout does not fit its ``output_format``."""


class OutputDecoder:
    """Turns stdout bytes into answer pieces for one ``output_format``; collects usage."""

    def __init__(self, output_format: str) -> None:
        self.format = output_format
        self.usage = Usage()
        self.answer_bytes = 0  # UTF-8 bytes of the answer so far (the completion estimate)
        self._text = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending = bytearray()
        self._emitted = False
        self._deltas = False
        self._line = 0

    def feed(self, data: bytes) -> list[str]:
        """Pieces of answer completed by ``data``."""
        if self.format == "text":
            self.answer_bytes += len(data)
            piece = self._text.decode(data)
            return [piece] if piece else []
        self._pending += data
        if self.format == "json":
            return []
        pieces: list[str] = []
        while (end := self._pending.find(b"\n")) >= 0:
            line = bytes(self._pending[:end])
            del self._pending[: end + 1]
            pieces.extend(self._stream_line(line))
        self._count(pieces)
        return pieces

    def _count(self, pieces: list[str]) -> None:
        for piece in pieces:
            self.answer_bytes += len(piece) if piece.isascii() else len(piece.encode())

    def estimate(self, prompt_tokens: int | None) -> None:
        """When the command reported no usage at all, fill it in with the edge's estimate (see
        the module docstring) and mark it estimated."""
        usage = self.usage
        if usage.prompt_tokens is None and usage.completion_tokens is None:
            usage.prompt_tokens = prompt_tokens
            usage.completion_tokens = -(-self.answer_bytes // 4)
            usage.estimated = True

    def end(self) -> list[str]:
        """Pieces left when stdout ended."""
        if self.format == "text":
            piece = self._text.decode(b"", final=True)
            return [piece] if piece else []
        if self.format == "json":
            pieces = self._json_object(bytes(self._pending))
        else:
            line, self._pending = bytes(self._pending), bytearray()
            pieces = self._stream_line(line)
        self._count(pieces)
        return pieces

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
    ) -> None:
        self._tracker = tracker
        self._label = label
        self._argv = tuple(argv) if argv else None
        self._env = dict(env)
        self._format = output_format
        self._timeout_ms = timeout_ms

    def _timeout(self, run: CliRun) -> AdapterError:
        return AdapterError(
            "upstream_timeout",
            f"{self._label} did not finish within request_timeout_ms={self._timeout_ms}; "
            "its process group was killed",
            status=504,
            failure="timeout",
            failover=run.silent,
        )

    def _malformed(self, run: CliRun, exc: MalformedOutput) -> AdapterError:
        tail = run.stderr_tail()
        return AdapterError(
            "upstream_error",
            f"{self._label} gave an unusable answer: {exc}"
            + (f"; stderr ends with: {tail}" if tail else ""),
        )

    async def _start(self, call: UpstreamCall) -> tuple[CliRun, float]:
        prompt = render_prompt(require_chat(call, self._label)).encode()
        refuse_unhonoured(call, "cli", self._label)
        if self._argv is None:
            raise AdapterError(
                "upstream_error",
                f"{self._label} has no command; set command on the provider or its adapter",
            )
        deadline = asyncio.get_running_loop().time() + self._timeout_ms / 1000
        env = {**self._env, REQUEST_ID_ENV: call.request_id}
        run = await CliRun.start(self._argv, env, prompt, self._label, self._tracker)
        return run, deadline

    @contextlib.contextmanager
    def _failures(self, run: CliRun) -> Iterator[None]:
        """The one place a run's failures are mapped: whatever ends the block early kills the
        run's group, then a timeout or a malformed output is raised as its AdapterError and
        anything else (a cancellation, a closed stream) as itself."""
        try:
            yield
        except BaseException as exc:
            run.abort()
            if isinstance(exc, TimeoutError):
                raise self._timeout(run) from exc
            if isinstance(exc, MalformedOutput):
                raise self._malformed(run, exc) from exc
            raise

    async def complete(self, call: UpstreamCall) -> UpstreamReply:
        """Run the command to its end and return its answer as a ``chat.completion``."""
        run, deadline = await self._start(call)
        decoder = OutputDecoder(self._format)
        pieces: list[str] = []
        with self._failures(run):
            async with asyncio.timeout_at(deadline):
                while chunk := await run.read():
                    pieces.extend(decoder.feed(chunk))
                await run.finish()
            pieces.extend(decoder.end())
        decoder.estimate(call.estimated_prompt_tokens)
        body = chat_completion(
            call.request_id, call.answer_model, "".join(pieces), "stop", decoder.usage
        )
        return UpstreamReply(200, body, decoder.usage)

    async def open_stream(self, call: UpstreamCall) -> UpstreamStream | UpstreamReply:
        """Start the command; the stream opens once it writes its first output.

        Waiting for that first output means a command that fails at once (bad arguments, a
        missing login) is a 502 before any frame. With ``output_format: json`` the whole
        answer is read first, as it only exists once the command ends.
        """
        run, deadline = await self._start(call)
        decoder = OutputDecoder(self._format)
        ready: list[str] = []
        ended = False
        with self._failures(run):
            async with asyncio.timeout_at(deadline):
                while not ready and not ended:
                    chunk = await run.read()
                    if chunk:
                        ready.extend(decoder.feed(chunk))
                        ended = self._format == "json"
                    else:
                        ended = True
                if ended:
                    while chunk := await run.read():
                        decoder.feed(chunk)
                    await run.finish()
                    ready.extend(decoder.end())
        chunks = ChatChunks(call.request_id, call.answer_model)
        frames = self._relay(
            run,
            deadline,
            decoder,
            chunks,
            ready,
            ended,
            include_usage(call.body),
            call.estimated_prompt_tokens,
        )

        async def close() -> None:
            run.abort()
            with contextlib.suppress(RuntimeError):  # see upstream_http.relay_lines
                await frames.aclose()

        return UpstreamStream(status=200, frames=frames, usage=decoder.usage, closer=close)

    async def _relay(
        self,
        run: CliRun,
        deadline: float,
        decoder: OutputDecoder,
        chunks: ChatChunks,
        ready: list[str],
        ended: bool,
        with_usage: bool,
        prompt_tokens: int | None,
    ) -> AsyncGenerator[bytes, None]:
        with self._failures(run):
            yield chunks.role()
            for piece in ready:
                yield chunks.content(piece)
            while not ended:
                async with asyncio.timeout_at(deadline):
                    chunk = await run.read()
                    if not chunk:
                        await run.finish()
                if chunk:
                    for piece in decoder.feed(chunk):
                        yield chunks.content(piece)
                    continue
                ended = True
                for piece in decoder.end():
                    yield chunks.content(piece)
            decoder.estimate(prompt_tokens)
            yield chunks.finish("stop")
            if with_usage:
                yield chunks.usage(decoder.usage)
            yield DONE_FRAME
