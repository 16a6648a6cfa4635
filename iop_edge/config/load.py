"""Load ``edge.yaml`` text into an effective :class:`~iop_edge.config.schema.EdgeConfig`.

Pure: the caller hands over the text, the environment and a file reader; nothing here reads
files or the clock.

Steps, each reporting every problem it finds before the load fails:

1. YAML → Python (safe loader; a syntax error or a duplicate key gives the line and column;
   nesting depth, expanded size and integer range are bounded: :mod:`iop_edge.config.limits`).
2. ``${VAR}`` / ``${VAR:-default}`` / ``${file:/abs/path}`` expansion in string values (``$$``
   is a literal ``$``; files are read through a reader the caller injects), recording the
   values taken from outside the text (:mod:`iop_edge.config.provenance`).
3. Legacy shapes normalized (the single-instance adapter mapping → named instances,
   a bare provider id in ``models[].providers`` → ``{id: ...}``).
4. The schema (types, ranges, unknown keys).
5. Cross-field and cross-entity rules, with the defaults that depend on them
   (:mod:`iop_edge.config.validate`).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Mapping
from typing import Any, Final, get_args

import yaml
from pydantic import BaseModel, ValidationError

from iop_edge.config import paths
from iop_edge.config.limits import MAX_DEPTH, check_node_graph, check_values
from iop_edge.config.provenance import Provenance
from iop_edge.config.redact import (
    ARGS_KEYS,
    REDACTED,
    SECRET_KEYS,
    SECRET_MAPS,
    STORE_URL_KEYS,
    redact_text,
)
from iop_edge.config.schema import UNION_TAGS, EdgeConfig, _show
from iop_edge.config.validate import validate_config
from iop_edge.errors import ConfigError, ConfigProblem

#: ``$$``, ``${file:/path}`` (not ``${file:-default}``: that is a variable named ``file``),
#: ``${VAR}`` and ``${VAR:-default}``.
_REF_RE: Final = re.compile(
    r"\$\$|\$\{(?:file:(?!-)(?P<file>[^}]*)"
    r"|(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?::-(?P<default>[^}]*))?)\}"
)

_BaseLoader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
#: Keys whose values a message never quotes: the value may be (or hold) a secret (redact.py).
_SECRET_HOLDERS: Final = SECRET_MAPS | ARGS_KEYS | SECRET_KEYS


class _StrictLoader(_BaseLoader):  # type: ignore[valid-type,misc]
    """A safe loader that refuses duplicate mapping keys instead of keeping the last one."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, yaml.Node] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, str | int | float | bool) and key in seen:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"found duplicate key {key!r} (first defined on line "
                    f"{seen[key].start_mark.line + 1})",
                    key_node.start_mark,
                )
            if isinstance(key, str | int | float | bool):
                seen[key] = key_node
        mapping: dict[Any, Any] = super().construct_mapping(node, deep=deep)
        return mapping


def parse_yaml(text: str, *, source: str = "edge.yaml") -> Any:
    """Parse YAML text; a syntax error becomes a :class:`ConfigError` with line and column.

    The composed node graph is measured before any value is built: a document nested too
    deep, expanding past the node cap (an alias bomb) or holding a recursive alias is refused
    (:mod:`iop_edge.config.limits`).
    """
    loader = _StrictLoader(text)  # a SafeLoader subclass: safe
    try:
        node = loader.get_single_node()
        check_node_graph(node, source)
        return None if node is None else loader.construct_document(node)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        what = " ".join(p for p in (exc.context, exc.problem) if p)
        raise ConfigError([ConfigProblem("", f"{where}: YAML syntax error: {what}")]) from exc
    except yaml.YAMLError as exc:
        raise ConfigError([ConfigProblem("", f"{source}: YAML error: {exc}")]) from exc
    except RecursionError:
        # PyYAML without libyaml composes recursively: it overflows on text nested a few
        # hundred levels deep, before check_node_graph can measure it (libyaml stops at 1000).
        raise ConfigError(
            [
                ConfigProblem(
                    "",
                    f"{source}: the document is nested too deep to parse; a config may nest at "
                    f"most {MAX_DEPTH} levels",
                )
            ]
        ) from None
    finally:
        loader.dispose()


class UnreadableFile(Exception):
    """What a :data:`FileReader` raises: the file cannot be used; the message says why."""


#: Reads the file of a ``${file:/path}`` reference (the shell's seam: this package reads no
#: files): its text, or :class:`UnreadableFile`.
FileReader = Callable[[str], str]


class _Expander:
    """One expansion of a parsed document (:func:`expand_env`), keeping what it found: the
    values it substituted (``found``), the problems, and each reference it left in place
    (``unresolved``: its path and its text, which stays in the value as a placeholder)."""

    def __init__(
        self,
        data: Any,
        env: Mapping[str, str],
        problems: list[ConfigProblem],
        read_file: FileReader | None,
        refuse: str | None,
    ) -> None:
        self.raw = data
        self.env = env
        self.problems = problems
        self.read_file = read_file
        self.refuse = refuse
        self.found: set[str] = set()
        self.unresolved: list[tuple[str, str]] = []
        self._files: dict[str, str | UnreadableFile] = {}  # one read per file per load

    def expand(self, value: Any, loc: tuple[str | int, ...] = ()) -> Any:
        if isinstance(value, str):
            if "$" not in value:
                return value
            return _REF_RE.sub(lambda match: self._substitute(match, loc), value)
        if isinstance(value, dict):
            return {k: self.expand(v, (*loc, str(k))) for k, v in value.items()}
        if isinstance(value, list):
            return [self.expand(item, (*loc, i)) for i, item in enumerate(value)]
        return value

    def _substitute(self, match: re.Match[str], loc: tuple[str | int, ...]) -> str:
        reference = match.group(0)
        if reference == "$$":
            return "$"
        if self.refuse is not None:
            return self._unresolved(loc, reference, f"{reference} is not expanded: {self.refuse}")
        path = match.group("file")
        if path is not None:
            return self._file(loc, reference, path)
        name, default = match.group("name"), match.group("default")
        if name in self.env:
            value = self.env[name]
            self.found.add(value)
            return value
        if default is not None:
            return default
        return self._unresolved(
            loc,
            reference,
            f"environment variable {name} is not set; set it in the daemon's environment "
            f"(for example in the file of iop-edge serve --env-file) or write "
            f"${{{name}:-default}}",
        )

    def _file(self, loc: tuple[str | int, ...], reference: str, path: str) -> str:
        if "$" in path:
            why = (
                "a file path is taken as written, without ${VAR} in it; write the absolute "
                "path (for a systemd credential: /run/credentials/iop-edge.service/NAME)"
            )
        elif not path.startswith("/"):
            why = f"the path {path!r} is not absolute; write the file's absolute path"
        elif self.read_file is None:
            why = "files are not read here"
        else:
            if path not in self._files:
                try:
                    self._files[path] = self.read_file(path)
                except UnreadableFile as exc:
                    self._files[path] = exc
            text = self._files[path]
            if isinstance(text, str):
                self.found.add(text)
                return text
            why = str(text)
        return self._unresolved(loc, reference, f"cannot read {reference}: {why}")

    def _unresolved(self, loc: tuple[str | int, ...], reference: str, message: str) -> str:
        path = paths.render_loc(loc, self.raw)
        self.problems.append(ConfigProblem(path, message))
        self.unresolved.append((path, reference))
        return reference  # the placeholder: later problems about it are recognized by it

    def restates(self, problem: ConfigProblem) -> bool:
        """Whether a later problem only restates an unresolved reference: it is at the
        reference's path, or its message quotes the placeholder."""
        return any(
            problem.path == path or reference in problem.message
            for path, reference in self.unresolved
        )


def expand_env(
    data: Any,
    env: Mapping[str, str],
    problems: list[ConfigProblem],
    *,
    read_file: FileReader | None = None,
    refuse: str | None = None,
    found: set[str] | None = None,
) -> Any:
    """Expand ``${VAR}``, ``${VAR:-default}`` and ``${file:/abs/path}`` in every string value
    of a parsed document.

    A variable that is unset and has no default, or a file that cannot be read (through
    ``read_file``: no reader, no file), is reported at the path of the value and left in
    place. With ``refuse`` (why), no reference is expanded: each one is a problem. The values
    substituted from the environment or a file are added to ``found`` (a default is not).
    Expansion yields text only: use it for secrets, hosts and URLs.
    """
    expander = _Expander(data, env, problems, read_file, refuse)
    expanded = expander.expand(data)
    if found is not None:
        found |= expander.found
    return expanded


def normalize_legacy_shapes(data: dict[str, Any]) -> dict[str, Any]:
    """Rewrite legacy shapes into the canonical ones, leaving anything unexpected to the schema.

    - ``nodes[].adapters`` as a mapping ``{type: {config}}`` → ``[{name: type, type: type, ...}]``
    - a bare provider id in ``models[].providers`` → ``{id: provider_id}``
    """
    nodes = data.get("nodes")
    if isinstance(nodes, list):
        new_nodes = []
        for node in nodes:
            adapters = node.get("adapters") if isinstance(node, dict) else None
            if isinstance(adapters, dict):
                node = dict(node)
                node["adapters"] = [
                    {"name": kind, "type": kind, **(body or {})}
                    if body is None or isinstance(body, dict)
                    else body  # not a mapping: left for the schema to report
                    for kind, body in adapters.items()
                ]
            new_nodes.append(node)
        data = {**data, "nodes": new_nodes}
    models = data.get("models")
    if isinstance(models, list):
        new_models = []
        for model in models:
            refs = model.get("providers") if isinstance(model, dict) else None
            if isinstance(refs, list):
                model = {
                    **model,
                    "providers": [{"id": r} if isinstance(r, str) else r for r in refs],
                }
            new_models.append(model)
        data = {**data, "models": new_models}
    return data


def _field_names(model: type[BaseModel], loc: tuple[str | int, ...]) -> list[str]:
    """The allowed keys at a location, for "did you mean" hints on unknown keys."""
    current = model
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        field = current.model_fields.get(part)
        if field is None:
            return []
        args = get_args(field.annotation) or (field.annotation,)
        nested = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
        if not nested:
            return []
        current = nested[0]
    return list(current.model_fields)


def problems_from_validation_error(exc: ValidationError, raw: Any) -> list[ConfigProblem]:
    """Turn pydantic's errors into path-qualified problems that name the value and the rule."""
    problems = []
    for err in exc.errors(include_url=False):
        loc = tuple(p for p in err["loc"] if p not in UNION_TAGS)
        path = paths.render_loc(loc, raw)
        field = next((str(p) for p in reversed(loc) if isinstance(p, str)), "value")
        kind = err["type"]
        value = err.get("input")
        if kind == "extra_forbidden":
            allowed = _field_names(EdgeConfig, loc)
            close = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
            hint = f"did you mean {close[0]!r}?" if close else "allowed keys: " + ", ".join(allowed)
            message = f"unknown key {str(loc[-1])!r}; {hint}"
        elif kind == "missing":
            message = f"required key {field!r} is missing"
        elif kind == "value_error":
            message = str(err["ctx"]["error"]).replace("{field}", field)
        elif kind == "literal_error":
            message = f"{_show(value)} is not allowed; {field} must be {err['ctx']['expected']}"
        elif kind == "too_short":
            message = f"is empty; {field} needs at least {err['ctx']['min_length']} item"
        else:
            message = f"{_show(value)} is invalid: {err['msg'][0].lower()}{err['msg'][1:]}"
        shown = _show(value)
        if _holds_secret(loc) and message.startswith(shown):
            message = f"{REDACTED} ({type(value).__name__}){message[len(shown) :]}"
        if not (kind == "value_error" and loc and loc[-1] in STORE_URL_KEYS):
            # (a store URL's rule quotes its value already redacted, and the URL forms it
            # names would read as URLs with a password and a query)
            message = redact_text(message)
        problems.append(ConfigProblem(path, message))
    return problems


def _holds_secret(loc: tuple[str | int, ...]) -> bool:
    """Whether the value at ``loc`` sits under a key whose values may be secret (a header or
    env value, a cli argument); a header or env *name* (``[key]``) is not."""
    return loc[-1:] != ("[key]",) and any(part in _SECRET_HOLDERS for part in loc)


def parse_config(
    data: Any,
    *,
    env: Mapping[str, str] | None = None,
    read_file: FileReader | None = None,
    refuse: str | None = None,
) -> EdgeConfig:
    """Validate an already-parsed document into an effective config, or raise ConfigError.

    ``env`` and ``read_file`` resolve the references (:func:`expand_env`); with ``refuse``,
    every reference is a problem. An unresolved reference does not hide the other problems:
    the load goes on with the reference as a placeholder, and drops the problems that only
    restate it. The config records the values it took from outside (its
    :attr:`~EdgeConfig.provenance`), and no problem message or path shows one of them.
    """
    if data is None:
        raise ConfigError([ConfigProblem("", "the config is empty; it must be a YAML mapping")])
    if not isinstance(data, dict):
        raise ConfigError(
            [ConfigProblem("", f"the config is a {type(data).__name__}; it must be a mapping")]
        )
    problems = check_values(data)
    if problems:
        raise ConfigError(problems)
    expander = _Expander(data, env or {}, problems, read_file, refuse)
    data = expander.expand(data)
    provenance = Provenance(expander.found)
    config = None
    try:
        config = _effective(data)
    except ConfigError as exc:
        problems += [p for p in exc.problems if not expander.restates(p)]
    if problems or config is None:
        raise ConfigError(
            [
                ConfigProblem(provenance.scrub_text(p.path), provenance.scrub_text(p.message))
                for p in problems
            ]
        )
    return config.with_provenance(provenance) if provenance else config


def _effective(data: dict[str, Any]) -> EdgeConfig:
    """The effective config of an expanded document: legacy shapes, schema, rules."""
    data = normalize_legacy_shapes(data)
    try:
        config = EdgeConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(problems_from_validation_error(exc, data)) from None
    try:
        return validate_config(config)
    except ConfigError as exc:
        # Messages may quote a value: a URL's password or query must not reach a report.
        raise ConfigError(
            [ConfigProblem(p.path, redact_text(p.message)) for p in exc.problems]
        ) from None


def load_config(
    text: str,
    *,
    env: Mapping[str, str] | None = None,
    read_file: FileReader | None = None,
    refuse: str | None = None,
    source: str = "edge.yaml",
) -> EdgeConfig:
    """Load YAML text into an effective config; raise :class:`ConfigError` listing every problem
    (the references as in :func:`parse_config`)."""
    return parse_config(
        parse_yaml(text, source=source), env=env, read_file=read_file, refuse=refuse
    )


def dump_config(config: EdgeConfig) -> dict[str, Any]:
    """The effective config as plain data that :func:`parse_config` loads back to an equal config.

    Identity keys come first in each adapter and provider, for people reading the dump.
    """
    data = config.model_dump(mode="json", exclude_none=True)
    for node in data["nodes"]:
        node["adapters"] = [_identity_first(a, ("name", "type")) for a in node["adapters"]]
        node["providers"] = [_identity_first(p, ("id", "type")) for p in node["providers"]]
    return data


def _identity_first(item: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    return {**{k: item[k] for k in keys}, **item}
