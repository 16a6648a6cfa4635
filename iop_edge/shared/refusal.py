"""What the shared store's gate raises into admission (apart, so that admission does not
import the store's client)."""

from __future__ import annotations

__all__ = ["StoreRefusal"]


class StoreRefusal(Exception):
    """The shared store is out of reach and ``provider_pool.shared.on_store_down`` is
    ``reject``: the request is refused ``store_unavailable`` with this message."""
