"""Shared fixtures: one local SparkSession per test session (real Spark, local[2])."""

from __future__ import annotations

import os
import sys

import pytest


@pytest.fixture(scope="session")
def spark():
    """A real local SparkSession configured like a keyshift job (no connector jars)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from keyshift.processing.session import build_spark_session, spark_conf

    session = build_spark_session("keyshift-tests", "local[2]", spark_conf(4, driver_memory="2g"))
    yield session
    session.stop()
