"""The checks of a translated request's values, and the 400 that each refusal is.

Every surface's translation (Anthropic Messages, OpenAI Responses) refuses what it cannot
translate with a :class:`~iop_edge.errors.RequestError` whose message names the path
(``messages[3].content[1].type``, ``input[2].output``), the value and the rule, and whose
``param`` is the path: :func:`refusal` builds it, :func:`shown` quotes the value, and the
``*_at`` checks return the value when it has the kind the rule asks for.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from iop_edge.errors import RequestError

__all__ = ["boolean_at", "number_at", "object_at", "refusal", "shown", "string_at"]


def refusal(path: str, rule: str) -> RequestError:
    """The 400 for the value at ``path``: ``<path>: <rule>.``, ``param`` the path."""
    return RequestError("invalid_request_error", f"{path}: {rule}.", status=400, param=path)


def shown(value: object) -> str:
    """A value as an error message quotes it (its repr, cut at 60 characters)."""
    return f"{value!r:.60}"


def string_at(value: object, path: str, *, empty: bool = False) -> str:
    """``value``, checked to be a string (non-empty unless ``empty``)."""
    if not isinstance(value, str) or (not value and not empty):
        what = "a string" if empty else "a non-empty string"
        raise refusal(path, f"must be {what}, not {shown(value)}")
    return value


def object_at(value: object, path: str) -> Mapping[str, Any]:
    """``value``, checked to be an object."""
    if not isinstance(value, Mapping):
        raise refusal(path, f"must be an object, not {shown(value)}")
    return value


def boolean_at(value: object, path: str) -> bool:
    """``value``, checked to be a boolean."""
    if not isinstance(value, bool):
        raise refusal(path, f"must be a boolean, not {shown(value)}")
    return value


def number_at(value: object, path: str, *, integer: bool = False) -> int | float:
    """``value``, checked to be a non-negative number (an integer when ``integer``; a boolean
    is neither)."""
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or value < 0:
        what = "a non-negative integer" if integer else "a non-negative number"
        raise refusal(path, f"must be {what}, not {shown(value)}")
    return value
