"""Who is calling: bearer token (or ``x-api-key``) → SHA-256 → principal; the admin token; and
the provider credential to forward.

Raw tokens exist only in the request being served: never logged, stored, labelled or forwarded,
and never quoted in an error message. A credential is printable ASCII (what ``iop-edge token
new`` issues and what HTTP can carry safely): a header holding anything else — a pasted
non-breaking space, bytes that are not UTF-8 (aiohttp hands those over as surrogate escapes) —
is refused as malformed with a 401, before it is hashed or forwarded.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from iop_edge.config.schema import ConsoleSection, OpenAISection
from iop_edge.errors import AuthCode, AuthError

_BEARER: Final = "bearer "
#: What ``strip`` may remove around a credential: HTTP's own whitespace, nothing wider (a
#: Unicode-aware strip would accept a token followed by a non-breaking space).
_HTTP_SPACE: Final = " \t"
#: Where the CLI reads the admin token from (named in error messages).
ADMIN_TOKEN_ENV: Final = "IOP_EDGE_ADMIN_TOKEN"
#: The header Anthropic's clients send their key in (``ANTHROPIC_API_KEY``).
API_KEY_HEADER: Final = "x-api-key"
_MISSING_TOKEN: Final = (
    "Missing API key: send 'Authorization: Bearer <token>' or 'x-api-key: <token>'."
)


@dataclass(frozen=True, slots=True)
class Principal:
    """The caller of a request. ``token_ref`` is the unit of usage attribution."""

    principal_ref: str
    principal_alias: str | None
    token_ref: str


#: The principal of requests on an open surface (no ``principal_tokens`` configured).
ANONYMOUS: Final = Principal(principal_ref="anonymous", principal_alias=None, token_ref="anonymous")


def printable_ascii(value: str) -> bool:
    """True when ``value`` is printable ASCII (spaces included): a credential HTTP can carry."""
    return value.isascii() and value.isprintable()


def bearer_digest(authorization: str | None, code: AuthCode, missing: str) -> bytes:
    """The SHA-256 of the token in ``Authorization: Bearer <token>``.

    Raises :class:`AuthError` with ``code``: ``missing`` when there is no bearer token, a fixed
    "malformed" message (which never quotes the value) when the token is not printable ASCII.
    """
    if not authorization or authorization[:7].lower() != _BEARER:
        raise AuthError(code, missing)
    token = authorization[7:].strip(_HTTP_SPACE)
    if not token:
        raise AuthError(code, missing)
    if not printable_ascii(token):
        raise AuthError(
            code,
            "The bearer token is malformed: it holds a character that is not printable ASCII "
            "(a pasted non-breaking space or line break?). Send the token exactly as issued.",
        )
    return hashlib.sha256(token.encode("ascii")).digest()


def api_key_digest(value: str) -> bytes:
    """The SHA-256 of the token in an ``x-api-key`` header value (non-empty after HTTP
    whitespace is stripped); a token that is not printable ASCII is refused, never quoted."""
    token = value.strip(_HTTP_SPACE)
    if not printable_ascii(token):
        raise AuthError(
            "invalid_api_key",
            "The x-api-key header is malformed: it holds a character that is not printable "
            "ASCII (a pasted non-breaking space or line break?). Send the token exactly as "
            "issued.",
        )
    return hashlib.sha256(token.encode("ascii")).digest()


class Authenticator:
    """Maps ``Authorization: Bearer <token>`` (or ``x-api-key: <token>``, see
    :meth:`authenticate_headers`) to a :class:`Principal`.

    The token is hashed with SHA-256. Stored digests are indexed by their first 16 bytes — a
    lookup whose timing depends only on a hash output the caller cannot steer — and the full
    digest is then compared with :func:`hmac.compare_digest`, in constant time. With no principal
    tokens configured every request is :data:`ANONYMOUS` (the config allows that only on a
    loopback listener, or with ``allow_anonymous``).
    """

    def __init__(self, section: OpenAISection) -> None:
        self._by_prefix: dict[bytes, list[tuple[bytes, Principal]]] = {}
        for t in section.principal_tokens:
            digest = bytes.fromhex(t.token_hash_sha256)
            principal = Principal(
                principal_ref=t.principal_ref,
                principal_alias=t.principal_alias,
                token_ref=t.token_ref,
            )
            self._by_prefix.setdefault(digest[:16], []).append((digest, principal))

    @property
    def open(self) -> bool:
        """True when no principal tokens are configured (every request is anonymous)."""
        return not self._by_prefix

    def authenticate(self, authorization: str | None) -> Principal:
        """The principal of an ``Authorization`` header value, or :class:`AuthError`."""
        if not self._by_prefix:
            return ANONYMOUS
        digest = bearer_digest(
            authorization,
            "invalid_api_key",
            "Missing bearer token: send 'Authorization: Bearer <token>'.",
        )
        return self._principal(digest)

    def authenticate_headers(self, headers: Mapping[str, str]) -> Principal:
        """The principal of a request's headers: the token of ``Authorization: Bearer <token>``
        or of ``x-api-key: <token>`` (what Anthropic's clients send; an empty one counts as
        absent). With both, they must hold the same token: two different credentials are
        refused (401 ``invalid_api_key`` naming both headers, never quoting either) rather
        than one silently chosen."""
        if not self._by_prefix:
            return ANONYMOUS
        authorization = headers.get("Authorization")
        api_key = headers.get(API_KEY_HEADER, "")
        if not api_key.strip(_HTTP_SPACE):
            return self._principal(bearer_digest(authorization, "invalid_api_key", _MISSING_TOKEN))
        digest = api_key_digest(api_key)
        if authorization is not None:
            bearer = bearer_digest(
                authorization,
                "invalid_api_key",
                "The Authorization header holds no bearer token and x-api-key is set: send "
                "the token in x-api-key alone, or as 'Authorization: Bearer <token>'.",
            )
            if not hmac.compare_digest(bearer, digest):
                raise AuthError(
                    "invalid_api_key",
                    "The Authorization and x-api-key headers hold different tokens: send the "
                    "token in one of them (or the same token in both).",
                )
        return self._principal(digest)

    def _principal(self, digest: bytes) -> Principal:
        for stored, principal in self._by_prefix.get(digest[:16], ()):
            if hmac.compare_digest(stored, digest):
                return principal
        raise AuthError("invalid_api_key", "Incorrect API key provided.")


class AdminTokenCheck:
    """``console.admin_token_sha256``: when set, every admin request needs
    ``Authorization: Bearer <admin token>`` (SHA-256 compared in constant time)."""

    def __init__(self, section: ConsoleSection) -> None:
        digest = section.admin_token_sha256
        self._digest = bytes.fromhex(digest) if digest is not None else None

    @property
    def enabled(self) -> bool:
        """True when an admin token is configured."""
        return self._digest is not None

    def check(self, authorization: str | None) -> None:
        """Raise :class:`AuthError` (``invalid_admin_token``) unless the header holds the
        admin token; do nothing when no admin token is configured."""
        if self._digest is None:
            return
        digest = bearer_digest(
            authorization,
            "invalid_admin_token",
            "The admin API needs the admin token: send 'Authorization: Bearer <token>' "
            f"(iop-edge status and config refresh read it from ${ADMIN_TOKEN_ENV} or "
            "--admin-token-file).",
        )
        if not hmac.compare_digest(self._digest, digest):
            raise AuthError("invalid_admin_token", "Incorrect admin token provided.")


class ProviderAuthForwarder:
    """``openai.provider_auth``: carries a raw provider credential from the request upstream.

    The source header is always removed from what goes upstream (even when forwarding is off);
    when enabled, its value is sent as ``target_header: scheme value``. Nothing is stored. A
    value that is not printable ASCII is refused (401 ``invalid_provider_auth``) rather than
    forwarded as raw bytes.
    """

    def __init__(self, section: OpenAISection) -> None:
        auth = section.provider_auth
        self.enabled = auth.enabled
        self.from_header = auth.from_header
        self.target_header = auth.target_header
        self.prefix = f"{auth.scheme} " if auth.scheme else ""
        self.required = auth.required

    def upstream_headers(self, request_headers: Mapping[str, str]) -> dict[str, str]:
        """The headers to add upstream for this request (empty when forwarding is off)."""
        if not self.enabled:
            return {}
        value = request_headers.get(self.from_header, "").strip(_HTTP_SPACE)
        if not value:
            if self.required:
                raise AuthError(
                    "provider_auth_required",
                    f"This edge forwards a provider credential and requires it: send it in "
                    f"the {self.from_header} header.",
                )
            return {}
        if not printable_ascii(value):
            raise AuthError(
                "invalid_provider_auth",
                f"The {self.from_header} header is malformed: it holds a character that is not "
                "printable ASCII (a pasted non-breaking space or line break?). Send the "
                "credential exactly as issued.",
            )
        return {self.target_header: self.prefix + value}
