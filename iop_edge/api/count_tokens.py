"""``POST /v1/messages/count_tokens``: a Messages request's input tokens, without a slot.

The request is authenticated, its model resolved and allow-listed, and its body translated as
for ``/v1/messages`` (``max_tokens`` not required; a body the translation refuses — a server
tool, say — can still be counted by a passthrough provider, and is refused as the translation
said otherwise); then it is counted by the first way that works, in this order, and the
answer's ``x-iop-token-count`` header says which:

1. ``passthrough`` — a provider of the model that speaks Messages (``native_apis: [messages]``)
   counts it: the body is forwarded to its ``/messages/count_tokens`` (``model`` its target,
   ``anthropic-version`` and ``anthropic-beta`` forwarded) and its answer returned as it came
   (an error status too, but 429 and 5xx: the upstream failed, and the count moves on);
2. ``tokenizer`` — a provider that exposes its tokenizer (vLLM's ``/tokenize``, llama.cpp's
   ``/apply-template`` and ``/tokenize``) counts the translated chat body with the model's chat
   template;
3. ``estimate`` — the edge's estimate (:mod:`iop_edge.translate.count_tokens`): the system
   prompt, every message, the tool definitions, tool calls and results, and images.

Providers are tried in the model group's order (a model route: its one adapter). Counting takes
no slot and is not admitted (it does not generate); an upstream that fails or is slow only
moves the count to the next way. The request has its request line (endpoint
``messages/count_tokens``), and its errors are Anthropic's, as for ``/v1/messages``.
"""

from __future__ import annotations

from typing import Final

import orjson
from aiohttp import web

from iop_edge.adapters.base import UpstreamCall
from iop_edge.api.bodies import decode_json_object
from iop_edge.api.errors import describe
from iop_edge.api.messages import FORWARDED_HEADERS, MESSAGES_API, MESSAGES_SURFACE
from iop_edge.api.record import RequestRecord
from iop_edge.api.request_path import RequestPath, error_response, request_id, session_id
from iop_edge.errors import AdapterError, IopEdgeError, RequestError
from iop_edge.translate.chat_request import InternalRequest
from iop_edge.translate.count_tokens import estimate_chat_tokens
from iop_edge.translate.messages_request import translate_request

__all__ = ["COUNT_HEADER", "TokenCounter"]

#: the answer's header naming how it was counted: passthrough, tokenizer or estimate
COUNT_HEADER: Final = "x-iop-token-count"
_JSON: Final = "application/json"


class TokenCounter:
    """The ``count_tokens`` handler on a request path (its auth, catalog, adapters, log)."""

    __slots__ = ("_path",)

    def __init__(self, path: RequestPath) -> None:
        self._path = path

    async def serve(self, request: web.Request) -> web.StreamResponse:
        """Count the request's input tokens (module docstring)."""
        path = self._path
        record = RequestRecord(request_id(request), "messages/count_tokens", path.clock.now())
        try:
            headers = request.headers
            path.guard.check(headers)
            record.session_id = session_id(headers)
            record.principal = path.auth.authenticate_headers(headers)
            raw = await path.read_body(request, record)
            body = decode_json_object(raw)
            try:
                internal: InternalRequest | None = translate_request(body, counting=True)
                refusal: RequestError | None = None
            except RequestError as exc:  # (a passthrough provider may still count it)
                if not isinstance(body.get("model"), str) or not body["model"]:
                    raise
                internal, refusal = None, exc
            record.model = model_id = body["model"]
            _, model, route = path.resolve(record, path.catalog, model_id)
            candidates = path.executors(path.catalog, model, route)
            upstream_headers = path.provider_auth.upstream_headers(headers)
            forwarded = {n: headers[n] for n in FORWARDED_HEADERS if n in headers}
            for provider_id, executor, target in candidates:
                if MESSAGES_API not in executor.native_apis:
                    continue
                call = UpstreamCall(
                    "messages/count_tokens",
                    body,
                    target,
                    False,
                    {**upstream_headers, **forwarded},
                    record.request_id,
                    model_id,
                )
                try:
                    reply = await executor.complete(call)
                except AdapterError as exc:
                    path.log.info(
                        "count_tokens_upstream_failed",
                        request_id=record.request_id,
                        provider=provider_id,
                        error=str(exc),
                    )
                    continue
                if reply.status == 429 or reply.status >= 500:
                    # The upstream failed rather than judged the request: count the next way.
                    path.log.info(
                        "count_tokens_upstream_failed",
                        request_id=record.request_id,
                        provider=provider_id,
                        error=reply.detail or f"the upstream answered HTTP {reply.status}",
                    )
                    continue
                record.provider, record.status = provider_id, reply.status
                if reply.status >= 400:
                    record.code, record.error = "client_error", reply.detail
                return _answer(record, reply.body, reply.status, "passthrough")
            if internal is None:
                assert refusal is not None
                raise refusal  # (no provider could count it as it is)
            for provider_id, executor, target in candidates:
                counted = await executor.count_tokens(
                    internal.chat, target, upstream_headers, record.request_id
                )
                if counted is not None:
                    record.provider, record.status = provider_id, 200
                    return _answer(record, _count(counted), 200, "tokenizer")
            record.status = 200
            return _answer(record, _count(estimate_chat_tokens(internal.chat)), 200, "estimate")
        except IopEdgeError as exc:
            status, record.code, _ = describe(exc)
            record.status = MESSAGES_SURFACE.error_status(record.code, status)
            if record.error is None:
                record.error = str(exc)
            return error_response(
                exc,
                record.request_id,
                render=MESSAGES_SURFACE.render_error,
                status_of=MESSAGES_SURFACE.error_status,
            )
        finally:
            record.duration = path.clock.now() - record.started
            path.finish(record)


def _count(tokens: int) -> bytes:
    return orjson.dumps({"input_tokens": tokens})


def _answer(record: RequestRecord, body: bytes, status: int, method: str) -> web.Response:
    headers = {"x-request-id": record.request_id, COUNT_HEADER: method}
    if record.provider:
        headers["x-iop-provider"] = record.provider
    return web.Response(body=body, status=status, content_type=_JSON, headers=headers)
