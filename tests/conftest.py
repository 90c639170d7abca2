"""Shared pytest settings: fixed seeds and a hypothesis profile (keep this file small and general)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "specrt", max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("specrt")


@pytest.fixture
def np_rng() -> np.random.Generator:
    """A fixed-seed numpy generator for test inputs (not for the sampler's own draws)."""
    return np.random.default_rng(20261129)
