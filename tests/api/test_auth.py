"""Principal tokens and provider-auth forwarding (SPEC §3.1, §6)."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from iop_edge.api.auth import ANONYMOUS, Authenticator, ProviderAuthForwarder
from iop_edge.config.schema import OpenAISection
from iop_edge.errors import AuthError


def section(**values: Any) -> OpenAISection:
    """An ``openai:`` section validated from keyword fields."""
    return OpenAISection.model_validate(values)


def entry(ref: str, token: str, principal: str = "team-a") -> dict[str, str]:
    """A principal_tokens entry for ``token`` (stored as its hash)."""
    return {
        "token_ref": ref,
        "principal_ref": principal,
        "principal_alias": "Team A",
        "token_hash_sha256": hashlib.sha256(token.encode()).hexdigest(),
    }


def test_a_bearer_token_maps_to_its_principal_by_hash():
    auth = Authenticator(
        section(principal_tokens=[entry("chat", "tok-1"), entry("batch", "tok-2")])
    )
    principal = auth.authenticate("Bearer tok-2")
    assert (principal.principal_ref, principal.principal_alias, principal.token_ref) == (
        "team-a",
        "Team A",
        "batch",
    )
    assert auth.authenticate("bearer tok-1").token_ref == "chat"


@pytest.mark.parametrize("header", [None, "", "Basic dG9rLTE=", "Bearer wrong", "Bearer "])
def test_a_missing_or_unknown_token_is_invalid_api_key(header):
    auth = Authenticator(section(principal_tokens=[entry("chat", "tok-1")]))
    with pytest.raises(AuthError) as info:
        auth.authenticate(header)
    assert info.value.code == "invalid_api_key"
    assert "tok-1" not in str(info.value)


def test_with_no_tokens_every_request_is_anonymous():
    auth = Authenticator(section())
    assert auth.open
    assert auth.authenticate(None) is ANONYMOUS
    assert auth.authenticate_headers({"x-api-key": "a", "Authorization": "Bearer b"}) is ANONYMOUS


def test_the_token_may_come_in_x_api_key_or_as_a_bearer_or_both_when_equal():
    """Issue 27: what Anthropic's clients send (``ANTHROPIC_API_KEY``: ``x-api-key``;
    ``ANTHROPIC_AUTH_TOKEN``: a bearer token); a header's name is case-insensitive in HTTP,
    the request path hands its case-insensitive headers over."""
    auth = Authenticator(
        section(principal_tokens=[entry("chat", "tok-1"), entry("batch", "tok-2")])
    )
    assert auth.authenticate_headers({"x-api-key": " tok-2 "}).token_ref == "batch"
    assert auth.authenticate_headers({"Authorization": "Bearer tok-1"}).token_ref == "chat"
    both = {"Authorization": "Bearer tok-1", "x-api-key": "tok-1"}
    assert auth.authenticate_headers(both).token_ref == "chat"
    assert auth.authenticate_headers({"Authorization": "Bearer tok-1", "x-api-key": ""}).token_ref


@pytest.mark.parametrize(
    ("headers", "says"),
    [
        ({}, "Missing API key"),
        ({"x-api-key": "tok-3"}, "Incorrect API key provided."),
        ({"x-api-key": "tok-1\n"}, "The x-api-key header is malformed"),
        ({"Authorization": "Bearer tok-2", "x-api-key": "tok-1"}, "hold different tokens"),
        ({"Authorization": "Bearer tok-3", "x-api-key": "tok-1"}, "hold different tokens"),
        ({"Authorization": "tok-1", "x-api-key": "tok-1"}, "The Authorization header holds no"),
    ],
)
def test_a_missing_wrong_or_conflicting_x_api_key_is_invalid_api_key(headers, says):
    auth = Authenticator(
        section(principal_tokens=[entry("chat", "tok-1"), entry("batch", "tok-2")])
    )
    with pytest.raises(AuthError) as info:
        auth.authenticate_headers(headers)
    assert info.value.code == "invalid_api_key"
    assert says in str(info.value)
    assert "tok-" not in str(info.value)


def test_provider_auth_forwards_the_source_header_as_the_target_header():
    forward = ProviderAuthForwarder(section(provider_auth={"enabled": True}))
    assert forward.upstream_headers({"X-IOP-Provider-Authorization": "sk-up"}) == {
        "Authorization": "Bearer sk-up"
    }
    raw = ProviderAuthForwarder(
        section(
            provider_auth={
                "enabled": True,
                "from_header": "X-Key",
                "target_header": "api-key",
                "scheme": "",
            }
        )
    )
    assert raw.upstream_headers({"X-Key": "k"}) == {"api-key": "k"}


def test_provider_auth_required_and_missing_is_provider_auth_required():
    forward = ProviderAuthForwarder(section(provider_auth={"enabled": True}))
    with pytest.raises(AuthError) as info:
        forward.upstream_headers({})
    assert info.value.code == "provider_auth_required"
    optional = ProviderAuthForwarder(section(provider_auth={"enabled": True, "required": False}))
    assert optional.upstream_headers({}) == {}


def test_provider_auth_disabled_forwards_nothing():
    forward = ProviderAuthForwarder(section())
    assert forward.upstream_headers({"X-IOP-Provider-Authorization": "sk-up"}) == {}


@pytest.mark.parametrize(
    "suffix",
    ["\xa0", "\udca0", "\udcff\udcfe", "\u00e9", "\x01", "\n", "\u200b"],
    ids=[
        "nbsp",
        "surrogate-escaped-a0",
        "surrogate-escaped-fffe",
        "e-acute",
        "control",
        "lf",
        "zwsp",
    ],
)
def test_a_token_holding_anything_but_printable_ascii_is_malformed_never_a_crash(suffix):
    """Issue 10: aiohttp hands bytes that are not UTF-8 over as surrogate escapes; hashing
    them used to raise UnicodeEncodeError (a 500 whose log held the token)."""
    auth = Authenticator(section(principal_tokens=[entry("chat", "tok-1")]))
    for header in (f"Bearer tok-1{suffix}", f"Bearer {suffix}tok-1"):
        with pytest.raises(AuthError) as info:
            auth.authenticate(header)
        assert info.value.code == "invalid_api_key"
        assert "malformed" in str(info.value)
        assert "tok-1" not in str(info.value)


def test_only_http_whitespace_is_stripped_around_a_token():
    auth = Authenticator(section(principal_tokens=[entry("chat", "tok-1")]))
    assert auth.authenticate("Bearer  tok-1 \t").token_ref == "chat"
    with pytest.raises(AuthError):
        auth.authenticate("Bearer tok-1\u3000")  # an ideographic space is not HTTP's


def test_the_admin_token_check():
    from iop_edge.api.auth import AdminTokenCheck
    from iop_edge.config.schema import ConsoleSection

    off = AdminTokenCheck(ConsoleSection())
    assert not off.enabled
    off.check(None)  # no admin token configured: nothing is required
    digest = hashlib.sha256(b"adm-1").hexdigest()
    check = AdminTokenCheck(ConsoleSection(admin_token_sha256=digest))
    assert check.enabled
    check.check("Bearer adm-1")
    for header in (None, "", "adm-1", "Bearer adm-2", "Bearer adm-1\udca0", "Basic adm-1"):
        with pytest.raises(AuthError) as info:
            check.check(header)
        assert info.value.code == "invalid_admin_token"
        assert "adm-1" not in str(info.value)


@pytest.mark.parametrize("value", ["sk-up\xa0", "sk-\udcffup", "sk\u00e9"])
def test_a_malformed_provider_credential_is_refused_not_forwarded(value):
    forward = ProviderAuthForwarder(section(provider_auth={"enabled": True, "required": False}))
    with pytest.raises(AuthError) as info:
        forward.upstream_headers({"X-IOP-Provider-Authorization": value})
    assert info.value.code == "invalid_provider_auth"
    assert "sk" not in str(info.value)
