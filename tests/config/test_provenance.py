"""Issue 25: ``${file:/path}`` references, the provenance of expanded values and the scrubber
that hides them, and references refused outright. The loader is pure: files come through an
injected reader."""

from __future__ import annotations

import pytest

from iop_edge.config import ConfigError, load_config
from iop_edge.config.load import UnreadableFile
from iop_edge.config.provenance import Provenance
from iop_edge.config.refresh import config_hash, refresh
from tests.helpers.config import MINIMAL_YAML

AUTH = "command: cat, headers: {Authorization: 'Bearer ${file:/run/secrets/key}'}"


class Files:
    """A file reader for the loader: a dict of path → text, counting reads."""

    def __init__(self, **texts: str) -> None:
        self.texts = {f"/run/secrets/{name}": text for name, text in texts.items()}
        self.reads: list[str] = []

    def __call__(self, path: str) -> str:
        self.reads.append(path)
        if path not in self.texts:
            raise UnreadableFile("No such file or directory")
        return self.texts[path]


def problems(text: str, **kw: object) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(text, **kw)  # type: ignore[arg-type]
    return [str(p) for p in info.value.problems]


def test_a_file_reference_is_the_files_text_read_once_per_load_and_recorded():
    text = MINIMAL_YAML.replace(
        "command: cat",
        "command: cat, headers: {Authorization: 'Bearer ${file:/run/secrets/key}', "
        "X-Again: '${file:/run/secrets/key}'}",
    )
    files = Files(key="sk-from-a-file")
    config = load_config(text, read_file=files)
    assert config.nodes[0].adapters[0].headers == {
        "Authorization": "Bearer sk-from-a-file",
        "X-Again": "sk-from-a-file",
    }
    assert files.reads == ["/run/secrets/key"]
    assert config.provenance.values == {"sk-from-a-file"}
    files.texts["/run/secrets/key"] = "sk-rotated"  # every load reads the file again
    rotated = load_config(text, read_file=files).nodes[0].adapters[0].headers
    assert rotated is not None
    assert rotated["X-Again"] == "sk-rotated"


@pytest.mark.parametrize(
    ("reference", "why"),
    [
        ("${file:/run/secrets/key}", "No such file or directory"),
        (
            "${file:run/secrets/key}",
            "the path 'run/secrets/key' is not absolute; write the file's absolute path",
        ),
        (
            "${file:${CREDENTIALS_DIRECTORY}/key}",
            "a file path is taken as written, without ${VAR} in it; write the absolute path "
            "(for a systemd credential: /run/credentials/iop-edge.service/NAME)",
        ),
    ],
    ids=["missing", "relative", "nested"],
)
def test_a_file_that_cannot_be_read_is_a_problem_naming_the_path_the_file_and_why(reference, why):
    text = MINIMAL_YAML.replace("command: cat", f"command: cat, headers: {{X-Key: '{reference}'}}")
    found = problems(text, read_file=Files())
    head = reference.split("}")[0] + "}"  # a nested reference ends at its first brace
    assert found == [f"nodes[local].adapters[shell].headers.X-Key: cannot read {head}: {why}"]


def test_without_a_reader_a_file_reference_is_a_problem_and_file_with_a_default_is_a_variable():
    text = MINIMAL_YAML.replace("command: cat", f"command: cat, headers: {{X: '{AUTH[42:-2]}'}}")
    assert problems(text) == [
        "nodes[local].adapters[shell].headers.X: cannot read ${file:/run/secrets/key}: files "
        "are not read here"
    ]
    text = MINIMAL_YAML.replace("command: cat", "command: '${file:-cat}'")
    assert load_config(text).nodes[0].adapters[0].command == "cat"


def test_provenance_records_values_from_the_environment_and_files_not_defaults():
    text = MINIMAL_YAML.replace(
        "command: cat",
        "command: '${CMD}', args: ['${ARG:-default-arg}', '${SET:-unused}', '$$LITERAL', "
        "'${file:/run/secrets/key}']",
    )
    config = load_config(
        text, env={"CMD": "cat", "SET": "from-env"}, read_file=Files(key="from-file")
    )
    assert config.provenance.values == {"cat", "from-env", "from-file"}
    assert load_config(MINIMAL_YAML).provenance.values == frozenset()


def test_provenance_changes_neither_equality_nor_the_hash_nor_no_change_detection():
    """The same values from the text or from the environment: equal configs, one hash, and a
    refresh from one to the other changes nothing."""
    literal = load_config(MINIMAL_YAML)
    text = MINIMAL_YAML.replace("command: cat", "command: '${CMD}'")
    expanded = load_config(text, env={"CMD": "cat"})
    assert expanded == literal
    assert hash(expanded) == hash(literal)
    assert config_hash(expanded) == config_hash(literal)
    outcome = refresh(literal, text, mode="apply", env={"CMD": "cat"})
    assert (outcome.result.result, outcome.result.report) == ("applied", [])
    assert outcome.running is literal


def test_a_message_never_quotes_a_value_from_outside_the_text():
    """Not the whole value, not its ``repr``, not its start cut short by ``...``; nor an id in
    a path."""
    long_key = "sk-" + "Zq8+/w" * 16
    text = MINIMAL_YAML.replace("{id: local,", "{id: '${NODE}',").replace(
        "command: cat", "command: cat, headers: {X: '${LONG}'}"
    )
    text += "edge: {id: '${LONG}'}\nlisten: {port: 0}\nlogging: {level: '${LEVEL}'}\n"
    env = {"LONG": long_key, "NODE": "secret-node", "LEVEL": "it's \\ loud"}
    found = problems(text, env=env)
    shown = "\n".join(found)
    assert [p.split(":")[0] for p in found] == ["edge.id", "listen.port", "logging.level"]
    assert "<redacted>" in found[0]
    assert long_key[:8] not in shown
    assert "loud" not in shown
    assert "secret-node" not in shown


def test_refused_references_are_each_a_problem_and_read_nothing():
    text = MINIMAL_YAML.replace(
        "command: cat", "command: '${CMD}', args: ['${A:-x}', '${file:/run/secrets/key}', '$$']"
    )
    files = Files(key="k")
    found = problems(text, env={"CMD": "cat"}, read_file=files, refuse="no token")
    assert found == [
        "nodes[local].adapters[shell].command: ${CMD} is not expanded: no token",
        "nodes[local].adapters[shell].args[0]: ${A:-x} is not expanded: no token",
        "nodes[local].adapters[shell].args[1]: ${file:/run/secrets/key} is not expanded: no token",
    ]
    assert files.reads == []


def test_the_scrubber_hides_every_form_of_a_value_longest_first():
    scrub = Provenance(["abc-secret", "abc-secret-longer", "https://u:pw@host/v1?k=v", ""])
    assert scrub.scrub_text("x abc-secret-longer y abc-secret") == "x <redacted> y <redacted>"
    assert scrub.scrub_text("at https://u:<redacted>@host/v1?k=<redacted>") == "at <redacted>"
    assert scrub.scrub_text("'abc-secr...' is invalid") == "'<redacted>...' is invalid"
    assert scrub.scrub_text("'abc...' is fine") == "'abc...' is fine"  # too short to tell
    assert scrub.scrub({"abc-secret": ["abc-secret", 3, None], "k": ("abc-secret",)}) == {
        "<redacted>": ["<redacted>", 3, None],
        "k": ["<redacted>"],
    }
    quoted = Provenance(["a\\b\x00"])
    assert quoted.scrub_text(repr("a\\b\x00")) == "'<redacted>'"
    assert Provenance(["x"]) | Provenance(["y"]) == Provenance()  # never part of identity
    assert (Provenance(["xyz1"]) | Provenance(["yzw2"])).values == {"xyz1", "yzw2"}
    assert "xyz1" not in repr(Provenance(["xyz1"]))


def test_the_config_after_a_live_refresh_keeps_both_provenances():
    """The running config's values and the live changes taken from the candidate are both
    hidden from every later report."""
    base = MINIMAL_YAML.replace("{id: echo,", "{id: echo, display_name: '${OLD}',")
    running = load_config(base, env={"OLD": "old-label"})
    text = base.replace("'${OLD}'", "'${NEW}'").replace("{id: cat,", "{id: cat, capacity: 2,")
    outcome = refresh(running, text, mode="apply", env={"NEW": "new-label"})
    assert outcome.result.result == "applied"
    [entry] = [e for e in outcome.result.report if e.path.endswith("display_name")]
    assert (entry.old, entry.new, entry.applied) == ("<redacted>", "<redacted>", True)
    assert outcome.running.models[0].display_name == "new-label"
    assert outcome.running.provenance.values == {"old-label", "new-label"}
    later = refresh(outcome.running, base.replace("'${OLD}'", "plain"))
    [entry] = [e for e in later.result.report if e.path.endswith("display_name")]
    assert (entry.old, entry.new) == ("<redacted>", "plain")
