"""Authentication switched on by configuration: Redis with a password, Kafka with SASL/PLAIN.

A private stack (its own state directory, free ports, the shared jar cache) is started by
keyshift's own `stack.up` with `redis_password` and `kafka_sasl_username`/`_password` set, and
stopped at the end; the shared stack on 9092/6379/8080 is never touched. Each test shows that a
client without the credentials is refused and that keyshift's own clients (`keyshift.runs.redis_client`,
`keyshift.kafka_clients`, `keyshift.topics`) get in and move data.
"""

from __future__ import annotations

import secrets
import socket
import stat
import uuid

import pytest

from keyshift import stack
from keyshift.errors import StackError
from keyshift.settings import Settings
from keyshift.stack import kafka, process
from keyshift.stack import redis as redis_stack

pytestmark = pytest.mark.integration

UP_TIMEOUT_S = 180.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def secured(tmp_path_factory) -> Settings:
    """Redis and Kafka of a private stack with authentication on; stopped after the module."""
    shared = Settings()
    own = Settings(
        home=tmp_path_factory.mktemp("auth") / "state",
        cache_dir=shared.cache,
        kafka_port=_free_port(),
        kafka_controller_port=_free_port(),
        redis_port=_free_port(),
        redis_password=secrets.token_urlsafe(12) + " @/:",  # characters a URL must quote
        kafka_sasl_username="keyshift",
        kafka_sasl_password=secrets.token_urlsafe(12),
    )
    try:
        stack.up(own, "redis,kafka", timeout_s=UP_TIMEOUT_S)
        yield own
    finally:
        stack.down(own, "redis,kafka")
        assert not process.port_open("127.0.0.1", own.kafka_port)
        assert not process.port_open("127.0.0.1", own.redis_port)


def _with(settings: Settings, **changes) -> Settings:
    """`settings` with some fields changed (validated again, so passwords become SecretStr)."""
    return Settings(**{**settings.model_dump(), **changes})


# ---- Redis ------------------------------------------------------------------------------------


def test_redis_refuses_a_client_without_the_password(secured):
    import redis

    anonymous = redis.Redis(host="127.0.0.1", port=secured.redis_port, socket_connect_timeout=5)
    try:
        with pytest.raises(redis.AuthenticationError):
            anonymous.set("keyshift:auth-test", "x")
    finally:
        anonymous.close()


@pytest.mark.parametrize("password", [None, "wrong-password"])
def test_keyshift_clients_without_the_right_password_say_which_setting_to_fix(secured, password):
    from keyshift.runs import redis_client

    bad = _with(secured, redis_password=password)
    with pytest.raises(StackError, match="refused the login.*KEYSHIFT_REDIS_PASSWORD"):
        redis_client(bad)
    with pytest.raises(StackError, match="refused the login.*KEYSHIFT_REDIS_PASSWORD"):
        redis_stack.ping(bad)


def test_keyshift_redis_client_logs_in_and_sets_and_gets(secured):
    from keyshift.runs import redis_client

    client = redis_client(secured)
    key = f"keyshift:auth-test:{uuid.uuid4().hex}"
    try:
        client.set(key, "value")
        assert client.get(key) == "value"
        assert client.config_get("requirepass")["requirepass"] == secured.redis_password.get_secret_value()
    finally:
        client.delete(key)
        client.close()
    assert redis_stack.status(secured).state == "healthy"


def test_the_redis_config_holding_the_password_is_private(secured):
    path = redis_stack.config_file(secured)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert secured.redis_password.get_secret_value() in path.read_text()
    # never on a command line, where `ps` would show it
    record = process.read_record(secured.home, redis_stack.NAME)
    assert secured.redis_password.get_secret_value() not in " ".join(record.argv)


# ---- Kafka ------------------------------------------------------------------------------------


def test_kafka_refuses_a_client_without_sasl(secured):
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError

    with pytest.raises(KafkaError):
        admin = KafkaAdminClient(
            bootstrap_servers=secured.bootstrap_servers, bootstrap_timeout_ms=5_000, request_timeout_ms=5_000
        )
        try:
            admin.list_topics()
        finally:
            admin.close()


def test_kafka_refuses_a_wrong_password_and_keyshift_says_which_settings_to_fix(secured):
    from keyshift.topics import describe_topics

    wrong = _with(secured, kafka_sasl_password="wrong-password")
    with pytest.raises(StackError, match="login.*KEYSHIFT_KAFKA_SASL_USERNAME and KEYSHIFT_KAFKA_SASL_PASSWORD"):
        describe_topics(wrong)
    plaintext = _with(secured, kafka_sasl_username=None, kafka_sasl_password=None)
    with pytest.raises(StackError, match="requires a login.*set KEYSHIFT_KAFKA_SASL_USERNAME"):
        describe_topics(plaintext)


def test_keyshift_kafka_clients_log_in_and_produce_and_consume(secured):
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    from keyshift.kafka_clients import client_options
    from keyshift.topics import create_topics, delete_topics, end_offsets, kafka_config

    topic = f"keyshift-auth-{uuid.uuid4().hex[:8]}"
    assert create_topics(secured, [topic], partitions=2) == {topic: "created"}
    try:
        producer = KafkaProducer(bootstrap_servers=secured.bootstrap_servers, acks="all", **client_options(secured))
        for i in range(10):
            producer.send(topic, key=str(i % 2).encode(), value=f"event-{i}".encode(), partition=i % 2)
        producer.flush(timeout=30)
        producer.close()
        assert end_offsets(secured, topic) == {0: 5, 1: 5}

        consumer = KafkaConsumer(**kafka_config(secured, "keyshift-auth-test"), group_id=None,
                                 enable_auto_commit=False, consumer_timeout_ms=15_000)
        try:
            partitions = [TopicPartition(topic, p) for p in (0, 1)]
            consumer.assign(partitions)
            consumer.seek_to_beginning(*partitions)
            values = sorted(record.value.decode() for _, record in zip(range(10), consumer))
        finally:
            consumer.close()
        assert values == sorted(f"event-{i}" for i in range(10))
    finally:
        delete_topics(secured, [topic])
    health = kafka.probe(secured)  # the stack's own probe logs in too
    assert health.broker_ids == (1,)
    assert kafka.status(secured).state == "healthy"


def test_the_broker_config_holding_the_password_is_private(secured):
    path = kafka.config_file(secured)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    record = process.read_record(secured.home, kafka.NAME)
    assert secured.kafka_sasl_password.get_secret_value() not in " ".join(record.argv)


def test_spark_reads_the_secured_broker_with_keyshift_spark_options(secured, spark):
    from kafka import KafkaProducer

    from keyshift.kafka_clients import client_options, spark_options
    from keyshift.topics import create_topics, delete_topics

    topic = f"keyshift-auth-spark-{uuid.uuid4().hex[:8]}"
    create_topics(secured, [topic], partitions=1)
    try:
        producer = KafkaProducer(bootstrap_servers=secured.bootstrap_servers, acks="all", **client_options(secured))
        for i in range(3):
            producer.send(topic, value=f"spark-{i}".encode())
        producer.flush(timeout=30)
        producer.close()

        rows = (
            spark.read.format("kafka")
            .option("kafka.bootstrap.servers", secured.bootstrap_servers)
            .option("subscribe", topic)
            .option("startingOffsets", "earliest")
            .options(**spark_options(secured))
            .load()
            .selectExpr("CAST(value AS STRING) AS value")
            .collect()
        )
        assert sorted(row.value for row in rows) == ["spark-0", "spark-1", "spark-2"]
    finally:
        delete_topics(secured, [topic])
