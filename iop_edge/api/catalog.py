"""The model catalog the OpenAI surface serves from: one immutable snapshot per running config.

A refresh builds a new :class:`Catalog` and swaps it in together with the scheduler's new
policy, in one step of the event loop, so no request sees half a config. Pure: built from an
effective config, no I/O.

``GET /v1/models`` lists the model groups with at least one enabled provider, each followed by
its aliases (``models[].aliases``, entries of their own), and every model route; in OpenAI's
shape, or in Anthropic's (:meth:`Catalog.anthropic_page`, paginated as Anthropic's is). A
model's ``created`` is the Unix time this process first loaded its id (the caller keeps those
times across refreshes, see :func:`build_catalog`): stable across reloads, and a model a
refresh adds is newer than the ones loaded at start, as a client sorting by ``created``
expects.

A request's model resolves here too: an alias is another name of its group, so
:attr:`Catalog.models` maps it to the group's own entry (whose ``id`` is the group id: one
scheduler group, one set of providers), and a principal's allow-list that names any name of a
group admits all of them (:meth:`Catalog.permits`); :func:`admission_group` (the providers of
the model that serve the request) and :func:`model_not_found`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from iop_edge.adapters.base import Endpoint, StreamBounds
from iop_edge.adapters.fields import refusal
from iop_edge.api.model_list import (
    ANTHROPIC_DEFAULT_LIMIT,
    ListedModel,
    anthropic_list_body,
    listed_model,
    openai_list_body,
)
from iop_edge.config.policy import (
    EMBEDDING_TYPES,
    capable_group,
    completions_group,
    embeddings_group,
)
from iop_edge.config.schema import EdgeConfig, ModelGroup
from iop_edge.errors import RequestError


@dataclass(frozen=True, slots=True)
class ModelEntry:
    """A ``models[]`` group as the request path needs it."""

    id: str
    display_name: str | None
    context_window_tokens: int
    default_max_tokens: int | None
    min_max_tokens: int | None
    default_thinking_token_budget: int | None
    #: provider id → upstream model name
    targets: Mapping[str, str]
    #: True when at least one provider is OpenAI-compatible (``/v1/completions`` needs one)
    serves_completions: bool
    #: True when at least one provider is ``openai_compat`` or ``ollama`` (``/v1/embeddings``)
    serves_embeddings: bool = False
    #: the runtime types of its providers (``openai_compat``, ``ollama``, ``cli``)
    kinds: frozenset[str] = frozenset({"openai_compat"})
    #: True when a provider is not ``openai_compat``: its requests' fields are checked
    normalized: bool = False
    #: the group's other names (``models[].aliases``), each resolving to this entry
    aliases: tuple[str, ...] = ()

    @classmethod
    def from_group(cls, group: ModelGroup, types: Mapping[str, str]) -> ModelEntry:
        """Build from an effective config's model group (targets already resolved);
        ``types`` maps every provider id of the config to its runtime type."""
        kinds = frozenset(types[ref.id] for ref in group.providers)
        return cls(
            id=group.id,
            display_name=group.display_name,
            context_window_tokens=group.context_window_tokens,
            default_max_tokens=group.default_max_tokens,
            min_max_tokens=group.min_max_tokens,
            default_thinking_token_budget=group.default_thinking_token_budget,
            targets=MappingProxyType({ref.id: ref.target or ref.id for ref in group.providers}),
            serves_completions="openai_compat" in kinds,
            serves_embeddings=not kinds.isdisjoint(EMBEDDING_TYPES),
            kinds=kinds,
            normalized=kinds != {"openai_compat"},
            aliases=group.aliases,
        )


@dataclass(frozen=True, slots=True)
class RouteEntry:
    """An ``openai.model_routes[]`` entry: a fixed adapter instance and upstream target."""

    model: str
    node_id: str
    adapter: str
    target: str


@dataclass(frozen=True, slots=True)
class Catalog:
    """Everything the request path reads from the config, resolved once."""

    #: every model id and alias → its group's entry (an alias's ``entry.id`` is the group id)
    models: Mapping[str, ModelEntry]
    routes: Mapping[str, RouteEntry]
    long_context_threshold_tokens: int
    #: provider id → node id (every provider, enabled or not)
    provider_nodes: Mapping[str, str]
    #: the listed model ids, aliases and route ids → their ``created`` (Unix time first loaded)
    listed: Mapping[str, int]
    models_body: bytes = field(repr=False)
    #: ``provider_pool.fair_share``: whose share a request counts in (see :meth:`share_of`)
    fair_share: str = "principal"
    #: principal (or token) ref → the model ids, aliases and route ids it may use (every name
    #: of a group its allow-list names by any of them); absent: all
    allowed: Mapping[str, frozenset[str]] = field(default_factory=dict)
    #: the ``/v1/models`` body of each ref with an allow-list
    allowed_bodies: Mapping[str, bytes] = field(default_factory=dict, repr=False)
    #: what ``GET /v1/models`` lists, in order: every listed entry, and those of each ref
    #: with an allow-list
    listing: tuple[ListedModel, ...] = ()
    allowed_listings: Mapping[str, tuple[ListedModel, ...]] = field(default_factory=dict)
    #: provider id → its stream bounds (live), for the providers that set one
    stream_bounds: Mapping[str, StreamBounds] = field(default_factory=dict)
    #: ``openai.responses_store``: ``max_items``, ``max_bytes``, ``ttl_ms`` (live)
    responses_store: tuple[int, int, int] = (1000, 64 * 1024 * 1024, 3_600_000)

    def share_of(self, principal_ref: str, token_ref: str) -> str:
        """The ref a request is shared, capped and allow-listed under: its token's
        ``token_ref`` with ``fair_share: token``, else its ``principal_ref``."""
        return token_ref if self.fair_share == "token" else principal_ref

    def permits(self, ref: str, model_id: str) -> bool:
        """Whether ``ref`` may use ``model_id`` (its allow-list names it — or another name of
        its group — or it has none)."""
        allowed = self.allowed.get(ref)
        return allowed is None or model_id in allowed

    def models_body_for(self, ref: str) -> bytes:
        """The ``GET /v1/models`` body ``ref`` sees: only what it may use."""
        return self.allowed_bodies.get(ref, self.models_body)

    def model_body(self, model_id: str, *, anthropic: bool = False) -> bytes | None:
        """The ``GET /v1/models/{id}`` body (OpenAI's model object, or Anthropic's
        ``ModelInfo``), or None for an id that is not listed (unknown, or a group without an
        enabled provider). An alias is listed under its own id."""
        if model_id not in self.listed:
            return None
        found = next(entry for entry in self.listing if entry.id == model_id)
        return found.anthropic if anthropic else found.openai

    def anthropic_page(
        self,
        ref: str,
        *,
        limit: int = ANTHROPIC_DEFAULT_LIMIT,
        after_id: str | None = None,
        before_id: str | None = None,
    ) -> bytes:
        """The ``GET /v1/models`` body ``ref`` sees in Anthropic's list shape:
        ``{"data", "has_more", "first_id", "last_id"}``, at most ``limit`` entries, those after
        ``after_id`` or before ``before_id`` (Anthropic's cursors: ids of this listing, in its
        order). Raises a 400 naming the cursor when it is not an id ``ref`` sees."""
        listing = self.allowed_listings.get(ref, self.listing)
        return anthropic_list_body(listing, limit=limit, after_id=after_id, before_id=before_id)


class LoadTimes:
    """The ``created`` of each model id: the Unix time this process first loaded it (kept
    for the process's life, so refreshes do not change it). Reads the wall clock once per new
    id, at catalog build time; never on the request path."""

    def __init__(self, wall_clock: Callable[[], float]) -> None:
        self._wall_clock = wall_clock
        self._first: dict[str, int] = {}

    def __call__(self, model_id: str) -> int:
        created = self._first.get(model_id)
        if created is None:
            created = self._first[model_id] = int(self._wall_clock())
        return created


def build_catalog(config: EdgeConfig, created: Callable[[str], int] = lambda _: 0) -> Catalog:
    """The catalog of an effective config. ``created(id)`` is the Unix time to report for a
    listed model or route id (the server gives the time it first loaded the id)."""
    types = {p.id: p.type for n in config.nodes for p in n.providers}
    enabled = {p.id for n in config.nodes for p in n.providers if p.enabled}
    models = {group.id: ModelEntry.from_group(group, types) for group in config.models}
    routes = {
        r.model: RouteEntry(model=r.model, node_id=r.node or "", adapter=r.adapter, target=r.target)
        for r in config.openai.model_routes
    }
    # An alias resolves to its group's own entry: the request path needs no other look-up.
    models.update((alias, models[g.id]) for g in config.models for alias in g.aliases)
    # (id, display name, context window) of each entry, in the listing's order
    shown: list[tuple[str, str | None, int | None]] = [
        (name, g.display_name, g.context_window_tokens)
        for g in config.models
        if any(r.id in enabled for r in g.providers)
        for name in (g.id, *g.aliases)
    ]
    shown += [(r.model, None, None) for r in config.openai.model_routes]
    listed = {name: created(name) for name, _, _ in shown}
    listing = [listed_model(name, display, listed[name], window) for name, display, window in shown]
    names = {g.id: frozenset((g.id, *g.aliases)) for g in config.models}
    names.update((alias, names[g.id]) for g in config.models for alias in g.aliases)
    allowed = {
        p.ref: frozenset(
            name for model in p.models for name in names.get(model, frozenset((model,)))
        )
        for p in config.provider_pool.principals
        if p.models is not None
    }
    allowed_listings = {
        ref: tuple(entry for entry in listing if entry.id in ids) for ref, ids in allowed.items()
    }
    return Catalog(
        models=MappingProxyType(models),
        routes=MappingProxyType(routes),
        long_context_threshold_tokens=config.long_context_threshold_tokens,
        provider_nodes=MappingProxyType({p.id: n.id for n in config.nodes for p in n.providers}),
        listed=MappingProxyType(listed),
        models_body=openai_list_body(listing),
        fair_share=config.provider_pool.fair_share,
        allowed=MappingProxyType(allowed),
        allowed_bodies=MappingProxyType(
            {ref: openai_list_body(entries) for ref, entries in allowed_listings.items()}
        ),
        listing=tuple(listing),
        allowed_listings=MappingProxyType(allowed_listings),
        stream_bounds=MappingProxyType(
            {
                p.id: StreamBounds(p.first_token_timeout_ms, p.stream_idle_timeout_ms)
                for n in config.nodes
                for p in n.providers
                if p.first_token_timeout_ms is not None or p.stream_idle_timeout_ms is not None
            }
        ),
        responses_store=(
            config.openai.responses_store.max_items,
            config.openai.responses_store.max_bytes,
            config.openai.responses_store.ttl_ms,
        ),
    )


def model_not_found(model_id: str) -> RequestError:
    """The 404 of a model id the catalog does not have (or the principal may not use: the
    allow-list leaks no model's existence)."""
    return RequestError(
        "model_not_found",
        f"The model '{model_id}' does not exist on this edge; GET /v1/models lists the models.",
        status=404,
        param="model",
    )


def admission_group(model: ModelEntry, endpoint: Endpoint, body: Mapping[str, object]) -> str:
    """The scheduler group a request of ``model`` is admitted into: the providers that serve
    ``endpoint`` (``completions``: ``openai_compat``; ``embeddings``: ``openai_compat`` and
    ``ollama``) and honour every field of ``body`` (see :mod:`iop_edge.adapters.fields`).
    Raises a 400 naming the model when no provider of it serves the endpoint, or naming the
    field when none honours it. A group of ``openai_compat`` providers only costs no check."""
    if endpoint == "completions":
        if not model.serves_completions:
            raise _unsupported_endpoint(model, endpoint, "it has no openai_compat provider")
        return completions_group(model.id)
    if endpoint == "embeddings":
        if not model.serves_embeddings:
            raise _unsupported_endpoint(
                model, endpoint, "its providers are all cli, which cannot embed"
            )
        group, kinds = embeddings_group(model.id), model.kinds & EMBEDDING_TYPES
    else:
        group, kinds = model.id, model.kinds
    if not model.normalized:
        return group
    refused: dict[str, tuple[str, str]] = {}
    for kind in kinds:
        found = refusal(kind, endpoint, body)
        if found is not None:
            refused[kind] = found
    if not refused:
        return group
    capable = kinds - refused.keys()
    if capable:
        return capable_group(model.id, capable)
    param = (refused.get("ollama") or refused["cli"])[0]
    reasons = "; ".join(f"its {kind} providers: '{f}': {why}" for kind, (f, why) in refused.items())
    raise RequestError(
        "unsupported_parameter",
        f"No provider of the model '{model.id}' can honour this request ({reasons}). Leave the "
        "field out, or use a model with an openai_compat provider.",
        param=param,
    )


def _unsupported_endpoint(model: ModelEntry, endpoint: Endpoint, why: str) -> RequestError:
    other = "/v1/chat/completions" if endpoint != "chat/completions" else "another endpoint"
    return RequestError(
        "unsupported_endpoint",
        f"The model '{model.id}' does not serve /v1/{endpoint}: {why}. Use {other}, or a "
        "model with a provider that serves it.",
        param="model",
    )
