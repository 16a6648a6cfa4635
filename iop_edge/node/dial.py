"""One dial of the edge by ``iop-node`` (design §2): the WebSocket upgrade with the node's
token, then ``HELLO`` → ``WELCOME`` → ``PAYLOAD`` → ``ACK``. What it ends with is a
:class:`Dialled` link, acknowledged and ready to serve, or one of two failures:

- :class:`Permanent` — trying again cannot help (exit 2): HTTP 401 (the token is unknown), a
  protocol version the edge does not speak (``WELCOME.protocol``, or the edge's
  ``REFUSED{protocol}``), both versions named; or exit 1: a payload this node cannot build
  (``ACK{error}`` first, close 4004).
- :class:`Retry` — anything else: the edge unreachable, a TLS failure, another HTTP status, a
  refusal of another kind, a violation by the edge.

The link's own limits replace the defaults it was dialled with as soon as ``WELCOME`` names them.
"""

from __future__ import annotations

import ssl as ssl_module
from dataclasses import dataclass
from typing import Final

import aiohttp
import pydantic

from iop_edge.adapters.registry import AdapterSet
from iop_edge.config.payload import NodeConfigPayload
from iop_edge.link.connection import LinkClosed, LinkConnection, client_options
from iop_edge.link.handshake import (
    Hello,
    LinkLimits,
    ProtocolMismatch,
    Welcome,
    parse_refused,
    parse_welcome,
)
from iop_edge.link.protocol import (
    CLOSE_NORMAL,
    CLOSE_PAYLOAD,
    CLOSE_PROTOCOL,
    CLOSE_VIOLATION,
    Frame,
    Kind,
    LinkViolation,
    optional_field,
    require_field,
)
from iop_edge.node.generations import PayloadCache, UnknownGeneration
from iop_edge.node.options import EXIT_FAILED, EXIT_REFUSED, NodeOptions
from iop_edge.seams import Clock

__all__ = ["HANDSHAKE_TIMEOUT", "Dialled", "Permanent", "Retry", "dial"]

HANDSHAKE_TIMEOUT: Final = 30.0
"""Seconds from the dial to the ``ACK``: the TCP and TLS connect, the upgrade, ``WELCOME`` and
``PAYLOAD`` (an edge that accepts and then says nothing is dialled again)."""


class Permanent(Exception):
    """The edge refused this node for good; ``exit_code`` is the program's (2, or 1 for a
    payload this node cannot build)."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class Retry(Exception):
    """The dial failed in a way another dial may not: try again after the backoff."""


@dataclass(frozen=True, slots=True)
class Dialled:
    """An acknowledged link: the edge's ``WELCOME``, the payload generation it runs, and that
    generation's adapters (held in the cache: release the generation once the link is done)."""

    link: LinkConnection
    welcome: Welcome
    generation: str
    adapters: AdapterSet


async def dial(
    http: aiohttp.ClientSession,
    options: NodeOptions,
    hello: Hello,
    cache: PayloadCache,
    *,
    clock: Clock,
    ssl: ssl_module.SSLContext | None = None,
) -> Dialled:
    """Dial ``options.link_url`` and go through the handshake; :class:`Permanent` or
    :class:`Retry` when it fails (the link is then closed)."""
    try:
        ws = await http.ws_connect(
            options.link_url,
            headers={"Authorization": f"Bearer {options.token}"},
            ssl=ssl if ssl is not None else True,
            **client_options(LinkLimits()),
        )
    except aiohttp.WSServerHandshakeError as exc:
        if exc.status == 401:
            raise Permanent(
                f"the edge at {options.edge} does not know this node's token (HTTP 401): the "
                f"token in {options.token_file} matches no nodes[].token_hash_sha256 there; "
                "print a new one with iop-edge token node --node ID",
                EXIT_REFUSED,
            ) from None
        raise Retry(f"the edge answered the upgrade with HTTP {exc.status}") from None
    except aiohttp.ClientConnectorCertificateError as exc:
        raise Retry(f"TLS verification of the edge failed: {exc.certificate_error}") from None
    except (aiohttp.ClientError, OSError) as exc:
        raise Retry(f"{type(exc).__name__}: {exc}") from None
    link = LinkConnection(ws, local="node", limits=LinkLimits(), clock=clock, peer=options.edge)
    try:
        return await _handshake(link, hello, cache)
    except BaseException:
        if not link.closed:  # (a stop, or the handshake's time ran out)
            await link.close(CLOSE_NORMAL, "handshake abandoned")
        raise


async def _handshake(link: LinkConnection, hello: Hello, cache: PayloadCache) -> Dialled:
    try:
        await link.send(Frame(Kind.HELLO, meta=hello.to_meta()))
        welcome = _welcome(await link.receive())
        link.limits = welcome.limits
        frame = await link.receive()
        if frame.kind is not Kind.PAYLOAD:
            raise LinkViolation("phase", f"the edge sent {frame.kind.name} before PAYLOAD")
        generation = require_field(frame.meta, "generation", str, "PAYLOAD")
        body = optional_field(frame.meta, "payload", dict, "PAYLOAD")
    except LinkViolation as exc:
        await link.close(CLOSE_VIOLATION, exc.reason)
        raise Retry(f"the edge broke the link protocol: {exc}") from None
    except ProtocolMismatch as exc:
        await link.close(CLOSE_PROTOCOL, "protocol")
        raise Permanent(str(exc), EXIT_REFUSED) from None
    except LinkClosed as exc:
        if exc.code == CLOSE_PROTOCOL:
            raise Permanent(
                f"the edge closed the link for a protocol version mismatch ({exc.reason}); "
                f"this iop-node speaks link protocol {hello.protocol}",
                EXIT_REFUSED,
            ) from None
        raise Retry(f"the edge closed the link during the handshake: {exc}") from None
    adapters = await _adapters(link, welcome, generation, body, cache)
    try:
        await link.send(Frame(Kind.ACK, meta={"generation": generation}))
    except BaseException as exc:
        await cache.release(generation)
        if isinstance(exc, LinkClosed):
            raise Retry(f"the edge closed the link before the ACK: {exc}") from None
        raise
    return Dialled(link, welcome, generation, adapters)


def _welcome(frame: Frame) -> Welcome:
    """The edge's ``WELCOME``; a ``REFUSED`` instead is :class:`Permanent` for another
    protocol version, :class:`Retry` otherwise."""
    if frame.kind is Kind.WELCOME:
        return parse_welcome(frame.meta)
    if frame.kind is Kind.REFUSED:
        refused = parse_refused(frame.meta)
        if refused.reason == "protocol":
            raise Permanent(
                f"the edge refused the link: {refused.message} (edge protocol "
                f"{refused.edge_protocol}, node protocol {refused.node_protocol})",
                EXIT_REFUSED,
            )
        raise Retry(f"the edge refused the link ({refused.reason}): {refused.message}")
    raise LinkViolation("phase", f"the edge answered HELLO with {frame.kind.name}")


async def _adapters(
    link: LinkConnection,
    welcome: Welcome,
    generation: str,
    body: dict[str, object] | None,
    cache: PayloadCache,
) -> AdapterSet:
    """The generation's adapters, held in ``cache``; a payload that does not build is told to
    the edge (``ACK{error}``, close 4004) and is :class:`Permanent` (exit 1)."""
    try:
        payload = None if body is None else NodeConfigPayload.model_validate(body)
        if payload is not None and payload.node_id != welcome.node_id:
            raise ValueError(
                f"the payload is node {payload.node_id!r}'s, but the edge welcomed this node "
                f"as {welcome.node_id!r}"
            )
        return cache.acquire(generation, payload)
    except UnknownGeneration as exc:
        # (released between HELLO and PAYLOAD: the next HELLO will not list it)
        await _refuse_payload(link, generation, str(exc))
        raise Retry(str(exc)) from None
    except (pydantic.ValidationError, ValueError, KeyError, TypeError) as exc:
        message = f"payload generation {generation!r} does not build on this node: {exc}"
        await _refuse_payload(link, generation, message)
        raise Permanent(message, EXIT_FAILED) from None


async def _refuse_payload(link: LinkConnection, generation: str, message: str) -> None:
    try:
        await link.send(Frame(Kind.ACK, meta={"generation": generation, "error": message}))
    except LinkClosed:
        return
    await link.close(CLOSE_PAYLOAD, "payload")
