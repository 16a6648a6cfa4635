"""``native_apis`` (issues 27 and 28): the APIs an ``openai_compat`` upstream serves itself, an
execution field that reaches the adapters through the node payload; refused elsewhere, each
value once. (Its restart class is checked with the other execution fields in
``test_refresh.py``.)"""

from __future__ import annotations

from typing import Any

import pytest

from iop_edge.config.payload import node_payload
from iop_edge.config.schema import EXECUTION_FIELDS, NATIVE_APIS
from tests.helpers.config import base_doc, load, node, problem_at, problems, provider

PROVIDER = "nodes[gpu-1].providers[vllm-a]"


def test_the_allowed_apis_are_one_constant_messages_and_responses():
    assert NATIVE_APIS == ("messages", "responses")
    assert "native_apis" in EXECUTION_FIELDS


def test_omitted_is_none_and_a_list_of_known_apis_loads():
    assert load(base_doc()).nodes[0].providers[0].native_apis is None
    doc = base_doc()
    provider(doc)["native_apis"] = ["messages"]
    assert load(doc).nodes[0].providers[0].native_apis == ("messages",)
    provider(doc)["native_apis"] = ["responses", "messages"]
    assert load(doc).nodes[0].providers[0].native_apis == ("responses", "messages")
    provider(doc)["native_apis"] = []
    assert load(doc).nodes[0].providers[0].native_apis == ()


def test_an_unknown_api_is_refused_naming_the_value_and_the_allowed_ones():
    doc = base_doc()
    provider(doc)["native_apis"] = ["responses", "realtime"]
    assert problem_at(doc, f"{PROVIDER}.native_apis[1]") == (
        "'realtime' is not allowed; native_apis must be 'messages' or 'responses'"
    )


def test_an_api_listed_twice_is_refused():
    doc = base_doc()
    provider(doc)["native_apis"] = ["messages", "messages"]
    assert problem_at(doc, f"{PROVIDER}.native_apis") == (
        "'messages' is listed twice in ['messages', 'messages']; native_apis entries must be unique"
    )
    provider(doc)["native_apis"] = ["responses", "messages", "responses"]
    assert problem_at(doc, f"{PROVIDER}.native_apis") == (
        "'responses' is listed twice in ['responses', 'messages', 'responses']; native_apis "
        "entries must be unique"
    )


def ollama_and_cli_doc(native_apis: Any) -> dict[str, Any]:
    """base_doc() with native_apis on its cli adapter and on an ollama provider."""
    doc = base_doc()
    node(doc)["adapters"][2]["native_apis"] = native_apis
    node(doc)["providers"].append(
        {
            "id": "ol",
            "type": "ollama",
            "category": "local_inference",
            "adapter": "ollama-local",
            "models": ["qwen3"],
            "enabled": False,  # the rule is structural: it holds for a disabled provider too
            "native_apis": native_apis,
        }
    )
    return doc


@pytest.mark.parametrize("native_apis", [["messages"], ["responses"], []])
def test_ollama_and_cli_adapters_and_providers_refuse_it(native_apis):
    found = {p.path: p.message for p in problems(ollama_and_cli_doc(native_apis))}
    shown = str(native_apis)
    assert found == {
        "nodes[gpu-1].adapters[shell].native_apis": (
            f"{shown} is not available on cli adapters; native_apis is an execution field of "
            "openai_compat adapters and providers only (the requests of cli adapters are "
            "translated)"
        ),
        "nodes[gpu-1].providers[ol].native_apis": (
            f"{shown} is not available on ollama providers; native_apis is an execution field "
            "of openai_compat adapters and providers only (the requests of ollama providers "
            "are translated)"
        ),
    }


@pytest.mark.parametrize("alias", ["seulgivibe_claude", "seulgivibe_openai"])
def test_the_openai_compat_aliases_may_declare_it(alias):
    doc = base_doc()
    provider(doc).update({"type": alias, "native_apis": ["messages"]})
    assert load(doc).nodes[0].providers[0].native_apis == ("messages",)


def test_the_payload_carries_it_provider_first_over_the_adapter():
    doc = base_doc()
    node(doc)["adapters"][0]["native_apis"] = ["messages", "responses"]
    node(doc)["providers"].append(
        {
            "id": "chat-only",
            "type": "openai_compat",
            "category": "api",
            "adapter": "vllm-main",
            "models": ["chat"],
            "native_apis": [],
        }
    )
    payload = node_payload(load(doc), "gpu-1")
    adapter = next(a for a in payload.adapters if a.name == "vllm-main")
    assert adapter.execution.native_apis == ("messages", "responses")
    by_id = {p.id: p.execution.native_apis for p in payload.providers}
    assert by_id == {"vllm-a": ("messages", "responses"), "chat-only": ()}
