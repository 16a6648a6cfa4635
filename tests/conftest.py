"""Shared test settings.

Hypothesis runs derandomized (a fixed seed per test) so that a CI run is repeatable; set
``HYPOTHESIS_PROFILE=explore`` locally to search with fresh random examples.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("explore", deadline=None, max_examples=1000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
