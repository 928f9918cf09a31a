"""Shared pytest configuration.

Hypothesis profiles: ``default`` (what ``scripts/test`` runs: 500 simulated
schedules, derandomized so CI is repeatable) and ``deep`` (10x the schedules,
random seeds each run): ``scripts/test --hypothesis-profile=deep``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
from hypothesis import HealthCheck, settings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

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


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """One local Spark session for every test that asks for it (it costs
    seconds to start); tests that use it are marked ``spark``."""
    from spark_verify.session import java_problem, spark_session

    problem = java_problem()
    if problem is not None:
        pytest.fail(problem)
    session = spark_session("local[2]", app_name="kq-verify-tests")
    yield session
    session.stop()
