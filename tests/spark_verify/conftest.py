"""One local Spark session for every test that asks for ``spark``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from spark_verify.session import java_problem, spark_session


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    problem = java_problem()
    if problem is not None:
        pytest.fail(problem)
    session = spark_session("local[2]", app_name="kq-verify-tests")
    yield session
    session.stop()
