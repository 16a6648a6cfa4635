"""Loading text: YAML errors, environment expansion, legacy shapes, the shipped configs."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest

from iop_edge.config import ConfigError, dump_config, load_config, parse_config
from iop_edge.config.load import expand_env
from iop_edge.errors import ConfigProblem
from tests.helpers.config import MINIMAL_YAML, base_doc, load, problem_at, provider

ROOT = Path(__file__).resolve().parents[2]


def load_problems(
    text: str, *, env: Mapping[str, str] | None = None, source: str = "edge.yaml"
) -> list[str]:
    """The problems ``load_config`` rejects ``text`` with, as the user reads them."""
    with pytest.raises(ConfigError) as info:
        load_config(text, env=env, source=source)
    return [str(p) for p in info.value.problems]


def test_a_yaml_syntax_error_gives_line_and_column_not_a_traceback():
    text = MINIMAL_YAML.replace("providers: [cat]}", "providers: [cat}")
    (message,) = load_problems(text, source="edge.yaml")
    assert message.startswith("edge.yaml:2:")
    assert "YAML syntax error" in message
    assert "Traceback" not in message


def test_a_duplicate_key_is_an_error_with_both_lines():
    text = "logging: {level: info}\n" + MINIMAL_YAML + "logging: {level: debug}\n"
    (message,) = load_problems(text, source="edge.yaml")
    assert message.startswith("edge.yaml:9:1:")
    assert "found duplicate key 'logging' (first defined on line 1)" in message


def test_yaml_merge_keys_still_work():
    text = MINIMAL_YAML + "x-common: &common {level: debug}\n"
    assert "unknown key 'x-common'" in load_problems(text)[0]
    text = MINIMAL_YAML.replace(
        "adapters: [{name: shell, type: cli, command: cat}]",
        "adapters: [{name: shell, type: cli, <<: {command: cat}}]",
    )
    assert load_config(text).nodes[0].adapters[0].command == "cat"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "the config is empty; it must be a YAML mapping"),
        ("# only a comment\n", "the config is empty; it must be a YAML mapping"),
        ("- a\n- b\n", "the config is a list; it must be a mapping"),
        ("just text\n", "the config is a str; it must be a mapping"),
    ],
)
def test_a_document_that_is_not_a_mapping_is_rejected(text, expected):
    assert load_problems(text) == [expected]


def test_env_expansion_fills_variables_and_defaults():
    text = MINIMAL_YAML.replace("command: cat", "command: '${CMD}', args: ['${ARG:-x}', '$$HOME']")
    adapter = load_config(text, env={"CMD": "cat"}).nodes[0].adapters[0]
    assert (adapter.command, adapter.args) == ("cat", ("x", "$HOME"))
    adapter = load_config(text, env={"CMD": "cat", "ARG": "y"}).nodes[0].adapters[0]
    assert adapter.args == ("y", "$HOME")


def test_a_missing_environment_variable_is_an_error_naming_it_at_its_path():
    text = MINIMAL_YAML.replace(
        "command: cat", "command: cat, headers: {Authorization: 'Bearer ${API_KEY}'}"
    )
    assert load_problems(text, env={}) == [
        "nodes[local].adapters[shell].headers.Authorization: environment variable API_KEY is "
        "not set; set it in the daemon's environment (for example in the file of iop-edge serve "
        "--env-file) or write ${API_KEY:-default}"
    ]


def test_env_expansion_reports_every_missing_variable():
    found: list[ConfigProblem] = []
    expand_env({"a": "${ONE}", "b": ["${TWO}"]}, {}, found)
    assert [(p.path, p.message.split(";")[0]) for p in found] == [
        ("a", "environment variable ONE is not set"),
        ("b[0]", "environment variable TWO is not set"),
    ]


def test_an_unset_variable_does_not_hide_the_other_problems():
    """Issue 25 item 4: the load goes on with a placeholder; a problem that only restates the
    unset reference (its path, or a message quoting it) is dropped."""
    text = MINIMAL_YAML.replace("command: cat", "command: '${CMD}'").replace(
        "{id: cat,", "{id: cat, priority: -1,"
    )
    assert load_problems(text) == [
        "nodes[local].adapters[shell].command: environment variable CMD is not set; set it in "
        "the daemon's environment (for example in the file of iop-edge serve --env-file) or "
        "write ${CMD:-default}",
        "nodes[local].providers[cat].priority: -1 is negative; priority must be >= 0",
    ]
    # In an id, the placeholder is no identifier: that restatement is dropped too.
    text = MINIMAL_YAML.replace("{id: cat,", "{id: '${PROVIDER}',").replace(
        "providers: [cat]", "providers: ['${PROVIDER}']"
    )
    found = load_problems(text)
    assert [p.split(":")[0] for p in found] == [
        "models[echo].providers[0]",
        "nodes[local].providers[${PROVIDER}].id",
        "models[echo].providers",  # (as for any invalid item: the list holds no valid one)
    ]
    assert not any("not a valid identifier" in p for p in found)


def test_the_effective_config_dump_loads_back_to_the_same_config():
    config = load(base_doc())
    assert parse_config(dump_config(config)) == config


def test_a_bare_provider_id_and_an_id_target_mapping_are_both_accepted():
    doc = base_doc()
    provider(doc)["models"] = ["chat", "other"]
    doc["models"][0]["providers"] = ["vllm-a"]
    assert load(doc).models[0].providers[0].target == "chat"
    doc["models"][0]["providers"] = [{"id": "vllm-a", "target": "other"}]
    assert load(doc).models[0].providers[0].target == "other"
    doc["models"][0]["providers"] = [{"id": "vllm-a", "tgt": "other"}]
    assert "did you mean 'target'" in problem_at(doc, "models[chat].providers[vllm-a].tgt")


def test_the_shipped_config_validates():
    config = load_config((ROOT / "configs/edge.yaml").read_text(), env={})
    assert [m.id for m in config.models] == ["echo"]
    echo = config.nodes[0].providers[0]
    assert (echo.type, echo.adapter) == ("cli", "shell")
    assert config.nodes[0].adapters[0].command == "cat"


def test_the_full_example_validates_with_its_secret_from_the_environment_or_without_one():
    text = (ROOT / "configs/examples/full.yaml").read_text()
    config = load_config(text, env={"OPENAI_API_KEY": "sk-test"})
    hosted = next(a for a in config.nodes[0].adapters if a.name == "hosted-api")
    assert hosted.headers == {"Authorization": "Bearer sk-test"}
    placeholder = load_config(text, env={})
    hosted = next(a for a in placeholder.nodes[0].adapters if a.name == "hosted-api")
    assert hosted.headers == {"Authorization": "Bearer sk-replace-me"}
