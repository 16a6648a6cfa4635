"""The schema of ``edge.yaml`` (SPEC §3): frozen pydantic models with ``extra="forbid"``.

This module is the single source of truth for field names, types and defaults. It checks what
one field can check on its own (types, ranges, formats) with messages that name the bad value and
the rule; rules that relate fields or entities live in :mod:`iop_edge.config.validate`, which
also fills in the defaults that depend on other entities (legacy queue policy, adapter
references, upstream targets).

A value written ``{field}`` inside a validator message is replaced by the field's name when the
message is turned into a :class:`~iop_edge.errors.ConfigProblem`.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Final, Literal, get_args
from urllib.parse import SplitResult, parse_qsl, urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    PrivateAttr,
    Strict,
    StrictBool,
    Tag,
    model_validator,
)

from iop_edge.config.address import ListenAddress
from iop_edge.config.provenance import NO_PROVENANCE, Provenance
from iop_edge.config.redact import redact_store_url
from iop_edge.errors import RETRY_CLASSES, RetryClass

# --- field validators -----------------------------------------------------------------------

_REF_RE: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_MODEL_ID_RE: Final = re.compile(r"^[^\s\[\]]+$")
_HEX64_RE: Final = re.compile(r"^[0-9a-fA-F]{64}$")
_HEADER_RE: Final = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")

DEFAULT_MAX_QUEUE: Final = 16
DEFAULT_QUEUE_TIMEOUT_MS: Final = 30_000
DEFAULT_LONG_CONTEXT_THRESHOLD: Final = 100_000
DEFAULT_MAX_BODY_BYTES: Final = 8 * 1024 * 1024
# Connection limits of the listeners (why these values: docs/operations.md, "Limits").
DEFAULT_KEEPALIVE_TIMEOUT_MS: Final = 75_000
DEFAULT_HEADER_TIMEOUT_MS: Final = 10_000
DEFAULT_WRITE_TIMEOUT_MS: Final = 30_000
DEFAULT_MAX_CONNECTIONS: Final = 4096
# The stored responses of /v1/responses (issue 28; docs/configuration.md, "openai").
DEFAULT_RESPONSES_MAX_ITEMS: Final = 1000
DEFAULT_RESPONSES_MAX_BYTES: Final = 64 * 1024 * 1024
DEFAULT_RESPONSES_TTL_MS: Final = 3_600_000
#: An entry costs 0.5-1 KiB of memory besides its counted bytes (its id, its place in two
#: orders, the allocator's share; bench/bench_responses_store.py): the cap keeps that
#: uncounted part under about 1 GiB.
MAX_RESPONSES_ITEMS: Final = 1_000_000
#: 30 days, as long as OpenAI keeps a stored response; the store forgets on a restart anyway.
MAX_RESPONSES_TTL_MS: Final = 30 * 24 * 3_600_000
# Remote nodes: the heartbeat of a node link (docs/configuration.md, "Remote nodes").
DEFAULT_HEARTBEAT_MS: Final = 2_000
MIN_HEARTBEAT_MS: Final = 100
MAX_HEARTBEAT_MS: Final = 60_000
# Health and failover (SPEC §5.1; docs/admission.md, "Health and failover").
DEFAULT_MAX_ATTEMPTS: Final = 2
DEFAULT_FAILURE_THRESHOLD: Final = 3
DEFAULT_EJECT_MS: Final = 10_000
DEFAULT_MAX_EJECT_MS: Final = 300_000
DEFAULT_PROBE_INTERVAL_MS: Final = 2_000
DEFAULT_PROBE_TIMEOUT_MS: Final = 2_000
#: The path each HTTP runtime type probes under its base_url (cli has no health check).
DEFAULT_HEALTH_PATHS: Final = {"openai_compat": "/models", "ollama": "/api/tags"}
SEULGIVIBE_ALIASES: Final = ("seulgivibe_claude", "seulgivibe_openai")
# Several edges sharing one pool through a store (docs/configuration.md, "provider_pool.shared").
DEFAULT_LEASE_TTL_MS: Final = 10_000
MIN_LEASE_TTL_MS: Final = 1_000
MAX_LEASE_TTL_MS: Final = 600_000
#: The URL schemes of a store (Redis or Valkey): TCP, TCP with TLS, a Unix socket.
STORE_SCHEMES: Final = ("redis", "rediss", "unix")


def _show(value: object) -> str:
    """Render a bad value for a message: short, quoted when it is text."""
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _ref(value: str) -> str:
    if not _REF_RE.match(value):
        raise ValueError(
            f"{_show(value)} is not a valid identifier; {{field}} must start with a letter or "
            "digit and contain only letters, digits, '.', '_' and '-'"
        )
    return value


def _model_id(value: str) -> str:
    if not _MODEL_ID_RE.match(value):
        raise ValueError(
            f"{_show(value)} is not a valid model id; {{field}} must be non-empty, "
            "without whitespace or square brackets"
        )
    return value


def _non_empty(value: str) -> str:
    if not value.strip():
        raise ValueError(f"{_show(value)} is empty; {{field}} must be a non-empty string")
    return value


def _non_negative(value: int) -> int:
    if value < 0:
        raise ValueError(f"{value} is negative; {{field}} must be >= 0")
    return value


def _positive(value: int) -> int:
    if value <= 0:
        raise ValueError(f"{value} is not positive; {{field}} must be > 0")
    return value


def _at_most(limit: int, why: str) -> AfterValidator:
    """A validator refusing values above ``limit``, saying ``why`` the limit is there."""

    def check(value: int) -> int:
        if value > limit:
            raise ValueError(f"{value} is above {limit}; {{field}} must be <= {limit} ({why})")
        return value

    return AfterValidator(check)


def _at_least(limit: int, why: str) -> AfterValidator:
    """A validator refusing values below ``limit``, saying ``why`` the limit is there."""

    def check(value: int) -> int:
        if value < limit:
            raise ValueError(f"{value} is below {limit}; {{field}} must be >= {limit} ({why})")
        return value

    return AfterValidator(check)


def _at_least_one(value: int) -> int:
    if value < 1:
        raise ValueError(
            f"{value} is below 1; {{field}} must be >= 1 (to take a provider out of dispatch, "
            "set enabled: false)"
        )
    return value


def _sha256_hex(value: str) -> str:
    if not _HEX64_RE.match(value):
        raise ValueError(
            f"{_show(value)} is not a SHA-256 hex digest; {{field}} must be 64 hexadecimal "
            "characters (generate one with `iop-edge token new`)"
        )
    return value.lower()


def _header_name(value: str) -> str:
    if not _HEADER_RE.match(value):
        raise ValueError(f"{_show(value)} is not a valid HTTP header name")
    return value


def _address(value: str) -> str:
    try:
        ListenAddress.parse(value)
    except ValueError as exc:
        separator = ":" if str(exc).startswith("an IPv6") else ""
        raise ValueError(f"{_show(value)}{separator} {exc}") from None
    return value


def _http_url(value: str) -> str:
    if not (value.startswith("http://") or value.startswith("https://")) or len(value) < 10:
        raise ValueError(f"{_show(value)} is not an http(s) URL; {{field}} must start with http://")
    return value.rstrip("/")


def _probe_path(value: str) -> str:
    if not value.startswith("/") or any(c.isspace() for c in value) or "#" in value:
        raise ValueError(
            f"{_show(value)} is not a path; {{field}} must start with '/' (it is joined to the "
            "provider's base_url) and contain no whitespace or '#'"
        )
    return value


def _positive_weight(value: float) -> float:
    if not value > 0 or value != value or value == float("inf"):
        raise ValueError(f"{value} is not a positive finite number; {{field}} must be > 0")
    return value


def _distinct(value: tuple[str, ...]) -> tuple[str, ...]:
    seen: set[str] = set()
    for item in value:
        if item in seen:
            raise ValueError(
                f"{_show(item)} is listed twice in {list(value)}; {{field}} entries must be unique"
            )
        seen.add(item)
    return value


def _queue_max(value: Any) -> Any:
    # SPEC §3.1: max_queue 0 or omitted (null) means the default, 16.
    if value is None or (type(value) is int and value == 0):
        return DEFAULT_MAX_QUEUE
    return value


Ref = Annotated[str, AfterValidator(_ref)]
ModelId = Annotated[str, AfterValidator(_model_id)]
NonEmpty = Annotated[str, AfterValidator(_non_empty)]
# Lax mode lets YAML lists fill tuples; numbers and booleans stay strict ("8" is not 8).
NonNegative = Annotated[int, Strict(), AfterValidator(_non_negative)]
Positive = Annotated[int, Strict(), AfterValidator(_positive)]
Capacity = Annotated[int, Strict(), AfterValidator(_at_least_one)]
Sha256Hex = Annotated[str, AfterValidator(_sha256_hex)]
HeaderName = Annotated[str, AfterValidator(_header_name)]
Address = Annotated[str, AfterValidator(_address)]
HttpUrl = Annotated[str, AfterValidator(_http_url)]
ProbePath = Annotated[str, AfterValidator(_probe_path)]
# A number (an int is taken as a float), never a string or a bool ("3" is not 3).
Weight = Annotated[float, Strict(), AfterValidator(_positive_weight)]


class _Section(BaseModel):
    """Base of every config model: immutable, unknown keys rejected, no type coercion."""

    model_config = ConfigDict(frozen=True, extra="forbid")


# --- identity and listeners -----------------------------------------------------------------


class EdgeIdentity(_Section):
    """``edge``: who this edge is (used in logs, payloads and metrics)."""

    id: Ref = "edge"


class ListenTls(_Section):
    """``listen.tls``: the certificate chain and private key (PEM files) the node listener
    serves TLS with; the shell reads them at start (this module reads no file)."""

    cert_file: NonEmpty
    key_file: NonEmpty


class ListenSection(_Section):
    """``listen``: the node-facing listener, where remote node agents (``iop-node``) connect.

    It opens when :attr:`EdgeConfig.node_listener_enabled`; off loopback it needs ``tls``
    (checked in :mod:`iop_edge.config.validate`): a node sends its token and receives
    provider credentials over it.
    """

    address: Address = "127.0.0.1:7600"
    tls: ListenTls | None = None


class BootstrapSection(_Section):
    """``bootstrap``: how remote nodes join. ``enabled``: ``None`` (the default) opens the node
    listener when any node is remote, ``true`` always, ``false`` never (then no node may be
    remote). ``heartbeat_ms``: how often each side of a node link pings; a link silent for
    three heartbeats is dead. The edge derives each node's config itself (its payload)."""

    enabled: StrictBool | None = None
    heartbeat_ms: Annotated[
        Positive,
        _at_least(MIN_HEARTBEAT_MS, "faster pings cost traffic and CPU on both sides"),
        _at_most(MAX_HEARTBEAT_MS, "a silent link is declared dead after three of them"),
    ] = DEFAULT_HEARTBEAT_MS


class LoggingSection(_Section):
    """``logging``: level and format (one JSON object per event, or a console rendering)."""

    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["json", "console"] = "json"


class ReloadSection(_Section):
    """``reload``: how the daemon notices a changed config file.

    ``watch`` (default true) watches the file's directory and re-reads the file every 30 s; with
    ``false`` only SIGHUP (``systemctl reload``) and the admin API refresh. Restart-class: the
    watcher is started with the process.
    """

    watch: StrictBool = True


class MetricsSection(_Section):
    """``metrics``: the Prometheus ``/metrics`` listener."""

    enabled: StrictBool = True
    listen: Address = "127.0.0.1:9464"


class ConsoleSection(_Section):
    """``console``: the admin API listener (status, refresh).

    ``admin_token_sha256`` (the SHA-256 of an admin token, never the token) makes every admin
    request need ``Authorization: Bearer <token>``; a ``listen`` address off loopback
    requires it (checked in :mod:`iop_edge.config.validate`).
    """

    enabled: StrictBool = True
    listen: Address = "127.0.0.1:7601"
    admin_token_sha256: Sha256Hex | None = None


class ControlPlaneSection(_Section):
    """``control_plane``: reserved for a central control plane."""

    enabled: StrictBool = False
    url: HttpUrl | None = None


class A2ASection(_Section):
    """``a2a``: reserved for an agent-to-agent listener."""

    enabled: StrictBool = False
    listen: Address | None = None


# --- the OpenAI surface ---------------------------------------------------------------------


class PrincipalToken(_Section):
    """One accepted bearer token, stored only as its SHA-256 hash, mapped to a principal."""

    token_ref: Ref
    token_hash_sha256: Sha256Hex
    principal_ref: NonEmpty
    principal_alias: str | None = None


class ProviderAuth(_Section):
    """Request-time forwarding of a raw provider credential from a request header upstream."""

    enabled: StrictBool = False
    from_header: HeaderName = "X-IOP-Provider-Authorization"
    target_header: HeaderName = "Authorization"
    scheme: str = "Bearer"
    required: StrictBool = True


class ModelRoute(_Section):
    """A compatibility route: external ``model`` id → an adapter instance and upstream target.

    Its requests are admitted like a model group's (SPEC §5.2: principals' caps and fair
    share); ``capacity`` caps how many run at once (``None``: unbounded). Live."""

    model: ModelId
    adapter: Ref
    target: NonEmpty
    node: Ref | None = None
    capacity: Capacity | None = None


_DEFAULT_PORTS: Final = {"http": 80, "https": 443}


def _origin(value: str) -> str:
    # Stored as a browser serialises the Origin header (lowercase, no default port), so the
    # request path compares strings and parses nothing.
    rule = (
        "{field} entries must be origins as a browser sends them in the Origin header: "
        "http(s)://host[:port], without a path, a query or a wildcard"
    )
    try:
        parts = urlsplit(value.strip())
        port = parts.port
    except ValueError:
        raise ValueError(f"{_show(value)} is not an origin; {rule}") from None
    host = parts.hostname
    if (
        parts.scheme not in _DEFAULT_PORTS
        or not host
        or "*" in value
        or parts.username is not None
        or parts.path not in ("", "/")
        or parts.query
        or parts.fragment
    ):
        raise ValueError(f"{_show(value)} is not an origin; {rule}")
    netloc = f"[{host}]" if ":" in host else host
    if port is not None and port != _DEFAULT_PORTS[parts.scheme]:
        netloc += f":{port}"
    return f"{parts.scheme}://{netloc}"


Origin = Annotated[str, AfterValidator(_origin)]


_STORE_FORMS: Final = {
    "redis": "redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]",
    "rediss": "rediss://[[USER]:PASSWORD@]HOST[:PORT][/DB]",
    "unix": "unix://[[USER]:PASSWORD@]/SOCKET/PATH[?db=DB]",
}
_DB_RE: Final = re.compile(r"^[0-9]+$")


def _joined(items: list[str], conjunction: str = "and") -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} {conjunction} {items[-1]}"


def _ends_early(value: str, parts: SplitResult) -> bool:
    """Whether an ``@`` follows the host part of a store URL: then a ``/``, ``?`` or ``#``
    in its user-info (the password, or a user name alone) ended the host part early, and
    what was parsed after it (path, query) holds a piece of the user-info. (Without a host
    part, ``unix:///run/x@y.sock``, an ``@`` is the socket path's.)"""
    netloc = parts.netloc
    return bool(netloc) and "@" in value[value.find("//") + 2 + len(netloc) :]


def _store_defects(value: str) -> tuple[str | None, list[str]]:
    """The scheme of a store URL (when it is one of :data:`STORE_SCHEMES`) and everything
    wrong with the URL, each as a clause (``it has no host``); no clause quotes its user-info."""
    written, colon, _ = value.partition(":")
    scheme = written.lower()  # as urlsplit reads it (REDIS:// is redis://)
    if not colon or scheme not in STORE_SCHEMES:
        starts = [f"{known}://" for known in STORE_SCHEMES]
        return None, [f"it does not start with {_joined(starts, 'or')}"]
    if any(c.isspace() for c in value):
        return scheme, ["it contains whitespace"]
    try:
        parts = urlsplit(value)
    except ValueError:  # an unbalanced IPv6 bracket, a netloc that NFKC-normalizes to '@'...
        # (not quoting the exception: it quotes the netloc, the password with it)
        return scheme, ["it does not parse as a URL"]
    if _ends_early(value, parts):
        # Nothing after the host part can be read as meant, nor quoted (it holds a piece of
        # the password), so nothing else is said.
        return scheme, [
            "an '@' follows its host part, so a '/', '?' or '#' in its password ended the host "
            "part early (percent-encode them in the password: %2F, %3F, %23)"
        ]
    defects: list[str] = []
    query: dict[str, str] = {}
    for name, given in parse_qsl(parts.query, keep_blank_values=True):
        if name != "db":
            defects.append(f"its query parameter {name!r} is not supported (only db is)")
        elif "db" in query:
            defects.append("it gives ?db= twice")
        query.setdefault(name, given)
    db = query.get("db")
    if scheme == "unix":
        host = parts.netloc.rpartition("@")[2]
        if host:
            defects.append(
                f"it names a host ({host!r}), which a unix:// URL cannot have "
                "(write three slashes: unix:///run/redis.sock)"
            )
        elif not parts.path or parts.path == "/":
            defects.append("it has no socket path")
        elif not parts.path.startswith("/"):
            defects.append(f"its socket path {parts.path!r} is not absolute")
    else:
        if not parts.hostname:
            defects.append("it has no host")
        try:
            port = parts.port
        except ValueError:
            port = -1
        if port is not None and not 1 <= port <= 65535:
            shown = parts.netloc.rpartition("@")[2].rpartition(":")[2]
            defects.append(f"its port {shown!r} is not a number from 1 to 65535")
        path = parts.path.strip("/") if parts.path.count("/") <= 1 else parts.path
        if path and db is not None:
            defects.append("it gives the database twice (in the path and as ?db=)")
        elif path:
            db = path
    if db is not None and not _DB_RE.match(db):
        defects.append(f"its database {db!r} is not an integer >= 0")
    if parts.fragment or value.endswith("#"):
        defects.append("it has a fragment (#...)")
    return scheme, defects


def _store_url(value: str) -> str:
    # The message quotes the value through redact_store_url, and the loader leaves it as it
    # is (load.problems_from_validation_error): keep every part of it free of secrets.
    scheme, defects = _store_defects(value)
    if defects:
        forms = [_STORE_FORMS[scheme]] if scheme else list(_STORE_FORMS.values())
        raise ValueError(
            f"{_show(redact_store_url(value))} is not a valid store URL: {_joined(defects)}; "
            f"{{field}} must be {_joined(forms, 'or')}"
        )
    return value


StoreUrl = Annotated[str, AfterValidator(_store_url)]


class ResponsesStoreSection(_Section):
    """``openai.responses_store``: the in-memory store of ``/v1/responses``
    (:mod:`iop_edge.api.responses_store`), which ``previous_response_id`` and
    ``GET``/``DELETE /v1/responses/{id}`` read.

    At most ``max_items`` responses and ``max_bytes`` bytes (each response's JSON plus its
    conversation's; least recently used out first; ``max_bytes`` >= ``openai.max_body_bytes``,
    checked in :mod:`iop_edge.config.validate`), each kept ``ttl_ms`` from when it was stored.
    Live. Nothing survives a restart.
    """

    max_items: Annotated[
        Positive, _at_most(MAX_RESPONSES_ITEMS, "each entry also costs memory max_bytes omits")
    ] = DEFAULT_RESPONSES_MAX_ITEMS
    max_bytes: Positive = DEFAULT_RESPONSES_MAX_BYTES
    ttl_ms: Annotated[
        Positive, _at_most(MAX_RESPONSES_TTL_MS, "30 days, the longest OpenAI keeps a response")
    ] = DEFAULT_RESPONSES_TTL_MS


class OpenAISection(_Section):
    """``openai``: the OpenAI-compatible listener, its principals and its route catalog.

    ``allowed_origins`` lists the browser origins (web pages) allowed to call the surface; a
    request carrying any other ``Origin`` header is refused (:mod:`iop_edge.api.guard`).
    ``responses_store`` bounds the stored responses of ``/v1/responses`` (live).
    """

    listen: Address = "127.0.0.1:8080"
    allow_anonymous: StrictBool = False
    max_body_bytes: Positive = DEFAULT_MAX_BODY_BYTES
    keepalive_timeout_ms: Positive = DEFAULT_KEEPALIVE_TIMEOUT_MS
    header_timeout_ms: Positive = DEFAULT_HEADER_TIMEOUT_MS
    write_timeout_ms: Positive = DEFAULT_WRITE_TIMEOUT_MS
    max_connections: Positive = DEFAULT_MAX_CONNECTIONS
    principal_tokens: tuple[PrincipalToken, ...] = ()
    provider_auth: ProviderAuth = ProviderAuth()
    model_routes: tuple[ModelRoute, ...] = ()
    allowed_origins: tuple[Origin, ...] = ()
    responses_store: ResponsesStoreSection = ResponsesStoreSection()


# --- queue policy and model groups ----------------------------------------------------------


class FailoverSection(_Section):
    """``provider_pool.failover``: ``max_attempts`` tries per request on distinct providers,
    all before the client's first byte (1: no failover)."""

    max_attempts: Positive = DEFAULT_MAX_ATTEMPTS


class HealthSection(_Section):
    """``provider_pool.health``: ``failure_threshold`` consecutive failures eject a provider
    for ``eject_ms``, doubled on each re-ejection up to ``max_eject_ms`` (checked >=
    ``eject_ms`` in :mod:`iop_edge.config.validate`); an ejected provider with a health check
    is probed every ``probe_interval_ms``."""

    failure_threshold: Positive = DEFAULT_FAILURE_THRESHOLD
    eject_ms: Positive = DEFAULT_EJECT_MS
    max_eject_ms: Positive = DEFAULT_MAX_EJECT_MS
    probe_interval_ms: Positive = DEFAULT_PROBE_INTERVAL_MS


class PrincipalShare(_Section):
    """``provider_pool.principals[]``: one principal's share of the pool and its limits.

    ``ref`` names a ``principal_ref`` (a ``token_ref`` with ``fair_share: token``; checked in
    :mod:`iop_edge.config.validate`). ``weight``: its share of freed slots while several
    principals wait. ``max_in_flight``: leases it may hold at once, pool-wide;
    ``max_queued``: its pending requests; ``max_requests_per_minute``: its request rate;
    ``models``: the model ids and route ids it may use (omitted: all).
    """

    ref: NonEmpty
    weight: Weight = 1.0
    max_in_flight: Positive | None = None
    max_queued: NonNegative | None = None
    max_requests_per_minute: Positive | None = None
    models: tuple[NonEmpty, ...] | None = None


class SharedSection(_Section):
    """``provider_pool.shared``: the pool's capacity and principals' limits held across every
    edge that names the same store (Redis or Valkey).

    ``store``: the store's URL (``redis://``, ``rediss://`` for TLS, or ``unix://`` and a
    socket's absolute path; a database number in the path, or ``?db=N`` for a socket); may
    hold a password (written ``${VAR}``), so it is shown only as :attr:`store_redacted` and
    is not in the pool's policy. Restart-class: the connection is opened at start.
    ``lease_ttl_ms``: how long a lease a replica stops renewing (it died) still holds its slot.
    ``on_store_down``: ``static_split`` (each edge takes ``floor(capacity / members)``) or
    ``reject`` (503). Both live.
    """

    store: Annotated[StoreUrl, Field(repr=False)]  # a repr lands in logs and tracebacks
    lease_ttl_ms: Annotated[
        int,
        Strict(),
        _at_least(MIN_LEASE_TTL_MS, "each lease is renewed every third of it"),
        _at_most(MAX_LEASE_TTL_MS, "a dead edge's leases hold their slots that long"),
    ] = DEFAULT_LEASE_TTL_MS
    on_store_down: Literal["static_split", "reject"] = "static_split"

    @property
    def store_redacted(self) -> str:
        """``store`` as logs, status and reports may show it: the password ``<redacted>``."""
        return redact_store_url(self.store)


class ProviderPool(_Section):
    """``provider_pool``: the queue, failover and health policy shared by every model group and
    provider.

    ``max_queue`` caps all pending requests of the edge (0 or omitted → 16);
    ``queue_timeout_ms`` is each pending request's maximum wait (omitted → 30000, 0 → none).
    ``shared`` (omitted: none) holds the pool's limits across several edges through a store.
    """

    max_queue: Annotated[NonNegative, BeforeValidator(_queue_max)] = DEFAULT_MAX_QUEUE
    queue_timeout_ms: NonNegative = DEFAULT_QUEUE_TIMEOUT_MS
    failover: FailoverSection = FailoverSection()
    health: HealthSection = HealthSection()
    fair_share: Literal["principal", "token", "none"] = "principal"
    principals: tuple[PrincipalShare, ...] = ()
    shared: SharedSection | None = None


class ModelProviderRef(_Section):
    """An entry of ``models[].providers``: a provider id and the upstream model name to ask for.

    ``target`` is always set in an effective config (resolved at load when omitted).
    """

    id: Ref
    target: NonEmpty | None = None


class ModelGroup(_Section):
    """A ``models[]`` entry: the canonical routing key into the provider pool.

    ``aliases`` are further names the group answers to (Claude Code asks for ``claude-…``
    names): each is a model id of its own in requests and in ``GET /v1/models``, and resolves
    to this group exactly as ``id`` does. Unique across every model id, alias and route id
    (checked in :mod:`iop_edge.config.validate`). Live, like every field of a group.
    """

    id: ModelId
    aliases: tuple[ModelId, ...] = ()
    display_name: str | None = None
    context_window_tokens: Positive
    providers: tuple[ModelProviderRef, ...] = Field(min_length=1)
    default_max_tokens: Positive | None = None
    min_max_tokens: Positive | None = None
    default_thinking_token_budget: NonNegative | None = None


# --- nodes, adapters, providers -------------------------------------------------------------

AdapterType = Literal["openai_compat", "ollama", "cli"]
ProviderType = Literal["openai_compat", "ollama", "cli", "seulgivibe_claude", "seulgivibe_openai"]
OutputFormat = Literal["text", "json", "stream-json"]
NativeApi = Literal["messages", "responses"]
"""An API besides OpenAI's chat that an ``openai_compat`` upstream serves itself, so the edge
passes its requests through instead of translating them (``native_apis``): ``messages``,
Anthropic Messages (``{base_url}/messages`` and ``{base_url}/messages/count_tokens``);
``responses``, OpenAI Responses (``{base_url}/responses``). The one list of them: a new one is
added here."""
NATIVE_APIS: Final[tuple[NativeApi, ...]] = get_args(NativeApi)
"""Every :data:`NativeApi`, in order."""
#: The runtime types that may declare ``native_apis``: the others never speak an API but their
#: own (``ollama``) or none (``cli``); their requests are translated.
NATIVE_API_TYPES: Final = ("openai_compat",)

#: Provider-first execution fields: set on a provider, they override its adapter's values.
EXECUTION_FIELDS: Final = (
    "provider",
    "endpoint",
    "base_url",
    "headers",
    "command",
    "args",
    "env",
    "mode",
    "resume_args",
    "output_format",
    "context_size",
    "request_timeout_ms",
    "native_apis",
)


class ExecutionFields(_Section):
    """How to reach an upstream; shared by adapter instances and (as overrides) providers."""

    provider: NonEmpty | None = None
    endpoint: NonEmpty | None = None
    base_url: HttpUrl | None = None
    headers: dict[HeaderName, str] | None = None
    command: NonEmpty | None = None
    args: tuple[str, ...] | None = None
    env: dict[str, str] | None = None
    mode: NonEmpty | None = None
    resume_args: tuple[str, ...] | None = None
    output_format: OutputFormat | None = None
    context_size: Positive | None = None
    request_timeout_ms: Positive | None = None
    native_apis: Annotated[tuple[NativeApi, ...], AfterValidator(_distinct)] | None = None


class HealthCheck(_Section):
    """``nodes[].providers[].health_check``: how an ejected provider is probed —
    ``GET {base_url}{path}`` with the provider's ``headers``, healthy on a 2xx answer within
    ``timeout_ms``. ``false`` turns probing off (then an ejected provider gets one trial
    request once its ejection ends, as a cli provider always does)."""

    path: ProbePath
    timeout_ms: Positive = DEFAULT_PROBE_TIMEOUT_MS


def _health_check_kind(value: Any) -> str:
    return "health_check:off" if isinstance(value, bool) else "health_check:on"


#: Tags of the union members of ``health_check``: a problem's path leaves them out.
UNION_TAGS: Final = frozenset({"health_check:on", "health_check:off"})

# A HealthCheck, or a boolean (`true` becomes the type's default check before this is
# validated; the validator refuses `true` on a cli provider). The discriminator reports a bad
# value against the one member it was meant for.
HealthCheckSetting = Annotated[
    Annotated[HealthCheck, Tag("health_check:on")] | Annotated[StrictBool, Tag("health_check:off")],
    Discriminator(_health_check_kind),
]


class Adapter(ExecutionFields):
    """A named adapter instance of a node (``nodes[].adapters[]``)."""

    name: Ref
    type: AdapterType
    enabled: StrictBool = True


def _runtime_type(data: Any) -> Any:
    # SPEC §3.1: seulgivibe_* types run as openai_compat; the alias survives as the
    # `provider` label unless one is set. Defaults that depend on a sibling field are filled
    # here so the schema stays the one place defaults live.
    if not isinstance(data, dict):
        return data
    data = dict(data)
    kind = data.get("type")
    if kind in SEULGIVIBE_ALIASES:
        data["type"] = "openai_compat"
        if data.get("provider") is None:
            data["provider"] = kind
    if data.get("long_context_capacity") is None:
        capacity = data.get("capacity", 1)
        if type(capacity) is int:
            data["long_context_capacity"] = capacity
    check = data.get("health_check")
    runtime = data.get("type")  # after the alias normalization above
    default_path = DEFAULT_HEALTH_PATHS.get(runtime) if isinstance(runtime, str) else None
    if check is None or check is True:
        # cli (or an unknown type, refused elsewhere) has no check to turn on; `true` on a
        # cli provider is left for the validator to name.
        data["health_check"] = {"path": default_path} if default_path else (check or False)
    elif isinstance(check, dict) and "path" not in check and default_path:
        data["health_check"] = {**check, "path": default_path}
    if data.get("retry_on") is None and runtime == "cli":
        data["retry_on"] = ("connect",)  # an agent's side effects must not run twice
    return data


class Provider(ExecutionFields):
    """A ``nodes[].providers[]`` entry: one schedulable resource of a node.

    ``adapter`` is always set in an effective config (the exact instance name, resolved at load
    from a legacy type-name reference or from the provider's type when omitted).
    ``max_queue`` / ``queue_timeout_ms`` are legacy inputs, read only without ``provider_pool``
    and always cleared in an effective config. ``health_check`` is always a
    :class:`HealthCheck` or ``false`` in an effective config (omitted: the type's default,
    ``GET /models`` for openai_compat, ``GET /api/tags`` for ollama, none for cli).
    ``retry_on`` lists the failures before the response head that fail over to another provider
    (``connect``, ``timeout_before_head``, ``5xx``; a 429 always does): all three for an HTTP
    type, ``[connect]`` for cli. Live.
    ``first_token_timeout_ms`` / ``stream_idle_timeout_ms`` bound a stream's first frame and
    each gap between frames (live: scheduling policy, carried to each request by the catalog).
    """

    id: Ref
    type: ProviderType
    category: Literal["api", "cli", "local_inference"]
    adapter: Ref | None = None
    models: tuple[NonEmpty, ...] = Field(min_length=1)
    enabled: StrictBool = True
    capacity: Capacity = 1
    long_context_capacity: NonNegative = 1
    total_context_tokens: Positive | None = None
    priority: NonNegative = 0
    first_token_timeout_ms: Positive | None = None
    stream_idle_timeout_ms: Positive | None = None
    max_queue: NonNegative | None = None
    queue_timeout_ms: NonNegative | None = None
    health_check: HealthCheckSetting = False
    retry_on: tuple[RetryClass, ...] = RETRY_CLASSES

    _normalize = model_validator(mode="before")(_runtime_type)


class NodeRuntime(_Section):
    """``nodes[].runtime``: legacy node runtime concurrency metadata (informational)."""

    max_concurrency: Positive | None = None


class Node(_Section):
    """A ``nodes[]`` entry: the adapters and providers of one machine.

    With ``token_hash_sha256`` (the SHA-256 of a node token, ``iop-edge token node``) the node
    is :attr:`remote`: its agent dials the edge's node listener and runs the adapters there;
    without, they run in the edge process.
    """

    id: Ref
    alias: NonEmpty | None = None
    agent_kind: NonEmpty = "server"
    token_hash_sha256: Sha256Hex | None = None
    runtime: NodeRuntime = NodeRuntime()
    adapters: tuple[Adapter, ...] = ()
    providers: tuple[Provider, ...] = ()

    @property
    def remote(self) -> bool:
        """Whether the node's adapters run in a remote agent (``iop-node``), not in the edge."""
        return self.token_hash_sha256 is not None


# --- the root -------------------------------------------------------------------------------


class EdgeConfig(_Section):
    """The whole ``edge.yaml``. After :func:`iop_edge.config.load_config` it is *effective*:
    every default filled in, legacy forms normalized, references resolved."""

    edge: EdgeIdentity = EdgeIdentity()
    listen: ListenSection = ListenSection()
    bootstrap: BootstrapSection = BootstrapSection()
    logging: LoggingSection = LoggingSection()
    reload: ReloadSection = ReloadSection()
    metrics: MetricsSection = MetricsSection()
    console: ConsoleSection = ConsoleSection()
    control_plane: ControlPlaneSection = ControlPlaneSection()
    a2a: A2ASection = A2ASection()
    openai: OpenAISection = OpenAISection()
    long_context_threshold_tokens: Positive = DEFAULT_LONG_CONTEXT_THRESHOLD
    provider_pool: ProviderPool = ProviderPool()
    models: tuple[ModelGroup, ...] = ()
    nodes: tuple[Node, ...] = ()

    # Not a field: equality, hash, dumps and the config hash never see it (provenance.py).
    _provenance: Provenance = PrivateAttr(default=NO_PROVENANCE)

    @property
    def remote_nodes(self) -> tuple[Node, ...]:
        """The nodes whose agents dial in (:attr:`Node.remote`), in config order."""
        return tuple(node for node in self.nodes if node.remote)

    @property
    def node_listener_enabled(self) -> bool:
        """Whether the node listener (``listen.address``) opens: ``bootstrap.enabled`` when
        set, else whether any node is remote."""
        enabled = self.bootstrap.enabled
        return bool(self.remote_nodes) if enabled is None else enabled

    @property
    def provenance(self) -> Provenance:
        """The values this config took from the environment or from files, never to be shown
        (:mod:`iop_edge.config.provenance`); empty for a config built from values alone."""
        return self._provenance

    def with_provenance(self, provenance: Provenance) -> EdgeConfig:
        """This config, recorded as holding ``provenance``'s values (a copy, equal to it)."""
        copy = self.model_copy()
        copy._provenance = provenance
        return copy
