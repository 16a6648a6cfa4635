"""An OpenAI Responses request translated into the internal form (a chat body and the rest).

Top-level fields:

========================  =======================================================================
Responses                 chat (:class:`~iop_edge.translate.chat_request.InternalRequest`)
========================  =======================================================================
``model``                 ``model`` (the id the client asked for; the shell resolves aliases)
``instructions``          a first ``system`` message; not carried over from the previous
                          response (OpenAI's rule: each request says its own)
``input``                 chat messages (:mod:`~iop_edge.translate.responses_input`), after
                          the stored history's when the request continues a response
``max_output_tokens``     ``max_tokens`` (a positive integer; the group's generation policy
                          applies to it as for chat)
``temperature``,          the same fields, values unchanged
``top_p``
``user``,                 the same fields (no effect on the answer; an adapter that builds its
``prompt_cache_key``,     own request accepts them)
``safety_identifier``
``stream``                ``stream``, with ``stream_options.include_usage`` so that the answer's
                          usage comes in its last chunk
``tools``                 function tools (flat ``name``, ``description``, ``parameters`` —
                          ``{}`` of properties when null —, ``strict``) → chat's nested form; a
                          built-in tool (``web_search``, ``file_search``, ``computer_use…``,
                          ``code_interpreter``, ``image_generation``, ``mcp``, ``local_shell``,
                          ``shell``, ``apply_patch``…) is a 400 naming its type and index: it
                          runs on OpenAI's side; so is a ``custom`` (free-form input) tool
``tool_choice``           ``auto``, ``none``, ``required``, ``{"type": "function", "name"}`` →
                          chat's; forwarded only with tools (``auto`` and ``none`` without
                          tools are dropped; a forced call without tools is a 400)
``parallel_tool_calls``   ``false`` → ``parallel_tool_calls: false`` (with tools)
``reasoning``             not a chat field: ``effort`` → a :class:`ReasoningRequest`'s effort
                          (``minimal`` … ``max``), ``none`` → reasoning disabled; ``summary``
                          is accepted and has no effect (the reasoning comes back whole)
``text``                  ``format``: ``text`` → nothing, ``json_object`` → ``response_format``
                          ``json_object``, ``json_schema`` (flat ``name``, ``schema``,
                          ``strict``, ``description``) → chat's nested ``json_schema``;
                          ``verbosity`` is dropped (chat upstreams have no such control)
``include``               ``reasoning.encrypted_content`` seals the reasoning in its item
                          (:mod:`~iop_edge.translate.responses_reply`); the values about
                          built-in tools' items and ``message.input_image.image_url`` change
                          nothing; ``message.output_text.logprobs`` is a 400 (no log
                          probabilities), any other value too
``store``,                for the shell: whether to keep the response, and the one it
``previous_response_id``  continues (:class:`ResponsesRequest`)
``metadata``              echoed in the Response, not forwarded
``truncation``            ``disabled``; ``auto`` is accepted and does the same: the edge never
                          drops items, so a conversation that does not fit the context window is
                          a 400 either way
``top_logprobs``          ``0`` only (the edge returns no log probabilities)
``background``            ``false`` only: the edge runs no background responses
========================  =======================================================================

Top-level fields in :data:`DROPPED_FIELDS` are accepted and not forwarded, each for the reason
given there; ``conversation`` and ``prompt`` are refused (:data:`REFUSED_FIELDS`), as is any other
unknown field and any value the table cannot translate. Every error is a
:class:`~iop_edge.errors.RequestError` whose message names the path (``input[3].content[1].type``),
the value and the rule; ``param`` is the path.

The Response echoes the request's fields (:attr:`ResponsesRequest.echo`: each as the client sent
it, ``truncation`` as ``disabled``); :mod:`~iop_edge.translate.responses_reply` renders it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, get_args

from iop_edge.errors import RequestError
from iop_edge.translate.chat_request import (
    InternalRequest,
    ReasoningEffort,
    ReasoningRequest,
    function_tool,
)
from iop_edge.translate.request_checks import (
    boolean_at,
    number_at,
    object_at,
    refusal,
    shown,
    string_at,
)
from iop_edge.translate.responses_input import input_items, translate_items

__all__ = [
    "DROPPED_FIELDS",
    "INCLUDE_VALUES",
    "REFUSED_FIELDS",
    "ResponsesRequest",
    "translate_responses",
]

#: Top-level fields accepted and not forwarded, with why that changes nothing the client gets.
DROPPED_FIELDS: Final[dict[str, str]] = {
    "service_tier": "a priority-capacity request; the edge's admission and fair share decide",
    "stream_options": "asks for obfuscation padding in stream events; the edge adds none",
    "prompt_cache_retention": "how long OpenAI keeps a prompt cache; the upstreams keep theirs",
    "max_tool_calls": "bounds the calls of built-in tools, which the edge does not run",
    "context_management": (
        "asks OpenAI to compact the context past a threshold; without it the conversation is "
        "sent whole (a context that no longer fits is a clear 400)"
    ),
}
#: Fields refused with a reason of their own (any other unknown field gets the general one).
REFUSED_FIELDS: Final[dict[str, str]] = {
    "conversation": (
        "the edge keeps no conversations; continue a response with previous_response_id, or "
        "send the history as input"
    ),
    "prompt": "a prompt template stored at OpenAI, which the edge cannot read; send instructions",
}
#: The ``include`` values accepted, each with what it does here.
INCLUDE_VALUES: Final[dict[str, str]] = {
    "reasoning.encrypted_content": "the reasoning items carry the reasoning, sealed by the edge",
    "message.input_image.image_url": "nothing: input images keep their URLs as sent",
    "file_search_call.results": "nothing: the edge runs no built-in tool",
    "web_search_call.results": "nothing: the edge runs no built-in tool",
    "web_search_call.action.sources": "nothing: the edge runs no built-in tool",
    "computer_call_output.output.image_url": "nothing: the edge runs no built-in tool",
    "code_interpreter_call.outputs": "nothing: the edge runs no built-in tool",
}
#: The fields a Response echoes, and the request's fields they come from.
_ECHOED: Final = (
    "instructions",
    "max_output_tokens",
    "max_tool_calls",
    "metadata",
    "parallel_tool_calls",
    "previous_response_id",
    "prompt_cache_key",
    "reasoning",
    "safety_identifier",
    "store",
    "temperature",
    "text",
    "tool_choice",
    "tools",
    "top_logprobs",
    "top_p",
    "user",
)
_TRANSLATED: Final = frozenset(
    {
        *_ECHOED,
        "model",
        "input",
        "stream",
        "include",
        "truncation",
        "background",
    }
)
_EFFORTS: Final = get_args(ReasoningEffort)
_SUMMARIES: Final = frozenset({"auto", "concise", "detailed"})
_CHOICES: Final = ("auto", "none", "required")


@dataclass(frozen=True, slots=True)
class ResponsesRequest:
    """A Responses request, translated.

    ``internal`` is the internal form (its ``chat`` body, ``model`` the client's model,
    ``stream``); ``input_items`` this request's input as items (a string input is one user
    message item), what the store keeps with the response's output; ``store`` whether to keep
    the response (default true); ``previous_response_id`` the response it continues;
    ``instructions`` its system prompt; ``echo`` the fields its Response echoes;
    ``include`` the client's ``include`` values (for the renderers: sealed reasoning).
    """

    internal: InternalRequest
    input_items: tuple[dict[str, Any], ...]
    store: bool
    previous_response_id: str | None
    instructions: str | None
    echo: dict[str, Any]
    include: tuple[str, ...] = ()


def _function_tool(tool: Mapping[str, Any], path: str) -> dict[str, Any]:
    name = string_at(tool.get("name"), f"{path}.name")
    parameters = tool.get("parameters")
    schema = (
        {"type": "object", "properties": {}}
        if parameters is None
        else dict(object_at(parameters, f"{path}.parameters"))
    )
    description = tool.get("description")
    if description is not None:
        string_at(description, f"{path}.description", empty=True)
    strict = tool.get("strict")
    if strict is not None:
        boolean_at(strict, f"{path}.strict")
    return function_tool(name, description, schema, strict)


def _tools(value: object) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        raise refusal("tools", f"must be an array of tools, not {shown(value)}")
    tools = []
    for index, tool in enumerate(value):
        path = f"tools[{index}]"
        kind = object_at(tool, path).get("type")
        if kind == "function":
            tools.append(_function_tool(tool, path))
        elif kind == "custom":
            raise refusal(
                f"{path}.type",
                f"'custom' (tool {shown(tool.get('name'))}) is a free-form tool, whose input is "
                "not JSON arguments; the edge translates function tools only",
            )
        else:
            raise refusal(
                f"{path}.type",
                f"{shown(kind)} is a built-in tool, which runs on OpenAI's side; the edge "
                "translates function tools only",
            )
    return tools


def _tool_choice(value: object, tools: list[dict[str, Any]], chat: dict[str, Any]) -> None:
    names = [tool["function"]["name"] for tool in tools]
    if isinstance(value, str):
        if value not in _CHOICES:
            raise refusal("tool_choice", f"{shown(value)} is not one of {', '.join(_CHOICES)}")
        if value == "required" and not tools:
            raise refusal("tool_choice", "'required' asks for a tool call, and there are no tools")
        if tools:
            chat["tool_choice"] = value
        return
    choice = object_at(value, "tool_choice")
    kind = choice.get("type")
    if kind != "function":
        raise refusal(
            "tool_choice.type",
            f"{shown(kind)} is not translated; the edge forces function tools only "
            '({"type": "function", "name": …})',
        )
    name = string_at(choice.get("name"), "tool_choice.name")
    if name not in names:
        raise refusal("tool_choice.name", f"{name!r} is not the name of a function in tools")
    chat["tool_choice"] = {"type": "function", "function": {"name": name}}


def _reasoning(value: object) -> ReasoningRequest | None:
    reasoning = object_at(value, "reasoning")
    request = None
    for name, item in reasoning.items():
        if item is None:
            continue
        path = f"reasoning.{name}"
        if name == "effort":
            if item == "none":
                request = ReasoningRequest(mode="disabled")
            elif item in _EFFORTS:
                request = ReasoningRequest(effort=item)
            else:
                efforts = ", ".join(["none", *_EFFORTS])
                raise refusal(path, f"{shown(item)} is not one of {efforts}")
        elif name in ("summary", "generate_summary"):
            if item not in _SUMMARIES:
                raise refusal(path, f"{shown(item)} is not one of {', '.join(sorted(_SUMMARIES))}")
        else:
            raise refusal(path, "is not a field the edge translates (effort, summary)")
    return request


def _text(value: object, chat: dict[str, Any]) -> None:
    for name, item in object_at(value, "text").items():
        if item is None or name == "verbosity":
            continue
        if name != "format":
            raise refusal(f"text.{name}", "is not a field the edge translates (format, verbosity)")
        form = object_at(item, "text.format")
        kind = form.get("type")
        if kind == "json_object":
            chat["response_format"] = {"type": "json_object"}
        elif kind == "json_schema":
            schema: dict[str, Any] = {
                "name": string_at(form.get("name"), "text.format.name"),
                "schema": dict(object_at(form.get("schema"), "text.format.schema")),
            }
            if form.get("description") is not None:
                schema["description"] = string_at(
                    form["description"], "text.format.description", empty=True
                )
            if form.get("strict") is not None:
                schema["strict"] = boolean_at(form["strict"], "text.format.strict")
            chat["response_format"] = {"type": "json_schema", "json_schema": schema}
        elif kind != "text":
            raise refusal(
                "text.format.type", f"{shown(kind)} is not one of text, json_object, json_schema"
            )


def _include(value: object) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise refusal("include", f"must be an array of strings, not {shown(value)}")
    for index, item in enumerate(value):
        if item == "message.output_text.logprobs":
            raise refusal(
                f"include[{index}]",
                f"{item!r} cannot be honoured: the edge returns no log probabilities",
            )
        if item not in INCLUDE_VALUES:
            raise refusal(
                f"include[{index}]",
                f"{shown(item)} is not one of {', '.join(INCLUDE_VALUES)}",
            )
    return tuple(value)


def _metadata(value: object) -> dict[str, str]:
    metadata = object_at(value, "metadata")
    return {key: string_at(item, f"metadata.{key}", empty=True) for key, item in metadata.items()}


def _refuse(name: str, value: object) -> RequestError:
    why = REFUSED_FIELDS.get(
        name,
        "the edge does not translate this field, and a field is never silently dropped (it "
        f"drops only {', '.join(sorted(DROPPED_FIELDS))})",
    )
    return refusal(name, f"{shown(value)} cannot be honoured: {why}")


def _checked(body: Mapping[str, Any]) -> tuple[str, ...]:
    """The dropped fields of ``body``, once every field has been found known."""
    dropped = []
    for name, value in body.items():
        if value is None:
            continue
        if name in DROPPED_FIELDS:
            dropped.append(name)
        elif name not in _TRANSLATED:
            raise _refuse(name, value)
    if body.get("background") is not None and boolean_at(body["background"], "background"):
        raise refusal(
            "background",
            "true cannot be honoured: the edge runs no background responses; send the request "
            "and wait for its answer, or stream it",
        )
    truncation = body.get("truncation")
    if truncation is not None and truncation not in ("auto", "disabled"):
        raise refusal("truncation", f"{shown(truncation)} is not one of auto, disabled")
    top_logprobs = body.get("top_logprobs")
    if top_logprobs is not None and number_at(top_logprobs, "top_logprobs", integer=True) != 0:
        raise refusal(
            "top_logprobs",
            f"{top_logprobs} cannot be honoured: it must be 0 (the edge returns no log "
            "probabilities)",
        )
    return tuple(dropped)


def translate_responses(
    body: Mapping[str, Any], history: Sequence[Mapping[str, Any]] = ()
) -> ResponsesRequest:
    """The internal form of a Responses request body (see the module docstring).

    ``history`` is the conversation so far when the request continues a stored response (its
    input items followed by its output items), translated before ``input``. Raises
    :class:`~iop_edge.errors.RequestError` for anything it cannot translate.
    """
    dropped = _checked(body)
    model = string_at(body.get("model"), "model")
    previous = body.get("previous_response_id")
    if previous is not None:
        string_at(previous, "previous_response_id")
    items = input_items(body.get("input"), continued=previous is not None)
    instructions = body.get("instructions")
    if instructions is not None:
        string_at(instructions, "instructions", empty=True)
    messages = translate_items(
        [(f"history[{i}]", item) for i, item in enumerate(history)]
        + [(f"input[{i}]", item) for i, item in enumerate(items)],
        instructions=instructions or "",
    )
    chat: dict[str, Any] = {"model": model, "messages": messages}
    if not chat["messages"]:
        raise refusal("input", "is empty, and so is the conversation it continues")
    max_tokens = body.get("max_output_tokens")
    if max_tokens is not None:
        if type(max_tokens) is not int or max_tokens < 1:
            raise refusal(
                "max_output_tokens", f"must be a positive integer, not {shown(max_tokens)}"
            )
        chat["max_tokens"] = max_tokens
    stream = body.get("stream")
    if stream is not None and boolean_at(stream, "stream"):
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    for name in ("temperature", "top_p"):
        if body.get(name) is not None:
            chat[name] = number_at(body[name], name)
    tools = _tools(body["tools"]) if body.get("tools") is not None else []
    if tools:
        chat["tools"] = tools
    if body.get("tool_choice") is not None:
        _tool_choice(body["tool_choice"], tools, chat)
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not boolean_at(parallel, "parallel_tool_calls") and tools:
        chat["parallel_tool_calls"] = False
    if body.get("text") is not None:
        _text(body["text"], chat)
    for name in ("user", "prompt_cache_key", "safety_identifier"):
        if body.get(name) is not None:
            chat[name] = string_at(body[name], name, empty=True)
    reasoning = _reasoning(body["reasoning"]) if body.get("reasoning") is not None else None
    include = _include(body["include"]) if body.get("include") is not None else ()
    store = body.get("store")
    if store is not None:
        boolean_at(store, "store")
    echo = {name: body[name] for name in _ECHOED if body.get(name) is not None}
    if "metadata" in echo:
        echo["metadata"] = _metadata(echo["metadata"])
    if body.get("truncation") is not None:
        echo["truncation"] = "disabled"
    return ResponsesRequest(
        internal=InternalRequest(chat, model, bool(stream), reasoning, (), dropped),
        input_items=items,
        store=store is not False,
        previous_response_id=previous,
        instructions=instructions,
        echo=echo,
        include=include,
    )
