"""Shared fixtures: one local SparkSession per test session (real Spark, local[2]).

There can be only one SparkContext per process, so unit and integration tests share this one;
it carries the Kafka connector jars (fetched by `make setup` / `keyshift stack fetch`).
"""

from __future__ import annotations

import logging
import os
import sys

import pytest

# py4j logs every JVM call at INFO, and once more after pytest closed its streams at exit
logging.getLogger("py4j").setLevel(logging.WARNING)


def pytest_addoption(parser):
    parser.addoption("--run-slow", action="store_true", default=False,
                     help="also run the tests marked slow (more fault points of the same mechanisms; `make test-all`)")


def pytest_collection_modifyitems(config, items):
    """Tests marked `slow` repeat a mechanism another test already proves at one more fault point
    or load level; `make test` (CI) skips them to keep the suite's time, `make test-all` runs them."""
    if config.getoption("--run-slow") or os.environ.get("KEYSHIFT_RUN_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="slow: run with `make test-all` (pytest --run-slow)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def settings():
    """The default settings: the local stack that `keyshift stack up` starts."""
    from keyshift.settings import Settings

    return Settings()


@pytest.fixture(scope="session")
def spark(settings):
    """A real local SparkSession configured like a keyshift job, with the Kafka connector."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from keyshift.runtime.session import build_spark_session, spark_conf
    from keyshift.stack.spark import connector_jars

    session = build_spark_session("keyshift-tests", "local[2]", spark_conf(4, jars=connector_jars(settings), driver_memory="3g"))
    yield session
    session.stop()


@pytest.fixture(scope="session")
def stack_settings(settings):
    """The default settings, once Kafka and Redis answer; skips the test when they do not."""
    from keyshift.stack.process import port_open

    for what, host, port in (("Kafka", settings.kafka_host, settings.kafka_port), ("Redis", settings.redis_host, settings.redis_port)):
        if not port_open(host, port):
            pytest.skip(f"{what} does not answer on {host}:{port}; start the stack with `keyshift stack up`")
    return settings


@pytest.fixture
def read_topic(settings):
    """A function `read_topic(topic)`: every committed record of the topic, from the beginning.

    It returns kafka-python `ConsumerRecord`s (partition, offset, key, value as bytes ...) up to
    the end offsets at the call, partition by partition in the order the consumer hands them. It
    reads with `read_committed` and stops when every partition's position reaches its end offset,
    since the job's side outputs are transactional: commit markers take offsets of their own, so
    a topic holds fewer records than its end offsets add up to (`keyshift.topics.read_committed`).
    """
    from keyshift.topics import read_committed

    def read(topic: str) -> list:
        return read_committed(settings, topic)

    return read
