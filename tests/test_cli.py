"""The iop-edge command line, run as a real subprocess."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from iop_edge.cli import format_status, main
from iop_edge.config import dump_config, load_config, parse_config
from iop_edge.config.payload import NodeConfigPayload, node_payload
from iop_edge.config.refresh import config_hash

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = str(ROOT / "configs/edge.yaml")
FULL = str(ROOT / "configs/examples/full.yaml")


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    return subprocess.run(
        [sys.executable, "-m", "iop_edge.cli", *args],
        capture_output=True,
        text=True,
        env={**base, **(env or {})},
        timeout=60,
        check=False,
    )


def test_validate_a_valid_file_exits_0():
    result = run("config", "validate", SHIPPED)
    assert (result.returncode, result.stdout.strip()) == (0, f"{SHIPPED}: valid")


def test_validate_an_invalid_file_exits_1_with_one_line_per_problem(tmp_path):
    doc = yaml.safe_load(Path(SHIPPED).read_text())
    doc["nodes"][0]["providers"][0].update({"priority": -1, "capcity": 2})
    bad = tmp_path / "edge.yaml"
    bad.write_text(yaml.safe_dump(doc))
    result = run("config", "validate", str(bad))
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "nodes[local].providers[echo-cat].priority: -1 is negative; priority must be >= 0",
        "nodes[local].providers[echo-cat].capcity: unknown key 'capcity'; did you mean 'capacity'?",
    ]
    result = run("config", "validate", str(bad), "--json")
    assert result.returncode == 1
    assert json.loads(result.stdout) == {
        "valid": False,
        "errors": [
            {
                "path": "nodes[local].providers[echo-cat].priority",
                "message": "-1 is negative; priority must be >= 0",
            },
            {
                "path": "nodes[local].providers[echo-cat].capcity",
                "message": "unknown key 'capcity'; did you mean 'capacity'?",
            },
        ],
    }


@pytest.mark.parametrize(
    "config",
    sorted(str(p.relative_to(ROOT)) for p in (ROOT / "configs").rglob("*.yaml")),
)
def test_every_shipped_config_validates_with_an_empty_environment(config):
    """What a new user does first, before setting any secret: ``env -i iop-edge config
    validate``. A secret an example needs has a ``${VAR:-default}`` placeholder."""
    result = subprocess.run(
        [str(Path(sys.executable).with_name("iop-edge")), "config", "validate", config],
        capture_output=True,
        text=True,
        env={},
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    assert (result.returncode, result.stderr) == (0, ""), result.stderr
    assert result.stdout == f"{config}: valid\n"


def test_validate_json_on_a_valid_file():
    result = run("config", "validate", SHIPPED, "--json")
    assert (result.returncode, json.loads(result.stdout)) == (
        0,
        {"valid": True, "errors": [], "warnings": []},
    )


def test_validate_names_what_is_set_but_has_no_effect(tmp_path):
    """Issue 29 item 1: ``listen.tls`` with no node listener to serve is valid, and validate
    says it is unused (a line on stdout, the ``warnings`` list in JSON)."""
    doc = yaml.safe_load(Path(SHIPPED).read_text())
    doc["listen"] = {"tls": {"cert_file": "/etc/edge.pem", "key_file": "/etc/edge.key"}}
    config = tmp_path / "edge.yaml"
    config.write_text(yaml.safe_dump(doc))
    result = run("config", "validate", str(config))
    assert result.returncode == 0
    assert result.stdout.splitlines()[0] == f"{config}: valid"
    assert result.stdout.splitlines()[1].startswith(
        "warning: listen.tls: is set but the node listener does not open"
    )
    [warning] = json.loads(run("config", "validate", str(config), "--json").stdout)["warnings"]
    assert warning["path"] == "listen.tls"


def test_validate_a_missing_file_exits_1_naming_it(tmp_path):
    result = run("config", "validate", str(tmp_path / "nope.yaml"))
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"cannot read config {tmp_path / 'nope.yaml'}: No such file or directory"
    )


def test_validate_takes_the_default_path_from_the_environment():
    result = run("config", "validate", env={"IOP_EDGE_CONFIG": SHIPPED})
    assert result.returncode == 0


def test_usage_errors_exit_2():
    assert run("config").returncode == 2
    assert run("config", "payload").returncode == 2
    assert run("nonsense").returncode == 2


def test_show_prints_the_effective_config_with_secrets_redacted():
    result = run("config", "show", FULL, env={"OPENAI_API_KEY": "sk-very-secret"})
    assert result.returncode == 0
    assert "sk-very-secret" not in result.stdout
    shown = yaml.safe_load(result.stdout)
    hosted = next(a for a in shown["nodes"][0]["adapters"] if a["name"] == "hosted-api")
    assert hosted["headers"] == {"Authorization": "<redacted>"}
    assert shown["provider_pool"] == {
        "max_queue": 16,
        "queue_timeout_ms": 30000,
        "failover": {"max_attempts": 2},
        "health": {
            "failure_threshold": 3,
            "eject_ms": 10000,
            "max_eject_ms": 300000,
            "probe_interval_ms": 2000,
        },
        "fair_share": "principal",
        "principals": [],
    }
    assert shown["models"][0]["providers"][0] == {"id": "vllm-a", "target": "qwen3-32b"}
    # Every provider shows its effective health check: the type's default when omitted.
    checks = {p["id"]: p["health_check"] for n in shown["nodes"] for p in n["providers"]}
    assert checks["vllm-a"] == {"path": "/models", "timeout_ms": 2000}
    assert all(c is False or c["path"] in ("/models", "/api/tags") for c in checks.values())


def leaves(data: Any, path: str = "") -> dict[str, Any]:
    """Every leaf of a nested document by its path (lists by position)."""
    if isinstance(data, dict):
        return {
            k: v for key, item in data.items() for k, v in leaves(item, f"{path}.{key}").items()
        }
    if isinstance(data, list) and data and isinstance(data[0], (dict, list)):
        return {
            k: v for i, item in enumerate(data) for k, v in leaves(item, f"{path}[{i}]").items()
        }
    return {path: data}


@pytest.mark.parametrize("form", [(), ("--json",)], ids=["yaml", "json"])
def test_config_show_loads_back_as_the_same_effective_config(form):
    """Configuration, "The effective config": the output of ``config show`` (YAML or JSON) loads as
    the same effective config — exactly for a config without secrets; with them, the only
    differences are the values printed as ``<redacted>``."""
    shipped = load_config(Path(SHIPPED).read_text(), env={})
    shown = run("config", "show", SHIPPED, *form)
    assert shown.returncode == 0
    again = parse_config(yaml.safe_load(shown.stdout))
    assert again == shipped
    assert config_hash(again) == config_hash(shipped)
    env = {"OPENAI_API_KEY": "sk-very-secret"}
    full = load_config(Path(FULL).read_text(), env=env)
    shown_full = yaml.safe_load(run("config", "show", FULL, *form, env=env).stdout)
    original, printed = leaves(dump_config(full)), leaves(shown_full)
    assert original.keys() == printed.keys()
    differ = {path for path in original if original[path] != printed[path]}
    assert differ == {
        ".nodes[0].adapters[2].headers.Authorization",
        ".nodes[1].providers[0].env.CLAUDE_CONFIG_DIR",
        ".openai.principal_tokens[0].token_hash_sha256",
        ".openai.principal_tokens[1].token_hash_sha256",
    }
    assert all(printed[path] == "<redacted>" for path in differ)


def test_payload_prints_one_node_as_json():
    result = run("config", "payload", "--node", "local", "--config", SHIPPED)
    assert result.returncode == 0
    payload = json.loads(result.stdout)
    assert payload["node_id"] == "local"
    assert payload["providers"][0]["execution"]["command"] == "cat"
    result = run("config", "payload", "--node", "gpu-9", "--config", SHIPPED)
    assert result.returncode == 1
    assert "'gpu-9' is not a node id; known nodes: local" in result.stderr


@pytest.mark.parametrize(
    "config", sorted(str(p.relative_to(ROOT)) for p in (ROOT / "configs").rglob("*.yaml"))
)
def test_config_payload_loads_back_for_every_node_of_every_shipped_config(config):
    """``config payload`` prints a payload that loads back: with ``--show-secrets`` equal to
    the node's payload, redacted with only its ``<redacted>`` values differing (a node
    without an alias once printed no ``alias`` and did not load)."""
    effective = load_config((ROOT / config).read_text(), env={})
    for node in effective.nodes:
        expected = node_payload(effective, node.id)
        command = ("config", "payload", "--node", node.id, "--config", str(ROOT / config))
        clear = run(*command, "--show-secrets")
        assert clear.returncode == 0, clear.stderr
        assert NodeConfigPayload.model_validate(json.loads(clear.stdout)) == expected
        shown = run(*command)
        assert shown.returncode == 0, shown.stderr
        printed = leaves(
            NodeConfigPayload.model_validate(json.loads(shown.stdout)).model_dump(mode="json")
        )
        original = leaves(expected.model_dump(mode="json"))
        assert printed.keys() == original.keys()
        assert {printed[p] for p in original if printed[p] != original[p]} <= {"<redacted>"}


def test_token_new_prints_a_token_once_and_an_entry_holding_only_its_hash(tmp_path):
    result = run(
        "token",
        "new",
        "--token-ref",
        "app-chat",
        "--principal-ref",
        "team-a",
        "--alias",
        "Team A",
        "--json",
    )
    assert result.returncode == 0
    out = json.loads(result.stdout)
    entry = out["principal_token"]
    assert entry == {
        "token_ref": "app-chat",
        "token_hash_sha256": hashlib.sha256(out["token"].encode()).hexdigest(),
        "principal_ref": "team-a",
        "principal_alias": "Team A",
    }
    # the printed entry is ready to paste into a config
    doc = yaml.safe_load(Path(SHIPPED).read_text())
    doc["openai"]["principal_tokens"] = [entry]
    config = load_config(yaml.safe_dump(doc))
    assert config.openai.principal_tokens[0].token_ref == "app-chat"
    human = run("token", "new", "--token-ref", "app", "--principal-ref", "p")
    raw = human.stdout.splitlines()[0].rsplit(" ", 1)[1]
    assert hashlib.sha256(raw.encode()).hexdigest() in human.stdout
    # the operator is told the token works only after a restart (a refresh does not apply it)
    assert "accepted once the daemon restarts" in human.stderr


def test_token_new_rejects_bad_names_in_the_path_message_form_of_config_validate(tmp_path):
    """The lines are those `config validate` prints for the same entry in a config file."""
    result = run("token", "new", "--token-ref", "has space", "--principal-ref", "")
    assert (result.returncode, result.stdout) == (2, "")
    expected = [
        "openai.principal_tokens[has space].token_ref: 'has space' is not a valid identifier; "
        "token_ref must start with a letter or digit and contain only letters, digits, '.', "
        "'_' and '-'",
        "openai.principal_tokens[has space].principal_ref: '' is empty; principal_ref must be a "
        "non-empty string",
    ]
    assert result.stderr.splitlines() == expected
    doc = yaml.safe_load(Path(SHIPPED).read_text())
    doc["openai"]["principal_tokens"] = [
        {"token_ref": "has space", "token_hash_sha256": "a" * 64, "principal_ref": ""}
    ]
    config = tmp_path / "edge.yaml"
    config.write_text(yaml.safe_dump(doc))
    assert run("config", "validate", str(config)).stderr.splitlines() == expected


def test_token_node_prints_a_node_token_once_and_the_hash_line_for_the_node(tmp_path):
    """``token node``: the token once (``iopn_``), then the line to set under ``nodes[ID]``
    with its SHA-256 and what to do next; nothing written anywhere but stdout."""
    quiet = {"HOME": str(tmp_path / "home"), "XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    result = subprocess.run(
        [sys.executable, "-m", "iop_edge.cli", "token", "node", "--node", "gpu-2"],
        capture_output=True,
        text=True,
        env={**os.environ, **quiet},
        cwd=tmp_path,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    first, comment, setting = result.stdout.splitlines()
    token = first.rsplit(" ", 1)[1]
    assert first == (
        "node token (shown only now; put it in the node's token file, mode 0600, and keep no "
        f"other copy): {token}"
    )
    assert re.fullmatch(r"iopn_[A-Za-z0-9_-]{43}", token)
    assert comment == "# set under nodes[gpu-2] in edge.yaml, then iop-edge restart:"
    assert setting == f"token_hash_sha256: {hashlib.sha256(token.encode()).hexdigest()}"
    assert result.stdout.count(token) == 1
    assert token not in result.stderr
    assert "restart-class" in result.stderr
    assert list(tmp_path.iterdir()) == []  # no file, no home directory, nothing kept
    # the line is ready to paste: the node becomes remote, and the config loads
    doc = yaml.safe_load(Path(SHIPPED).read_text())
    doc["nodes"][0].update(yaml.safe_load(setting))
    assert load_config(yaml.safe_dump(doc)).nodes[0].remote
    again = run("token", "node", "--node", "gpu-2")
    assert token not in again.stdout  # a new token every time


def test_token_node_json_is_the_token_and_the_nodes_entry():
    result = run("token", "node", "--node", "gpu-2", "--json")
    assert (result.returncode, result.stderr) == (0, "")
    out = json.loads(result.stdout)
    assert out == {
        "token": out["token"],
        "node": {
            "id": "gpu-2",
            "token_hash_sha256": hashlib.sha256(out["token"].encode()).hexdigest(),
        },
    }
    assert out["token"].startswith("iopn_")
    assert result.stdout.count(out["token"]) == 1


@pytest.mark.parametrize("node_id", ["has space", "_gpu", "gpu/2", ""])
def test_token_node_refuses_a_bad_id_as_config_validate_would(tmp_path, node_id):
    """A bad id exits 2 with the line ``config validate`` prints for a node with that id, and
    prints no token."""
    result = run("token", "node", "--node", node_id)
    assert (result.returncode, result.stdout) == (2, "")
    doc = yaml.safe_load(Path(SHIPPED).read_text())
    doc["nodes"][0]["id"] = node_id
    config = tmp_path / "edge.yaml"
    config.write_text(yaml.safe_dump(doc))
    validated = run("config", "validate", str(config)).stderr.splitlines()
    assert result.stderr.splitlines() == [line for line in validated if ".id:" in line]
    assert "is not a valid identifier" in result.stderr


@pytest.mark.parametrize("command", ["validate", "show"])
def test_config_commands_take_the_file_as_config_or_as_positional(tmp_path, command):
    """``--config FILE`` works for every command that reads a config; the positional FILE
    is kept as an alias; two different files are a usage error."""
    by_flag = run("config", command, "--config", SHIPPED)
    by_position = run("config", command, SHIPPED)
    assert by_flag.returncode == by_position.returncode == 0
    assert by_flag.stdout == by_position.stdout
    both = run("config", command, SHIPPED, "--config", SHIPPED)
    assert both.returncode == 0
    other = tmp_path / "other.yaml"
    other.write_text(Path(SHIPPED).read_text())
    clash = run("config", command, SHIPPED, "--config", str(other))
    assert clash.returncode == 2
    assert f"two config files given: {SHIPPED} and --config {other}" in clash.stderr
    missing = run("config", command, "--config", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 1
    assert f"cannot read config {tmp_path / 'nope.yaml'}" in missing.stderr


def test_every_command_that_reads_a_config_takes_config():
    """The parser of each such command knows ``--config`` (the others read no config)."""
    from iop_edge.cli import build_parser

    parser = build_parser()
    reads_config = [
        ["serve"],
        ["status"],
        ["restart"],
        ["config", "validate"],
        ["config", "show"],
        ["config", "payload", "--node", "n"],
        ["config", "refresh"],
    ]
    for command in reads_config:
        args = parser.parse_args([*command, "--config", "/x/edge.yaml"])
        assert args.config == "/x/edge.yaml", command


def refresh_files(tmp_path: Path, edit: Callable[[dict[str, Any]], None]) -> tuple[str, str]:
    """The shipped config as running.yaml and an ``edit`` of it as candidate.yaml."""
    doc = yaml.safe_load(Path(SHIPPED).read_text())
    running = tmp_path / "running.yaml"
    running.write_text(yaml.safe_dump(doc))
    edit(doc)
    candidate = tmp_path / "candidate.yaml"
    candidate.write_text(yaml.safe_dump(doc))
    return str(running), str(candidate)


def test_offline_refresh_exit_codes_and_json(tmp_path):
    def live(doc: dict[str, Any]) -> None:
        doc["nodes"][0]["providers"][0]["capacity"] = 2

    def restart(doc: dict[str, Any]) -> None:
        doc["logging"]["level"] = "debug"

    def invalid(doc: dict[str, Any]) -> None:
        doc["nodes"][0]["providers"][0]["priority"] = -1

    for edit, code, outcome in (
        (live, 0, "applied"),
        (restart, 3, "restart_required"),
        (invalid, 1, "rejected"),
    ):
        running, candidate = refresh_files(tmp_path, edit)
        result = run("config", "refresh", "--offline", running, "--config", candidate, "--json")
        assert result.returncode == code, result.stderr
        data = json.loads(result.stdout)
        assert (data["mode"], data["result"]) == ("dry_run", outcome)
        assert set(data) >= {
            "changed_nodes",
            "changed_providers",
            "changed_models",
            "report",
            "errors",
        }


def test_offline_refresh_prints_a_table(tmp_path):
    running, candidate = refresh_files(
        tmp_path, lambda d: d["nodes"][0]["providers"][0].update({"capacity": 2})
    )
    result = run("config", "refresh", "--offline", running, "--config", candidate, "--apply")
    assert result.returncode == 0
    lines = result.stdout.splitlines()
    assert lines[0] == "result: applied (mode apply)"
    assert "changed providers: echo-cat" in lines
    row = next(line for line in lines if "capacity" in line)
    assert row.split() == ["live", "yes", "nodes[local].providers[echo-cat].capacity", "4", "2"]


def test_an_offline_dry_run_says_what_would_happen_not_what_happened(tmp_path):
    def edit(doc: dict[str, Any]) -> None:
        doc["nodes"][0]["providers"][0]["capacity"] = 2
        doc["logging"]["level"] = "debug"

    running, candidate = refresh_files(tmp_path, edit)
    result = run("config", "refresh", "--offline", running, "--candidate", candidate)
    assert result.returncode == 3
    lines = result.stdout.splitlines()
    assert lines[0] == "result: would need a restart (dry run: nothing was applied)"
    assert "applied" not in "\n".join(lines[1:]).replace("nothing was applied", "")
    assert lines[4].split()[:4] == ["CLASS", "WOULD", "APPLY", "PATH"]
    rows = [line.split() for line in lines[5:7]]
    assert rows == [
        ["restart", "no", "logging.level", "info", "debug"],
        ["live", "yes", "nodes[local].providers[echo-cat].capacity", "4", "2"],
    ]
    # --candidate and --config name the same file offline
    same = run("config", "refresh", "--offline", running, "--config", candidate)
    assert same.stdout == result.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text("models: [\n")
    rejected = run("config", "refresh", "--offline", running, "--candidate", str(bad))
    assert rejected.returncode == 1
    assert (
        rejected.stdout.splitlines()[0]
        == "result: would be rejected (dry run: nothing was applied)"
    )


def test_refresh_usage_errors_exit_2(tmp_path):
    running, candidate = refresh_files(tmp_path, lambda d: None)
    both = run(
        "config", "refresh", "--offline", running, "--config", candidate, "--dry-run", "--apply"
    )
    assert both.returncode == 2


def test_status_names_ejected_held_and_half_open_providers_and_panicking_models():
    def entry(pid: str, health: str, **fields: Any) -> dict[str, Any]:
        return {
            "node": "gpu",
            "id": pid,
            "status": "active",
            "health": health,
            "in_flight": 0,
            "capacity": 2,
            "long_in_flight": 0,
            "long_context_capacity": 2,
            "priority": 0,
            "consecutive_failures": 0,
            "last_failure": None,
            "ejected_until": None,
            "half_open": False,
            "held_until": None,
        } | fields

    status = {
        "edge": "e",
        "config": {"hash": "0" * 64, "generation": 1, "path": "edge.yaml", "restart_pending": []},
        "queue": {"depth": 0, "max_queue": 16, "queue_timeout_ms": 30000},
        "providers": [
            entry("ok", "healthy"),
            entry(
                "dead",
                "unhealthy",
                consecutive_failures=3,
                ejected_until="2026-12-01T10:00:10.000+00:00",
                last_failure="cannot connect: Connection refused",
            ),
            entry("trial", "unhealthy", half_open=True),
            entry("busy", "healthy", held_until="2026-12-01T10:00:30.000+00:00"),
            entry(
                "liar",
                "unhealthy",
                ejected_until="2026-12-01T10:00:40.000+00:00",
                probes_trusted=False,
            ),
        ],
        "models": [
            {"id": "chat", "providers": 2, "panic": True, "derived_from": None},
            {"id": "chat[completions]", "providers": 2, "panic": True, "derived_from": "chat"},
        ],
        "counters": {
            "admitted": 5,
            "inherited": 2,
            "released": 7,
            "failovers": 2,
            "rejected": {},
        },
    }
    text = format_status(status)
    assert "gpu/dead: ejected until 2026-12-01T10:00:10.000+00:00 after 3 consecutive" in text
    assert "  last failure: cannot connect: Connection refused" in text
    assert "gpu/trial: half-open, the next request is a trial" in text
    assert "gpu/busy: held out until 2026-12-01T10:00:30.000+00:00 (429 Retry-After)" in text
    assert "gpu/ok" not in text.split("\n\n")[-2]  # a healthy provider needs no line
    assert "model chat: PANIC" in text
    assert "chat[completions]" not in text  # a model's panic is shown once
    assert "  its probes pass but its requests fail: probes no longer end its ejections" in text
    assert text.count("probes no longer") == 1  # (gpu/liar only)
    assert "admitted 5, inherited 2, released 7, failovers 2" in text


def test_payload_redacts_secrets_unless_asked_to_show_them(tmp_path):
    """Issue 25 item 3: ``config payload`` hides what ``config show`` hides (header values, a
    URL's password and query) and every value taken from the environment or a file;
    ``--show-secrets`` prints them in clear."""
    key_file = tmp_path / "key"
    key_file.write_text("sk-from-a-file-4b1d\n")
    doc = yaml.safe_load(Path(SHIPPED).read_text())
    doc["nodes"][0]["adapters"].append(
        {
            "name": "hosted",
            "type": "openai_compat",
            "base_url": "https://user:url-password-71c@${API_HOST}/v1?key=query-secret-9e2",
            "headers": {"Authorization": "Bearer ${API_KEY}", "X-Key": f"${{file:{key_file}}}"},
        }
    )
    doc["nodes"][0]["alias"] = "${NODE_ALIAS}"
    path = tmp_path / "edge.yaml"
    path.write_text(yaml.safe_dump(doc))
    env = {"API_HOST": "api.host-secret.example", "API_KEY": "sk-env-8c2f", "NODE_ALIAS": "al-5d"}
    secrets = [
        "url-password-71c",
        "query-secret-9e2",
        "api.host-secret.example",
        "sk-env-8c2f",
        "sk-from-a-file-4b1d",
        "al-5d",
    ]
    shown = run("config", "payload", "--node", "local", "--config", str(path), env=env)
    assert shown.returncode == 0, shown.stderr
    assert [s for s in secrets if s in shown.stdout] == []
    payload = json.loads(shown.stdout)
    hosted = next(a for a in payload["adapters"] if a["name"] == "hosted")
    assert hosted["execution"]["headers"] == {"Authorization": "<redacted>", "X-Key": "<redacted>"}
    assert hosted["execution"]["base_url"] == "https://user:<redacted>@<redacted>/v1?key=<redacted>"
    assert payload["alias"] == "<redacted>"
    clear = run(
        "config", "payload", "--node", "local", "--config", str(path), "--show-secrets", env=env
    )
    assert clear.returncode == 0, clear.stderr
    assert [s for s in secrets if s not in clear.stdout] == []


def help_text(*words: str, capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exited:
        main([*words, "--help"])
    assert exited.value.code == 0
    return capsys.readouterr().out


def test_every_help_is_plain_text_with_placeholders_that_say_what_goes_there(capsys):
    """Issue 25 item 5: no reStructuredText markup (backticks), no argparse dest names (the
    ``{serve,status,...}`` choice list, ``--config CONFIG``, ``--token-ref TOKEN_REF``, a
    positional's ``file``) in the help of any command; the commands are found by reading the
    help itself."""
    helps: dict[tuple[str, ...], str] = {}
    todo: list[tuple[str, ...]] = [()]
    while todo:
        words = todo.pop()
        text = helps[words] = help_text(*words, capsys=capsys)
        todo += [
            (*words, name) for name in re.findall(r"^ {4}([a-z][a-z-]*)(?: {2,}|$)", text, re.M)
        ]
    assert {w[-1] for w in helps if w} >= {"serve", "restart", "payload", "refresh", "admin"}
    for words, text in helps.items():
        where = " ".join(("iop-edge", *words))
        assert "`" not in text, where
        assert re.search(r"\{[\w-]+(?:,[\w-]+)+\}", text) is None, where
        for option, placeholder in re.findall(r"(--[a-z][a-z-]*) ([A-Za-z_.]+)", text):
            assert placeholder != option[2:].replace("-", "_").upper(), (where, option)
        # a positional's dest is a lower-case word in the usage: only the command's are there
        usage = text.split("\n\n", 1)[0]
        words_in_usage = set(re.findall(r"(?<![\w.-])([a-z][a-z_]*)(?![\w-])", usage))
        assert words_in_usage <= {"usage", *words}, (where, usage)
