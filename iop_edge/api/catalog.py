"""The model catalog the OpenAI surface serves from: one immutable snapshot per running config.

A refresh builds a new :class:`Catalog` and swaps it in together with the scheduler's new
policy, in one step of the event loop, so no request sees half a config. Pure: built from an
effective config, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import orjson

from iop_edge.config.policy import passthrough_providers
from iop_edge.config.schema import EdgeConfig, ModelGroup


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

    @classmethod
    def from_group(cls, group: ModelGroup, passthrough: set[str]) -> ModelEntry:
        """Build from an effective config's model group (targets already resolved);
        ``passthrough`` holds the ids of the config's ``openai_compat`` providers."""
        return cls(
            id=group.id,
            display_name=group.display_name,
            context_window_tokens=group.context_window_tokens,
            default_max_tokens=group.default_max_tokens,
            min_max_tokens=group.min_max_tokens,
            default_thinking_token_budget=group.default_thinking_token_budget,
            targets=MappingProxyType({ref.id: ref.target or ref.id for ref in group.providers}),
            serves_completions=any(ref.id in passthrough for ref in group.providers),
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
    #: Unix time the catalog was built (the ``created`` of every model object)
    created: int
    models_body: bytes = field(repr=False)
    #: ``provider_pool.fair_share``: whose share a request counts in (see :meth:`share_of`)
    fair_share: str = "principal"
    #: principal (or token) ref → the model and route ids it may use; absent: all
    allowed: Mapping[str, frozenset[str]] = field(default_factory=dict)
    #: the ``/v1/models`` body of each ref with an allow-list
    allowed_bodies: Mapping[str, bytes] = field(default_factory=dict, repr=False)

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
        """The ``GET /v1/models/{id}`` body, or None for an unknown id."""
        model = self.models.get(model_id)
        if model is None and model_id not in self.routes:
            return None
        display = model.display_name if model else None
        return orjson.dumps(_model_object(model_id, display, self.created))


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


def build_catalog(config: EdgeConfig, created: int = 0) -> Catalog:
    """The catalog of an effective config; ``created`` is the Unix time to report for models."""
    passthrough = passthrough_providers(config)
    models = {group.id: ModelEntry.from_group(group, passthrough) for group in config.models}
    routes = {
        r.model: RouteEntry(model=r.model, node_id=r.node or "", adapter=r.adapter, target=r.target)
        for r in config.openai.model_routes
    }
    listing = [_model_object(g.id, g.display_name, created) for g in config.models] + [
        _model_object(r.model, None, created) for r in config.openai.model_routes
    ]
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
        created=created,
        models_body=orjson.dumps({"object": "list", "data": listing}),
        fair_share=config.provider_pool.fair_share,
        allowed=MappingProxyType(allowed),
        allowed_bodies=MappingProxyType(allowed_bodies),
    )
