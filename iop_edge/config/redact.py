"""Hide secrets in config data shown to people (``config show``, refresh reports, status)."""

from __future__ import annotations

from typing import Any, Final

REDACTED: Final = "<redacted>"

#: Mapping keys whose values may hold secrets: every value under them is hidden.
SECRET_MAPS: Final = frozenset({"headers", "env"})
#: A key to pass to :func:`redact` for a value known to be secret (one value of such a map).
SECRET_VALUE: Final = "<secret>"
#: Keys whose own value is hidden (token hashes are reported by token_ref only).
SECRET_KEYS: Final = frozenset({"token_hash_sha256", SECRET_VALUE})


def redact(value: Any, key: str = "") -> Any:
    """A copy of dumped config data with header values, env values and token hashes hidden.

    ``key`` is the mapping key ``value`` sits under (so a bare ``headers`` map is hidden too).
    """
    if key in SECRET_KEYS and value is not None:
        return REDACTED
    if isinstance(value, dict):
        if key in SECRET_MAPS:
            return dict.fromkeys(value, REDACTED)
        return {k: redact(v, k) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact(v) for v in value]
    return value
