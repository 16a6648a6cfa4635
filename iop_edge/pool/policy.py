"""The admission policy: what the scheduler is told about providers, model groups and the queue.

A :class:`PoolPolicy` is the live part of the config as the scheduler sees it. The config layer
builds it (defaults already applied, ``max_queue`` already normalized) and hands it to
:meth:`iop_edge.pool.PoolScheduler.apply_policy` on every live refresh. Both dataclasses check
their own bounds, so a policy that exists is one the scheduler can run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final, Literal

from iop_edge.errors import RETRY_CLASSES, FailureKind, RetryClass

ProviderKey = tuple[str, str]
"""A provider resource: ``(node_id, provider_id)``. Slots belong to this key."""

RETRY_CLASS_OF: Final[Mapping[FailureKind, RetryClass | None]] = MappingProxyType(
    {
        "connect": "connect",
        "dropped": "timeout_before_head",
        "timeout": "timeout_before_head",
        "status_5xx": "5xx",
        "exit": "5xx",
        "status_429": None,  # always fails over: the upstream refused, no work was done
        "protocol": None,  # never before the first byte: never fails over
    }
)
"""The one mapping of a failure's kind to its retry class (``None``: not up to ``retry_on``)."""


def may_retry(kind: FailureKind, retry_on: frozenset[str]) -> bool:
    """Whether a failure of ``kind`` before the client's first byte fails over from a provider
    whose rule is ``retry_on``: a 429 always; otherwise when its class is listed."""
    if kind == "status_429":
        return True
    retry_class = RETRY_CLASS_OF[kind]
    return retry_class is not None and retry_class in retry_on


@dataclass(frozen=True, slots=True)
class ProviderPolicy:
    """The scheduling policy of one provider resource ``node_id + provider_id``.

    ``capacity`` is the number of concurrent requests it takes; ``long_context_capacity`` how many
    of those may be long-context (a long-context request takes a long slot *and* a general one).
    A lower ``priority`` number is preferred. A disabled provider is never a dispatch candidate.
    ``probe`` says whether the provider has an active health check: an ejected provider with
    one is probed, and so is an idle one; one without gets a single trial request once its
    ejection ends. ``retry_on`` lists the :data:`RetryClass` es of failures that fail over to
    another provider (:func:`may_retry`). ``remote``: its node runs elsewhere and reaches the
    edge over a node link, so it starts disconnected and is a candidate only while that link
    is up (:meth:`iop_edge.pool.PoolScheduler.set_connected`); a local provider always is.
    """

    node_id: str
    provider_id: str
    capacity: int
    long_context_capacity: int
    priority: int
    enabled: bool
    probe: bool = False
    retry_on: frozenset[str] = frozenset(RETRY_CLASSES)
    remote: bool = False

    def __post_init__(self) -> None:
        where = f"provider {self.node_id}/{self.provider_id}"
        if self.capacity < 1:
            raise ValueError(f"{where}: capacity {self.capacity} is below 1")
        if not 0 <= self.long_context_capacity <= self.capacity:
            raise ValueError(
                f"{where}: long_context_capacity {self.long_context_capacity} is outside "
                f"0..capacity ({self.capacity})"
            )
        if self.priority < 0:
            raise ValueError(f"{where}: priority {self.priority} is negative")
        unknown = sorted(self.retry_on.difference(RETRY_CLASSES))
        if unknown:
            raise ValueError(f"{where}: retry_on {unknown} names no class of {RETRY_CLASSES}")

    @property
    def key(self) -> ProviderKey:
        """The resource key ``(node_id, provider_id)``."""
        return (self.node_id, self.provider_id)


@dataclass(frozen=True, slots=True)
class HealthPolicy:
    """When a provider is ejected and how it comes back (SPEC §5.1); times in milliseconds.

    ``failure_threshold`` consecutive failures eject a provider for ``eject_ms``; each
    re-ejection before a successful request doubles that, up to ``max_eject_ms``. A provider
    with a health check is probed every ``probe_interval_ms`` while it is ejected, and while it
    is idle (no attempt in flight, none ended for that long).
    """

    failure_threshold: int = 3
    eject_ms: int = 10_000
    max_eject_ms: int = 300_000
    probe_interval_ms: int = 2_000

    def __post_init__(self) -> None:
        for name in ("failure_threshold", "eject_ms", "max_eject_ms", "probe_interval_ms"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} {getattr(self, name)} is below 1")
        if self.max_eject_ms < self.eject_ms:
            raise ValueError(f"max_eject_ms {self.max_eject_ms} is below eject_ms {self.eject_ms}")

    @property
    def probe_interval_s(self) -> float:
        """``probe_interval_ms`` in seconds."""
        return self.probe_interval_ms / 1000.0

    def ejection_s(self, ejections: int) -> float:
        """How long the ``ejections``-th consecutive ejection lasts, in seconds."""
        doubled = self.eject_ms << min(ejections - 1, 32)
        return min(doubled, self.max_eject_ms) / 1000.0


StoreDownMode = Literal["static_split", "reject"]
"""What an edge sharing its pool does while the store does not answer: ``static_split``
serves with ``floor(capacity / members)`` of each provider, ``reject`` answers 503."""
STORE_DOWN_MODES: Final[tuple[StoreDownMode, ...]] = ("static_split", "reject")


@dataclass(frozen=True, slots=True)
class SharedPolicy:
    """The live policy of an edge that shares its pool with others through a store
    (``provider_pool.shared``; the store's URL is not here: it is restart-class and secret).

    ``lease_ttl_ms``: how long a lease that is no longer renewed (its edge died) still holds
    its slot; ``on_store_down``: a :data:`StoreDownMode`.
    """

    lease_ttl_ms: int = 10_000
    on_store_down: StoreDownMode = "static_split"

    def __post_init__(self) -> None:
        if self.lease_ttl_ms < 1:
            raise ValueError(f"lease_ttl_ms {self.lease_ttl_ms} is below 1")
        if self.on_store_down not in STORE_DOWN_MODES:
            raise ValueError(
                f"on_store_down {self.on_store_down!r} is not one of {STORE_DOWN_MODES}"
            )

    @property
    def lease_ttl_s(self) -> float:
        """``lease_ttl_ms`` in seconds."""
        return self.lease_ttl_ms / 1000.0


@dataclass(frozen=True, slots=True)
class PoolPolicy:
    """The whole admission policy of the edge.

    ``max_queue`` caps every pending request of the edge together (already normalized, >= 1);
    ``queue_timeout_ms`` is each pending request's maximum wait (0 = no timeout). ``providers``
    lists every provider in config order; ``groups`` maps each model group id to the keys of its
    providers in config order. ``groups`` is frozen into a read-only mapping on construction.
    ``max_attempts`` is how many distinct providers one request may try before its first byte
    (1: no failover); ``health`` says when providers are ejected. ``fair_share`` is how freed
    slots are shared among principals (:mod:`iop_edge.pool.fair`; ``none``: arrival order),
    ``weights``, ``caps`` (``max_in_flight``), ``queue_caps`` (``max_queued``) and
    ``per_minute`` (``max_requests_per_minute``) the configured principals' (others: weight 1,
    no limits). ``principals`` names the principals the config knows of (listed in the
    statistics even before their first request). ``derived`` maps each derived group (one that
    shares a model's providers: its ``/v1/completions`` or ``/v1/embeddings`` group) to its
    model's group: a derived group's panic is not reported on its own — one outage, one report.
    ``shared``: how the pool is shared with other edges through a store (``None``: it is not;
    this edge's slots are the only ones).
    """

    max_queue: int
    queue_timeout_ms: int
    providers: tuple[ProviderPolicy, ...]
    groups: Mapping[str, tuple[ProviderKey, ...]]
    max_attempts: int = 2
    health: HealthPolicy = HealthPolicy()
    fair_share: Literal["principal", "token", "none"] = "principal"
    weights: Mapping[str, float] = field(default_factory=dict)
    caps: Mapping[str, int] = field(default_factory=dict)
    queue_caps: Mapping[str, int] = field(default_factory=dict)
    per_minute: Mapping[str, int] = field(default_factory=dict)
    principals: tuple[str, ...] = ()
    derived: Mapping[str, str] = field(default_factory=dict)
    shared: SharedPolicy | None = None

    def __post_init__(self) -> None:
        if self.max_queue < 1:
            raise ValueError(f"max_queue {self.max_queue} is below 1")
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts {self.max_attempts} is below 1")
        if self.queue_timeout_ms < 0:
            raise ValueError(f"queue_timeout_ms {self.queue_timeout_ms} is negative")
        known: set[ProviderKey] = set()
        for provider in self.providers:
            if provider.key in known:
                raise ValueError(f"provider {'/'.join(provider.key)} is listed twice")
            known.add(provider.key)
        groups = {group_id: tuple(keys) for group_id, keys in self.groups.items()}
        for group_id, keys in groups.items():
            if len(set(keys)) != len(keys):
                raise ValueError(f"model group {group_id!r} lists a provider twice: {keys!r}")
            for key in keys:
                if key not in known:
                    raise ValueError(
                        f"model group {group_id!r} references provider {'/'.join(key)}, "
                        "which is not in the policy"
                    )
        for group_id, model in self.derived.items():
            if group_id not in groups or model not in groups:
                raise ValueError(
                    f"derived group {group_id!r} of {model!r}: both must be model groups"
                )
        # Frozen all the way down: a caller mutating its dict later cannot change a running policy.
        object.__setattr__(self, "groups", MappingProxyType(groups))
        object.__setattr__(self, "derived", MappingProxyType(dict(self.derived)))
        object.__setattr__(self, "weights", MappingProxyType(dict(self.weights)))
        object.__setattr__(self, "caps", MappingProxyType(dict(self.caps)))
        object.__setattr__(self, "queue_caps", MappingProxyType(dict(self.queue_caps)))
        object.__setattr__(self, "per_minute", MappingProxyType(dict(self.per_minute)))

    @property
    def queue_timeout_s(self) -> float | None:
        """The queue timeout in seconds, or ``None`` when pending requests never time out."""
        return self.queue_timeout_ms / 1000.0 if self.queue_timeout_ms else None
