"""The real local stack: `keyshift stack up` brings Kafka, Redis and Airflow up healthy and each
answers a real request; a second `up` reuses them; `down` stops only what keyshift started.

The shared stack (default settings: Kafka 9092, Redis 6379, Airflow 8080) is started if down and
left running. The start/stop life cycle runs on a second, private stack (its own state directory
and free ports), so it never disturbs the shared one.
"""

from __future__ import annotations

import socket
import subprocess
import time
import uuid

import pytest
from click.testing import CliRunner

from keyshift import stack
from keyshift.errors import StackError
from keyshift.kafka_clients import client_options
from keyshift.settings import Settings
from keyshift.stack import airflow, kafka, process, redis

pytestmark = pytest.mark.integration

UP_TIMEOUT_S = 300.0


@pytest.fixture(scope="module")
def settings() -> Settings:
    return Settings()


@pytest.fixture(scope="module")
def running(settings) -> dict[str, float]:
    """Bring the shared stack up (or find it up); the seconds each service took."""
    return stack.up(settings, timeout_s=UP_TIMEOUT_S)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_up_makes_every_service_healthy(running, settings):
    assert set(running) == {"kafka", "redis", "airflow"}
    for status in stack.status(settings):
        # healthy, or reused: started by another stack or state dir and answering
        assert status.state in ("healthy", "external"), status


def test_kafka_answers_metadata_and_carries_records(running, settings):
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
    from kafka.admin import NewTopic

    health = kafka.probe(settings)
    assert health.broker_ids == (1,)
    assert health.cluster_id

    topic = f"keyshift-stack-test-{uuid.uuid4().hex[:8]}"
    security = client_options(settings)  # {} unless SASL/PLAIN is configured
    admin = KafkaAdminClient(bootstrap_servers=settings.bootstrap_servers, request_timeout_ms=15000, **security)
    try:
        admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])
        producer = KafkaProducer(bootstrap_servers=settings.bootstrap_servers, **security)
        for i in range(10):
            producer.send(topic, key=str(i % 2).encode(), value=f"event-{i}".encode())
        producer.flush(timeout=30)
        producer.close()

        consumer = KafkaConsumer(
            topic,
            bootstrap_servers=settings.bootstrap_servers,
            auto_offset_reset="earliest",
            group_id=f"{topic}-group",
            consumer_timeout_ms=15000,
            **security,
        )
        assert topic in consumer.topics()  # a metadata request through the consumer too
        values = sorted(record.value.decode() for _, record in zip(range(10), consumer))
        consumer.close()
        assert values == sorted(f"event-{i}" for i in range(10))
    finally:
        admin.delete_topics([topic])
        admin.close()


def test_redis_answers_ping_and_keeps_an_append_only_file(running, settings):
    client = redis.client(settings)
    try:
        assert client.ping() is True
        assert client.config_get("appendonly") == {"appendonly": "yes"}
        assert client.config_get("bind") == {"bind": "127.0.0.1"}
        assert client.config_get("dir") == {"dir": str(redis.redis_dir(settings))}
    finally:
        client.close()


def test_airflow_is_healthy_and_its_api_takes_our_token(running, settings):
    import requests

    answer = airflow.health(settings)
    assert airflow.unhealthy_components(answer) == []

    session = airflow.api_session(settings)
    version = session.get("/api/v2/version", timeout=30)
    assert version.status_code == 200
    assert version.json()["version"] == "3.3.2"
    assert session.get("/api/v2/dags", timeout=30).status_code == 200
    # and without the token the API refuses
    assert requests.get(f"{airflow.base_url(settings)}/api/v2/dags", timeout=30).status_code == 401
    # the token came from the password kept in the state directory; another one is refused
    assert airflow.admin_password(settings)
    with pytest.raises(StackError, match="refused user"):
        airflow.token(Settings(airflow_password="not-" + airflow.admin_password(settings)))


def test_airflow_sees_the_spark_default_connection(running, settings):
    result = subprocess.run(
        [airflow.airflow_executable(), "connections", "get", "spark_default", "-o", "json"],
        env=airflow.airflow_env(settings), capture_output=True, text=True, timeout=120, check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert '"conn_type": "spark"' in result.stdout
    assert settings.spark_master in result.stdout


def test_a_second_up_reuses_the_running_services(running, settings):
    pids = {p.name: p.pid for s in stack.status(settings) for p in s.processes}
    started = time.monotonic()

    stack.up(settings, timeout_s=60)

    assert time.monotonic() - started < 30
    assert {p.name: p.pid for s in stack.status(settings) for p in s.processes} == pids


def test_status_command_prints_each_state_and_address(running, settings):
    from keyshift.cli.stack import command

    result = CliRunner().invoke(command, ["status"])

    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    up = ("healthy", "external")
    for name, address in (("kafka", settings.bootstrap_servers), ("redis", settings.redis_address),
                          ("airflow", airflow.base_url(settings))):
        assert any(line.split()[:3] in ([name, state, address] for state in up) for line in lines), name
    assert "airflow-scheduler" in result.output
    assert f"password {airflow.admin_password(settings)}" in result.output  # the login to use


@pytest.fixture
def private(tmp_path, settings):
    """A second stack in its own state directory on free ports, sharing the jar cache."""
    own = Settings(
        home=tmp_path / "state",
        cache_dir=settings.cache,
        kafka_port=_free_port(),
        kafka_controller_port=_free_port(),
        redis_port=_free_port(),
    )
    yield own
    stack.down(own)


def test_private_stack_life_cycle_up_down(private):
    took = stack.up(private, "kafka,redis", timeout_s=120)

    assert set(took) == {"kafka", "redis"}
    assert kafka.probe(private).broker_ids == (1,)
    assert redis.ping(private)
    assert kafka.is_formatted(private)

    assert stack.down(private, "kafka,redis") == ["kafka", "redis"]

    assert not process.port_open("127.0.0.1", private.kafka_port)
    assert not process.port_open("127.0.0.1", private.redis_port)
    assert [s.state for s in stack.status(private, "kafka,redis")] == ["stopped", "stopped"]
    assert stack.down(private, "kafka,redis") == []  # nothing of ours left


def test_a_service_not_healthy_in_time_names_its_log(private):
    with pytest.raises(StackError) as caught:
        stack.up(private, "kafka", timeout_s=1)  # a JVM needs longer than that
    assert str(process.log_file(private.home, "kafka")) in str(caught.value)


def test_a_port_taken_by_something_else_is_reported(private):
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", private.redis_port))
        squatter.listen()
        with pytest.raises(StackError, match=f"port 127.0.0.1:{private.redis_port} is in use"):
            stack.up(private, "redis", timeout_s=10)
    assert not process.is_running(private.home, "redis")
