"""The scheduler's policy from an effective config (pure): config → pool, nothing in between.

The reload path (supervisor → refresh → scheduler) maps a config to a :class:`PoolPolicy` here,
without passing through the HTTP package.
"""

from __future__ import annotations

from iop_edge.config.schema import EdgeConfig, SharedSection
from iop_edge.pool import ANONYMOUS, HealthPolicy, PoolPolicy, ProviderPolicy, SharedPolicy

__all__ = [
    "EMBEDDING_TYPES",
    "ROUTE_UNBOUNDED",
    "capable_group",
    "completions_group",
    "embedding_providers",
    "embeddings_group",
    "known_principals",
    "passthrough_providers",
    "pool_policy",
    "route_group",
    "route_provider",
    "shared_policy",
]

ROUTE_UNBOUNDED = 1_000_000
"""The slots of a model route without a ``capacity``: more than any edge runs at once."""


def passthrough_providers(config: EdgeConfig) -> set[str]:
    """The ids of the ``openai_compat`` providers: the only ones serving ``/v1/completions``."""
    return {p.id for n in config.nodes for p in n.providers if p.type == "openai_compat"}


def completions_group(model_id: str) -> str:
    """The scheduler group of a model's ``/v1/completions`` requests: its passthrough
    (``openai_compat``) providers only, sharing their slots with the chat group. The brackets
    cannot appear in a model id, so the name never collides."""
    return f"{model_id}[completions]"


EMBEDDING_TYPES = frozenset({"openai_compat", "ollama"})
"""The runtime types that serve ``/v1/embeddings`` (a ``cli`` provider cannot)."""


def embedding_providers(config: EdgeConfig) -> set[str]:
    """The ids of the providers that serve ``/v1/embeddings``: ``openai_compat`` and ``ollama``."""
    return {p.id for n in config.nodes for p in n.providers if p.type in EMBEDDING_TYPES}


def embeddings_group(model_id: str) -> str:
    """The scheduler group of a model's ``openai_compat`` and ``ollama`` providers (sharing
    their slots with the chat group): its ``/v1/embeddings`` requests, and the chat requests
    that its ``cli`` providers cannot honour (tools, sampling fields)."""
    return f"{model_id}[embeddings]"


def capable_group(model_id: str, capable: frozenset[str]) -> str:
    """The scheduler group of the providers of ``model_id`` whose runtime type is in
    ``capable`` — the types that honour a request, always ``openai_compat`` alone or with
    ``ollama`` when some type of the model refuses it (what ``cli`` honours, ``ollama`` does:
    see :mod:`iop_edge.adapters.fields`)."""
    if "ollama" in capable:
        return embeddings_group(model_id)
    return completions_group(model_id)


def route_group(model: str) -> str:
    """The scheduler group of a ``model_routes[]`` entry (brackets: never a model id)."""
    return f"{model}[route]"


def route_provider(model: str) -> str:
    """The provider id, in the scheduler and its statistics, of a route's slots."""
    return f"route:{model}"


def known_principals(config: EdgeConfig) -> tuple[str, ...]:
    """Every principal a request can be shared under (SPEC §5.2): the ``principals[]`` refs,
    and each token's ``principal_ref`` (its ``token_ref`` with ``fair_share: token``), or
    ``anonymous`` when no token is configured. Sorted; these bound the metrics' label values."""
    tokens = config.openai.principal_tokens
    by_token = config.provider_pool.fair_share == "token"
    names = {t.token_ref if by_token else t.principal_ref for t in tokens}
    names.update(p.ref for p in config.provider_pool.principals)
    if not tokens:
        names.add(ANONYMOUS)
    return tuple(sorted(names))


def shared_policy(shared: SharedSection | None) -> SharedPolicy | None:
    """The live part of ``provider_pool.shared`` (``None``: the pool is not shared). The
    store's URL stays in the config (``shared.store``): restart-class, and secret."""
    if shared is None:
        return None
    return SharedPolicy(lease_ttl_ms=shared.lease_ttl_ms, on_store_down=shared.on_store_down)


def pool_policy(config: EdgeConfig) -> PoolPolicy:
    """The scheduler's policy from an effective config: every provider, every model group, and
    for each model with passthrough providers its :func:`completions_group`, and with
    embedding providers its :func:`embeddings_group`."""
    nodes_of = {p.id: n.id for n in config.nodes for p in n.providers}
    passthrough = passthrough_providers(config)
    embedding = embedding_providers(config)
    pool = config.provider_pool
    health = pool.health
    groups = {g.id: tuple((nodes_of[r.id], r.id) for r in g.providers) for g in config.models}
    derived: dict[str, str] = {}  # (a model's panic is reported under the model alone)
    for g in config.models:
        keys = tuple((nodes_of[r.id], r.id) for r in g.providers if r.id in passthrough)
        if keys:
            groups[completions_group(g.id)] = keys
            derived[completions_group(g.id)] = g.id
        keys = tuple((nodes_of[r.id], r.id) for r in g.providers if r.id in embedding)
        if keys:
            groups[embeddings_group(g.id)] = keys
            derived[embeddings_group(g.id)] = g.id
    # A model route is admitted as a group of one provider of its own: its capacity (live),
    # no long-context slots, no health check (its outcomes are not reported).
    routes = tuple(
        ProviderPolicy(
            node_id=r.node or "",
            provider_id=route_provider(r.model),
            capacity=r.capacity or ROUTE_UNBOUNDED,
            long_context_capacity=0,
            priority=0,
            enabled=True,
        )
        for r in config.openai.model_routes
    )
    for r, provider in zip(config.openai.model_routes, routes, strict=True):
        groups[route_group(r.model)] = (provider.key,)
    return PoolPolicy(
        principals=known_principals(config),
        max_queue=pool.max_queue,
        queue_timeout_ms=pool.queue_timeout_ms,
        max_attempts=pool.failover.max_attempts,
        fair_share=pool.fair_share,
        weights={p.ref: float(p.weight) for p in pool.principals if p.weight != 1},
        caps={p.ref: p.max_in_flight for p in pool.principals if p.max_in_flight is not None},
        queue_caps={p.ref: p.max_queued for p in pool.principals if p.max_queued is not None},
        per_minute={
            p.ref: p.max_requests_per_minute
            for p in pool.principals
            if p.max_requests_per_minute is not None
        },
        health=HealthPolicy(
            failure_threshold=health.failure_threshold,
            eject_ms=health.eject_ms,
            max_eject_ms=health.max_eject_ms,
            probe_interval_ms=health.probe_interval_ms,
        ),
        providers=tuple(
            ProviderPolicy(
                node_id=n.id,
                provider_id=p.id,
                capacity=p.capacity,
                long_context_capacity=p.long_context_capacity,
                priority=p.priority,
                enabled=p.enabled,
                probe=p.health_check is not False,
                retry_on=frozenset(p.retry_on),
                remote=n.token_hash_sha256 is not None,
            )
            for n in config.nodes
            for p in n.providers
        )
        + routes,
        groups=groups,
        derived=derived,
        shared=shared_policy(pool.shared),
    )
