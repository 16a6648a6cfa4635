"""Fixtures of the reliability harness: captured logs and the fake upstreams."""

from __future__ import annotations

import io

import pytest


@pytest.fixture(autouse=True)
def _logs_captured(log_stream: io.StringIO) -> None:
    """Every reliability test captures the edge's log (kept off the terminal)."""
