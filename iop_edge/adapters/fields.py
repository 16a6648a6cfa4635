"""Which request fields each normalized adapter honours, and the refusal of those it cannot.

``openai_compat`` passes every field through untouched, so it honours all of them. ``ollama``
and ``cli`` build a new request for their upstream: a field they do not translate would be
silently dropped, so it is refused instead — :func:`refusal` names it, and the request path
turns that into a 400 whose ``param`` is the field (or, in a model group that mixes provider
types, admits the request only into the providers that honour it: see
:func:`iop_edge.config.policy.capable_group`).

A field is accepted when it is absent, ``null``, or carries a value the adapter honours:

- **honoured**: translated (see :mod:`iop_edge.adapters.ollama` and :mod:`iop_edge.adapters.cli`);
  on ``ollama`` the reasoning fields become Ollama's ``think``: ``reasoning_effort`` (one of
  :data:`THINK_LEVELS`' keys) its level, ``thinking_token_budget`` 0 ``false`` and above 0
  ``true`` (Ollama has no budget, so a positive one is not enforced);
- **no effect**: accepted and not forwarded, because it cannot change the answer (``user``,
  ``metadata``, ``store``, ``service_tier``, ``safety_identifier``, ``prompt_cache_key``);
- **the edge's limits** (``cli`` only): ``max_tokens``, ``max_completion_tokens``,
  ``thinking_token_budget`` and ``reasoning_effort`` are accepted but not enforced — a
  command-line agent decides its own length and effort — because a model group's generation
  policy sets them on every request (and an Anthropic client's ``thinking`` and effort become
  them);
- **the default value** of a field that asks for more than one answer or for extras
  (``n: 1``, ``logprobs: false``, ``parallel_tool_calls: true``, ``tool_choice: "auto"``,
  ``modalities: ["text"]``, an empty ``logit_bias``);
- anything else (an unknown field included) is refused.

Pure, and cheap on the request path: one dictionary look-up per field of the body.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final

from iop_edge.adapters.base import UnsupportedRequestError

if TYPE_CHECKING:
    from iop_edge.adapters.base import UpstreamCall

__all__ = ["THINK_LEVELS", "FieldRefusal", "refusal", "refuse_unhonoured"]

#: (field, why): the first field of a request an adapter cannot honour
FieldRefusal = tuple[str, str]

_Rule = Callable[[Any], str | None]
"""None when the adapter honours the value, else why not."""

THINK_LEVELS: Final[Mapping[str, bool | str]] = {
    "none": False,
    "minimal": "low",
    "low": "low",
    "medium": "medium",
    "high": "high",
    # (the Anthropic surface's efforts above high: Ollama's highest level)
    "xhigh": "high",
    "max": "high",
}
"""The ``reasoning_effort`` values ``ollama`` honours, each with the ``think`` it sends."""


def _honoured(value: Any) -> str | None:
    return None


def _never(why: str) -> _Rule:
    def rule(value: Any) -> str | None:
        return why

    return rule


def _only_one(value: Any) -> str | None:
    return None if value == 1 else "it returns one choice per request; n must be 1"


def _no_logprobs(value: Any) -> str | None:
    return None if value is False else "it does not return log probabilities"


def _no_top_logprobs(value: Any) -> str | None:
    return None if value == 0 else "it does not return log probabilities"


def _empty_bias(value: Any) -> str | None:
    return None if value == {} else "it does not support logit_bias"


def _text_only(value: Any) -> str | None:
    return None if value == ["text"] else 'it answers in text only; modalities must be ["text"]'


def _parallel_tools(value: Any) -> str | None:
    return (
        None
        if value is True
        else "it cannot be kept from calling several tools at once; parallel_tool_calls must "
        "be true"
    )


def _tool_choice(value: Any) -> str | None:
    return (
        None
        if value in ("auto", "none")
        else 'it cannot be forced to call a tool; tool_choice must be "auto" or "none"'
    )


def _think_level(value: Any) -> str | None:
    if isinstance(value, str) and value in THINK_LEVELS:
        return None
    return f"reasoning_effort must be one of {', '.join(THINK_LEVELS)}"


def _response_format(value: Any) -> str | None:
    kind = value.get("type") if isinstance(value, Mapping) else None
    if kind in ("text", "json_object"):
        return None
    if kind == "json_schema":
        schema = value.get("json_schema")
        if isinstance(schema, Mapping) and isinstance(schema.get("schema"), Mapping):
            return None
        return "a json_schema response_format needs json_schema.schema (an object)"
    return 'response_format.type must be "text", "json_object" or "json_schema"'


def _text_format(value: Any) -> str | None:
    kind = value.get("type") if isinstance(value, Mapping) else None
    return None if kind == "text" else "it answers in free text only"


def _text_input(value: Any) -> str | None:
    if isinstance(value, str) or (
        isinstance(value, list) and value and all(isinstance(item, str) for item in value)
    ):
        return None
    return "it embeds text only (a string or an array of strings), not token ids"


def _float_or_base64(value: Any) -> str | None:
    return None if value in ("float", "base64") else 'encoding_format must be "float" or "base64"'


_NO_EFFECT: Final[dict[str, _Rule]] = dict.fromkeys(
    ("user", "metadata", "store", "service_tier", "safety_identifier", "prompt_cache_key"),
    _honoured,
)
_BASE: Final[dict[str, _Rule]] = {
    "model": _honoured,
    "messages": _honoured,
    "stream": _honoured,
    "stream_options": _honoured,
    **_NO_EFFECT,
    "n": _only_one,
    "logprobs": _no_logprobs,
    "top_logprobs": _no_top_logprobs,
    "logit_bias": _empty_bias,
    "modalities": _text_only,
    "functions": _never("legacy functions are not translated; send tools instead"),
    "function_call": _never("legacy function_call is not translated; send tool_choice instead"),
}

_OLLAMA_CHAT: Final[dict[str, _Rule]] = {
    **_BASE,
    **dict.fromkeys(
        (
            "max_tokens",
            "max_completion_tokens",
            "temperature",
            "top_p",
            "seed",
            "presence_penalty",
            "frequency_penalty",
            "stop",
            "tools",
        ),
        _honoured,
    ),
    "response_format": _response_format,
    "tool_choice": _tool_choice,
    # false: the adapter keeps the answer's first tool call only (Ollama cannot be told)
    "parallel_tool_calls": _honoured,
    # Ollama's think: 0 turns it off, above 0 on (Ollama has no budget to enforce).
    "thinking_token_budget": _honoured,
    "reasoning_effort": _think_level,
}

_CLI_CHAT: Final[dict[str, _Rule]] = {
    **_BASE,
    # Set by a model group's generation policy on every request: accepted, not enforced.
    **dict.fromkeys(("max_tokens", "max_completion_tokens", "thinking_token_budget"), _honoured),
    # What an Anthropic client's effort becomes: accepted (one of Ollama's levels, so that
    # every request cli honours, ollama honours too), not enforced — the agent decides.
    "reasoning_effort": _think_level,
    "response_format": _text_format,
    "tool_choice": _never("it cannot call tools"),
    "tools": _never("it cannot call tools"),
    # Every field cli honours, ollama honours too (so the providers that honour a request are
    # always those of one of a model's scheduler groups: see config.policy.capable_group).
    "parallel_tool_calls": _parallel_tools,
}

_OLLAMA_EMBEDDINGS: Final[dict[str, _Rule]] = {
    "model": _honoured,
    "input": _text_input,
    "encoding_format": _float_or_base64,
    "dimensions": _honoured,
    **_NO_EFFECT,
}

_RULES: Final[dict[tuple[str, str], dict[str, _Rule]]] = {
    ("ollama", "chat/completions"): _OLLAMA_CHAT,
    ("cli", "chat/completions"): _CLI_CHAT,
    ("ollama", "embeddings"): _OLLAMA_EMBEDDINGS,
}


def refusal(kind: str, endpoint: str, body: Mapping[str, Any]) -> FieldRefusal | None:
    """The first field of ``body`` that an adapter of runtime type ``kind`` cannot honour on
    ``endpoint``, with why; None when it honours every field (always for ``openai_compat``,
    and for an endpoint the adapter does not serve at all — the adapter refuses that)."""
    rules = _RULES.get((kind, endpoint))
    if rules is None:
        return None
    for name, value in body.items():
        if value is None:
            continue
        rule = rules.get(name)
        if rule is None:
            return name, "it does not translate this field, and a field is never silently dropped"
        why = rule(value)
        if why is not None:
            return name, why
    return None


def refuse_unhonoured(call: UpstreamCall, kind: str, label: str) -> None:
    """Raise a 400 (:class:`UnsupportedRequestError`, ``param`` the field) for the first field
    of ``call`` that an adapter of type ``kind`` (``label`` in the message) cannot honour."""
    refused = refusal(kind, call.endpoint, call.body)
    if refused is not None:
        name, why = refused
        raise UnsupportedRequestError(
            f"'{name}' cannot be honoured by {label}: {why}.",
            param=name,
            code="unsupported_parameter",
        )
