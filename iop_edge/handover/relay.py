"""The requests the old process of a handover relays to the new one, and the flags the OpenAI
surface reads while a handover runs and a drain ends.

Once old has handed its leases over (:mod:`iop_edge.handover.channel`), it admits nothing: a
request waiting in its queue, or arriving on a connection kept alive with it, is sent to the new
process with ``X-IOP-Handover: SECRET AGE`` (:data:`HANDOVER_HEADER`), and the answer is relayed
back as it comes, closing its connection (the client's next request opens one that new
accepts). New recognises the secret it gave old over the channel and admits the request as if
it had arrived ``AGE`` seconds ago: its place in the queue and its deadline are kept.

One :class:`HandoverRelay` per process; the server is given it at construction and reads it,
the coordinator (:mod:`iop_edge.handover.coordinator`) moves it: :meth:`~HandoverRelay.hand_to`
once the leases went, :meth:`~HandoverRelay.cut` when a drain runs out.
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Mapping
from typing import Final

import aiohttp
from aiohttp import web

from iop_edge.seams import Clock

__all__ = ["HANDOVER_HEADER", "HandoverRelay"]

HANDOVER_HEADER: Final = "X-IOP-Handover"
"""Carried by a request relayed from the process this one took over from: ``SECRET AGE``."""
#: hop-by-hop and per-connection headers, not relayed
#: (x-request-id is set anew: the id this process logged, so both logs share it)
_NOT_RELAYED: Final = frozenset(
    {
        "host",
        "content-length",
        "connection",
        "keep-alive",
        "transfer-encoding",
        "te",
        "upgrade",
        "x-request-id",
    }
)
_RELAYED_BACK: Final = frozenset(
    {"content-type", "retry-after", "x-request-id", "x-iop-provider", "cache-control"}
)
#: a relayed request's age is believed up to an hour (a bound against a bogus header)
_MAX_AGE: Final = 3600.0


class HandoverRelay:
    """The handover state of one process's OpenAI surface, and the relay to a successor."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        #: a handover: the URL of the process that took over (this one relays to it) ...
        self.successor: str | None = None
        #: ... and the secret a relayed request carries, with its age, in HANDOVER_HEADER:
        #: ours while we take over (:meth:`expect_relays`), the successor's once we hand over
        #: (:meth:`hand_to`)
        self.secret: str | None = None
        #: answers being relayed from the successor now
        self.relaying = 0
        #: requests the process we took over from relayed to us
        self.relayed_in = 0
        #: a drain ran out: the requests it cancels log 503 ``drain_timeout`` rather than 499
        #: ``client_gone``
        self.cutting = False
        self._session: aiohttp.ClientSession | None = None

    @property
    def handed_over(self) -> bool:
        """Whether this process handed over: it admits nothing, and relays."""
        return self.successor is not None

    # -- the coordinator's moves -------------------------------------------------------------

    def expect_relays(self) -> str:
        """A process started by a handover: make the secret its predecessor's relayed requests
        carry (sent over the channel), and recognise them from now on."""
        self.secret = secrets.token_urlsafe(24)
        return self.secret

    def hand_to(self, url: str, secret: str) -> None:
        """The leases went to the process at ``url``: relay what cannot be admitted here to it,
        carrying ``secret``."""
        self.successor = url
        self.secret = secret

    def cut(self) -> None:
        """The drain ran out: what is cancelled now is cut by the edge, not left by a client."""
        self.cutting = True

    # -- the request path --------------------------------------------------------------------

    def arrival(self, headers: Mapping[str, str]) -> float | None:
        """When a request relayed by the process this one took over from arrived there (on
        our clock), so that it keeps its place and its deadline; ``None`` for any other."""
        secret = self.secret
        if secret is None:  # (only a process started by a handover has one: no lookup)
            return None
        value = headers.get(HANDOVER_HEADER)
        if value is None:
            return None
        given, _, age = value.partition(" ")
        if not hmac.compare_digest(given.encode(), secret.encode()):
            return None
        try:
            waited = float(age)
        except ValueError:
            return None
        self.relayed_in += 1
        return self.clock.now() - max(0.0, min(waited, _MAX_AGE))

    async def forward(
        self, request: web.Request, request_id: str, arrived: float
    ) -> web.StreamResponse:
        """Send a request this process can no longer admit (it handed over) to the process
        that took over, with its age (since ``arrived``, on our clock) and under
        ``request_id``, and relay the answer as it comes."""
        assert self.successor is not None
        assert self.secret is not None
        raw = await request.read()  # (read before: aiohttp keeps the body)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _NOT_RELAYED}
        age = self.clock.now() - arrived
        headers[HANDOVER_HEADER] = f"{self.secret} {age:.6f}"
        headers["x-request-id"] = request_id
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=10)
            )
        url = self.successor + request.path_qs
        async with self._session.post(url, data=raw, headers=headers) as upstream:
            response = web.StreamResponse(
                status=upstream.status,
                headers={k: v for k, v in upstream.headers.items() if k.lower() in _RELAYED_BACK},
            )
            response.force_close()  # (before prepare: the header says so)
            self.relaying += 1
            try:
                await response.prepare(request)
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
            finally:
                self.relaying -= 1
        return response

    async def aclose(self) -> None:
        """Close the relay's connections (after a handover)."""
        if self._session is not None:
            await self._session.close()

    def __repr__(self) -> str:
        to = f" to {self.successor}" if self.successor else ""
        return f"<HandoverRelay{to}: {self.relaying} relaying, {self.relayed_in} relayed in>"
