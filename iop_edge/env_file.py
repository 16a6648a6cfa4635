"""The env file of ``iop-edge serve --env-file FILE``: ``KEY=VALUE`` lines for ``${VAR}``.

The syntax is the subset of systemd's ``EnvironmentFile=`` that secrets files use, so one
file serves either way:

- ``KEY=VALUE``, one a line; ``KEY`` is a variable name (letters, digits, ``_``; not first a
  digit). Spaces around ``KEY`` and before ``VALUE`` are dropped, and trailing spaces of an
  unquoted ``VALUE``;
- ``VALUE`` in single quotes is taken as written; in double quotes, ``\\"``, ``\\\\``, ``\\$``
  and ``\\``` stand for the character after the backslash (any other backslash is kept);
  nothing may follow the closing quote;
- blank lines, and lines whose first non-blank character is ``#`` or ``;`` (comments);
- a key given twice takes its last value.

A bad line is an error naming ``FILE:LINE`` and the rule — never the line's text, which may
hold a secret.
"""

from __future__ import annotations

import re
from typing import Final

from iop_edge.errors import ConfigError, ConfigProblem

_LINE_RE: Final = re.compile(r"^\s*(?P<key>[^=]*?)\s*=\s*(?P<value>.*?)\s*$", re.S)
_KEY_RE: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ESCAPES: Final = frozenset('"\\$`')


def parse_env_text(text: str, source: str) -> dict[str, str]:
    """The variables of an env file's text (``source`` names it in errors); raise
    :class:`ConfigError` listing every bad line."""
    found: dict[str, str] = {}
    problems: list[ConfigProblem] = []
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped[0] in "#;":
            continue
        try:
            key, value = _parse_line(line)
        except ValueError as exc:
            problems.append(ConfigProblem("", f"{source}:{number}: {exc}"))
            continue
        found[key] = value
    if problems:
        raise ConfigError(problems)
    return found


def _parse_line(line: str) -> tuple[str, str]:
    match = _LINE_RE.match(line)
    if match is None:
        raise ValueError(
            "not a KEY=VALUE line (a variable name, '=', its value; a comment starts with #)"
        )
    key, value = match["key"], match["value"]
    if not _KEY_RE.match(key):
        raise ValueError(
            "the name before '=' is not a variable name (letters, digits and '_', not "
            "starting with a digit)"
        )
    if value[:1] in ("'", '"'):
        value = _unquote(value)
    return key, value


def _unquote(value: str) -> str:
    quote, body = value[0], value[1:]
    if quote == "'":
        end = body.find("'")
        if end < 0:
            raise ValueError("the value's opening ' is never closed (on this line)")
        shown, rest = body[:end], body[end + 1 :]
    else:
        chars: list[str] = []
        i = 0
        while i < len(body):
            char = body[i]
            if char == "\\" and i + 1 < len(body) and body[i + 1] in _ESCAPES:
                chars.append(body[i + 1])
                i += 2
                continue
            if char == '"':
                break
            chars.append(char)
            i += 1
        else:
            raise ValueError("the value's opening \" is never closed (on this line)")
        shown, rest = "".join(chars), body[i + 1 :]
    if rest.strip():
        raise ValueError(f"text follows the value's closing {quote}; quote the whole value")
    return shown
