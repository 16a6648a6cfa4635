"""A translated stream on its way to the client: the adapter's chat frames through a surface's
stream translator (Anthropic Messages', OpenAI Responses'), as they come.

:func:`translated_frames` is the one relay loop of every translating renderer. An answer the
translation finds broken (tool arguments that are not JSON, a stream that ends without a finish)
ends with the surface's error event — the translator renders it — and then raises
:class:`~iop_edge.errors.AdapterError` with ``error_relayed``, so the request path records the
failure and writes nothing more; a clean end calls ``finished`` (the Responses surface stores
the response then).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Protocol

from iop_edge.errors import AdapterCode, AdapterError
from iop_edge.translate.events import Failure

__all__ = ["StreamTranslator", "translated_frames"]


class StreamTranslator(Protocol):
    """A surface's stream translator (Messages', Responses')."""

    @property
    def failure(self) -> Failure | None:
        """The failure the decoded answer ended with (its error event rendered), if any."""
        ...

    def feed(self, frames: bytes) -> bytes:
        """The client's bytes for a batch of the adapter's frames (may be empty)."""
        ...

    def end(self) -> bytes:
        """The adapter's frames ended cleanly: the client's last bytes."""
        ...


async def translated_frames(
    translator: StreamTranslator,
    frames: AsyncIterator[bytes],
    finished: Callable[[], None] | None = None,
) -> AsyncIterator[bytes]:
    """The client's stream of the adapter's chat ``frames`` (see the module docstring)."""
    async for frame in frames:
        out = translator.feed(frame)
        if out:
            yield out
        if translator.failure is not None:
            break
    else:
        out = translator.end()
        if out:
            yield out
    failure = translator.failure
    if failure is not None:
        # The answer broke: its error event is out; the request path records the failure.
        code: AdapterCode = (
            "upstream_timeout" if failure.code == "upstream_timeout" else "upstream_error"
        )
        raise AdapterError(code, failure.message, failure=None, error_relayed=True)
    if finished is not None:
        finished()
