"""Who is calling: bearer token → SHA-256 → principal; and the provider credential to forward.

Raw tokens exist only in the request being served: never logged, stored, labelled or forwarded.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from iop_edge.config.schema import OpenAISection
from iop_edge.errors import AuthError

_BEARER: Final = "bearer "


@dataclass(frozen=True, slots=True)
class Principal:
    """The caller of a request. ``token_ref`` is the unit of usage attribution."""

    principal_ref: str
    principal_alias: str | None
    token_ref: str


#: The principal of requests on an open surface (no ``principal_tokens`` configured).
ANONYMOUS: Final = Principal(principal_ref="anonymous", principal_alias=None, token_ref="anonymous")


class Authenticator:
    """Maps ``Authorization: Bearer <token>`` to a :class:`Principal`.

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
        if not authorization or authorization[:7].lower() != _BEARER:
            raise AuthError(
                "invalid_api_key",
                "Missing bearer token: send 'Authorization: Bearer <token>'.",
            )
        digest = hashlib.sha256(authorization[7:].strip().encode("utf-8")).digest()
        for stored, principal in self._by_prefix.get(digest[:16], ()):
            if hmac.compare_digest(stored, digest):
                return principal
        raise AuthError("invalid_api_key", "Incorrect API key provided.")


class ProviderAuthForwarder:
    """``openai.provider_auth``: carries a raw provider credential from the request upstream.

    The source header is always removed from what goes upstream (even when forwarding is off);
    when enabled, its value is sent as ``target_header: scheme value``. Nothing is stored.
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
        value = request_headers.get(self.from_header, "").strip()
        if not value:
            if self.required:
                raise AuthError(
                    "provider_auth_required",
                    f"This edge forwards a provider credential and requires it: send it in "
                    f"the {self.from_header} header.",
                )
            return {}
        return {self.target_header: self.prefix + value}
