"""The model catalog the OpenAI surface serves from: one immutable snapshot per running config.

A refresh builds a new :class:`Catalog` and swaps it in together with the scheduler's new
policy, in one step of the event loop, so no request sees half a config. Pure: built from an
effective config, no I/O.

``GET /v1/models`` lists the model groups with at least one enabled provider, and every model
route. A model's ``created`` is the Unix time this process first loaded its id (the caller
keeps those times across refreshes, see :func:`build_catalog`): stable across reloads, and a
model a refresh adds is newer than the ones loaded at start, as a client sorting by
``created`` expects.

A request's model resolves here too: :func:`admission_group` (the providers of the model that
serve the request) and :func:`model_not_found`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import orjson

from iop_edge.adapters.base import Endpoint, StreamBounds
from iop_edge.adapters.fields import refusal
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

    models: Mapping[str, ModelEntry]
    routes: Mapping[str, RouteEntry]
    long_context_threshold_tokens: int
    #: provider id → node id (every provider, enabled or not)
    provider_nodes: Mapping[str, str]
    #: the listed model and route ids → their ``created`` (Unix time first loaded)
    listed: Mapping[str, int]
    models_body: bytes = field(repr=False)
    #: ``provider_pool.fair_share``: whose share a request counts in (see :meth:`share_of`)
    fair_share: str = "principal"
    #: principal (or token) ref → the model and route ids it may use; absent: all
    allowed: Mapping[str, frozenset[str]] = field(default_factory=dict)
    #: the ``/v1/models`` body of each ref with an allow-list
    allowed_bodies: Mapping[str, bytes] = field(default_factory=dict, repr=False)
    #: provider id → its stream bounds (live), for the providers that set one
    stream_bounds: Mapping[str, StreamBounds] = field(default_factory=dict)

    def share_of(self, principal_ref: str, token_ref: str) -> str:
        """The ref a request is shared, capped and allow-listed under: its token's
        ``token_ref`` with ``fair_share: token``, else its ``principal_ref``."""
        return token_ref if self.fair_share == "token" else principal_ref

    def permits(self, ref: str, model_id: str) -> bool:
        """Whether ``ref`` may use ``model_id`` (its allow-list names it, or it has none)."""
        allowed = self.allowed.get(ref)
        return allowed is None or model_id in allowed

    def models_body_for(self, ref: str) -> bytes:
        """The ``GET /v1/models`` body ``ref`` sees: only what it may use."""
        return self.allowed_bodies.get(ref, self.models_body)

    def model_body(self, model_id: str) -> bytes | None:
        """The ``GET /v1/models/{id}`` body, or None for an id that is not listed (unknown, or
        a group without an enabled provider)."""
        created = self.listed.get(model_id)
        if created is None:
            return None
        model = self.models.get(model_id)
        display = model.display_name if model else None
        return orjson.dumps(_model_object(model_id, display, created))


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


def _model_object(model_id: str, display_name: str | None, created: int) -> dict[str, object]:
    obj: dict[str, object] = {
        "id": model_id,
        "object": "model",
        "created": created,
        "owned_by": "iop-edge",
    }
    if display_name:
        obj["display_name"] = display_name
    return obj


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
    listed = {
        g.id: created(g.id) for g in config.models if any(r.id in enabled for r in g.providers)
    }
    listed.update((r.model, created(r.model)) for r in config.openai.model_routes)
    listing = [
        _model_object(g.id, g.display_name, listed[g.id]) for g in config.models if g.id in listed
    ] + [_model_object(r.model, None, listed[r.model]) for r in config.openai.model_routes]
    allowed = {
        p.ref: frozenset(p.models) for p in config.provider_pool.principals if p.models is not None
    }
    allowed_bodies = {
        ref: orjson.dumps({"object": "list", "data": [m for m in listing if m["id"] in ids]})
        for ref, ids in allowed.items()
    }
    return Catalog(
        models=MappingProxyType(models),
        routes=MappingProxyType(routes),
        long_context_threshold_tokens=config.long_context_threshold_tokens,
        provider_nodes=MappingProxyType({p.id: n.id for n in config.nodes for p in n.providers}),
        listed=MappingProxyType(listed),
        models_body=orjson.dumps({"object": "list", "data": listing}),
        fair_share=config.provider_pool.fair_share,
        allowed=MappingProxyType(allowed),
        allowed_bodies=MappingProxyType(allowed_bodies),
        stream_bounds=MappingProxyType(
            {
                p.id: StreamBounds(p.first_token_timeout_ms, p.stream_idle_timeout_ms)
                for n in config.nodes
                for p in n.providers
                if p.first_token_timeout_ms is not None or p.stream_idle_timeout_ms is not None
            }
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
