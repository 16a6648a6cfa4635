"""A whole answer (:class:`~iop_edge.translate.events.Answer`) as an OpenAI Responses ``response``.

The Response object: ``id`` (the shell's ``resp_…``), ``object: "response"``, ``created_at``,
``status``, ``model`` (the model the client asked for, whichever provider answered),
``output``, ``usage``, ``error: null``, ``incomplete_details``, and the request's fields that a
Response echoes (``instructions``, ``tools``, ``tool_choice``, ``parallel_tool_calls``,
``temperature``, ``top_p``, ``max_output_tokens``, ``text``, ``reasoning``, ``metadata``,
``user``, ``store``, ``previous_response_id``… — the request translation gathers them,
:attr:`~iop_edge.translate.responses_request.ResponsesRequest.echo`), each absent one at its
default (:data:`RESPONSE_DEFAULTS`: OpenAI's, but ``temperature`` and ``top_p`` are ``null``
when the client sent none, since the upstream's own default applies, which the edge does not
know).

- ``status``: ``completed``; ``incomplete`` with ``incomplete_details.reason``
  ``max_output_tokens`` (finish ``length``) or ``content_filter``.
- ``output``, in order, each only when the answer has one: a ``reasoning`` item (``summary``
  empty, the reasoning in ``content`` as one ``reasoning_text``), a ``message`` item (one
  ``output_text`` part, no annotations or log probabilities; its ``status`` is ``incomplete``
  when the answer is and the message is its last item), one ``function_call`` item per call
  (``call_id`` the upstream's call id, else ``call_<core>_<n>``; ``arguments`` the JSON text as
  the upstream gave it, checked to be one object when decoded).
- Item ids are ``rs_`` / ``msg_`` / ``fc_`` followed by ``<core>_<output index>``, where
  ``<core>`` is the response id without ``resp_``: the same in a streamed and a whole rendering
  of one answer (:mod:`iop_edge.translate.responses_stream`), so either can be stored.
- ``usage``: ``input_tokens`` (the upstream's prompt tokens, cached ones included as OpenAI
  counts them) with ``input_tokens_details.cached_tokens``, ``output_tokens`` with
  ``output_tokens_details.reasoning_tokens``, ``total_tokens``. When the upstream reports no
  usage, ``input_tokens`` is the edge's estimate of the request and ``output_tokens`` one token
  per 4 UTF-8 bytes of the answer (text, reasoning and tool arguments), as for Messages
  (:func:`~iop_edge.translate.messages_reply.anthropic_usage`).

**Sealed reasoning.** When the request's ``include`` asks for ``reasoning.encrypted_content``,
a reasoning item also carries ``encrypted_content``: the reasoning sealed by the edge
(:func:`seal_reasoning`: a prefix and the base64 of the text — opaque to the client, *not*
encrypted: it is the client's own reasoning). A client that keeps no state (``store: false``,
as Codex sends it) and sends its reasoning items back without their ``content`` (Codex sends
back only ``summary`` and ``encrypted_content``) still gives the upstream its reasoning on the
next turn: the request translation opens it (:func:`open_reasoning`). Any other
``encrypted_content`` (OpenAI's) cannot be read and is dropped.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal

from iop_edge.translate.events import Answer, Finish, TokenUsage
from iop_edge.translate.messages_reply import text_bytes
from iop_edge.translate.sse import dumps

__all__ = [
    "ENCRYPTED_REASONING",
    "RESPONSE_DEFAULTS",
    "ResponseStatus",
    "call_id_of",
    "function_call_item",
    "incomplete_details",
    "item_id",
    "message_item",
    "open_reasoning",
    "output_items",
    "output_text_part",
    "reasoning_item",
    "reasoning_text_part",
    "render_response",
    "response_body",
    "response_core",
    "response_error",
    "response_object",
    "response_usage",
    "seal_reasoning",
]

ResponseStatus = Literal["completed", "incomplete", "in_progress", "failed"]

#: the ``include`` value that asks for the reasoning items' ``encrypted_content``
ENCRYPTED_REASONING: Final = "reasoning.encrypted_content"
#: The echoed fields of a Response that the request did not set: OpenAI's defaults, except
#: ``temperature`` and ``top_p`` (the upstream's defaults apply, unknown to the edge).
RESPONSE_DEFAULTS: Final[Mapping[str, Any]] = {
    "background": False,
    "instructions": None,
    "max_output_tokens": None,
    "max_tool_calls": None,
    "parallel_tool_calls": True,
    "previous_response_id": None,
    "prompt_cache_key": None,
    "reasoning": {"effort": None, "summary": None},
    "safety_identifier": None,
    "service_tier": "default",
    "store": True,
    "temperature": None,
    "text": {"format": {"type": "text"}},
    "tool_choice": "auto",
    "tools": [],
    "top_logprobs": 0,
    "top_p": None,
    "truncation": "disabled",
    "user": None,
    "metadata": {},
}
_INCOMPLETE: Final[Mapping[str, str]] = {
    "length": "max_output_tokens",
    "content_filter": "content_filter",
}
_SEAL: Final = "iop-edge.r1."
_UNSAFE: Final = re.compile(r"[^A-Za-z0-9_-]")
# (edge codes a Response's error can say as they are: OpenAI's ResponseError.code is a closed
# set, and the edge's other codes are all the server's side of it)
_ERROR_CODES: Final[Mapping[str, str]] = {"rate_limit_exceeded": "rate_limit_exceeded"}


def response_core(response_id: str) -> str:
    """The part of a response id that its items' ids are made from."""
    return _UNSAFE.sub("_", response_id.removeprefix("resp_")) or "unidentified"


def item_id(prefix: str, core: str, output_index: int) -> str:
    """The id of the output item at ``output_index`` (``prefix``: ``rs``, ``msg`` or ``fc``)."""
    return f"{prefix}_{core}_{output_index}"


def call_id_of(call_id: str, core: str, ordinal: int) -> str:
    """A function call's ``call_id``: the upstream's, else one made from the response and the
    call's place among the answer's calls."""
    return call_id or f"call_{core}_{ordinal}"


def seal_reasoning(text: str) -> str:
    """The ``encrypted_content`` that carries ``text`` back to the edge (module docstring)."""
    return _SEAL + base64.b64encode(text.encode()).decode("ascii")


def open_reasoning(sealed: str) -> str | None:
    """The reasoning an ``encrypted_content`` carries: the text when the edge sealed it,
    ``None`` when it did not (OpenAI's, which nothing here can read). Raises ValueError when
    it has the edge's prefix and is corrupt."""
    if not sealed.startswith(_SEAL):
        return None
    try:
        return base64.b64decode(sealed[len(_SEAL) :], validate=True).decode()
    except ValueError:  # (binascii.Error and UnicodeDecodeError both are)
        raise ValueError("it has the edge's seal but is not the base64 of UTF-8 text") from None


def output_text_part(text: str) -> dict[str, Any]:
    """A message's ``output_text`` content part."""
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def reasoning_text_part(text: str) -> dict[str, Any]:
    """A reasoning item's ``reasoning_text`` content part."""
    return {"type": "reasoning_text", "text": text}


def reasoning_item(identifier: str, text: str, *, sealed: bool) -> dict[str, Any]:
    """A ``reasoning`` output item (``sealed``: with its ``encrypted_content``)."""
    item: dict[str, Any] = {
        "id": identifier,
        "type": "reasoning",
        "summary": [],
        "content": [reasoning_text_part(text)],
    }
    if sealed:
        item["encrypted_content"] = seal_reasoning(text)
    return item


def message_item(identifier: str, text: str, status: ResponseStatus) -> dict[str, Any]:
    """An assistant ``message`` output item with its one ``output_text`` part."""
    return {
        "id": identifier,
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": [output_text_part(text)],
    }


def function_call_item(
    identifier: str, call_id: str, name: str, arguments: str, status: ResponseStatus
) -> dict[str, Any]:
    """A ``function_call`` output item."""
    return {
        "id": identifier,
        "type": "function_call",
        "status": status,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }


def incomplete_details(finish: Finish) -> dict[str, str] | None:
    """``incomplete_details`` of an answer that ended so (``None``: it is complete)."""
    reason = _INCOMPLETE.get(finish.reason)
    return {"reason": reason} if reason is not None else None


def response_usage(
    usage: TokenUsage | None, estimated_input_tokens: int, output_bytes: int
) -> dict[str, Any]:
    """The Response's ``usage`` (see the module docstring)."""
    if usage is None:
        usage = TokenUsage()
    prompt, completion = usage.prompt_tokens, usage.completion_tokens
    inputs = prompt if prompt is not None else estimated_input_tokens
    outputs = completion if completion is not None else -(-output_bytes // 4)
    return {
        "input_tokens": inputs,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens or 0},
        "output_tokens": outputs,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens or 0},
        "total_tokens": inputs + outputs,
    }


def response_error(code: str, message: str) -> dict[str, str]:
    """A failed Response's ``error``: OpenAI's code for the edge's (``rate_limit_exceeded``,
    else ``server_error``: an upstream that failed or timed out) and the edge's message."""
    return {"code": _ERROR_CODES.get(code, "server_error"), "message": message}


def response_object(
    *,
    response_id: str,
    created_at: int,
    model: str,
    echo: Mapping[str, Any],
    status: ResponseStatus,
    output: list[dict[str, Any]],
    usage: dict[str, Any] | None,
    error: dict[str, str] | None = None,
    incomplete: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A Response object: the answer's part and the request's echoed fields."""
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "error": error,
        "incomplete_details": incomplete,
        **RESPONSE_DEFAULTS,
        **echo,
        "model": model,
        "output": output,
        "usage": usage,
    }


def render_response(
    answer: Answer,
    *,
    response_id: str,
    created_at: int,
    model: str,
    echo: Mapping[str, Any],
    estimated_input_tokens: int,
    status_override: str | None = None,
    include: Sequence[str] = (),
) -> dict[str, Any]:
    """The Response of ``answer`` (module docstring). ``response_id`` and ``created_at`` are
    the shell's; ``model`` the model the client asked for; ``echo`` the request's echoed
    fields; ``estimated_input_tokens`` the edge's estimate of the request (used when the
    upstream reported no usage); ``include`` the request's (``reasoning.encrypted_content``
    seals the reasoning); ``status_override`` replaces the status (a stored response's)."""
    core = response_core(response_id)
    incomplete = incomplete_details(answer.finish)
    output: list[dict[str, Any]] = []
    output_bytes = text_bytes(answer.text) + text_bytes(answer.reasoning)
    if answer.reasoning:
        sealed = ENCRYPTED_REASONING in include
        output.append(reasoning_item(item_id("rs", core, 0), answer.reasoning, sealed=sealed))
    if answer.text:
        last = not answer.tool_calls and incomplete is not None
        status: ResponseStatus = "incomplete" if last else "completed"
        output.append(message_item(item_id("msg", core, len(output)), answer.text, status))
    for ordinal, call in enumerate(answer.tool_calls):
        output_bytes += text_bytes(call.arguments)
        output.append(
            function_call_item(
                item_id("fc", core, len(output)),
                call_id_of(call.call_id, core, ordinal),
                call.name,
                call.arguments,
                "completed",
            )
        )
    response = response_object(
        response_id=response_id,
        created_at=created_at,
        model=model,
        echo=echo,
        status="incomplete" if incomplete is not None else "completed",
        output=output,
        usage=response_usage(answer.finish.usage, estimated_input_tokens, output_bytes),
        incomplete=incomplete,
    )
    if status_override is not None:
        response["status"] = status_override
    return response


def response_body(answer: Answer, **fields: Any) -> bytes:
    """:func:`render_response` as the JSON body of the answer (``fields``: its keywords)."""
    return dumps(render_response(answer, **fields))


def output_items(response: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A Response's output items, as the next turn's history takes them (the store keeps a
    response's input items followed by these)."""
    output = response.get("output")
    return [dict(item) for item in output] if isinstance(output, list) else []
