"""The internal form of a request (an OpenAI request body): token estimate, and the model's
generation policy.

Pure functions of the body and the catalog entry; the request path calls them before admission,
on the body a surface parsed (the OpenAI surface's checks: :func:`iop_edge.api.chat.parse_body`).

**Token estimate.** The input of a chat request is estimated as ``ceil(B / 4) + 3 × M + 1600 ×
G`` tokens, where ``B`` is the number of UTF-8 bytes of its text — message contents (strings
and ``text`` parts), names, reasoning sent back (``reasoning_content``), tool-call arguments
and legacy ``function_call`` arguments, and the JSON of ``tools`` — ``M`` the number of
messages and ``G`` of images (each counted at the largest size an upstream takes): one formula
for every surface, :func:`iop_edge.translate.count_tokens.estimate_chat_tokens`. A
completions prompt counts ``ceil(B / 4) + I``, ``I`` the number of token ids it sends as such.
For ``/v1/completions`` the text is the prompt's strings and every token id of a token-id
prompt (``[1, 2, 3]``, or ``[[1, 2], [3]]`` for a batch) counts as one token; ``M`` = 0. It
costs one pass over the text, is monotone in text length, and lands near real tokenizers: about
4 characters per token for English, about one token per character for Korean or Chinese (3
bytes each) — and exactly right for token ids. (Counting ids as nothing would let a client
send a long context in a general slot.) For ``/v1/embeddings`` the text is the ``input`` (a
string, strings, token ids or token-id lists, counted as for a completions prompt); ``M`` = 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import orjson

from iop_edge.adapters.base import Endpoint
from iop_edge.api.catalog import ModelEntry
from iop_edge.errors import RequestError
from iop_edge.translate.count_tokens import estimate_chat_tokens

MAX_TOKEN_FIELDS: Final = ("max_completion_tokens", "max_tokens")
THINKING_FIELD: Final = "thinking_token_budget"


@dataclass(frozen=True, slots=True)
class PreparedRequest:
    """A request ready for admission: the body to send upstream and what admission needs."""

    body: dict[str, Any]
    stream: bool
    estimated_input_tokens: int
    max_tokens: int | None
    long_context: bool


def decode_json_object(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object (a 400 naming what is wrong otherwise)."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise RequestError(
            "invalid_request_error", f"The request body is not valid JSON: {exc}.", status=400
        ) from None
    if not isinstance(body, dict):
        raise RequestError(
            "invalid_request_error", "The request body must be a JSON object.", status=400
        )
    return body


def _bad(message: str, param: str | None) -> RequestError:
    return RequestError("invalid_request_error", message, status=400, param=param)


def _text_bytes(value: Any) -> int:
    if isinstance(value, str):
        return len(value) if value.isascii() else len(value.encode("utf-8"))
    if isinstance(value, list):
        total = 0
        for part in value:
            if isinstance(part, str):
                total += _text_bytes(part)
            elif isinstance(part, dict):
                total += _text_bytes(part.get("text"))
        return total
    return 0


def _prompt_tokens(prompt: Any) -> int:
    """A completions prompt: a string, a list of strings (a batch), a list of token ids, or a
    list of token-id lists (a batch). Text counts by bytes, a token id as one token."""
    if not isinstance(prompt, list):
        return -(-_text_bytes(prompt) // 4)
    text = ids = 0
    for part in prompt:
        if isinstance(part, str):
            text += _text_bytes(part)
        elif isinstance(part, list):
            ids += len(part)  # a token-id list (each item at least one token)
        elif isinstance(part, int):
            ids += 1
    return -(-text // 4) + ids


def estimate_input_tokens(body: dict[str, Any], endpoint: Endpoint) -> int:
    """The documented estimate of a request's input tokens (see the module docstring)."""
    if endpoint != "chat/completions":
        return _prompt_tokens(body.get("prompt" if endpoint == "completions" else "input"))
    return estimate_chat_tokens(body)


def apply_generation_policy(body: dict[str, Any], model: ModelEntry) -> int | None:
    """Apply the model's generation policy to ``body`` in place; return the max tokens.

    ``default_max_tokens`` fills ``max_tokens`` when the request sets neither ``max_tokens`` nor
    ``max_completion_tokens``; ``min_max_tokens`` raises a smaller value to the floor (in the
    field the request used); ``default_thinking_token_budget`` fills ``thinking_token_budget``
    when the request sets none.
    """
    field = next((name for name in MAX_TOKEN_FIELDS if body.get(name) is not None), None)
    if field is None and model.default_max_tokens is not None:
        field = "max_tokens"
        body[field] = model.default_max_tokens
    if (
        field is not None
        and model.min_max_tokens is not None
        and body[field] < model.min_max_tokens
    ):
        body[field] = model.min_max_tokens
    if model.default_thinking_token_budget is not None and body.get(THINKING_FIELD) is None:
        body[THINKING_FIELD] = model.default_thinking_token_budget
    return body[field] if field is not None else None


def prepare(
    body: dict[str, Any], endpoint: Endpoint, model: ModelEntry | None, threshold: int
) -> PreparedRequest:
    """Policy, estimate, context check and long-context class for a parsed body.

    ``model`` is None for a model route (no group policy, no context window). An embeddings
    request gets no generation policy and no context check (each input is embedded on its own,
    and the upstream knows its model's limit); its estimate still classes it long-context.
    """
    if endpoint == "embeddings":
        estimate = estimate_input_tokens(body, endpoint)
        return PreparedRequest(body, False, estimate, None, estimate > threshold)
    max_tokens = apply_generation_policy(body, model) if model is not None else None
    if model is None:
        max_tokens = next((body[n] for n in MAX_TOKEN_FIELDS if body.get(n) is not None), None)
    estimate = estimate_input_tokens(body, endpoint)
    if model is not None and estimate + (max_tokens or 0) > model.context_window_tokens:
        raise RequestError(
            "context_length_exceeded",
            f"This model's maximum context length is {model.context_window_tokens} tokens; the "
            f"request needs about {estimate} input tokens (estimated) plus {max_tokens or 0} "
            "for the completion. Shorten the input or lower max_tokens.",
            status=400,
            param="messages" if endpoint == "chat/completions" else "prompt",
        )
    return PreparedRequest(
        body=body,
        stream=bool(body.get("stream")),
        estimated_input_tokens=estimate,
        max_tokens=max_tokens,
        long_context=estimate > threshold,
    )
