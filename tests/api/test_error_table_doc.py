"""The error table of docs/api.md is the code's: each row's OpenAI status and Anthropic type and
status are those the edge answers, and every code the edge answers has a row."""

from __future__ import annotations

import re
from pathlib import Path

from iop_edge.api.errors import ADMISSION_STATUS
from iop_edge.translate.anthropic_errors import ANTHROPIC_ERRORS

DOC = Path(__file__).parents[2] / "docs" / "api.md"


def _rows() -> list[list[str]]:
    text = DOC.read_text()
    table = text[text.index("| situation | status | code | Anthropic type and status |") :]
    table = table[: table.index("\n\n")]
    return [
        [cell.strip() for cell in line.strip("|").split("|")] for line in table.splitlines()[2:]
    ]


def test_each_rows_anthropic_type_and_status_are_the_codes():
    checked = 0
    for situation, _, codes, anthropic in _rows():
        named = re.findall(r"`([a-z_]+)`", codes)
        answers = re.findall(r"`([a-z_]+)` (\d{3})", anthropic)
        if not answers:  # (refused before any surface: the cell says why)
            assert anthropic.startswith("—"), situation
            continue
        assert len(named) == len(answers), situation
        for code, (kind, status) in zip(named, answers, strict=True):
            assert ANTHROPIC_ERRORS[code] == (kind, int(status)), (situation, code)
            checked += 1
    assert checked >= 20


def test_every_code_the_anthropic_surface_answers_has_a_row():
    documented = {code for row in _rows() for code in re.findall(r"`([a-z_]+)`", row[2])}
    # client_gone is never sent (the client left); the rest are answers.
    assert set(ANTHROPIC_ERRORS) - documented == {"client_gone", "invalid_admin_token"}


def test_each_rows_openai_status_is_the_admission_table_s():
    for situation, status, codes, _ in _rows():
        for code in re.findall(r"`([a-z_]+)`", codes):
            if code in ADMISSION_STATUS:
                assert status.startswith(str(ADMISSION_STATUS[code])), (situation, code)
