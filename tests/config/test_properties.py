"""Properties of loading, over generated documents."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import TypeVar

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from iop_edge.config import ConfigError, dump_config, load_config, parse_config
from iop_edge.errors import ConfigProblem
from iop_edge.testing.strategies import mutated_docs, valid_docs, yaml_values

T = TypeVar("T")


def rejection(load: Callable[[T], object], arg: T) -> list[ConfigProblem] | None:
    """The problems ``load(arg)`` is rejected with, or None when it loads; any other exception
    propagates and fails the test."""
    try:
        load(arg)
    except ConfigError as exc:
        return exc.problems
    return None


@given(valid_docs())
def test_load_dump_load_gives_the_same_effective_config(doc):
    config = parse_config(copy.deepcopy(doc))
    again = parse_config(dump_config(config))
    assert again == config
    assert dump_config(again) == dump_config(config)


@given(valid_docs())
@settings(max_examples=30)
def test_yaml_text_loads_to_the_same_config_as_the_parsed_document(doc):
    assert load_config(yaml.safe_dump(doc)) == parse_config(copy.deepcopy(doc))


@given(st.one_of(yaml_values, st.dictionaries(st.text(max_size=6), yaml_values, max_size=4)))
def test_arbitrary_yaml_documents_raise_nothing_but_config_error(value):
    problems = rejection(load_config, yaml.safe_dump(value))
    assert problems is None or all(p.message for p in problems)


@given(st.text(max_size=200))
def test_arbitrary_text_raises_nothing_but_config_error(text):
    problems = rejection(load_config, text)
    assert problems is None or all(p.message for p in problems)


@given(mutated_docs())
def test_mutated_valid_configs_raise_nothing_but_config_error_and_every_problem_has_a_path(doc):
    problems = rejection(parse_config, doc)
    assert problems is None or all(p.path and p.message for p in problems), problems
