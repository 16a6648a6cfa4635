"""Principal tokens: generated once, stored only as SHA-256 hashes."""

from __future__ import annotations

import hashlib
import secrets

TOKEN_PREFIX = "iop_"


def new_token() -> str:
    """A fresh random bearer token (256 bits of entropy, URL-safe)."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def token_hash(token: str) -> str:
    """The lowercase hex SHA-256 of a token, as ``openai.principal_tokens[].token_hash_sha256``."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()
