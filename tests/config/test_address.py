"""ListenAddress: the one parser of ``HOST:PORT`` (schema, loopback rules, listeners, CLI)."""

from __future__ import annotations

import pytest

from iop_edge.config.address import ListenAddress


@pytest.mark.parametrize(
    ("text", "host", "port", "loopback", "url"),
    [
        ("127.0.0.1:8080", "127.0.0.1", 8080, True, "http://127.0.0.1:8080"),
        ("localhost:0", "localhost", 0, True, "http://localhost:0"),
        ("[::1]:7601", "::1", 7601, True, "http://[::1]:7601"),
        ("127.9.8.7:1", "127.9.8.7", 1, True, "http://127.9.8.7:1"),
        ("0.0.0.0:9464", "0.0.0.0", 9464, False, "http://0.0.0.0:9464"),
        ("[::]:65535", "::", 65535, False, "http://[::]:65535"),
        ("edge.example:443", "edge.example", 443, False, "http://edge.example:443"),
    ],
)
def test_parse(text: str, host: str, port: int, loopback: bool, url: str) -> None:
    address = ListenAddress.parse(text)
    assert (address.host, address.port, address.is_loopback) == (host, port, loopback)
    assert (address.url(), str(address)) == (url, text)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("8080", "is not a listen address"),
        (":8080", "is not a listen address"),
        ("host:", "is not a listen address"),
        ("host:65536", "is not a listen address"),
        ("host:８０", "is not a listen address"),  # full-width digits are digits to Python
        ("::1:8080", "an IPv6 host must be written in brackets"),
    ],
)
def test_refused(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ListenAddress.parse(text)


def test_wildcards() -> None:
    assert ListenAddress.parse("0.0.0.0:1").is_wildcard
    assert ListenAddress.parse("[::]:1").is_wildcard
    assert not ListenAddress.parse("127.0.0.1:1").is_wildcard
