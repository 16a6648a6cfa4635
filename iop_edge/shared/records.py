"""The values the shared store answers (leases, grants, releases, views), its statistics
snapshot, and the URL as shown to people. Plain frozen data; the client is :mod:`.store`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, Literal, cast
from urllib.parse import parse_qsl, urlencode, urlsplit

import orjson

__all__ = [
    "HIDDEN",
    "LATENCY_BUCKETS",
    "Grant",
    "LeaseRef",
    "ProviderView",
    "Released",
    "StoreStatistics",
    "StoreView",
    "decode_released",
    "redact_store_url",
]

#: the upper bounds (seconds) of the latency histogram's buckets; ``+Inf`` is implied
LATENCY_BUCKETS: Final = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
#: what a password is shown as
HIDDEN: Final = "***"


@dataclass(frozen=True, slots=True)
class LeaseRef:
    """One lease: its id (``{instance_id}:{seq}``), the provider (``node/provider``) whose
    slot it holds, whether it also holds a long-context slot, and the principal whose
    in-flight count it is part of (``None``: counted for no principal)."""

    lease_id: str
    provider: str
    long: bool = False
    principal: str | None = None

    @property
    def instance(self) -> str:
        """The instance that took it: its id's part before the first ``:``."""
        return self.lease_id.partition(":")[0]


@dataclass(frozen=True, slots=True)
class Grant:
    """What ``acquire`` did: granted, or refused by the first full limit (``provider``,
    ``long`` or ``principal``), and the live counts after it (the lease included if granted;
    ``principal_held`` is 0 for a lease without a principal)."""

    granted: bool
    refused: Literal["provider", "long", "principal"] | None
    held: int
    long_held: int
    principal_held: int
    #: orders every answer about these counts (the store's counter when it answered)
    version: int = field(default=0, compare=False)
    #: of those counts, the leases of the instance that asked (general, long, principal)
    mine: tuple[int, int, int] = field(default=(0, 0, 0), compare=False)


@dataclass(frozen=True, slots=True)
class Released:
    """A release as the store published it: the counts left after it, and the instance whose
    lease it was."""

    provider: str
    held: int
    long_held: int
    principal: str | None
    principal_held: int
    instance: str
    #: orders every answer about these counts (the store's counter when it answered)
    version: int = field(default=0, compare=False)
    #: the leases of the instance that asked (the reply to its release; a message: ``None``)
    mine: tuple[int, int, int] | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class ProviderView:
    """A provider's live leases in the store: general, long-context, and the general ones by
    instance id."""

    held: int
    long_held: int
    held_by: Mapping[str, int]
    #: the long-context leases of the instance that asked
    long_mine: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class StoreView:
    """The live counts of the providers and principals asked about, and the live members."""

    providers: Mapping[str, ProviderView]
    principals: Mapping[str, int]
    members: int
    #: orders every answer about these counts (the store's counter when it answered)
    version: int = field(default=0, compare=False)
    #: each principal's leases of the instance that asked
    principals_mine: Mapping[str, int] = field(default_factory=dict, compare=False)


@dataclass(frozen=True, slots=True)
class StoreStatistics:
    """The client's counters since it was made: calls and failures per operation (every
    :data:`OPS` present), and one latency histogram of every call, answered or failed.
    ``latency_counts[i]`` counts the calls that took at most ``LATENCY_BUCKETS[i]`` seconds
    (cumulative, as Prometheus wants; ``latency_count`` is the ``+Inf`` bucket).
    ``last_error`` is the message of the last failure, ``None`` once a call succeeded after it.
    """

    calls: Mapping[str, int]
    errors: Mapping[str, int]
    latency_buckets: tuple[float, ...]
    latency_counts: tuple[int, ...]
    latency_sum: float
    latency_count: int
    last_error: str | None


def redact_store_url(url: str) -> str:
    """``url`` with its password hidden: ``redis://:***@host:6379/0``; a user name alone too
    (``redis://***@host``: a token is sometimes passed that way, as the config's redaction
    says); in a ``unix://`` URL the ``password`` query parameter too."""
    parts = urlsplit(url)
    netloc = parts.netloc
    user, at, host = netloc.rpartition("@")
    if parts.password is not None:
        name = user.partition(":")[0]
        netloc = f"{name}:{HIDDEN}@{host}"
    elif at:
        netloc = f"{HIDDEN}@{host}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        query = urlencode(
            [(k, HIDDEN if k.lower() == "password" else v) for k, v in pairs], safe="*"
        )
    # (by hand: urlunsplit drops the "//" of an empty host, and unix:///path needs it)
    shown = f"{parts.scheme}://{netloc}{parts.path}"
    if query:
        shown += f"?{query}"
    if parts.fragment:
        shown += f"#{parts.fragment}"
    return shown


def decode_released(data: object) -> Released | None:
    """A release message as :data:`scripts.RELEASE` publishes it (``None``: not one)."""
    try:
        provider, held, long_held, principal, principal_held, instance, version = orjson.loads(
            cast("str | bytes", data)
        )
        return Released(
            provider=str(provider),
            held=int(held),
            long_held=int(long_held),
            principal=str(principal) or None,
            principal_held=int(principal_held),
            instance=str(instance),
            version=int(version),
        )
    except (TypeError, ValueError):
        return None
