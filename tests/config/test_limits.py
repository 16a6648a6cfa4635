"""The bounds of a config (issue 10, items 1, 6 and 9): nesting depth, integer size, alias
expansion and the config file itself are refused with a clear ``path: message`` — through
:func:`load_config`, :func:`parse_config`, the refresh path and the file reader — never with an
exception that would kill the reload worker; and no report quotes a secret.

The ``iop-edge`` command and the daemon's refresh path run as real processes in
``test_limits_cli.py``.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from iop_edge.config import ConfigError, EdgeConfig, load_config, parse_config
from iop_edge.config.limits import INT_MAX, INT_MIN, MAX_DEPTH
from iop_edge.config.load import parse_yaml
from iop_edge.config.redact import REDACTED
from iop_edge.config.refresh import refresh
from iop_edge.config_file import MAX_FILE_BYTES, load_config_file, snapshot_config_file
from tests.helpers.config import MINIMAL_YAML, base_doc, load, node, problems
from tests.helpers.limits import (
    DEEP,
    DEPTH_RULE,
    INT_RULE,
    NEXT_LINE,
    NODE_RULE,
    SECRET_ARGS,
    SECRET_URL,
    SECRETS,
    SHOWN_ARGS,
    SHOWN_URL,
    alias_bomb,
    call_within,
    nested_list,
    nested_mapping,
    with_priority,
)


def running() -> EdgeConfig:
    """MINIMAL_YAML loaded: the config a refresh is checked against."""
    return load_config(MINIMAL_YAML)


def load_problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(text)
    return [str(p) for p in info.value.problems]


def refresh_errors(text: str) -> list[str]:
    """The errors of a dry-run refresh of ``text`` against a running config (must be rejected:
    never an exception)."""
    result = refresh(running(), text, mode="dry_run").result
    assert result.result == "rejected"
    assert result.report == []
    return [f"{e.path}: {e.message}" if e.path else e.message for e in result.errors]


# --- nesting depth (item 1) ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("build", "path"),
    [
        (nested_mapping, "x-deep" + ".a" * (MAX_DEPTH - 1)),
        (nested_list, "x-deep" + "[0]" * (MAX_DEPTH - 1)),
    ],
    ids=["mapping", "list"],
)
def test_a_value_nested_990_deep_is_a_config_error_naming_the_depth_limit(build, path):
    text = MINIMAL_YAML + f"x-deep: {build(DEEP)}\n"
    expected = (
        f"{path}: is nested more than {MAX_DEPTH} levels deep (line {NEXT_LINE}); {DEPTH_RULE}"
    )
    assert load_problems(text) == [expected]
    # The refresh path says the same, as a rejected result (it raised RecursionError).
    assert refresh_errors(text) == [expected]


def test_the_depth_limit_counts_levels_from_the_root_mapping():
    # The root mapping is level 1 and x-deep's value level 2, so MAX_DEPTH - 2 mappings put the
    # innermost scalar at level MAX_DEPTH: allowed (only the unknown key is left to report).
    at_limit = MINIMAL_YAML + f"x-deep: {nested_mapping(MAX_DEPTH - 2)}\n"
    (message,) = load_problems(at_limit)
    assert message.startswith("x-deep: unknown key 'x-deep'")
    over = MINIMAL_YAML + f"x-deep: {nested_mapping(MAX_DEPTH - 1)}\n"
    (message,) = load_problems(over)
    assert message.endswith(DEPTH_RULE)


@pytest.mark.parametrize("depth", [DEEP, 5000])
def test_parsed_data_nested_too_deep_is_a_config_error_not_a_recursion_error(depth):
    # parse_config takes already-parsed data (no YAML parser capping the depth first).
    doc = base_doc()
    value: Any = 1
    for _ in range(depth):
        value = [value]
    node(doc)["x-deep"] = value
    path = "nodes[gpu-1].x-deep" + "[0]" * (MAX_DEPTH - 3)
    with pytest.raises(ConfigError) as info:  # not helpers.problems: deepcopy would recurse
        parse_config(doc)
    assert [str(p) for p in info.value.problems] == [
        f"{path}: is nested more than {MAX_DEPTH} levels deep; {DEPTH_RULE}"
    ]


# --- integer range (item 1) ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "size"),
    [(2**64, "large"), (2**100, "large"), (INT_MIN - 1, "small"), (-(2**64), "small")],
)
def test_an_integer_outside_64_bits_is_a_config_error_at_its_path(value, size):
    text = with_priority(value)
    expected = f"nodes[local].providers[cat].priority: {value} is too {size}; {INT_RULE}"
    assert load_problems(text) == [expected]
    # The config hash (orjson) raised TypeError on 2**64 from inside refresh().
    assert refresh_errors(text) == [expected]


def test_the_largest_64_bit_integer_is_accepted_and_refreshes():
    text = with_priority(INT_MAX)
    assert load_config(text).nodes[0].providers[0].priority == INT_MAX
    result = refresh(running(), text, mode="apply").result
    assert (result.result, result.errors) == ("applied", [])
    assert [(e.path, e.new, e.applied) for e in result.report] == [
        ("nodes[local].providers[cat].priority", INT_MAX, True)
    ]


def test_the_smallest_64_bit_integer_passes_the_range_check_and_meets_the_schema():
    # Inside the range: what is left is the schema's own rule for the field.
    assert load_problems(with_priority(INT_MIN)) == [
        f"nodes[local].providers[cat].priority: {INT_MIN} is negative; priority must be >= 0"
    ]


@pytest.mark.parametrize(("sign", "size"), [("", "large"), ("-", "small")])
def test_an_integer_of_5000_digits_is_refused_before_it_is_built(sign, size):
    # Python refuses to convert more than 4,300 digits (ValueError): the old loader raised it.
    text = with_priority(sign + "9" * 5000)
    shown = (sign + "9" * 24)[:24]
    assert load_problems(text) == [
        f"nodes[local].providers[cat].priority: {shown}… is too {size}; {INT_RULE}"
    ]
    assert refresh_errors(text) == load_problems(text)


def test_every_out_of_range_integer_is_reported_at_once():
    doc = base_doc()
    doc["provider_pool"]["queue_timeout_ms"] = 2**64
    doc["models"][0]["context_window_tokens"] = 2**65
    assert [(p.path, p.message.split(";")[0]) for p in problems(doc)] == [
        ("provider_pool.queue_timeout_ms", f"{2**64} is too large"),
        ("models[chat].context_window_tokens", f"{2**65} is too large"),
    ]


# --- alias expansion (item 6) ----------------------------------------------------------------


def test_a_billion_laughs_alias_bomb_is_refused_before_it_expands():
    # 9 levels expand to 9**9 (387 million) strings: the old loader took minutes and gigabytes.
    # parse_yaml is asked first and under a bound: it builds values that share the aliased
    # lists (cheap), so a regression fails here rather than expanding in load_config.
    text = MINIMAL_YAML + alias_bomb(9)
    assert len(text.encode()) < 1500
    with pytest.raises(ConfigError) as info:
        call_within(30, parse_yaml, text)
    expected = f"x-lol6: {NODE_RULE}"
    assert [str(p) for p in info.value.problems] == [expected]
    assert load_problems(text) == [expected]
    assert refresh_errors(text) == [expected]


def test_aliases_of_one_long_string_are_refused_before_the_text_expands():
    # Under the node cap, 5,000 uses of one 4,000-character string are 20 MB of text (a million
    # would be 4 GB, in a file under 4 MiB): refused by its expanded text, at its path.
    text = MINIMAL_YAML + f"x-text: &s {'y' * 4000}\nx-uses: [{', '.join(['*s'] * 5000)}]\n"
    with pytest.raises(ConfigError) as info:
        call_within(30, parse_yaml, text)
    [problem] = info.value.problems
    assert problem.path == "x-uses"
    assert "expands to more than 16 MiB of text, an alias counted at every use" in problem.message
    assert refresh_errors(text) == [str(problem)]


def test_aliases_that_expand_below_the_cap_still_load():
    data = parse_yaml(MINIMAL_YAML + alias_bomb(4))  # 9**4 strings: far below the cap
    assert len(data["x-lol3"]) == 9
    assert data["x-lol3"][8][8][8] == ["lol"] * 9


@pytest.mark.parametrize(
    ("value", "path"),
    [("&loop [*loop]", "x-loop[0]"), ("&loop {self: *loop}", "x-loop.self")],
    ids=["list", "mapping"],
)
def test_a_recursive_alias_is_refused(value, path):
    text = MINIMAL_YAML + f"x-loop: {value}\n"
    expected = (
        f"{path}: is a recursive alias (line {NEXT_LINE} refers to a node that contains it); "
        "a config cannot be recursive"
    )
    with pytest.raises(ConfigError) as info:
        call_within(30, parse_yaml, text)
    assert [str(p) for p in info.value.problems] == [expected]
    assert refresh_errors(text) == [expected]


# --- the config file (item 6; item 9 for non-UTF-8) ------------------------------------------


def snapshot_problems(path: Path) -> list[str]:
    """What one bounded read of ``path`` reports (the daemon's read, in a bounded thread)."""
    snapshot = call_within(30, snapshot_config_file, str(path))
    assert snapshot.data is None
    with pytest.raises(ConfigError) as info:
        snapshot.text()
    assert snapshot.digest == f"unreadable: {info.value}"
    return [str(p) for p in info.value.problems]


def test_a_file_over_the_size_cap_is_refused_naming_its_size_and_the_cap(tmp_path):
    path = tmp_path / "edge.yaml"
    path.write_bytes(MINIMAL_YAML.encode() + b"#" * (MAX_FILE_BYTES - len(MINIMAL_YAML) + 1))
    assert snapshot_problems(path) == [
        f"cannot read config {path}: it is {MAX_FILE_BYTES + 1:,} bytes; a config file may be "
        f"at most 4 MiB ({MAX_FILE_BYTES:,} bytes)"
    ]


def test_a_file_of_exactly_the_size_cap_is_read(tmp_path):
    path = tmp_path / "edge.yaml"
    path.write_bytes(MINIMAL_YAML.encode() + b"#" * (MAX_FILE_BYTES - len(MINIMAL_YAML)))
    snapshot = snapshot_config_file(str(path))
    assert (snapshot.error, len(snapshot.data or b"")) == (None, MAX_FILE_BYTES)


def test_a_fifo_at_the_config_path_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "edge.yaml"
    os.mkfifo(fifo)
    try:
        assert snapshot_problems(fifo) == [
            f"cannot read config {fifo}: it is a FIFO (named pipe), not a regular file"
        ]
    finally:
        # A regressed reader blocks in open() until a writer comes: come, so its thread ends.
        with contextlib.suppress(OSError):
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


def test_a_directory_at_the_config_path_is_refused(tmp_path):
    assert snapshot_problems(tmp_path) == [
        f"cannot read config {tmp_path}: it is a directory, not a regular file"
    ]


def test_a_symlink_to_a_regular_file_is_read(tmp_path):
    target = tmp_path / "real.yaml"
    target.write_text(MINIMAL_YAML)
    link = tmp_path / "edge.yaml"
    link.symlink_to(target)
    assert load_config_file(str(link), {}) == running()


def test_a_non_utf8_file_is_refused_naming_the_file_and_the_byte_offset(tmp_path):
    path = tmp_path / "edge.yaml"
    data = MINIMAL_YAML.encode() + b"# caf\xe9\n"  # Latin-1, as an editor might save it
    path.write_bytes(data)
    offset = data.index(b"\xe9")
    expected = (
        f"{path}: not valid UTF-8 at byte {offset} (line {NEXT_LINE}, byte 0xe9); save the file "
        "as UTF-8"
    )
    snapshot = snapshot_config_file(str(path))
    assert snapshot.data == data
    with pytest.raises(ConfigError) as info:
        snapshot.text()
    assert [str(p) for p in info.value.problems] == [expected]
    with pytest.raises(ConfigError) as info:
        load_config_file(str(path), {})
    assert [str(p) for p in info.value.problems] == [expected]


# --- secrets in reports (item 9) -------------------------------------------------------------


def assert_no_secret(shown: str) -> None:
    assert [s for s in SECRETS if s in shown] == []


def test_a_refresh_report_redacts_url_userinfo_query_and_secret_cli_args():
    before = base_doc()
    after = copy.deepcopy(before)
    vllm, _, shell = node(after)["adapters"]
    vllm["base_url"] = SECRET_URL
    shell["args"] = SECRET_ARGS
    node(after)["adapters"].append(
        {"name": "extra", "type": "cli", "command": "llm", "resume_args": SECRET_ARGS}
    )
    result = refresh(load(before), yaml.safe_dump(after), mode="dry_run").result
    assert result.result == "restart_required"
    entries = {e.path: (e.old, e.new) for e in result.report}
    assert entries == {
        "nodes[gpu-1].adapters[vllm-main].base_url": ("http://127.0.0.1:8000/v1", SHOWN_URL),
        "nodes[gpu-1].adapters[shell].args": (None, SHOWN_ARGS),
        "nodes[gpu-1].adapters[extra]": (
            None,
            {
                "name": "extra",
                "type": "cli",
                "command": "llm",
                "resume_args": SHOWN_ARGS,
                "enabled": True,
            },
        ),
    }
    assert_no_secret(json.dumps(result.to_json()))


def test_a_changed_secret_is_still_reported_as_a_change_with_both_sides_redacted():
    before = base_doc()
    node(before)["adapters"][0]["base_url"] = SECRET_URL
    after = copy.deepcopy(before)
    node(after)["adapters"][0]["base_url"] = SECRET_URL.replace("s3cret", "s3cret-2")
    result = refresh(load(before), yaml.safe_dump(after), mode="dry_run").result
    assert [(e.path, e.old, e.new) for e in result.report] == [
        ("nodes[gpu-1].adapters[vllm-main].base_url", SHOWN_URL, SHOWN_URL)
    ]
    assert_no_secret(json.dumps(result.to_json()))


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        (
            "base_url",
            SECRET_URL.replace("https", "ftp"),
            f"{SHOWN_URL.replace('https', 'ftp')!r} is not an http(s) URL; base_url must start "
            "with http://",
        ),
        # args written as one string instead of a list: the whole value may be a secret.
        (
            "args",
            " ".join(SECRET_ARGS),
            f"{REDACTED} (str) is invalid: input should be a valid tuple",
        ),
        ("env", {"API_KEY": ["sk-live-XYZ"]}, None),
        ("headers", {"Authorization": ["Bearer sk-live-XYZ"]}, None),
    ],
    ids=["url", "args", "env", "headers"],
)
def test_a_refused_secret_value_is_not_quoted_in_the_refresh_errors(field, value, expected):
    doc = base_doc()
    node(doc)["adapters"][2 if field in ("args", "env") else 0][field] = value
    (error,) = refresh_errors(yaml.safe_dump(doc))
    assert_no_secret(error)
    assert REDACTED in error
    if expected is not None:
        adapter = "shell" if field == "args" else "vllm-main"
        assert error == f"nodes[gpu-1].adapters[{adapter}].{field}: {expected}"


def test_a_bad_header_name_is_still_quoted():
    # Header names are not secret: the user must see which one is wrong.
    doc = base_doc()
    node(doc)["adapters"][0]["headers"] = {"Bad Name": "x"}
    assert "'Bad Name' is not a valid HTTP header name" in str(problems(doc)[0])
