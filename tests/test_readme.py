"""The README and the reference in ``docs/`` keep their links: every ``(#anchor)`` names a
heading of its page, every ``(page.md#anchor)`` a heading of that page, and every relative file
link names a file — the README's a file of the repository (``docs/`` pages included), a docs
page's a page of the site (MkDocs cannot publish a link out of ``docs/``).

GitHub renders the README and shows the docs pages in the repository; MkDocs builds the pages
into the site. Both make anchors of the headings, by slightly different rules, so the headings
are held to the ones on which both rules agree, and the MkDocs rule is checked against the ids
of a site really built."""

from __future__ import annotations

import re
import subprocess
import sys
import unicodedata
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers import ROOT

DOCS = ROOT / "docs"
README = (ROOT / "README.md").read_text(encoding="utf-8")
PAGES = {path.name: path.read_text(encoding="utf-8") for path in sorted(DOCS.glob("*.md"))}
LINK = re.compile(r"\]\(([^)\s]+)\)")
EXTERNAL = ("http://", "https://", "mailto:")


def prose(text: str) -> str:
    """The text outside fenced code blocks (a ``# comment`` in a shell block is no heading)."""
    kept, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced:
            kept.append(line)
    return "\n".join(kept)


def headings(text: str) -> list[str]:
    """The text of each heading, as a reader sees it (the markup of code spans and emphasis
    dropped, a link reduced to its text)."""
    found = []
    for line in prose(text).splitlines():
        heading = re.match(r"#{1,6} (.+)", line)
        if heading is not None:
            shown = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.group(1).strip())
            found.append(re.sub(r"[`*]", "", shown))
    return found


def github_slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped (``-`` and ``_`` kept),
    each space a ``-``."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def mkdocs_slug(heading: str) -> str:
    """MkDocs' anchor of a heading (Python-Markdown's ``toc`` extension, its default
    ``slugify``): accents and other non-ASCII dropped, punctuation dropped (``-`` and ``_``
    kept), lower case, each run of spaces and ``-`` one ``-``."""
    ascii_text = unicodedata.normalize("NFKD", heading).encode("ascii", "ignore").decode("ascii")
    return re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", ascii_text).strip().lower())


def anchors(text: str, slug: Callable[[str], str] = github_slug) -> set[str]:
    """The anchors of a page's headings; a repeated one gets GitHub's ``-1``, ``-2``, ... (the
    headings below never repeat, so MkDocs' ``_1`` never arises: see
    ``test_no_page_repeats_a_heading``)."""
    seen: dict[str, int] = {}
    found = set()
    for heading in headings(text):
        anchor = slug(heading)
        count = seen.get(anchor, 0)
        seen[anchor] = count + 1
        found.add(anchor if count == 0 else f"{anchor}-{count}")
    return found


def links(text: str) -> list[str]:
    """Every link target of a page's prose."""
    return LINK.findall(prose(text))


def broken(text: str, here: Path, slug: Callable[[str], str]) -> list[str]:
    """The relative links of the page at ``here`` whose file is missing, or whose ``#anchor``
    names no heading of its target (the page itself for a bare ``#anchor``)."""
    wrong = []
    for target in links(text):
        if target.startswith(EXTERNAL):
            continue
        path, _, anchor = target.partition("#")
        file = (here.parent / path).resolve() if path else here
        if not file.exists():
            wrong.append(target)
        elif anchor:
            shown = README if file == ROOT / "README.md" else file.read_text(encoding="utf-8")
            if file.suffix != ".md" or anchor not in anchors(shown, slug):
                wrong.append(target)
    return wrong


def test_the_anchor_rule_matches_githubs_on_the_readmes_own_headings():
    found = anchors(README)
    assert {"the-two-commands", "a-five-minute-tour"} <= found
    assert "configuration-edgeyaml" in anchors(PAGES["configuration.md"], mkdocs_slug)
    assert "restarts-without-a-gap" in anchors(PAGES["operations.md"], mkdocs_slug)
    assert mkdocs_slug("Configuration (edge.yaml) — café") == "configuration-edgeyaml-cafe"
    assert github_slug("Configuration (edge.yaml) — café") == "configuration-edgeyaml--café"


def test_every_anchor_link_names_a_heading():
    # the check can fail: there are links to check, from the README into the docs too
    assert [target for target in links(README) if target.startswith("docs/") and "#" in target]
    assert broken(README, ROOT / "README.md", github_slug) == []
    for name, text in PAGES.items():
        assert broken(text, DOCS / name, mkdocs_slug) == [], name
    assert sum("#" in target for text in PAGES.values() for target in links(text)) > 20


def test_every_relative_file_link_names_a_file():
    targets = [target for target in links(README) if not target.startswith(("#", *EXTERNAL))]
    assert targets
    assert [target for target in targets if not (ROOT / target.split("#")[0]).exists()] == []


def test_the_readme_links_into_every_page_of_the_docs():
    linked = {target.split("#")[0] for target in links(README)}
    assert {f"docs/{name}" for name in PAGES} - {"docs/index.md"} <= linked
    assert "docs/index.md" in linked


def test_a_docs_page_links_only_to_pages_of_the_site():
    """MkDocs publishes only ``docs/``: a link to ``../configs/edge.yaml`` would fail the strict
    build, so a docs page names repository files as code (``configs/edge.yaml``)."""
    outside = []
    for name, text in PAGES.items():
        for target in links(text):
            path = target.split("#")[0]
            if not path or target.startswith(EXTERNAL):
                continue
            if not path.endswith(".md") or (DOCS / path).resolve().parent != DOCS:
                outside.append(f"{name}: {target}")
    assert outside == []


def test_github_and_mkdocs_make_the_same_anchor_of_every_heading():
    """So a link works in the repository's view of a page and in the site alike."""
    for text in [README, *PAGES.values()]:
        for heading in headings(text):
            assert github_slug(heading) == mkdocs_slug(heading), heading


def test_no_page_repeats_a_heading():
    for text in [README, *PAGES.values()]:
        assert len(anchors(text, mkdocs_slug)) == len(headings(text))


def test_no_internal_issue_numbers():
    """The history lives in CHANGELOG.md; the README and the reference say what is."""
    for name, text in {"README.md": README, **PAGES}.items():
        assert re.findall(r"\bissues?\s*#?\d+|\(#\d+\)", text, re.IGNORECASE) == [], name


def test_every_page_is_in_the_site_nav():
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    nav = re.findall(r"^\s+- [^:\n]+: (\S+\.md)$", config, re.MULTILINE)
    assert sorted(nav) == sorted(PAGES)
    assert re.search(r"^strict: true$", config, re.MULTILINE)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site as ``make docs`` builds it (strict), in a temporary directory."""
    out = tmp_path_factory.mktemp("site")
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    return out


def test_the_mkdocs_rule_gives_the_ids_of_the_built_site(site):
    for name, text in PAGES.items():
        html = (site / name.replace(".md", ".html")).read_text(encoding="utf-8")
        ids = set(re.findall(r'<h[1-6] id="([^"]+)"', html))
        assert ids == anchors(text, mkdocs_slug), name
        assert ids
