"""Rules of SPEC §3.1 that relate fields and entities, and the defaults that depend on them.

:func:`validate_config` takes a config that passed the schema and returns the *effective*
config — legacy queue values promoted or dropped, adapter references resolved to instance names,
upstream targets resolved, route nodes resolved — or raises :class:`ConfigError` with every
problem found, each at its exact path.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass, field

from iop_edge.config.address import ListenAddress
from iop_edge.config.schema import (
    DEFAULT_MAX_QUEUE,
    DEFAULT_QUEUE_TIMEOUT_MS,
    NATIVE_API_TYPES,
    Adapter,
    EdgeConfig,
    ModelGroup,
    ModelProviderRef,
    ModelRoute,
    Node,
    Provider,
    ProviderPool,
)
from iop_edge.errors import ConfigError, ConfigProblem


def provider_path(node: Node, provider: Provider) -> str:
    """The path of a provider, as errors and refresh reports print it."""
    return f"nodes[{node.id}].providers[{provider.id}]"


def is_loopback(address: str) -> bool:
    """True when a ``HOST:PORT`` listen address only accepts connections from this machine."""
    return ListenAddress.parse(address).is_loopback


def _listing(items: Iterable[str], limit: int = 8) -> str:
    items = list(items)
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "") or "none"


def _suggest(value: str, known: Iterable[str]) -> str:
    known = list(known)
    close = difflib.get_close_matches(value, known, n=1)
    return f"did you mean {close[0]!r}?" if close else f"known: {_listing(known)}"


@dataclass
class _Checker:
    config: EdgeConfig
    problems: list[ConfigProblem] = field(default_factory=list)
    providers: dict[str, tuple[Node, Provider]] = field(default_factory=dict)

    def problem(self, path: str, message: str) -> None:
        self.problems.append(ConfigProblem(path, message))

    # -- sections ----------------------------------------------------------------------------

    def reserved_sections(self) -> None:
        for name in ("control_plane", "a2a"):
            if getattr(self.config, name).enabled:
                self.problem(
                    f"{name}.enabled",
                    f"true is not supported: {name} is reserved and has no service in this "
                    f"version; set {name}.enabled: false",
                )

    def console(self) -> None:
        """The admin API can change the running config: off loopback it needs a token, the
        same way an open OpenAI surface is refused off loopback."""
        console = self.config.console
        tokenless = console.enabled and console.admin_token_sha256 is None
        if tokenless and not is_loopback(console.listen):
            self.problem(
                "console.listen",
                f"{console.listen!r} is not a loopback address and console.admin_token_sha256 "
                "is not set; the admin API changes the running config, so off loopback it "
                "needs an admin token (set console.admin_token_sha256 to the hash printed by "
                "`iop-edge token admin`) or a loopback address such as 127.0.0.1:7601",
            )

    def node_listener(self) -> None:
        """The node listener carries node tokens in and provider credentials out: off loopback
        it needs TLS, the same way the console needs a token."""
        config = self.config
        listen = config.listen
        if config.node_listener_enabled and listen.tls is None and not is_loopback(listen.address):
            why = (
                "bootstrap.enabled is true"
                if config.bootstrap.enabled
                else f"nodes[{config.remote_nodes[0].id}] is remote"
            )
            self.problem(
                "listen.address",
                f"{listen.address!r} is not a loopback address and listen.tls is not set, but "
                f"the node listener opens there ({why}); nodes send their token and receive "
                "provider credentials over it, so off loopback it needs TLS (set "
                "listen.tls.cert_file and listen.tls.key_file) or a loopback address such as "
                "127.0.0.1:7600",
            )

    def node_tokens(self) -> None:
        """A remote node needs the node listener, and a token of its own: one secret, one role
        (never another node's, a principal's or the admin's)."""
        config = self.config
        principals = {t.token_hash_sha256: t.token_ref for t in config.openai.principal_tokens}
        seen: dict[str, str] = {}
        for node in config.nodes:
            digest = node.token_hash_sha256
            if digest is None:
                continue  # a local node: no token
            path = f"nodes[{node.id}].token_hash_sha256"
            if config.bootstrap.enabled is False:
                self.problem(
                    path,
                    "is set, so the node is remote, but bootstrap.enabled is false, so the node "
                    "listener never opens and its agent cannot connect; remove "
                    "bootstrap.enabled (or set it true), or remove token_hash_sha256 to run the "
                    "node's adapters in the edge process",
                )
            if digest in seen:
                other = f"nodes[{seen[digest]}].token_hash_sha256"
            elif digest in principals:
                other = f"openai.principal_tokens[{principals[digest]}].token_hash_sha256"
            elif digest == config.console.admin_token_sha256:
                other = "console.admin_token_sha256"
            else:
                seen[digest] = node.id
                continue
            self.problem(
                path,
                f"the same hash as {other}; a token has one role, so each remote node needs "
                f"a token of its own (make one with `iop-edge token node --node {node.id}`)",
            )

    def openai(self) -> None:
        section = self.config.openai
        refs: dict[str, int] = {}
        hashes: dict[str, str] = {}
        for index, token in enumerate(section.principal_tokens):
            path = f"openai.principal_tokens[{token.token_ref}]"
            if token.token_ref in refs:
                self.problem(
                    f"{path}.token_ref",
                    f"{token.token_ref!r} is used by entries {refs[token.token_ref]} and {index}; "
                    "token_ref must be unique",
                )
            refs.setdefault(token.token_ref, index)
            if token.token_hash_sha256 in hashes:
                self.problem(
                    f"{path}.token_hash_sha256",
                    "the same hash as openai.principal_tokens"
                    f"[{hashes[token.token_hash_sha256]}]; a token hash may appear only once",
                )
            hashes.setdefault(token.token_hash_sha256, token.token_ref)
        anonymous = not section.principal_tokens and not section.allow_anonymous
        if anonymous and not is_loopback(section.listen):
            self.problem(
                "openai.listen",
                f"{section.listen!r} is not a loopback address and openai.principal_tokens "
                "is empty; add principal tokens (iop-edge token new) or set "
                "openai.allow_anonymous: true to serve without authentication",
            )
        self.responses_store()

    def responses_store(self) -> None:
        """The response store must hold at least one request of the largest body the edge
        accepts: below that, the conversations of large requests would be refused by the store
        one by one, and ``previous_response_id`` would fail on them with no config error."""
        section = self.config.openai
        store = section.responses_store
        if store.max_bytes < section.max_body_bytes:
            self.problem(
                "openai.responses_store.max_bytes",
                f"{store.max_bytes} is below openai.max_body_bytes {section.max_body_bytes}; "
                "the store must hold at least one request of the largest body the edge "
                "accepts, so max_bytes >= max_body_bytes (lower max_body_bytes too)",
            )

    # -- nodes, adapters, providers ----------------------------------------------------------

    def nodes(self) -> tuple[Node, ...]:
        node_ids: set[str] = set()
        nodes = []
        for node in self.config.nodes:
            if node.id in node_ids:
                self.problem(
                    f"nodes[{node.id}].id", f"{node.id!r} is used twice; node ids must be unique"
                )
            node_ids.add(node.id)
            names: set[str] = set()
            for adapter in node.adapters:
                if adapter.name in names:
                    self.problem(
                        f"nodes[{node.id}].adapters[{adapter.name}].name",
                        f"{adapter.name!r} is used twice in this node; adapter names must be "
                        "unique within a node",
                    )
                names.add(adapter.name)
                self.native_apis(
                    f"nodes[{node.id}].adapters[{adapter.name}]", adapter.type, adapter
                )
            providers = tuple(self.provider(node, p) for p in node.providers)
            nodes.append(node.model_copy(update={"providers": providers}))
        return tuple(nodes)

    def provider(self, node: Node, provider: Provider) -> Provider:
        path = provider_path(node, provider)
        if provider.id in self.providers:
            other_node, _ = self.providers[provider.id]
            where = "this node" if other_node is node else f"nodes[{other_node.id}]"
            self.problem(
                f"{path}.id",
                f"{provider.id!r} is already the id of an earlier provider in {where}; "
                "provider ids must be unique across the whole config",
            )
        else:
            self.providers[provider.id] = (node, provider)
        if provider.long_context_capacity > provider.capacity:
            self.problem(
                f"{path}.long_context_capacity",
                f"{provider.long_context_capacity} is above capacity {provider.capacity}; "
                "0 <= long_context_capacity <= capacity",
            )
        if provider.health_check is True or (
            provider.type == "cli" and provider.health_check is not False
        ):
            given = "true" if provider.health_check is True else "a health check"
            self.problem(
                f"{path}.health_check",
                f"{given} is not available for a {provider.type} provider; "
                "a cli provider has no HTTP health check (omit health_check or set it to false: "
                "an ejected cli provider gets one trial request once its ejection ends)",
            )
        self.native_apis(path, provider.type, provider)
        adapter = self.resolve_adapter(node, provider, path, report=provider.enabled)
        if adapter is None:
            return provider
        if provider.enabled and adapter.type != provider.type:
            self.problem(
                f"{path}.type",
                f"{provider.type!r} does not match adapter {adapter.name!r} of type "
                f"{adapter.type!r}; a provider runs on an adapter of its own runtime type",
            )
        if provider.enabled and provider.category == "cli" and adapter.type != "cli":
            self.problem(
                f"{path}.category",
                f"'cli' needs an enabled cli adapter, but adapter {adapter.name!r} is "
                f"{adapter.type!r}",
            )
        if provider.enabled:
            self.reachable(path, adapter, provider)
        return provider.model_copy(update={"adapter": adapter.name})

    def native_apis(self, path: str, kind: str, fields: Adapter | Provider) -> None:
        """``native_apis`` only where the upstream can speak another API: an ``openai_compat``
        adapter or provider (an ``ollama`` or ``cli`` one has its requests translated)."""
        if fields.native_apis is None or kind in NATIVE_API_TYPES:
            return
        what = f"{kind} {type(fields).__name__.lower()}s"
        self.problem(
            f"{path}.native_apis",
            f"{list(fields.native_apis)} is not available on {what}; native_apis is an "
            "execution field of openai_compat adapters and providers only (the requests of "
            f"{what} are translated)",
        )

    def reachable(self, path: str, adapter: Adapter, provider: Provider | None = None) -> None:
        """An upstream needs a way to reach it: ``base_url`` for HTTP adapters, ``command``
        for cli — on the provider (provider-first) or on its adapter instance."""
        needed = "command" if adapter.type == "cli" else "base_url"
        if (provider is not None and getattr(provider, needed)) or getattr(adapter, needed):
            return
        where = f"nor on adapter {adapter.name!r}" if provider is not None else "on this adapter"
        self.problem(
            f"{path}.{needed}",
            f"is not set here {where}; {adapter.type} upstreams need {needed}",
        )

    def resolve_adapter(
        self, node: Node, provider: Provider, path: str, *, report: bool
    ) -> Adapter | None:
        """The exact instance name wins; a type name (or no name: the provider's own type)
        resolves only when exactly one enabled instance of that type exists in the node."""
        ref = provider.adapter or provider.type
        enabled = [a for a in node.adapters if a.enabled]
        named = next((a for a in node.adapters if a.name == ref), None)
        if named is not None:
            if named.enabled:
                return named
            if report:
                self.problem(
                    f"{path}.adapter",
                    f"{ref!r} is disabled in nodes[{node.id}]; a provider needs an enabled "
                    "adapter instance (disable the provider too, or enable the adapter)",
                )
            return None
        same_type = [a for a in enabled if a.type == ref]
        if len(same_type) == 1:
            return same_type[0]
        if report:
            given = f"{ref!r}" if provider.adapter else f"no adapter given and type {ref!r}"
            if same_type:
                names = _listing(a.name for a in same_type)
                self.problem(
                    f"{path}.adapter",
                    f"{given} matches several enabled {ref} instances ({names}); name one",
                )
            else:
                names = _listing(f"{a.name} ({a.type})" for a in enabled)
                self.problem(
                    f"{path}.adapter",
                    f"{given} names no enabled adapter instance of nodes[{node.id}] "
                    f"(enabled instances: {names}); provider.adapter must name one",
                )
        return None

    # -- queue policy ------------------------------------------------------------------------

    def queue_policy(self, referenced: set[str]) -> ProviderPool:
        """The effective root policy: ``provider_pool`` when present, else the legacy
        per-provider values of every participating provider, which must all agree."""
        health = self.config.provider_pool.health
        if health.max_eject_ms < health.eject_ms:
            self.problem(
                "provider_pool.health.max_eject_ms",
                f"{health.max_eject_ms} is below eject_ms {health.eject_ms}; an ejection "
                "doubles from eject_ms up to max_eject_ms, so max_eject_ms >= eject_ms",
            )
        if "provider_pool" in self.config.model_fields_set:
            return self.config.provider_pool
        pairs: dict[tuple[int, int], list[str]] = {}
        for pid, (node, provider) in self.providers.items():
            if not provider.enabled or pid not in referenced:
                continue
            pair = (
                provider.max_queue or DEFAULT_MAX_QUEUE,
                DEFAULT_QUEUE_TIMEOUT_MS
                if provider.queue_timeout_ms is None
                else provider.queue_timeout_ms,
            )
            pairs.setdefault(pair, []).append(provider_path(node, provider))
        if len(pairs) > 1:
            described = "; ".join(
                f"max_queue={mq} queue_timeout_ms={qt}: {_listing(where)}"
                for (mq, qt), where in sorted(pairs.items())
            )
            self.problem(
                "provider_pool",
                f"is absent and the legacy per-provider queue values disagree ({described}); "
                "set provider_pool: {max_queue: N, queue_timeout_ms: MS} — the edge never "
                "picks one provider's values",
            )
        if len(pairs) == 1:
            (max_queue, timeout_ms) = next(iter(pairs))
            return ProviderPool(max_queue=max_queue, queue_timeout_ms=timeout_ms)
        return ProviderPool()

    # -- models and routes -------------------------------------------------------------------

    def models(self) -> tuple[ModelGroup, ...]:
        seen: set[str] = set()
        models = []
        for model in self.config.models:
            path = f"models[{model.id}]"
            if model.id in seen:
                self.problem(f"{path}.id", f"{model.id!r} is used twice; model ids must be unique")
            seen.add(model.id)
            self.generation_policy(model, path)
            refs: list[ModelProviderRef] = []
            ids: set[str] = set()
            for ref in model.providers:
                ref_path = f"{path}.providers[{ref.id}]"
                if ref.id in ids:
                    self.problem(ref_path, f"{ref.id!r} is listed twice in this model")
                ids.add(ref.id)
                refs.append(self.model_provider(model, ref, ref_path))
            models.append(model.model_copy(update={"providers": tuple(refs)}))
        self.aliases()
        return tuple(models)

    def aliases(self) -> None:
        """``models[].aliases``: every name a request's ``model`` may be — a group id, an
        alias, a route id — names one group or route only, so each alias is checked against
        all of them and reported at its own path, naming the other place."""
        groups = {model.id for model in self.config.models}
        routes = {route.model for route in self.config.openai.model_routes}
        seen: dict[str, str] = {}
        rule = "model ids, aliases and route ids must all be distinct"
        for model in self.config.models:
            for index, alias in enumerate(model.aliases):
                path = f"models[{model.id}].aliases[{index}]"
                if alias == model.id:
                    other = f"this group's own id (models[{model.id}].id)"
                elif alias in groups:
                    other = f"the id of models[{alias}]"
                elif alias in seen:
                    other = f"already an alias at {seen[alias]}"
                elif alias in routes:
                    other = f"the id of openai.model_routes[{alias}]"
                else:
                    seen[alias] = path
                    continue
                self.problem(path, f"{alias!r} is {other}; {rule}")

    def generation_policy(self, model: ModelGroup, path: str) -> None:
        window = model.context_window_tokens
        if model.default_max_tokens is not None and model.default_max_tokens > window:
            self.problem(
                f"{path}.default_max_tokens",
                f"{model.default_max_tokens} is above context_window_tokens {window}; "
                "default_max_tokens must fit the context window",
            )
        if model.min_max_tokens is not None:
            if model.default_max_tokens is not None and (
                model.min_max_tokens > model.default_max_tokens
            ):
                self.problem(
                    f"{path}.min_max_tokens",
                    f"{model.min_max_tokens} is above default_max_tokens "
                    f"{model.default_max_tokens}; min_max_tokens <= default_max_tokens",
                )
            elif model.min_max_tokens > window:
                self.problem(
                    f"{path}.min_max_tokens",
                    f"{model.min_max_tokens} is above context_window_tokens {window}; "
                    "min_max_tokens must fit the context window",
                )

    def model_provider(
        self, model: ModelGroup, ref: ModelProviderRef, path: str
    ) -> ModelProviderRef:
        found = self.providers.get(ref.id)
        if found is None:
            self.problem(
                path,
                f"{ref.id!r} is not the id of any nodes[].providers[] entry; "
                f"{_suggest(ref.id, self.providers)}",
            )
            return ref
        node, provider = found
        total = provider.total_context_tokens
        if total is not None and total < model.context_window_tokens * (
            provider.long_context_capacity
        ):
            need = model.context_window_tokens * provider.long_context_capacity
            self.problem(
                f"{provider_path(node, provider)}.total_context_tokens",
                f"{total} is below models[{model.id}].context_window_tokens "
                f"{model.context_window_tokens} × long_context_capacity "
                f"{provider.long_context_capacity} = {need}; total_context_tokens must cover "
                "that for every model that references the provider",
            )
        if ref.target is not None:
            return ref
        if model.id in provider.models:
            return ref.model_copy(update={"target": model.id})
        if len(provider.models) == 1:
            return ref.model_copy(update={"target": provider.models[0]})
        self.problem(
            path,
            f"the upstream model is ambiguous: provider {ref.id!r} serves "
            f"{_listing(provider.models)} and none is named {model.id!r}; "
            f"write {{id: {ref.id}, target: <one of them>}}",
        )
        return ref

    def principals(self, servable: set[str]) -> None:
        """``provider_pool.principals[]``: unique refs, each naming a configured principal
        (a ``token_ref`` with ``fair_share: token``; ``anonymous`` when there are no tokens),
        and model allow-lists naming only model ids, aliases and route ids."""
        pool = self.config.provider_pool
        tokens = self.config.openai.principal_tokens
        by_token = pool.fair_share == "token"
        if tokens:
            known = {t.token_ref if by_token else t.principal_ref for t in tokens}
        else:
            known = {"anonymous"}
        what = "token_ref" if by_token else "principal_ref"
        seen: set[str] = set()
        for share in pool.principals:
            path = f"provider_pool.principals[{share.ref}]"
            if share.ref in seen:
                self.problem(f"{path}.ref", f"{share.ref!r} is listed twice; refs must be unique")
            seen.add(share.ref)
            if share.ref not in known:
                self.problem(
                    f"{path}.ref",
                    f"{share.ref!r} names no configured principal; with fair_share: "
                    f"{pool.fair_share} a ref is a {what} of openai.principal_tokens, or "
                    f"'anonymous' when there are none; {_suggest(share.ref, sorted(known))}",
                )
            for model in share.models or ():
                if model not in servable:
                    self.problem(
                        f"{path}.models",
                        f"{model!r} is no model id, alias or route id of this config; "
                        f"{_suggest(model, sorted(servable))}",
                    )

    def routes(self, nodes: tuple[Node, ...], model_ids: set[str]) -> tuple[ModelRoute, ...]:
        seen: set[str] = set()
        routes = []
        by_id = {n.id: n for n in nodes}
        for route in self.config.openai.model_routes:
            path = f"openai.model_routes[{route.model}]"
            if route.model in model_ids:
                self.problem(
                    f"{path}.model",
                    f"{route.model!r} is also a models[] id; route ids and model ids are "
                    "separate namespaces and must not collide",
                )
            if route.model in seen:
                self.problem(f"{path}.model", f"{route.model!r} is routed twice")
            seen.add(route.model)
            if route.node is not None and route.node not in by_id:
                self.problem(
                    f"{path}.node",
                    f"{route.node!r} is not a node id; {_suggest(route.node, by_id)}",
                )
                routes.append(route)
                continue
            candidates = [by_id[route.node]] if route.node else list(nodes)
            holders = [(n, a) for n in candidates for a in n.adapters if a.name == route.adapter]
            if len(holders) != 1:
                where = _listing(n.id for n, _ in holders)
                self.problem(
                    f"{path}.adapter",
                    f"{route.adapter!r} names no adapter instance"
                    + (f" of nodes[{route.node}]" if route.node else "")
                    if not holders
                    else f"{route.adapter!r} is an adapter of several nodes ({where}); "
                    "set node: to choose one",
                )
                routes.append(route)
                continue
            node, adapter = holders[0]
            if not adapter.enabled:
                self.problem(
                    f"{path}.adapter", f"{route.adapter!r} is disabled in nodes[{node.id}]"
                )
            else:
                self.reachable(f"nodes[{node.id}].adapters[{adapter.name}]", adapter)
            routes.append(route.model_copy(update={"node": node.id}))
        return tuple(routes)


def config_warnings(config: EdgeConfig) -> tuple[ConfigProblem, ...]:
    """What in a valid config is set but has no effect, each at its path, for the daemon to
    log at start (a warning, not an error: the config runs as it is).

    Today one: ``listen.tls`` while the node listener does not open.
    """
    if config.listen.tls is not None and not config.node_listener_enabled:
        why = (
            "bootstrap.enabled is false"
            if config.bootstrap.enabled is False
            else "no node is remote (none sets token_hash_sha256) and bootstrap.enabled is not true"
        )
        return (
            ConfigProblem(
                "listen.tls",
                f"is set but the node listener does not open: {why}; the certificate and "
                "key are not used",
            ),
        )
    return ()


def validate_config(config: EdgeConfig) -> EdgeConfig:
    """Check every cross-field and cross-entity rule; return the effective config.

    Raises :class:`ConfigError` listing every problem when any rule fails.
    """
    checker = _Checker(config)
    checker.reserved_sections()
    checker.console()
    checker.node_listener()
    checker.node_tokens()
    checker.openai()
    nodes = checker.nodes()
    models = checker.models()
    referenced = {ref.id for model in models for ref in model.providers}
    pool = checker.queue_policy(referenced)
    routes = checker.routes(nodes, {m.id for m in models})
    aliases = {alias for m in models for alias in m.aliases}
    checker.principals({m.id for m in models} | aliases | {r.model for r in routes})
    if not models and not routes:
        checker.problem(
            "models",
            "nothing to serve: define at least one models[] entry or openai.model_routes[] entry",
        )
    if checker.problems:
        raise ConfigError(checker.problems)
    # Legacy per-provider queue values never reach the effective config: they were either
    # promoted into provider_pool above or are ignored because provider_pool is present.
    nodes = tuple(
        node.model_copy(
            update={
                "providers": tuple(
                    p.model_copy(update={"max_queue": None, "queue_timeout_ms": None})
                    for p in node.providers
                )
            }
        )
        for node in nodes
    )
    openai = config.openai.model_copy(update={"model_routes": routes})
    return config.model_copy(
        update={"nodes": nodes, "models": models, "provider_pool": pool, "openai": openai}
    )
