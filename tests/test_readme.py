"""The README's own links lead somewhere: every ``(#anchor)`` names a heading of the README,
and every relative file link names a file of the repository."""

from __future__ import annotations

import re

from tests.helpers import ROOT

README = (ROOT / "README.md").read_text(encoding="utf-8")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def prose(text: str) -> str:
    """The text outside fenced code blocks (a ``# comment`` in a shell block is no heading)."""
    kept, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced:
            kept.append(line)
    return "\n".join(kept)


def anchors(text: str) -> set[str]:
    """The anchors GitHub makes of the headings: lower case, punctuation dropped (``-`` and
    ``_`` kept), spaces as ``-``; a repeated one gets ``-1``, ``-2``, ..."""
    seen: dict[str, int] = {}
    found = set()
    for line in prose(text).splitlines():
        heading = re.match(r"#{1,6} (.+)", line)
        if heading is None:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def test_the_anchor_rule_matches_githubs_on_the_readmes_own_headings():
    found = anchors(README)
    assert {"the-two-commands", "configuration-edgeyaml", "restarts-without-a-gap"} <= found


def test_every_anchor_link_names_a_heading():
    found = anchors(README)
    links = [target for target in LINK.findall(prose(README)) if target.startswith("#")]
    assert links  # the check can fail: there are links to check
    assert [target for target in links if target[1:] not in found] == []


def test_every_relative_file_link_names_a_file():
    targets = [
        target.split("#")[0]
        for target in LINK.findall(prose(README))
        if not target.startswith(("#", "http://", "https://", "mailto:"))
    ]
    assert targets
    assert [target for target in targets if not (ROOT / target).exists()] == []
