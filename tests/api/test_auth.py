"""Principal tokens and provider-auth forwarding (SPEC §3.1, §6)."""

from __future__ import annotations

import hashlib

import pytest

from iop_edge.api.auth import ANONYMOUS, Authenticator, ProviderAuthForwarder
from iop_edge.config.schema import OpenAISection
from iop_edge.errors import AuthError


def section(**values) -> OpenAISection:
    return OpenAISection.model_validate(values)


def entry(ref: str, token: str, principal: str = "team-a") -> dict:
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
