"""Shared test settings.

Hypothesis runs derandomized (a fixed seed per test) so that a CI run is repeatable; set
``HYPOTHESIS_PROFILE=explore`` locally to search with fresh random examples.
"""

from __future__ import annotations

import io
import os

import pytest
from hypothesis import HealthCheck, settings

from iop_edge.logs import configure_logging

settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("explore", deadline=None, max_examples=1000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture
def log_stream() -> io.StringIO:
    """Every structured log line the edge writes during the test (info level, JSON); a
    directory's conftest may override it (``tests/api`` logs at debug level)."""
    stream = io.StringIO()
    configure_logging("info", "json", stream)
    return stream
