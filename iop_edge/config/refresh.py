"""Refresh classification (SPEC §4): diff the running config against a candidate.

Every changed leaf — or a whole added/removed entity — becomes one :class:`ReportEntry` of class
``live`` (applied to the running daemon without a restart) or ``restart`` (reported, left
unapplied). What is live:

- ``long_context_threshold_tokens``, ``provider_pool.max_queue``, ``provider_pool.queue_timeout_ms``
- a provider's ``capacity``, ``long_context_capacity``, ``total_context_tokens``, ``priority``,
  ``enabled``, ``retry_on``, ``first_token_timeout_ms``, ``stream_idle_timeout_ms``
- ``models[]``: add, remove, and every field (aliases, display name, context window, provider
  list, generation policy)
- ``nodes[].runtime`` (legacy node runtime concurrency metadata)
- ``provider_pool.*`` (fair share, principals, failover, health, and
  ``provider_pool.shared.lease_ttl_ms`` / ``.on_store_down``),
  ``openai.model_routes[].capacity``, and ``openai.responses_store.*`` (the bounds of the
  stored responses of ``/v1/responses``)

Everything else is restart-class: edge identity, ``listen``, ``bootstrap``, ``logging``,
``reload``, ``metrics``, ``console``, ``control_plane``, ``a2a``, ``openai`` (any deep change,
principal tokens included), node add/remove and node alias/agent kind/token, adapter
instances, provider add/remove and every other provider field, ``provider_pool.shared.store``
and adding or removing ``provider_pool.shared`` (the store's connection is opened at start).
A restart entry whose cause is not obvious carries a ``reason`` (:data:`RESTART_REASONS`).

The config that runs after a refresh is the old config plus only its live changes
(:func:`apply_live`); it must pass validation, or no live change is applied.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field

from iop_edge.config.load import FileReader, load_config
from iop_edge.config.provenance import Provenance
from iop_edge.config.redact import SECRET_MAPS, SECRET_VALUE, redact
from iop_edge.config.schema import EdgeConfig, Node
from iop_edge.config.validate import validate_config
from iop_edge.errors import ConfigError, ConfigProblem

ChangeClass = Literal["live", "restart"]
Outcome = Literal["applied", "restart_required", "rejected"]
MODES: Final = ("dry_run", "apply")

#: Provider fields that change live; every other provider field needs a restart.
LIVE_PROVIDER_FIELDS: Final = (
    "capacity",
    "long_context_capacity",
    "total_context_tokens",
    "priority",
    "enabled",
    "retry_on",
    "first_token_timeout_ms",
    "stream_idle_timeout_ms",
)
#: Why a restart-class path needs a restart, where the path alone does not say it: the
#: ``reason`` of its report entry.
RESTART_REASONS: Final[Mapping[str, str]] = {
    "provider_pool.shared": (
        "the edge opens its connection to the store when it starts, and a pool turns shared "
        "or local only with a new process; iop-edge restart applies it"
    ),
    "provider_pool.shared.store": (
        "the edge opens its connection to the store when it starts; iop-edge restart "
        "connects the new process to the new store"
    ),
}
#: Fields of ``provider_pool.shared`` that change live (the store is restart-class).
LIVE_SHARED_FIELDS: Final = ("lease_ttl_ms", "on_store_down")
#: Root sections that need a restart on any change (``openai`` is diffed by entity below).
RESTART_SECTIONS: Final = (
    "edge",
    "listen",
    "bootstrap",
    "logging",
    "reload",
    "metrics",
    "console",
    "control_plane",
    "a2a",
)


class ReportEntry(BaseModel):
    """One changed path: its class, old and new value (secrets redacted), whether the
    running daemon took it, and for some restart-class paths why they need a restart
    (``reason``, left out of the JSON form when there is none)."""

    model_config = ConfigDict(frozen=True, populate_by_name=True)

    path: str
    change_class: ChangeClass = Field(alias="class")
    old: Any = None
    new: Any = None
    applied: bool = False
    reason: str | None = None


class RefreshError(BaseModel):
    """A problem that stopped (part of) a refresh, at its config path."""

    model_config = ConfigDict(frozen=True)

    path: str
    message: str


class RefreshResult(BaseModel):
    """The outcome of a refresh, as the CLI and the admin API print it.

    Every list is always present; ``changed_*`` are sorted by id and ``report`` by path.
    ``config_hash`` is the hash of the config running after the refresh; ``candidate_hash``
    the candidate's (absent when it failed to load).
    """

    model_config = ConfigDict(frozen=True)

    mode: str
    result: Outcome
    changed_nodes: list[str] = []
    changed_providers: list[str] = []
    changed_models: list[str] = []
    report: list[ReportEntry] = []
    errors: list[RefreshError] = []
    config_hash: str | None = None
    candidate_hash: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The JSON form (``class`` spelled as in the SPEC; an entry's ``reason`` only when
        it has one)."""
        data = self.model_dump(mode="json", by_alias=True)
        for entry in data["report"]:
            if entry["reason"] is None:
                del entry["reason"]
        return data


@dataclass(frozen=True, slots=True)
class RefreshOutcome:
    """A result and the config to run after it (the old one when nothing was applied)."""

    result: RefreshResult
    running: EdgeConfig
    candidate: EdgeConfig | None


# --- hashing --------------------------------------------------------------------------------

_SORT_KEYS: Final[Mapping[str, str]] = {
    "models": "id",
    "nodes": "id",
    "adapters": "name",
    "providers": "id",
    "principal_tokens": "token_ref",
    "model_routes": "model",
}


def _canonical(value: Any, key: str = "") -> Any:
    if isinstance(value, dict):
        return {k: _canonical(v, k) for k, v in value.items()}
    if isinstance(value, list):
        items = [_canonical(v) for v in value]
        ident = _SORT_KEYS.get(key)
        # Entity lists are compared by identity, so their order does not change the hash;
        # models[].providers (whose items carry "target") keep their order: it is meaningful.
        if ident and all(isinstance(i, dict) and "target" not in i for i in items):
            items.sort(key=lambda item: str(item.get(ident)))
        return items
    return value


def config_hash(config: EdgeConfig) -> str:
    """SHA-256 of the effective config, stable across key order, formatting and entity order."""
    data = _canonical(config.model_dump(mode="json", exclude_none=True))
    return hashlib.sha256(orjson.dumps(data, option=orjson.OPT_SORT_KEYS)).hexdigest()


# --- diff -----------------------------------------------------------------------------------


def _dump(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", exclude_none=True)
    if isinstance(value, tuple):
        return [_dump(v) for v in value]
    return value


@dataclass
class _Diff:
    entries: list[ReportEntry] = field(default_factory=list)
    nodes: set[str] = field(default_factory=set)
    providers: set[str] = field(default_factory=set)
    models: set[str] = field(default_factory=set)

    def add(self, path: str, cls: ChangeClass, old: Any, new: Any, key: str) -> None:
        self.entries.append(
            ReportEntry(
                path=path,
                change_class=cls,
                old=redact(old, key),
                new=redact(new, key),
                reason=RESTART_REASONS.get(path) if cls == "restart" else None,
            )
        )

    def leaves(self, path: str, old: Any, new: Any, cls: ChangeClass, key: str = "") -> None:
        """One entry per changed leaf of two dumped values (lists count as one leaf)."""
        if old == new:
            return
        if isinstance(old, dict) and isinstance(new, dict):
            for k in dict.fromkeys([*old, *new]):
                # a value inside headers/env is secret whatever its own key is
                child_key = SECRET_VALUE if key in SECRET_MAPS else k
                self.leaves(f"{path}.{k}", old.get(k), new.get(k), cls, child_key)
        else:
            self.add(path, cls, old, new, key)

    def entities(
        self,
        path: str,
        old: Iterable[Any],
        new: Iterable[Any],
        ident: str,
        cls: ChangeClass,
    ) -> list[tuple[Any, Any]]:
        """Diff two entity lists by identity: an added or removed entity is one entry; returns
        the (old, new) pairs present on both sides that differ, for field-level diffs."""
        before = {getattr(e, ident): e for e in old}
        after = {getattr(e, ident): e for e in new}
        changed = []
        for key in dict.fromkeys([*before, *after]):
            a, b = before.get(key), after.get(key)
            if a is None or b is None:
                self.add(f"{path}[{key}]", cls, _dump(a), _dump(b), "")
            elif a != b:
                changed.append((a, b))
        return changed


def _touched(entries: Iterable[Any], ident: str) -> set[str]:
    return {getattr(e, ident) for e in entries}


def classify(running: EdgeConfig, candidate: EdgeConfig) -> _Diff:
    """Every change from ``running`` to ``candidate``, classified live or restart."""
    diff = _Diff()
    for name in RESTART_SECTIONS:
        diff.leaves(name, _dump(getattr(running, name)), _dump(getattr(candidate, name)), "restart")
    _diff_openai(diff, running, candidate)
    diff.leaves(
        "long_context_threshold_tokens",
        running.long_context_threshold_tokens,
        candidate.long_context_threshold_tokens,
        "live",
    )
    _diff_pool(diff, running, candidate)

    before = {m.id for m in running.models}
    after = {m.id for m in candidate.models}
    diff.models |= before ^ after
    for old_model, new_model in diff.entities(
        "models", running.models, candidate.models, "id", "live"
    ):
        diff.models.add(old_model.id)
        diff.leaves(f"models[{old_model.id}]", _dump(old_model), _dump(new_model), "live")

    old_nodes = {n.id: n for n in running.nodes}
    new_nodes = {n.id: n for n in candidate.nodes}
    for node_id in old_nodes.keys() ^ new_nodes.keys():
        gone_or_new = old_nodes.get(node_id) or new_nodes[node_id]
        diff.nodes.add(node_id)
        diff.providers |= _touched(gone_or_new.providers, "id")
    diff.entities("nodes", running.nodes, candidate.nodes, "id", "restart")
    for old_node, new_node in (
        (old_nodes[k], new_nodes[k]) for k in old_nodes.keys() & new_nodes.keys()
    ):
        if old_node != new_node:
            _diff_node(diff, old_node, new_node)
    diff.entries.sort(key=lambda e: e.path)
    return diff


def _diff_pool(diff: _Diff, running: EdgeConfig, candidate: EdgeConfig) -> None:
    """``provider_pool``: live, but for ``shared``: added or removed whole, or its store
    changed, it is restart-class."""
    old, new = running.provider_pool, candidate.provider_pool
    if old == new:
        return
    rest = {"shared"}
    diff.leaves(
        "provider_pool",
        old.model_dump(mode="json", exclude_none=True, exclude=rest),
        new.model_dump(mode="json", exclude_none=True, exclude=rest),
        "live",
    )
    path = "provider_pool.shared"
    if old.shared is None or new.shared is None:
        if old.shared != new.shared:
            diff.add(path, "restart", _dump(old.shared), _dump(new.shared), "")
        return
    diff.leaves(f"{path}.store", old.shared.store, new.shared.store, "restart", "store")
    for name in LIVE_SHARED_FIELDS:
        diff.leaves(f"{path}.{name}", getattr(old.shared, name), getattr(new.shared, name), "live")


def _diff_openai(diff: _Diff, running: EdgeConfig, candidate: EdgeConfig) -> None:
    old, new = running.openai, candidate.openai
    if old == new:
        return
    skip = {"principal_tokens", "model_routes", "responses_store"}
    diff.leaves(
        "openai",
        old.model_dump(mode="json", exclude_none=True, exclude=skip),
        new.model_dump(mode="json", exclude_none=True, exclude=skip),
        "restart",
    )
    diff.leaves(
        "openai.responses_store", _dump(old.responses_store), _dump(new.responses_store), "live"
    )
    for a, b in diff.entities(
        "openai.principal_tokens",
        old.principal_tokens,
        new.principal_tokens,
        "token_ref",
        "restart",
    ):
        diff.leaves(f"openai.principal_tokens[{a.token_ref}]", _dump(a), _dump(b), "restart")
    for a, b in diff.entities(
        "openai.model_routes", old.model_routes, new.model_routes, "model", "restart"
    ):
        path = f"openai.model_routes[{a.model}]"
        rest = {"capacity"}
        diff.leaves(
            path,
            a.model_dump(mode="json", exclude_none=True, exclude=rest),
            b.model_dump(mode="json", exclude_none=True, exclude=rest),
            "restart",
        )
        diff.leaves(f"{path}.capacity", a.capacity, b.capacity, "live")


def _diff_node(diff: _Diff, old: Node, new: Node) -> None:
    path = f"nodes[{old.id}]"
    diff.nodes.add(old.id)
    scalar = {"adapters", "providers", "runtime"}
    diff.leaves(
        path,
        old.model_dump(mode="json", exclude_none=True, exclude=scalar),
        new.model_dump(mode="json", exclude_none=True, exclude=scalar),
        "restart",
    )
    diff.leaves(f"{path}.runtime", _dump(old.runtime), _dump(new.runtime), "live")
    for a, b in diff.entities(f"{path}.adapters", old.adapters, new.adapters, "name", "restart"):
        diff.leaves(f"{path}.adapters[{a.name}]", _dump(a), _dump(b), "restart")
    old_ids, new_ids = _touched(old.providers, "id"), _touched(new.providers, "id")
    diff.providers |= old_ids ^ new_ids
    for a, b in diff.entities(f"{path}.providers", old.providers, new.providers, "id", "restart"):
        diff.providers.add(a.id)
        a_data, b_data = _dump(a), _dump(b)
        for key in dict.fromkeys([*a_data, *b_data]):
            cls: ChangeClass = "live" if key in LIVE_PROVIDER_FIELDS else "restart"
            diff.leaves(
                f"{path}.providers[{a.id}].{key}", a_data.get(key), b_data.get(key), cls, key
            )


# --- apply ----------------------------------------------------------------------------------


def apply_live(running: EdgeConfig, candidate: EdgeConfig) -> EdgeConfig:
    """The running config with only the candidate's live changes taken over (not validated)."""
    candidates = {n.id: n for n in candidate.nodes}
    nodes = []
    for node in running.nodes:
        new_node = candidates.get(node.id)
        if new_node is None:
            nodes.append(node)
            continue
        new_providers = {p.id: p for p in new_node.providers}
        providers = tuple(
            p.model_copy(update={f: getattr(np, f) for f in LIVE_PROVIDER_FIELDS})
            if (np := new_providers.get(p.id)) is not None
            else p
            for p in node.providers
        )
        nodes.append(node.model_copy(update={"runtime": new_node.runtime, "providers": providers}))
    pool = candidate.provider_pool
    shared = running.provider_pool.shared  # added, removed or a new store: at a restart
    if shared is not None and pool.shared is not None:
        shared = shared.model_copy(update={f: getattr(pool.shared, f) for f in LIVE_SHARED_FIELDS})
    capacities = {r.model: r.capacity for r in candidate.openai.model_routes}
    routes = tuple(
        r.model_copy(update={"capacity": capacities[r.model]}) if r.model in capacities else r
        for r in running.openai.model_routes
    )
    return running.model_copy(
        update={
            "openai": running.openai.model_copy(
                update={
                    "model_routes": routes,
                    "responses_store": candidate.openai.responses_store,
                }
            ),
            "long_context_threshold_tokens": candidate.long_context_threshold_tokens,
            "provider_pool": pool.model_copy(update={"shared": shared}),
            "models": candidate.models,
            "nodes": tuple(nodes),
        }
    )


def refresh(
    running: EdgeConfig,
    candidate: EdgeConfig | str,
    *,
    mode: str = "dry_run",
    env: Mapping[str, str] | None = None,
    read_file: FileReader | None = None,
    refuse: str | None = None,
    source: str = "edge.yaml",
    running_hash: str | None = None,
) -> RefreshOutcome:
    """Classify ``candidate`` (an effective config, or YAML text) against ``running``.

    ``dry_run`` reports what would happen and applies nothing (every ``applied`` is false);
    ``apply`` returns, as :attr:`RefreshOutcome.running`, the config to run from now on — the old
    config plus its live changes, when that combination is valid. Text is loaded with ``env``,
    ``read_file`` and ``refuse`` (:func:`~iop_edge.config.load.load_config`).

    No value either config took from the environment or a file (their provenance) appears
    in the result, whatever field it is in: report values, paths, ids and messages are
    scrubbed (:mod:`iop_edge.config.provenance`).

    ``running_hash`` is ``running``'s :func:`config_hash` when the caller knows it (the
    supervisor does: it is not computed again); the result's ``config_hash`` is the hash of the
    config to run after it, computed once here.
    """
    running_hash = running_hash or config_hash(running)
    if mode not in MODES:
        error = ConfigProblem("mode", f"{mode!r} is not a refresh mode; use dry_run or apply")
        return rejected(running, mode, [error], running_hash)
    if isinstance(candidate, str):
        try:
            candidate = load_config(
                candidate, env=env, read_file=read_file, refuse=refuse, source=source
            )
        except ConfigError as exc:
            return rejected(running, mode, exc.problems, running_hash)

    diff = classify(running, candidate)
    restart = any(e.change_class == "restart" for e in diff.entries)
    live = [e for e in diff.entries if e.change_class == "live"]
    errors: list[RefreshError] = []
    merged = running
    provenance = running.provenance | candidate.provenance
    if live:
        try:
            # The running config holds values of both now: it keeps both provenances.
            merged = validate_config(apply_live(running, candidate)).with_provenance(provenance)
        except ConfigError as exc:
            merged = running
            errors = [
                RefreshError(
                    path=p.path,
                    message=f"{p.message} — the running config with only the live changes "
                    "would be invalid, so no live change was applied; restart to apply the "
                    "candidate whole",
                )
                for p in exc.problems
            ]
    applied = mode == "apply" and not errors
    report = [
        e.model_copy(update={"applied": applied and e.change_class == "live"}) for e in diff.entries
    ]
    after = merged if applied else running
    result = RefreshResult(
        mode=mode,
        result="restart_required" if restart else "applied",
        changed_nodes=sorted(diff.nodes),
        changed_providers=sorted(diff.providers),
        changed_models=sorted(diff.models),
        report=report,
        errors=errors,
        config_hash=config_hash(after) if after is not running else running_hash,
        candidate_hash=config_hash(candidate),
    )
    return RefreshOutcome(result=scrubbed(result, provenance), running=after, candidate=candidate)


def scrubbed(result: RefreshResult, provenance: Provenance) -> RefreshResult:
    """``result`` with every value of ``provenance`` hidden (the hashes are left alone: they
    are digests, not text of the config)."""
    if not provenance:
        return result
    hashes = {"config_hash": result.config_hash, "candidate_hash": result.candidate_hash}
    data = provenance.scrub(result.model_dump(mode="json", by_alias=True, exclude=set(hashes)))
    return RefreshResult.model_validate({**data, **hashes})


def rejected(
    running: EdgeConfig,
    mode: str,
    problems: Iterable[ConfigProblem],
    running_hash: str | None = None,
) -> RefreshOutcome:
    """The outcome of a refused candidate: ``rejected`` with every problem, nothing applied
    (no value of the running config's provenance shown)."""
    result = RefreshResult(
        mode=mode,
        result="rejected",
        errors=[RefreshError(path=p.path, message=p.message) for p in problems],
        config_hash=running_hash or config_hash(running),
    )
    return RefreshOutcome(
        result=scrubbed(result, running.provenance), running=running, candidate=None
    )
