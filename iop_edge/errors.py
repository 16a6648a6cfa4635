"""The exception tree of iop-edge.

Every error the daemon raises on purpose derives from :class:`IopEdgeError`::

    IopEdgeError
    ├── ConfigError          a config that cannot be loaded or is invalid (carries every problem)
    ├── ListenError          a listener cannot bind its address (in use, not permitted, ...)
    ├── AdmissionError       the scheduler refused or dropped a request (carries a reason code)
    ├── AdapterError         an upstream call failed (upstream_error / upstream_timeout)
    ├── AuthError            a request without a valid principal or provider credential
    ├── RequestError         a client request that is malformed, too large or names no model
    ├── StoreUnavailable     the shared store of several edges did not serve an operation
    └── (iop_edge.link)      the node link's: LinkViolation (the peer broke the protocol),
                             ProtocolMismatch (another protocol version), LinkClosed

Third-party exceptions are mapped to these once, at the boundary where they occur, with
``raise ... from exc`` so the original stays in the traceback.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

#: Why the scheduler refused or dropped a request (the values of
#: :class:`iop_edge.pool.RejectReason`, which a test keeps equal).
AdmissionReason = Literal[
    "queue_full",
    "queue_timeout",
    "no_available_provider",
    "model_not_found",
    "client_gone",
    "principal_queue_full",
    "rate_limit_exceeded",
    "handed_over",
    "store_unavailable",
]
#: How an upstream call failed.
AdapterCode = Literal["upstream_error", "upstream_timeout"]
#: What went wrong with one attempt on a provider, for its health, its failover (each kind
#: belongs to one ``retry_on`` class: :data:`iop_edge.pool.policy.RETRY_CLASS_OF`) and the
#: failover metric: ``connect`` — never sent (refused, DNS, TLS, a cli that could not be
#: spawned); ``dropped`` — the connection broke after it was made; ``timeout`` —
#: ``request_timeout_ms`` ran out; ``status_5xx`` / ``status_429`` — the upstream answered
#: that; ``exit`` — a cli exited non-zero; ``protocol`` — an answer that broke off or broke the
#: protocol after it started.
FailureKind = Literal[
    "connect", "dropped", "timeout", "status_5xx", "status_429", "exit", "protocol"
]
RetryClass = Literal["connect", "timeout_before_head", "5xx"]
"""A class of failures before the response head that a provider's ``retry_on`` may fail over:
``connect`` — never sent; ``timeout_before_head`` — sent, and no response head in time (or the
connection dropped before it); ``5xx`` — an answered 500/502/503/504, or a cli that exited
non-zero before any output. (Here, not in :mod:`iop_edge.pool.policy` which maps each
:data:`FailureKind` to one: the config's schema names them too, and loading a config must not
load the scheduler.)"""

RETRY_CLASSES: Final[tuple[RetryClass, ...]] = ("connect", "timeout_before_head", "5xx")
"""Every retry class: the default ``retry_on`` of an HTTP provider (an LLM call is safe to
repeat); a ``cli`` provider's is ``connect`` alone (an agent's side effects are not)."""
#: Why a request has no valid principal or credential (401).
AuthCode = Literal[
    "invalid_api_key", "provider_auth_required", "invalid_provider_auth", "invalid_admin_token"
]
#: Why a client request is refused before admission.
RequestCode = Literal[
    "invalid_request_error",
    "model_not_found",
    "context_length_exceeded",
    "request_too_large",
    "unsupported_media_type",
    "origin_not_allowed",
    "host_not_allowed",
    "unsupported_endpoint",
    "unsupported_parameter",
    "response_not_found",
]


class IopEdgeError(Exception):
    """Root of every error iop-edge raises on purpose."""


@dataclass(frozen=True, slots=True)
class ConfigProblem:
    """One problem found in a config: the exact path, and a sentence naming value and rule."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class ConfigError(IopEdgeError):
    """A config failed to load or validate. ``problems`` lists every problem found, in order."""

    def __init__(self, problems: list[ConfigProblem]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))


class ListenError(IopEdgeError):
    """A listener cannot bind its configured address; the message names the listener, the
    address, its config key and the reason (``iop-edge serve`` prints it and exits 1)."""


class AdmissionError(IopEdgeError):
    """The scheduler refused or dropped a request.

    ``reason`` is one of ``queue_full``, ``queue_timeout``, ``no_available_provider``,
    ``model_not_found`` or ``client_gone``; ``config_change`` is true when a live config change
    (a removed model group, a last provider disabled) caused it.
    """

    def __init__(
        self,
        reason: AdmissionReason,
        message: str,
        *,
        config_change: bool = False,
        retry_after: float | None = None,
    ) -> None:
        self.reason = reason
        self.config_change = config_change
        #: seconds until a retry could be admitted (the rate limit's), when known
        self.retry_after = retry_after
        super().__init__(message)


class AdapterError(IopEdgeError):
    """An upstream call failed. ``code`` is ``upstream_error`` or ``upstream_timeout``.

    ``failure`` is how the provider failed (``None``: not the provider's doing, e.g. the
    adapter was closed by a stop); ``failover`` is true when it failed before answering
    anything (connect error, timeout before the response head, a CLI that could not start or
    exited before any output), so the request may be retried on another provider.

    ``error_relayed`` is true when the upstream reported the failure in the stream in the
    client's own shape and that event was already relayed to the client as it came (an
    Anthropic ``event: error`` on Messages passthrough, whose wording the client's agent
    matches on): the caller must not write an error event of its own after it — the stream
    simply ends — but the failure still counts against the provider like any other.
    """

    def __init__(
        self,
        code: AdapterCode,
        message: str,
        *,
        status: int = 502,
        failure: FailureKind | None = "protocol",
        failover: bool = False,
        error_relayed: bool = False,
    ) -> None:
        self.code = code
        self.status = status
        self.failure = failure
        self.failover = failover
        self.error_relayed = error_relayed
        super().__init__(message)


class LeaseLost(AdapterError):
    """The shared store no longer counts the request's lease (its edge could not renew it in
    time): the request is stopped. Not the provider's doing; its message is the client's."""

    def __init__(self, message: str) -> None:
        super().__init__("upstream_error", message, status=503, failure=None)


class AuthError(IopEdgeError):
    """A request lacks a valid principal token or a required provider credential."""

    def __init__(self, code: AuthCode, message: str) -> None:
        self.code = code
        super().__init__(message)


class RequestError(IopEdgeError):
    """A client request the edge refuses before admission.

    ``code`` is ``invalid_request_error``, ``model_not_found``, ``context_length_exceeded`` or
    ``request_too_large``; ``param`` names the offending field when there is one.
    """

    def __init__(
        self, code: RequestCode, message: str, *, status: int = 400, param: str | None = None
    ):
        self.code = code
        self.status = status
        self.param = param
        super().__init__(message)


class StoreUnavailable(IopEdgeError):
    """The shared store (:mod:`iop_edge.shared`) did not serve an operation: connection
    refused or lost, no answer within its ``op_timeout``, or a script error. ``op`` names the
    operation (``acquire``, ``release``, ``renew``, ...); the message names the store by its
    URL with the password hidden."""

    def __init__(self, op: str, message: str) -> None:
        self.op = op
        super().__init__(message)
