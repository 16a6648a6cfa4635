"""The bodies of ``GET /v1/models`` and ``GET /v1/models/{id}``, in both shapes.

Each listed entry — a model group, each of its aliases, a model route — is rendered once per
catalog as OpenAI's model object (``{"id", "object": "model", "created", "owned_by"}``, and
``display_name`` when the group has one) and as Anthropic's ``ModelInfo`` (``{"type": "model",
"id", "display_name", "created_at"}``, with the group's context window as
``max_input_tokens``). A listing is OpenAI's ``{"object": "list", "data"}`` whole, or one page
of Anthropic's ``{"data", "has_more", "first_id", "last_id"}`` (its cursors ``after_id`` /
``before_id`` and its ``limit``, default 20, at most 1000).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Final

import orjson

from iop_edge.errors import RequestError

#: Anthropic's page size when the request names none, and the largest it accepts.
ANTHROPIC_DEFAULT_LIMIT: Final = 20
ANTHROPIC_MAX_LIMIT: Final = 1000


@dataclass(frozen=True, slots=True)
class ListedModel:
    """One entry of ``GET /v1/models`` (a group, an alias or a route), rendered once in both
    shapes."""

    id: str
    #: OpenAI's model object
    openai: bytes = field(repr=False)
    #: Anthropic's ``ModelInfo``
    anthropic: bytes = field(repr=False)


def _model_object(model_id: str, display_name: str | None, created: int) -> dict[str, object]:
    obj: dict[str, object] = {
        "id": model_id,
        "object": "model",
        "created": created,
        "owned_by": "iop-edge",
    }
    if display_name:
        obj["display_name"] = display_name
    return obj


def rfc3339(created: int) -> str:
    """A Unix time as Anthropic's ``created_at`` writes it (UTC, whole seconds)."""
    return datetime.fromtimestamp(created, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def listed_model(
    model_id: str, display_name: str | None, created: int, context_window: int | None
) -> ListedModel:
    """The entry of ``model_id``: ``display_name`` and ``context_window`` are its group's
    (``None`` for a route), ``created`` the Unix time this process first loaded the id."""
    info: dict[str, object] = {
        "type": "model",
        "id": model_id,
        # required by Anthropic's shape: the group's display name, else the id itself
        "display_name": display_name or model_id,
        "created_at": rfc3339(created),
        "lifecycle": "active",
    }
    if context_window is not None:
        info["max_input_tokens"] = context_window
    return ListedModel(
        id=model_id,
        openai=orjson.dumps(_model_object(model_id, display_name, created)),
        anthropic=orjson.dumps(info),
    )


def anthropic_list_body(
    listing: Sequence[ListedModel],
    *,
    limit: int = ANTHROPIC_DEFAULT_LIMIT,
    after_id: str | None = None,
    before_id: str | None = None,
) -> bytes:
    """One page of ``listing`` in Anthropic's list shape. Raises a 400 naming the cursor when
    it is not an id of ``listing``.

    ``after_id``: the ``limit`` entries after it, ``has_more`` when more follow; ``before_id``:
    the ``limit`` entries just before it, ``has_more`` when more precede (the direction the
    client pages in); neither: the first ``limit``."""
    ids = [entry.id for entry in listing]
    start, end = 0, len(ids)
    for param, cursor in (("after_id", after_id), ("before_id", before_id)):
        if cursor is not None and cursor not in ids:
            raise RequestError(
                "invalid_request_error",
                f"The {param} {cursor!r} is not the id of a model this listing holds; page "
                "with the first_id or last_id of an earlier page.",
                param=param,
            )
    if after_id is not None:
        start = ids.index(after_id) + 1
    if before_id is not None:
        end = ids.index(before_id)
    if before_id is not None and after_id is None:
        page = listing[max(start, end - limit) : end]
        has_more = end - start > limit
    else:
        page = listing[start : min(end, start + limit)]
        has_more = end - start > limit
    return orjson.dumps(
        {
            "data": [orjson.Fragment(entry.anthropic) for entry in page],
            "has_more": has_more,
            "first_id": page[0].id if page else None,
            "last_id": page[-1].id if page else None,
        }
    )


def openai_list_body(entries: Iterable[ListedModel]) -> bytes:
    """The whole listing in OpenAI's shape."""
    return orjson.dumps({"object": "list", "data": [orjson.Fragment(e.openai) for e in entries]})
