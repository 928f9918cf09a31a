"""Shared pytest configuration.

Hypothesis profiles: ``default`` (what ``scripts/test`` runs: 500 simulated
schedules, derandomized so CI is repeatable) and ``deep`` (10x the schedules,
random seeds each run): ``scripts/test --hypothesis-profile=deep``.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

settings.register_profile(
    "default",
    max_examples=500,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.register_profile(
    "deep",
    max_examples=5_000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.load_profile("default")
