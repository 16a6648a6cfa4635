"""AdapterSet.from_payload: executors built from a node's NodeConfigPayload alone (SPEC §3.1
provider-first execution fields, model routes, disabled entries, lifecycle)."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator

import pytest
import yaml

from iop_edge.adapters import DEFAULT_REQUEST_TIMEOUT_MS, AdapterSet
from iop_edge.adapters.registry import request_timeout_ms
from iop_edge.config import load_config
from iop_edge.config.payload import (
    AdapterPayload,
    NodeConfigPayload,
    ProviderPayload,
    node_payload,
)
from iop_edge.config.schema import ExecutionFields, NodeRuntime
from iop_edge.errors import AdapterError
from iop_edge.testing.fake_openai import FakeOpenAI
from tests.helpers import FAKE_CLI
from tests.helpers.adapters import chat, dead_port, reply_json


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as server:
        yield server


def node_doc(fake: FakeOpenAI, dead: str) -> str:
    doc = {
        "openai": {"model_routes": [{"model": "legacy", "adapter": "api", "target": "fake-model"}]},
        "models": [
            {
                "id": "m",
                "context_window_tokens": 8192,
                "providers": ["over", "plain", "agent"],
            }
        ],
        "nodes": [
            {
                "id": "n1",
                "adapters": [
                    {
                        "name": "api",
                        "type": "openai_compat",
                        "base_url": dead,
                        "headers": {"X-Source": "adapter"},
                        "request_timeout_ms": 5000,
                    },
                    {"name": "off", "type": "openai_compat", "base_url": dead, "enabled": False},
                    {"name": "shell", "type": "cli", "command": "cat"},
                ],
                "providers": [
                    {
                        "id": "over",
                        "type": "openai_compat",
                        "category": "api",
                        "adapter": "api",
                        "models": ["m"],
                        "base_url": fake.base_url,
                        "headers": {"X-Source": "provider"},
                    },
                    {
                        "id": "plain",
                        "type": "openai_compat",
                        "category": "api",
                        "adapter": "api",
                        "models": ["m"],
                    },
                    {
                        "id": "agent",
                        "type": "cli",
                        "category": "cli",
                        "adapter": "shell",
                        "models": ["m"],
                        "command": sys.executable,
                        "args": [*FAKE_CLI[1:], "--format", "json"],
                        "output_format": "json",
                    },
                    {
                        "id": "disabled",
                        "type": "openai_compat",
                        "category": "api",
                        "adapter": "api",
                        "models": ["m"],
                        "enabled": False,
                    },
                    {
                        "id": "stranded",
                        "type": "openai_compat",
                        "category": "api",
                        "adapter": "off",
                        "models": ["m"],
                        "enabled": False,
                    },
                ],
            }
        ],
    }
    return yaml.safe_dump(doc, sort_keys=False)


@pytest.fixture
async def adapter_set(fake: FakeOpenAI) -> AsyncIterator[AdapterSet]:
    dead = f"http://127.0.0.1:{dead_port()}/v1"
    payload = node_payload(load_config(node_doc(fake, dead)), "n1")
    # Only the payload crosses: rebuild it from JSON as a remote node agent would receive it.
    payload = NodeConfigPayload.model_validate_json(payload.model_dump_json())
    built = AdapterSet.from_payload(payload)
    yield built
    await built.aclose()


async def test_provider_first_fields_override_the_adapter(
    adapter_set: AdapterSet, fake: FakeOpenAI
) -> None:
    reply = await adapter_set.for_provider("over").complete(chat("provider wins"))
    assert reply.status == 200
    assert fake.requests[-1].headers["X-Source"] == "provider"

    # A provider without its own fields uses the adapter's: its base_url is the dead one.
    with pytest.raises(AdapterError) as caught:
        await adapter_set.for_provider("plain").complete(chat())
    assert "provider 'plain' (adapter 'api')" in str(caught.value)
    assert "cannot connect" in str(caught.value)


async def test_cli_provider_overrides_command_and_output_format(adapter_set: AdapterSet) -> None:
    reply = await adapter_set.for_provider("agent").complete(chat("json from the fake"))
    # The adapter's own command is `cat` with text output; the provider's fake answers JSON.
    assert reply_json(reply)["choices"][0]["message"]["content"] == "json from the fake"
    assert reply.usage.completion_tokens == 4


async def test_model_routes_use_the_adapter_alone(adapter_set: AdapterSet) -> None:
    with pytest.raises(AdapterError) as caught:
        await adapter_set.for_adapter("api").complete(chat(target="fake-model"))
    assert caught.value.code == "upstream_error"
    assert "adapter 'api'" in str(caught.value)
    assert "provider" not in str(caught.value)


async def test_disabled_providers_get_an_executor_for_a_live_enable(
    adapter_set: AdapterSet,
) -> None:
    adapter_set.for_provider("disabled")  # there: a refresh that enables it finds it ready


async def test_disabled_adapters_and_their_providers_get_no_executor(
    adapter_set: AdapterSet,
) -> None:
    with pytest.raises(KeyError, match=r"no provider 'stranded'.*agent, disabled, over, plain"):
        adapter_set.for_provider("stranded")
    with pytest.raises(KeyError, match="no enabled adapter 'off'; enabled adapters: api, shell"):
        adapter_set.for_adapter("off")


async def test_request_timeout_default_and_override(fake: FakeOpenAI) -> None:
    """The documented default applies when neither provider nor adapter sets
    ``request_timeout_ms``; a provider's own value wins. (That the executors obey the value
    they are built with is tested in test_cli.py, test_ollama.py and test_openai_compat.py.)"""
    payload = node_payload(load_config(node_doc(fake, "http://127.0.0.1:1/v1")), "n1")
    adapters = {a.name: a for a in payload.adapters}
    providers = {p.id: p for p in payload.providers}
    assert request_timeout_ms(adapters["shell"].execution) == DEFAULT_REQUEST_TIMEOUT_MS
    assert request_timeout_ms(providers["over"].execution) == 5000


async def test_a_payload_without_base_url_is_a_clear_upstream_error() -> None:
    # Config validation refuses this (see tests/config); a payload from elsewhere (a remote
    # node agent's) may still lack it, and the adapter says what to set.
    payload = NodeConfigPayload(
        edge_id="e",
        node_id="n1",
        alias=None,
        agent_kind="server",
        runtime=NodeRuntime(),
        adapters=(
            AdapterPayload(
                name="api", type="openai_compat", enabled=True, execution=ExecutionFields()
            ),
        ),
        providers=(
            ProviderPayload(
                id="p",
                type="openai_compat",
                category="api",
                adapter="api",
                models=("m",),
                enabled=True,
                execution=ExecutionFields(),
            ),
        ),
    )
    built = AdapterSet.from_payload(payload)
    try:
        with pytest.raises(AdapterError, match="has no base_url; set base_url on the provider"):
            await built.for_provider("p").complete(chat())
    finally:
        await built.aclose()


async def test_aclose_is_idempotent_and_later_calls_fail_cleanly(
    adapter_set: AdapterSet, fake: FakeOpenAI
) -> None:
    executor = adapter_set.for_provider("over")
    assert (await executor.complete(chat())).status == 200
    await adapter_set.aclose()
    await adapter_set.aclose()
    with pytest.raises(AdapterError, match="adapter 'api' is closed"):
        await executor.complete(chat())
    assert fake.total_requests == 1
