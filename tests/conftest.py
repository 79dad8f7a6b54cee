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


@pytest.fixture(scope="session")
def settings():
    """The default settings: the local stack that `keyshift stack up` starts."""
    from keyshift.settings import Settings

    return Settings()


@pytest.fixture(scope="session")
def spark(settings):
    """A real local SparkSession configured like a keyshift job, with the Kafka connector."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from keyshift.processing.session import build_spark_session, spark_conf
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
    """A function `read_topic(topic)`: every record of the topic, read from the beginning.

    It returns kafka-python `ConsumerRecord`s (partition, offset, key, value as bytes ...) up to
    the end offsets at the call, partition by partition in the order the consumer hands them.
    """
    from kafka import KafkaConsumer, TopicPartition

    from keyshift.kafka_clients import client_options
    from keyshift.topics import end_offsets

    def read(topic: str) -> list:
        ends = end_offsets(settings, topic)
        consumer = KafkaConsumer(bootstrap_servers=settings.bootstrap_servers, enable_auto_commit=False,
                                 group_id=None, consumer_timeout_ms=30_000, **client_options(settings))
        try:
            partitions = [TopicPartition(topic, p) for p in ends]
            consumer.assign(partitions)
            consumer.seek_to_beginning(*partitions)
            records, total = [], sum(ends.values())
            for message in consumer if total else ():
                records.append(message)
                if len(records) == total:
                    break
            return records
        finally:
            consumer.close()

    return read
