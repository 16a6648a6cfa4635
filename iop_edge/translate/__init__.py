"""The translation core (pure): other APIs' requests and answers to and from the internal form.

The internal form is OpenAI chat, what every adapter speaks: a request is a chat body (plus
what chat cannot say, :mod:`~iop_edge.translate.chat_request`), an answer is chat chunks or a
chat completion, decoded once (:mod:`~iop_edge.translate.chat_events`) into surface-neutral
events (:mod:`~iop_edge.translate.events`) that each surface renders. So the request path,
admission and the adapters never branch on the surface, and a new surface adds its own parser
and renderer and nothing else.

=============================  ==================================================================
module                         job
=============================  ==================================================================
``events``                     the internal form of an answer: events, usage, a whole answer
``chat_request``               the internal form of a request: the chat body's messages and
                               tools, the neutral reasoning request
``chat_events``                chat chunks / a chat completion → events / an answer
``sse``                        reading the adapters' SSE frames, writing a surface's events
``request_checks``             the checks of a request's values, the 400 of each refusal
``messages_request``           Anthropic Messages request → internal form (top-level fields)
``messages_content``           its messages and system prompt → chat messages
``messages_reply``             answer → Anthropic Message
``messages_stream``            events → Anthropic Messages event stream
``anthropic_errors``           the edge's error codes → Anthropic's error types and statuses
``responses_request``          OpenAI Responses request → internal form (top-level fields)
``responses_input``            its input items and stored history → chat messages
``responses_reply``            answer → Responses ``response`` object
``responses_stream``           events → Responses event stream
``count_tokens``               the estimate of ``/v1/messages/count_tokens``
=============================  ==================================================================

Like ``config/`` and ``pool/``: no asyncio, I/O or clock; the standard library, ``orjson`` and
``iop_edge.errors`` only (``tests/test_purity.py`` holds it).
"""
