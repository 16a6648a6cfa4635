"""The OpenAI surface (``api/chat.py``): its bodies checked, the fields the edge relies on
named in ``param`` (SPEC §6); unknown fields pass through."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import iop_edge.api
from iop_edge.api.chat import CHAT_ROUTES, parse_body
from iop_edge.api.surface import Surface
from iop_edge.errors import RequestError


@pytest.mark.parametrize(
    ("raw", "param", "fragment"),
    [
        (b"{not json", None, "not valid JSON"),
        (b"[1]", None, "must be a JSON object"),
        (b'{"messages": [{"role": "user", "content": "x"}]}', "model", "'model' is required"),
        (b'{"model": "m"}', "messages", "'messages' is required"),
        (b'{"model": "m", "messages": []}', "messages", "non-empty array"),
        (b'{"model": "m", "messages": ["x"]}', "messages[0]", "string 'role'"),
        (
            b'{"model": "m", "messages": [{"role": "user"}], "stream": "yes"}',
            "stream",
            "'stream' must be a boolean",
        ),
        (
            b'{"model": "m", "messages": [{"role": "user"}], "max_tokens": -1}',
            "max_tokens",
            "non-negative integer",
        ),
        (
            b'{"model": "m", "messages": [{"role": "user"}], "max_tokens": 1.5}',
            "max_tokens",
            "non-negative integer",
        ),
    ],
)
def test_malformed_bodies_are_400_naming_the_field(raw, param, fragment):
    with pytest.raises(RequestError) as info:
        parse_body(raw, "chat/completions")
    assert (info.value.status, info.value.code, info.value.param) == (
        400,
        "invalid_request_error",
        param,
    )
    assert fragment in str(info.value)


def test_completions_need_a_prompt():
    with pytest.raises(RequestError) as info:
        parse_body(b'{"model": "m"}', "completions")
    assert info.value.param == "prompt"
    assert parse_body(b'{"model": "m", "prompt": "hi"}', "completions")["prompt"] == "hi"


def test_unknown_fields_pass_through_untouched():
    body = parse_body(
        b'{"model": "m", "messages": [{"role": "user"}], "x_custom": {"a": 1}}', "chat/completions"
    )
    assert body["x_custom"] == {"a": 1}


def test_the_request_path_serves_every_surface_without_naming_one():
    """STYLE.md: a new API surface is a module beside ``chat.py``; the request path does not
    branch on the surface. The request path and the attempt import no surface module (only the
    :class:`Surface` seam), and each OpenAI endpoint is a surface of its own."""
    api = Path(iop_edge.api.__file__).parent
    for module in ("request_path.py", "attempt.py"):
        tree = ast.parse((api / module).read_text())
        imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        assert "iop_edge.api.surface" in imported, module
        assert not imported & {"iop_edge.api.chat", "iop_edge.api.server"}, module
    surfaces: dict[str, Surface] = dict(CHAT_ROUTES)
    assert {path: s.endpoint for path, s in surfaces.items()} == {
        "/v1/chat/completions": "chat/completions",
        "/v1/completions": "completions",
        "/v1/embeddings": "embeddings",
    }
