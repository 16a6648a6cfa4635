"""Hide secrets in config data shown to people (``config show``, refresh reports, status).

What is hidden, each replaced by ``<redacted>``:

- every value of a ``headers`` or ``env`` map, and a principal token's ``token_hash_sha256``;
- in any URL (a string starting with ``scheme://``): the password of the userinfo (a user
  name alone is hidden whole: ``https://TOKEN@host`` is a common way to pass a token), and the
  value of every query parameter (a parameter without ``=`` is hidden whole) and any fragment;
- in a cli ``args`` or ``resume_args`` list: the element after a flag whose name looks secret
  (``--api-key VALUE``), the value of ``--name=VALUE`` and ``NAME=VALUE`` elements whose name
  looks secret, the value of a ``Name: value`` header element whose name looks secret
  (``-H "Authorization: Bearer ..."``), an element that is itself a credential
  (``Bearer …``, ``Basic …``, ``Token …``), and URLs as above. A name looks secret when it
  contains ``key``, ``token``, ``secret``, ``passw``, ``pwd``, ``auth``, ``credential``,
  ``cookie``, ``session`` or ``bearer`` (case and ``-``/``_`` ignored);
- the value of a ``store`` key (``provider_pool.shared.store``, a Redis/Valkey URL) as
  :func:`redact_store_url` shows it: everything before its last ``@`` but the user name, so a
  password holding characters that end a URL's user-info early (``/``, ``?``, ``#``, a quote,
  a space) is hidden whole all the same.

Redaction only changes how a value is shown: refresh reports are computed on the real values,
so a changed secret still appears as a changed entry (with ``<redacted>`` on both sides).
"""

from __future__ import annotations

import re
from typing import Any, Final

REDACTED: Final = "<redacted>"

#: Mapping keys whose values may hold secrets: every value under them is hidden.
SECRET_MAPS: Final = frozenset({"headers", "env"})
#: A key to pass to :func:`redact` for a value known to be secret (one value of such a map).
SECRET_VALUE: Final = "<secret>"
#: Keys whose own value is hidden (token hashes are reported by token_ref only).
SECRET_KEYS: Final = frozenset({"token_hash_sha256", "admin_token_sha256", SECRET_VALUE})
#: Keys holding a command line, redacted element by element (see the module docstring).
ARGS_KEYS: Final = frozenset({"args", "resume_args"})
#: Keys holding a store URL (``provider_pool.shared.store``), shown by :func:`redact_store_url`.
STORE_URL_KEYS: Final = frozenset({"store"})
#: The query parameters of a store URL whose values are shown (the database number).
STORE_PUBLIC_PARAMS: Final = frozenset({"db"})
#: Name fragments that make a flag, variable or header name look secret.
SECRET_NAME_PARTS: Final = (
    "key",
    "token",
    "secret",
    "passw",
    "pwd",
    "auth",
    "credential",
    "cookie",
    "session",
    "bearer",
)

_URL_RE: Final = re.compile(
    # quotes end a URL too: messages quote values as 'https://…'
    r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?:(?P<userinfo>[^/?#\s'\"]*)@)?"
    r"(?P<rest>[^?#\s'\"]*)(?:\?(?P<query>[^#\s'\"]*))?(?P<fragment>#[^\s'\"]*)?"
)
_SCHEME_RE: Final = re.compile(r"^(?:Bearer|Basic|Token)\s+\S", re.I)
_FLAG_RE: Final = re.compile(r"^(?P<name>-{1,2}[A-Za-z0-9][\w.-]*)(?P<eq>=)(?P<value>.*)$", re.S)
_ASSIGN_RE: Final = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_.-]*)(?P<eq>=)(?P<value>.*)$", re.S)
_HEADER_RE: Final = re.compile(
    r"^(?P<name>[A-Za-z0-9][A-Za-z0-9-]*)(?P<eq>:\s*)(?P<value>.+)$", re.S
)


def redact(value: Any, key: str = "") -> Any:
    """A copy of dumped config data with the secrets of the module docstring hidden.

    ``key`` is the mapping key ``value`` sits under (so a bare ``headers`` map is hidden too).
    """
    if key in SECRET_KEYS and value is not None:
        return REDACTED
    if key in STORE_URL_KEYS and isinstance(value, str):
        return redact_store_url(value)
    if isinstance(value, dict):
        if key in SECRET_MAPS:
            return dict.fromkeys(value, REDACTED)
        return {k: redact(v, k) for k, v in value.items()}
    if isinstance(value, list | tuple):
        if key in ARGS_KEYS:
            return redact_args(value)
        return [redact(v) for v in value]
    if isinstance(value, str) and "://" in value:
        return redact_text(value)
    return value


def looks_secret(name: str) -> bool:
    """Whether a flag, variable or header name suggests its value is a secret."""
    folded = name.lower().replace("-", "").replace("_", "")
    return any(part in folded for part in SECRET_NAME_PARTS)


def redact_args(args: list[Any] | tuple[Any, ...]) -> list[Any]:
    """A command line with secret values hidden (the rule is in the module docstring)."""
    shown: list[Any] = []
    hide_next = False
    for arg in args:
        if not isinstance(arg, str):
            shown.append(redact(arg))
            hide_next = False
            continue
        if hide_next:
            shown.append(REDACTED)
            hide_next = False
            continue
        match = _FLAG_RE.match(arg) or _ASSIGN_RE.match(arg)
        if match is None and "://" not in arg:
            match = _HEADER_RE.match(arg)
        if match and looks_secret(match["name"]):
            shown.append(f"{match['name']}{match['eq']}{REDACTED}")
        elif arg.startswith("-") and "=" not in arg and looks_secret(arg):
            shown.append(arg)
            hide_next = True
        elif _SCHEME_RE.match(arg):
            shown.append(f"{arg.split(None, 1)[0]} {REDACTED}")
        else:
            shown.append(redact_text(arg))
    return shown


def redact_text(text: str) -> str:
    """``text`` with the userinfo password and the query values of every URL in it hidden."""
    if "://" not in text:
        return text
    return _URL_RE.sub(_redact_url, text)


def _redact_url(match: re.Match[str]) -> str:
    userinfo, query = match["userinfo"], match["query"]
    shown = match["scheme"]
    if userinfo is not None:
        user, colon, _ = userinfo.partition(":")
        shown += f"{user}:{REDACTED}@" if colon else f"{REDACTED}@"
    shown += match["rest"]
    if query is not None:
        shown += "?" + "&".join(_redact_param(p) for p in query.split("&"))
    fragment = match["fragment"]
    return shown + (f"#{REDACTED}" if fragment and len(fragment) > 1 else fragment or "")


def _redact_param(param: str) -> str:
    name, eq, _ = param.partition("=")
    if not param:
        return param
    return f"{name}={REDACTED}" if eq else REDACTED


def redact_store_url(url: str) -> str:
    """A store URL (``redis://``, ``rediss://``, ``unix://``) as it may be shown.

    Everything before the URL's last ``@`` is its user-info, shown as ``USER:<redacted>@``
    (a user name alone as ``<redacted>@``, like any URL's): cut at the last ``@`` rather than
    parsed, so a password that is not percent-encoded (holding ``/``, ``?``, ``#``, a quote or
    a space, which end a parsed user-info early) is hidden whole too. An ``@`` further on (in
    a query value) only hides more. The values of query parameters other than ``db`` and any
    fragment are hidden, as in any URL.
    """
    scheme, slashes, rest = url.partition("://")
    if not slashes:
        return redact_text(url)
    shown = f"{scheme}://"
    userinfo, at, after = rest.rpartition("@")
    if at and not rest.startswith("/"):  # unix:///path@x: no user-info, an '@' in the path
        rest = after
        user, colon, _ = userinfo.partition(":")
        shown += f"{user}:{REDACTED}@" if colon else f"{REDACTED}@"
    rest, hash_mark, fragment = rest.partition("#")
    rest, question, query = rest.partition("?")
    shown += rest
    if question:
        shown += "?" + "&".join(_store_param(p) for p in query.split("&"))
    if hash_mark:
        shown += f"#{REDACTED}" if fragment else "#"
    return shown


def _store_param(param: str) -> str:
    name, eq, value = param.partition("=")
    if name in STORE_PUBLIC_PARAMS and eq:
        return f"{name}={value}"
    return _redact_param(param)
