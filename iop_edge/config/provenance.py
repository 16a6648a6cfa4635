"""Where a config's values came from, so that what came from outside the text is never shown.

A load records every value it substituted for a ``${VAR}`` (from the environment) or a
``${file:/path}`` (from a file) — the default of ``${VAR:-default}`` is not recorded: it is in
the file for anyone to read. That set is the config's :class:`Provenance`. Redacting by
provenance catches a secret whatever field it lands in (a display name, an id, a URL, the
message of a value that failed a rule), where :mod:`iop_edge.config.redact` only knows the
fields that usually hold one.

:meth:`Provenance.scrub` replaces every occurrence of such a value in any string (nested
data included, longest value first) with ``<redacted>``, and the forms a message may show it
in: as ``repr`` shows it, as :func:`~iop_edge.config.redact.redact_text` shows a URL, and cut
short by ``...`` (a long value quoted by a message).

Provenance is not part of a config's identity: two configs with equal values are equal, and
hash the same, wherever their values came from.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, Final

from iop_edge.config.redact import REDACTED, redact_text

#: The marks a message puts where it cut a long value short.
_CUT_MARKS: Final = ("...", "…")
#: A value cut shorter than this is not looked for (a few characters give nothing away, and
#: would match ordinary words).
_MIN_CUT: Final = 4


class Provenance:
    """The values a load took from the environment or from files (see the module docstring).

    Immutable; ``a | b`` is the union. Always equal to another :class:`Provenance`: it rides
    along with a config (a private attribute of :class:`~iop_edge.config.schema.EdgeConfig`)
    without changing how configs compare.
    """

    __slots__ = ("_pattern", "_variants", "values")

    def __init__(self, values: Iterable[str] = ()) -> None:
        self.values: frozenset[str] = frozenset(v for v in values if v)
        variants = set(self.values)
        for value in self.values:
            variants.add(repr(value)[1:-1])
            variants.add(redact_text(value))
        variants.discard("")
        variants.discard(REDACTED)
        #: longest first: a value that holds another is replaced whole
        self._variants: tuple[str, ...] = tuple(sorted(variants, key=lambda v: (-len(v), v)))
        self._pattern = (
            re.compile("|".join(re.escape(v) for v in self._variants)) if self._variants else None
        )

    def __bool__(self) -> bool:
        return bool(self.values)

    def __or__(self, other: Provenance) -> Provenance:
        if not other.values <= self.values:
            return Provenance(self.values | other.values)
        return self

    def __eq__(self, other: object) -> bool:
        # Not part of a config's identity (module docstring): pydantic compares private
        # attributes when it compares models.
        return isinstance(other, Provenance)

    def __hash__(self) -> int:
        return 0

    def __copy__(self) -> Provenance:
        return self  # immutable

    def __deepcopy__(self, memo: dict[int, Any]) -> Provenance:
        return self

    def __repr__(self) -> str:
        # Never the values themselves: a repr lands in logs and tracebacks.
        return f"<Provenance of {len(self.values)} value(s)>"

    def scrub(self, value: Any) -> Any:
        """``value`` with every recorded value hidden in every string, keys included (dicts,
        lists and tuples are copied; other values are returned as they are)."""
        if self._pattern is None:
            return value
        return self._scrub(value)

    def _scrub(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.scrub_text(value)
        if isinstance(value, dict):
            return {self._scrub(k): self._scrub(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self._scrub(v) for v in value]
        return value

    def scrub_text(self, text: str) -> str:
        """``text`` with every recorded value (and the forms of the module docstring) hidden."""
        if self._pattern is None:
            return text
        text = self._pattern.sub(REDACTED, text)
        for mark in _CUT_MARKS:
            if mark in text:
                text = self._scrub_cut(text, mark)
        return text

    def _scrub_cut(self, text: str, mark: str) -> str:
        """Hide a value that a message cut short: its start, right before ``mark``."""
        for variant in self._variants:
            if variant[:_MIN_CUT] not in text:
                continue
            for end in range(len(variant) - 1, _MIN_CUT - 1, -1):
                start = variant[:end] + mark
                if start in text:
                    text = text.replace(start, REDACTED + mark)
                    break
        return text


#: The provenance of a config whose values all come from its text.
NO_PROVENANCE: Final = Provenance()
