"""Config paths in the one form every error and report uses.

Example: ``nodes[gpu-1].providers[vllm-a].priority``.

A list of entities is indexed by the entity's identity (``id``, ``name``, ``token_ref`` or
``model``); other lists by position.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

#: The key that identifies an item of each entity list, by the list's key.
IDENTITY_KEYS: Final[Mapping[str, str]] = {
    "nodes": "id",
    "providers": "id",
    "models": "id",
    "adapters": "name",
    "principal_tokens": "token_ref",
    "model_routes": "model",
    "principals": "ref",
}


def item_label(list_key: str, item: Any, index: int) -> str:
    """The bracket label of one list item: its identity when it has a usable one, else its index."""
    ident_key = IDENTITY_KEYS.get(list_key)
    if ident_key and isinstance(item, Mapping):
        ident = item.get(ident_key)
        if isinstance(ident, str) and ident and "[" not in ident and "]" not in ident:
            return ident
    return str(index)


def join(parent: str, key: str) -> str:
    """Append a mapping key to a path."""
    return f"{parent}.{key}" if parent else key


def render_loc(loc: Iterable[str | int], raw: Any) -> str:
    """Render a pydantic error location against the raw document it was validated from."""
    path = ""
    node = raw
    last_key = ""
    for part in loc:
        if isinstance(part, int):
            item = node[part] if isinstance(node, list) and 0 <= part < len(node) else None
            path += f"[{item_label(last_key, item, part)}]"
            node = item
        else:
            path = join(path, part)
            last_key = part
            node = node.get(part) if isinstance(node, Mapping) else None
    return path
