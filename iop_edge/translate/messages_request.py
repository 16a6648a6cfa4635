"""An Anthropic Messages request translated into the internal form (a chat body and the rest).

Top-level fields:

====================  ===========================================================================
Messages              chat (:class:`~iop_edge.translate.chat_request.InternalRequest`)
====================  ===========================================================================
``model``             ``model`` (the id the client asked for; the shell resolves aliases)
``max_tokens``        ``max_tokens`` (required, a positive integer; the group's generation
                      policy applies to it as for chat)
``system``            a first ``system`` message: the string, or the text blocks joined by a
                      blank line, Claude Code's billing header left out
``messages``          chat messages (:mod:`~iop_edge.translate.messages_content`)
``stop_sequences``    ``stop``
``temperature``,      the same fields, values unchanged (``top_k`` is not OpenAI's: an adapter
``top_p``, ``top_k``  that cannot honour it refuses it with a 400 naming it, as for chat)
``metadata.user_id``  ``user``
``stream``            ``stream``, with ``stream_options.include_usage`` so that the answer's
                      usage comes in its last chunk
``tools``             function tools (``name``, ``description``, ``input_schema`` →
                      ``parameters``, ``strict``); an Anthropic server tool (a ``type`` such as
                      ``web_search_20250305``, ``bash_20250124``, ``text_editor_…``) is a 400
                      naming it: it runs on Anthropic's side
``tool_choice``       ``auto`` → ``"auto"``, ``any`` → ``"required"``, ``tool`` → the named
                      function, ``none`` → ``"none"``; ``disable_parallel_tool_use: true`` →
                      ``parallel_tool_calls: false``
``thinking``          not a chat field: a :class:`ReasoningRequest` beside the body —
                      ``enabled`` (with ``budget_tokens``), ``adaptive`` or ``disabled``
``output_config``     ``effort`` → the :class:`ReasoningRequest`'s effort; ``format``
                      (``json_schema``) → ``response_format`` ``json_schema``
====================  ===========================================================================

Messages and the system prompt: :mod:`iop_edge.translate.messages_content` (content blocks,
tool results, thinking in history, the billing header). ``cache_control`` is dropped wherever it
is (the upstreams cache prefixes by themselves).

Top-level fields in :data:`DROPPED_FIELDS` are accepted and not forwarded, each for the reason
given there; any other unknown field is a 400 naming it, as is any value the table cannot
translate. Every error is a :class:`~iop_edge.errors.RequestError` whose message names the path
(``messages[3].content[1].type``), the value and the rule; ``param`` is the path.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, get_args

from iop_edge.errors import RequestError
from iop_edge.translate.chat_request import (
    InternalRequest,
    ReasoningEffort,
    ReasoningRequest,
    function_tool,
)
from iop_edge.translate.messages_content import system_text, translate_messages
from iop_edge.translate.request_checks import number_at, object_at, refusal, shown, string_at

__all__ = ["DROPPED_FIELDS", "REFUSED_FIELDS", "translate_request"]

#: Top-level fields accepted and not forwarded, with why that changes nothing the client gets.
DROPPED_FIELDS: Final[dict[str, str]] = {
    "cache_control": "a prompt-cache marker; the upstreams cache prefixes by themselves",
    "service_tier": "a priority-capacity request; the edge's admission and fair share decide",
    "speed": "a throughput preference (fast mode); it does not change the answer",
    "context_management": (
        "asks Anthropic to clear old tool results or thinking from the context; without it the "
        "same conversation is sent whole (a context that no longer fits is a clear 400)"
    ),
    "diagnostics": "asks for cache-miss diagnostics in the answer, which then has none",
    "user_profile_id": "an Anthropic account attribution; the edge's principal is the token's",
    "workspace_id": "an Anthropic workspace choice; the edge's principal is the token's",
}
#: Fields refused with a reason of their own (any other unknown field gets the general one).
REFUSED_FIELDS: Final[dict[str, str]] = {
    "mcp_servers": "the edge does not connect to MCP servers; declare their tools as tools",
    "container": "the edge runs no code-execution containers",
    "inference_geo": "the edge does not choose where inference runs",
}
_TRANSLATED: Final = frozenset(
    {
        "model",
        "max_tokens",
        "messages",
        "system",
        "stop_sequences",
        "temperature",
        "top_p",
        "top_k",
        "metadata",
        "stream",
        "tools",
        "tool_choice",
        "thinking",
        "output_config",
    }
)
_EFFORTS: Final = frozenset(get_args(ReasoningEffort)) - {"minimal"}


def _tools(value: object) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        raise refusal("tools", f"must be an array of tools, not {shown(value)}")
    tools = []
    for index, tool in enumerate(value):
        path = f"tools[{index}]"
        kind = object_at(tool, path).get("type")
        if kind not in (None, "custom"):
            raise refusal(
                f"{path}.type",
                f"{shown(kind)} (tool {shown(tool.get('name'))}) is an Anthropic server tool, "
                "which runs on Anthropic's side; the edge translates client tools (no type, or "
                '"custom") into function tools',
            )
        name = string_at(tool.get("name"), f"{path}.name")
        schema = dict(object_at(tool.get("input_schema"), f"{path}.input_schema"))
        description = tool.get("description")
        if description is not None:
            string_at(description, f"{path}.description", empty=True)
        strict = tool.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise refusal(f"{path}.strict", f"must be a boolean, not {shown(strict)}")
        tools.append(function_tool(name, description, schema, strict))
    return tools


def _tool_choice(value: object, chat: dict[str, Any]) -> None:
    choice = object_at(value, "tool_choice")
    kind = choice.get("type")
    if kind == "auto":
        chat["tool_choice"] = "auto"
    elif kind == "any":
        chat["tool_choice"] = "required"
    elif kind == "none":
        chat["tool_choice"] = "none"
    elif kind == "tool":
        name = string_at(choice.get("name"), "tool_choice.name")
        chat["tool_choice"] = {"type": "function", "function": {"name": name}}
    else:
        raise refusal("tool_choice.type", f"{shown(kind)} is not one of auto, any, tool, none")
    single = choice.get("disable_parallel_tool_use")
    if single is not None and not isinstance(single, bool):
        raise refusal(
            "tool_choice.disable_parallel_tool_use", f"must be a boolean, not {shown(single)}"
        )
    if single:
        chat["parallel_tool_calls"] = False


def _thinking(value: object) -> ReasoningRequest:
    thinking = object_at(value, "thinking")
    kind = thinking.get("type")
    # (``display``, summarized or omitted, is accepted: the thinking comes back as the
    # upstream gives it)
    if kind == "enabled":
        budget = thinking.get("budget_tokens")
        if type(budget) is not int or budget < 1:
            raise refusal(
                "thinking.budget_tokens", f"must be a positive integer, not {shown(budget)}"
            )
        return ReasoningRequest("enabled", budget)
    if kind in ("adaptive", "disabled"):
        return ReasoningRequest("adaptive" if kind == "adaptive" else "disabled")
    raise refusal("thinking.type", f"{shown(kind)} is not one of enabled, adaptive, disabled")


def _output_config(value: object, chat: dict[str, Any]) -> ReasoningEffort | None:
    config = object_at(value, "output_config")
    effort: ReasoningEffort | None = None
    for name, item in config.items():
        if item is None:
            continue
        if name == "effort":
            if item not in _EFFORTS:
                raise refusal(
                    "output_config.effort",
                    f"{shown(item)} is not one of {', '.join(sorted(_EFFORTS))}",
                )
            effort = item
        elif name == "format":
            form = object_at(item, "output_config.format")
            if form.get("type") != "json_schema":
                raise refusal(
                    "output_config.format.type", f"{shown(form.get('type'))} is not json_schema"
                )
            schema = dict(object_at(form.get("schema"), "output_config.format.schema"))
            chat["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "output", "schema": schema, "strict": True},
            }
        else:
            raise refusal(
                f"output_config.{name}", "is not a field the edge translates (effort, format)"
            )
    return effort


def _stop_sequences(value: object) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise refusal("stop_sequences", f"must be an array of strings, not {shown(value)}")
    return tuple(string_at(s, f"stop_sequences[{i}]") for i, s in enumerate(value))


def _refuse(name: str, value: object) -> RequestError:
    why = REFUSED_FIELDS.get(
        name,
        "the edge does not translate this field, and a field is never silently dropped (it "
        f"drops only {', '.join(sorted(DROPPED_FIELDS))})",
    )
    return refusal(name, f"{shown(value)} cannot be honoured: {why}")


def translate_request(body: Mapping[str, Any], *, counting: bool = False) -> InternalRequest:
    """The internal form of a Messages request body (see the module docstring).

    ``counting``: the body of ``/v1/messages/count_tokens``, where ``max_tokens`` is not
    required. Raises :class:`~iop_edge.errors.RequestError` for anything it cannot translate.
    """
    dropped = []
    for name, value in body.items():
        if name in _TRANSLATED or value is None:
            continue
        if name not in DROPPED_FIELDS:
            raise _refuse(name, value)
        dropped.append(name)
    model = string_at(body.get("model"), "model")
    chat: dict[str, Any] = {"model": model, "messages": []}
    system = body.get("system")
    if system is not None:
        text = system_text(system, "system")
        if text:
            chat["messages"].append({"role": "system", "content": text})
    chat["messages"] += translate_messages(body.get("messages"))
    max_tokens = body.get("max_tokens")
    if max_tokens is not None or not counting:
        if type(max_tokens) is not int or max_tokens < 1:
            raise refusal("max_tokens", f"is required: a positive integer, not {shown(max_tokens)}")
        chat["max_tokens"] = max_tokens
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise refusal("stream", f"must be a boolean, not {shown(stream)}")
    if stream:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    for name in ("temperature", "top_p", "top_k"):
        if body.get(name) is not None:
            chat[name] = number_at(body[name], name, integer=name == "top_k")
    stops = (
        _stop_sequences(body["stop_sequences"]) if body.get("stop_sequences") is not None else ()
    )
    if stops:
        chat["stop"] = list(stops)
    if body.get("tools") is not None:
        tools = _tools(body["tools"])
        if tools:
            chat["tools"] = tools
    if body.get("tool_choice") is not None:
        _tool_choice(body["tool_choice"], chat)
    metadata = body.get("metadata")
    if metadata is not None:
        for key, item in object_at(metadata, "metadata").items():
            if key != "user_id":
                raise refusal(
                    f"metadata.{key}", "is not a metadata field (user_id is the only one)"
                )
            if item is not None:
                chat["user"] = string_at(item, "metadata.user_id", empty=True)
    reasoning = _thinking(body["thinking"]) if body.get("thinking") is not None else None
    effort = (
        _output_config(body["output_config"], chat)
        if body.get("output_config") is not None
        else None
    )
    if effort is not None:
        base = reasoning or ReasoningRequest()
        reasoning = ReasoningRequest(base.mode, base.budget_tokens, effort)
    return InternalRequest(chat, model, bool(stream), reasoning, stops, tuple(dropped))
