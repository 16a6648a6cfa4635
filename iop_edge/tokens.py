"""Tokens: generated once, stored only as SHA-256 hashes.

Principal and admin tokens start ``iop_``; node tokens (what ``iop-node`` authenticates with)
start ``iopn_``, so a leaked one says what it opens.
"""

from __future__ import annotations

import hashlib
import secrets

TOKEN_PREFIX = "iop_"
NODE_TOKEN_PREFIX = "iopn_"


def new_token(prefix: str = TOKEN_PREFIX) -> str:
    """A fresh random bearer token (256 bits of entropy, URL-safe) starting ``prefix``."""
    return prefix + secrets.token_urlsafe(32)


def new_node_token() -> str:
    """A fresh node token (:data:`NODE_TOKEN_PREFIX`), for ``nodes[].token_hash_sha256``."""
    return new_token(NODE_TOKEN_PREFIX)


def token_hash(token: str) -> str:
    """The lowercase hex SHA-256 of a token, as ``openai.principal_tokens[].token_hash_sha256``,
    ``console.admin_token_sha256`` and ``nodes[].token_hash_sha256`` hold it."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()
