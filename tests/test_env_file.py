"""The files a config refers to (issue 25 item 2): the env file of ``serve --env-file`` (its
syntax, its errors) and the reader of ``${file:/path}``, both read with the config file's care
and again at every load."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from iop_edge.config import ConfigError
from iop_edge.config.load import UnreadableFile
from iop_edge.config_file import (
    MAX_SECRET_FILE_BYTES,
    ServiceEnvironment,
    load_config_file,
    read_secret_file,
)
from iop_edge.env_file import parse_env_text
from tests.helpers.config import MINIMAL_YAML


def test_the_env_file_syntax_is_systemds_environmentfile_subset():
    text = "\n".join(
        [
            "# a comment",
            "   ; another",
            "",
            "PLAIN=sk-plain value  ",
            "  SPACED = padded",
            "SINGLE='a \"quoted\" $VALUE\\n'",
            'DOUBLE="say \\"hi\\" \\\\ \\$HOME \\n"',
            "EMPTY=",
            "TWICE=first",
            "TWICE=last",
            "EQUALS=a=b",
        ]
    )
    assert parse_env_text(text, "iop.env") == {
        "PLAIN": "sk-plain value",
        "SPACED": "padded",
        "SINGLE": 'a "quoted" $VALUE\\n',
        "DOUBLE": 'say "hi" \\ $HOME \\n',
        "EMPTY": "",
        "TWICE": "last",
        "EQUALS": "a=b",
    }


def test_every_bad_line_of_an_env_file_is_named_by_file_and_line_without_its_text():
    text = "\n".join(
        [
            "OK=1",
            "sk-pasted-key-without-a-name",
            "1ST=digit first",
            "OPEN='never closed sk-secret",
            'HALF="a"sk-tail',
        ]
    )
    with pytest.raises(ConfigError) as info:
        parse_env_text(text, "iop.env")
    assert [p.message for p in info.value.problems] == [
        "iop.env:2: not a KEY=VALUE line (a variable name, '=', its value; a comment starts "
        "with #)",
        "iop.env:3: the name before '=' is not a variable name (letters, digits and '_', not "
        "starting with a digit)",
        "iop.env:4: the value's opening ' is never closed (on this line)",
        "iop.env:5: text follows the value's closing \"; quote the whole value",
    ]
    assert "sk-" not in str(info.value)


def test_the_service_environment_is_the_process_one_and_rereads_its_file(tmp_path):
    """As a mapping (what a handover's new process inherits) only the process's own
    environment; for ``${VAR}`` the env file's values over it, read again every time."""
    env_file = tmp_path / "iop.env"
    env_file.write_text("API_KEY=first\n")
    env = ServiceEnvironment({"API_KEY": "inherited", "HOME": "/h"}, str(env_file))
    assert dict(env) == {"API_KEY": "inherited", "HOME": "/h"}
    assert env.variables() == {"API_KEY": "first", "HOME": "/h"}
    config_path = tmp_path / "edge.yaml"
    config_path.write_text(
        MINIMAL_YAML.replace("{id: echo,", "{id: echo, display_name: '${API_KEY}',")
    )
    assert load_config_file(str(config_path), env).models[0].display_name == "first"
    env_file.write_text("API_KEY=second\n")
    assert load_config_file(str(config_path), env).models[0].display_name == "second"
    env_file.unlink()
    with pytest.raises(ConfigError) as info:
        load_config_file(str(config_path), env)
    assert str(info.value) == f"cannot read env file {env_file}: No such file or directory"


def test_a_file_reference_reads_a_regular_utf8_file_without_its_trailing_line_break(tmp_path):
    secret = tmp_path / "key"
    secret.write_bytes(b"sk-\xc3\xa9t\xc3\xa9\r\n\n")
    assert read_secret_file(str(secret)) == "sk-été"
    link = tmp_path / "link"
    link.symlink_to(secret)  # a Kubernetes secret is a symlink to a regular file
    assert read_secret_file(str(link)) == "sk-été"


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (lambda p: None, "No such file or directory"),
        (lambda p: p.mkdir(), "it is a directory, not a regular file"),
        (lambda p: os.mkfifo(p), "it is a FIFO (named pipe), not a regular file"),
        (
            lambda p: p.write_bytes(b"k" * (MAX_SECRET_FILE_BYTES + 1)),
            f"it is {MAX_SECRET_FILE_BYTES + 1:,} bytes; a file read by ${{file:}} may be at "
            f"most 64 KiB ({MAX_SECRET_FILE_BYTES:,} bytes)",
        ),
        (lambda p: p.write_bytes(b"ok\xff"), "not valid UTF-8 at byte 2 (line 1, byte 0xff)"),
    ],
    ids=["missing", "directory", "fifo", "too-large", "not-utf8"],
)
def test_a_file_that_cannot_be_used_says_why(tmp_path, make, why):
    path = tmp_path / "key"
    make(path)
    with pytest.raises(UnreadableFile) as info:
        read_secret_file(str(path))
    assert str(info.value) == why


def test_an_unreadable_file_reference_is_a_config_problem_naming_path_file_and_why(tmp_path):
    config_path = tmp_path / "edge.yaml"
    missing = tmp_path / "nope"
    config_path.write_text(
        MINIMAL_YAML.replace("command: cat", f"command: cat, headers: {{X: '${{file:{missing}}}'}}")
    )
    with pytest.raises(ConfigError) as info:
        load_config_file(str(config_path), {})
    assert str(info.value) == (
        f"nodes[local].adapters[shell].headers.X: cannot read ${{file:{missing}}}: No such file "
        "or directory"
    )


def test_the_shipped_env_file_parses_and_the_unit_reads_it_with_env_file():
    root = Path(__file__).resolve().parents[1]
    example = root / "deploy/iop-edge.env.example"
    assert set(parse_env_text(example.read_text(), str(example))) == {"OPENAI_API_KEY", "VLLM_URL"}
    unit = (root / "deploy/iop-edge.service").read_text()
    assert "--env-file /etc/iop-edge/iop-edge.env" in unit
    assert "\nEnvironmentFile=" not in unit  # systemd would read it once, at start
    assert "\nSupplementaryGroups=iop-edge-secrets\n" in unit
