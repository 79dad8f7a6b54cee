"""The compose stack and the local scripts use the same service settings (infra/stack.env).

The compose model comes from Docker Compose's own parser (`keyshift.stack.compose.config`); the
local side is what `keyshift.settings.Settings()` (no KEYSHIFT_* variable set) and
`keyshift.names` hold. `disagreements` lists every place where the two differ; it is empty for
the repository, and a copy of the compose files where one side was edited alone makes it speak.
`cluster_disagreements` does the same for the profile `cluster` against the settings of a local
cluster (`Settings(kafka_brokers=3)`): its Kafka nodes (ids, quorum, ports, replication), its two
Spark workers and its S3 port.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from keyshift import names
from keyshift.settings import Settings
from keyshift.stack import compose
from keyshift.stack_env import STACK_ENV_FILE, stack_values

KEYSHIFT_CONTAINERS = ("spark-master", "spark-worker", "airflow-init", "airflow-apiserver", "airflow-scheduler",
                       "airflow-dag-processor", "airflow-triggerer")
"""The services that run keyshift code (and so read its settings)."""

NAMES = {
    "KEYSHIFT_FLIGHTS_TOPIC": names.FLIGHTS_TOPIC,
    "KEYSHIFT_DEAD_LETTER_TOPIC": names.DEAD_LETTER_TOPIC,
    "KEYSHIFT_LATE_TOPIC": names.LATE_TOPIC,
    "KEYSHIFT_ALERTS_TOPIC": names.ALERTS_TOPIC,
    "KEYSHIFT_SINK_COMMITS_TOPIC": names.SINK_COMMITS_TOPIC,
    "KEYSHIFT_YSB_TOPIC": names.YSB_TOPIC,
    "KEYSHIFT_YSB_DEAD_LETTER_TOPIC": names.YSB_DEAD_LETTER_TOPIC,
    "KEYSHIFT_YSB_LATE_TOPIC": names.YSB_LATE_TOPIC,
    "KEYSHIFT_REDIS_PREFIX": names.REDIS_PREFIX,
}


def _published(service: Mapping[str, Any]) -> dict[int, int]:
    return {int(p["published"]): int(p["target"]) for p in service.get("ports", [])}


def disagreements(model: Mapping[str, Any], settings: Settings, local_names: Mapping[str, str]) -> list[str]:
    """Every service setting where the compose model and the local scripts differ (empty: agree)."""
    services = model["services"]
    found: list[str] = []

    def check(where: str, compose_value: object, local_value: object) -> None:
        if str(compose_value) != str(local_value):
            found.append(f"{where}: compose {compose_value!r}, local {local_value!r}")

    # the ports a local client uses reach the containers, and each container listens on what it publishes
    kafka = services["kafka"]
    check("kafka published port", sorted(_published(kafka)), [settings.kafka_port])
    listeners = dict(item.split("://") for item in kafka["environment"]["KAFKA_LISTENERS"].split(","))
    check("kafka HOST listener", listeners["HOST"].rsplit(":", 1)[1], settings.kafka_port)
    check("kafka CONTROLLER listener", listeners["CONTROLLER"].rsplit(":", 1)[1], settings.kafka_controller_port)
    advertised = kafka["environment"]["KAFKA_ADVERTISED_LISTENERS"].split(",")
    check("kafka advertised HOST listener", next(a for a in advertised if a.startswith("HOST://")),
          f"HOST://localhost:{settings.kafka_port}")
    redis = services["redis"]
    check("redis published port", _published(redis), {settings.redis_port: settings.redis_port})
    check("redis-server --port", redis["command"][0].split("--port ", 1)[1].split()[0], settings.redis_port)
    apiserver = services["airflow-apiserver"]
    check("airflow published port", _published(apiserver), {settings.airflow_port: settings.airflow_port})
    check("airflow api port", apiserver["environment"]["AIRFLOW__API__PORT"], settings.airflow_port)
    for name in KEYSHIFT_CONTAINERS:
        env = services[name]["environment"]
        # in the network: the broker's DOCKER listener, Redis and Airflow at the ports they listen on
        check(f"{name} kafka address", f"DOCKER://{env['KEYSHIFT_KAFKA_HOST']}:{env['KEYSHIFT_KAFKA_PORT']}",
              next(a for a in advertised if a.startswith("DOCKER://")))
        check(f"{name} KEYSHIFT_REDIS_PORT", env["KEYSHIFT_REDIS_PORT"], settings.redis_port)
        check(f"{name} KEYSHIFT_AIRFLOW_PORT", env["KEYSHIFT_AIRFLOW_PORT"], settings.airflow_port)
        check(f"{name} KEYSHIFT_PARTITIONS", env.get("KEYSHIFT_PARTITIONS"), settings.partitions)
        check(f"{name} KEYSHIFT_KAFKA_BROKERS", env.get("KEYSHIFT_KAFKA_BROKERS"), settings.kafka_brokers)
        for variable, value in local_names.items():
            check(f"{name} {variable}", env.get(variable), value)
    return found


def cluster_disagreements(model: Mapping[str, Any], cluster: Settings, s3_port: int) -> list[str]:
    """Every setting where the profile `cluster`'s model and a local cluster's settings differ.

    Args:
        model: the compose model with the profile active (`compose.config(profiles=("cluster",))`).
        cluster: the settings a client on this machine uses for the compose cluster: kafka_port the
            first node's published port (KEYSHIFT_KAFKA_CLUSTER_PORT_1), kafka_brokers 3.
        s3_port: the S3 server's port (KEYSHIFT_S3_PORT).

    Returns:
        One line per difference, "<where>: compose <value>, local <value>"; empty when they agree.

    Raises:
        KeyError: when the model lacks a service or a setting of the profile.
    """
    services = model["services"]
    found: list[str] = []

    def check(where: str, compose_value: object, local_value: object) -> None:
        if str(compose_value) != str(local_value):
            found.append(f"{where}: compose {compose_value!r}, local {local_value!r}")

    replication, min_isr = cluster.kafka_replication
    nodes = cluster.kafka_nodes
    check("kafka nodes", sorted(n for n in services if n.startswith("kafka-")), [f"kafka-{i}" for i, _, _ in nodes])
    # every node is its own host: its controller listens on node 1's port there
    voters = ",".join(f"{i}@kafka-{i}:{cluster.kafka_controller_port}" for i, _, _ in nodes)
    for i, client_port, _ in nodes:
        name = f"kafka-{i}"
        service = services[name]
        env = service["environment"]
        check(f"{name} node id", env["KAFKA_NODE_ID"], i)
        check(f"{name} quorum voters", env["KAFKA_CONTROLLER_QUORUM_VOTERS"], voters)
        # a local client reaches node i at the port Settings numbers it with, and the node says so
        check(f"{name} published port", _published(service), {client_port: client_port})
        listeners = dict(item.split("://") for item in env["KAFKA_LISTENERS"].split(","))
        check(f"{name} HOST listener", listeners["HOST"].rsplit(":", 1)[1], client_port)
        check(f"{name} CONTROLLER listener", listeners["CONTROLLER"].rsplit(":", 1)[1], cluster.kafka_controller_port)
        advertised = env["KAFKA_ADVERTISED_LISTENERS"].split(",")
        check(f"{name} advertised HOST listener", next(a for a in advertised if a.startswith("HOST://")),
              f"HOST://localhost:{client_port}")
        for key in ("KAFKA_DEFAULT_REPLICATION_FACTOR", "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR",
                    "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR",
                    "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_REPLICATION_FACTOR"):
            check(f"{name} {key}", env[key], replication)
        for key in ("KAFKA_MIN_INSYNC_REPLICAS", "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR",
                    "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_MIN_ISR"):
            check(f"{name} {key}", env[key], min_isr)
    master = services["spark-master"]["command"]
    master_url = f"spark://{master[master.index('--host') + 1]}:{master[master.index('--port') + 1]}"
    workers = sorted(n for n in services if n.startswith("spark-worker"))
    check("spark workers", workers, ["spark-worker", "spark-worker-2"])
    for name in workers:
        check(f"{name} master", services[name]["command"][2], master_url)
    s3 = services["s3"]
    check("s3 published port", _published(s3), {s3_port: s3_port})
    check("s3 server port", s3["entrypoint"][s3["entrypoint"].index("-p") + 1], s3_port)
    return found


@pytest.fixture
def local_settings(monkeypatch) -> Settings:
    """`Settings()` as a local script without any KEYSHIFT_* variable builds it."""
    import os

    for variable in [v for v in os.environ if v.startswith("KEYSHIFT_")]:
        monkeypatch.delenv(variable)
    return Settings()


def _copy_stack(tmp_path: Path) -> Path:
    """A copy of the compose files and the settings file in `tmp_path`; returns its docker-compose.yml."""
    for source in (compose.COMPOSE_FILE, compose.SERVICES_FILE, STACK_ENV_FILE):
        target = tmp_path / source.relative_to(compose.COMPOSE_FILE.parent)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source, target)
    return tmp_path / compose.COMPOSE_FILE.name


def test_compose_and_the_local_scripts_agree(local_settings):
    model = compose.config(env_file=compose.ENV_EXAMPLE)
    assert disagreements(model, local_settings, NAMES) == []


def _cluster_settings(local_settings: Settings, values: Mapping[str, str]) -> Settings:
    """A local client's settings for the compose cluster: its first node's port, three brokers."""
    return local_settings.model_copy(update={
        "kafka_port": int(values["KEYSHIFT_KAFKA_CLUSTER_PORT_1"]), "kafka_brokers": 3,
    })


def test_the_cluster_profile_and_a_local_cluster_agree(local_settings):
    values = stack_values()
    model = compose.config(env_file=compose.ENV_EXAMPLE, profiles=("cluster",))
    cluster = _cluster_settings(local_settings, values)
    assert cluster.kafka_nodes == [(1, 29092, 9093), (2, 29102, 9103), (3, 29112, 9113)]
    assert cluster.kafka_replication == (3, 2)
    assert cluster_disagreements(model, cluster, int(values["KEYSHIFT_S3_PORT"])) == []
    # the profile changes nothing of what the default services agree on
    assert disagreements(model, local_settings, NAMES) == []


def test_a_cluster_port_edited_alone_is_a_disagreement(tmp_path, local_settings):
    path = _copy_stack(tmp_path)
    stack_file = tmp_path / STACK_ENV_FILE.relative_to(compose.COMPOSE_FILE.parent)
    text = stack_file.read_text()
    stack_file.write_text(text.replace("KEYSHIFT_KAFKA_CLUSTER_PORT_1=29092", "KEYSHIFT_KAFKA_CLUSTER_PORT_1=39092"))
    values = stack_values(stack_file)
    model = compose.config(path, env_file=compose.ENV_EXAMPLE, profiles=("cluster",))
    # nodes 2 and 3 stay where they were: 10 and 20 above the old first port, not the new one
    assert cluster_disagreements(model, _cluster_settings(local_settings, values), int(values["KEYSHIFT_S3_PORT"])) == [
        "kafka-2 published port: compose {29102: 29102}, local {39102: 39102}",
        "kafka-2 HOST listener: compose '29102', local 39102",
        "kafka-2 advertised HOST listener: compose 'HOST://localhost:29102', local 'HOST://localhost:39102'",
        "kafka-3 published port: compose {29112: 29112}, local {39112: 39112}",
        "kafka-3 HOST listener: compose '29112', local 39112",
        "kafka-3 advertised HOST listener: compose 'HOST://localhost:29112', local 'HOST://localhost:39112'",
    ]


def test_a_broken_node_or_a_missing_worker_is_a_disagreement(tmp_path, local_settings):
    path = _copy_stack(tmp_path)
    services_file = tmp_path / compose.SERVICES_FILE.relative_to(compose.COMPOSE_FILE.parent)
    text = services_file.read_text()
    edited = (text.replace('KAFKA_NODE_ID: "3"', 'KAFKA_NODE_ID: "4"')
              .replace('    KAFKA_MIN_INSYNC_REPLICAS: "2"', '    KAFKA_MIN_INSYNC_REPLICAS: "1"')
              .replace("  spark-worker-2:\n    <<: *spark-worker\n    hostname: spark-worker-2\n    profiles: [cluster]\n", ""))
    assert edited.count("spark-worker-2") == text.count("spark-worker-2") - 2
    services_file.write_text(edited)
    values = stack_values()
    model = compose.config(path, env_file=compose.ENV_EXAMPLE, profiles=("cluster",))
    found = cluster_disagreements(model, _cluster_settings(local_settings, values), int(values["KEYSHIFT_S3_PORT"]))
    assert found == [
        "kafka-1 KAFKA_MIN_INSYNC_REPLICAS: compose '1', local 2",
        "kafka-2 KAFKA_MIN_INSYNC_REPLICAS: compose '1', local 2",
        "kafka-3 node id: compose '4', local 3",
        "kafka-3 KAFKA_MIN_INSYNC_REPLICAS: compose '1', local 2",
        "spark workers: compose ['spark-worker'], local ['spark-worker', 'spark-worker-2']",
    ]


def test_the_local_defaults_and_names_are_the_files():
    values = stack_values()
    defaults = {name: field.default for name, field in Settings.model_fields.items()}
    assert defaults["kafka_port"] == int(values["KEYSHIFT_KAFKA_PORT"])
    assert defaults["kafka_controller_port"] == int(values["KEYSHIFT_KAFKA_CONTROLLER_PORT"])
    assert defaults["redis_port"] == int(values["KEYSHIFT_REDIS_PORT"])
    assert defaults["airflow_port"] == int(values["KEYSHIFT_AIRFLOW_PORT"])
    assert defaults["partitions"] == int(values["KEYSHIFT_PARTITIONS"])
    assert NAMES == {variable: values[variable] for variable in NAMES}
    assert names.FLIGHT_TOPICS == (names.FLIGHTS_TOPIC, names.DEAD_LETTER_TOPIC, names.LATE_TOPIC, names.ALERTS_TOPIC)


def test_an_edit_of_the_settings_file_moves_both_sides(tmp_path, local_settings):
    path = _copy_stack(tmp_path)
    stack_file = tmp_path / STACK_ENV_FILE.relative_to(compose.COMPOSE_FILE.parent)
    edited = (stack_file.read_text().replace("KEYSHIFT_REDIS_PORT=6379", "KEYSHIFT_REDIS_PORT=16379")
              .replace("KEYSHIFT_FLIGHTS_TOPIC=flights", "KEYSHIFT_FLIGHTS_TOPIC=flights-2"))
    assert edited != stack_file.read_text()
    stack_file.write_text(edited)
    model = compose.config(path, env_file=compose.ENV_EXAMPLE)
    # the local side built from the edited file (as Settings and names would be after the edit)
    values = stack_values(stack_file)
    edited_settings = local_settings.model_copy(update={"redis_port": int(values["KEYSHIFT_REDIS_PORT"])})
    edited_names = {**NAMES, "KEYSHIFT_FLIGHTS_TOPIC": values["KEYSHIFT_FLIGHTS_TOPIC"]}
    assert disagreements(model, edited_settings, edited_names) == []
    assert _published(model["services"]["redis"]) == {16379: 16379}


def test_a_port_hard_coded_in_the_yaml_is_a_disagreement(tmp_path, local_settings):
    path = _copy_stack(tmp_path)
    services = tmp_path / compose.SERVICES_FILE.relative_to(compose.COMPOSE_FILE.parent)
    text = services.read_text()
    services.write_text(text.replace('"127.0.0.1:${KEYSHIFT_REDIS_PORT}:${KEYSHIFT_REDIS_PORT}"', '"127.0.0.1:6380:6379"'))
    model = compose.config(path, env_file=compose.ENV_EXAMPLE)
    assert disagreements(model, local_settings, NAMES) == ["redis published port: compose {6380: 6379}, local {6379: 6379}"]


def test_a_local_value_changed_alone_is_a_disagreement(local_settings):
    model = compose.config(env_file=compose.ENV_EXAMPLE)
    changed = local_settings.model_copy(update={"partitions": 12})
    found = disagreements(model, changed, {**NAMES, "KEYSHIFT_LATE_TOPIC": "late"})
    assert len(found) == 2 * len(KEYSHIFT_CONTAINERS)
    assert "airflow-scheduler KEYSHIFT_PARTITIONS: compose '8', local 12" in found
    assert "spark-worker KEYSHIFT_LATE_TOPIC: compose 'flights-late', local 'late'" in found


def test_every_partitions_option_of_the_cli_defaults_to_the_files():
    import click

    from keyshift.cli import _register, cli

    _register()
    found = {}

    def walk(command: click.Command, path: str) -> None:
        for param in command.params:
            if param.name == "partitions" and not getattr(param, "multiple", False) and isinstance(param.default, int):
                found[path] = param.default
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, f"{path} {name}")

    walk(cli, "keyshift")
    assert {"keyshift run demo", "keyshift job run", "keyshift bench watermark"} <= set(found), found
    assert set(found.values()) == {int(stack_values()["KEYSHIFT_PARTITIONS"])}, found


@pytest.mark.parametrize(("text", "error"), [
    ('KEYSHIFT_FLIGHTS_TOPIC="flights"\n', "is not NAME=value"),   # quotes: Compose would strip them, we would not
    ("KEYSHIFT_REDIS_PORT = 6379\n", "is not NAME=value"),        # spaces
    ("KEYSHIFT_FLIGHTS_TOPIC=${TOPIC}\n", "is not NAME=value"),    # interpolation
    ("KEYSHIFT_REDIS_PORT=6379\nKEYSHIFT_REDIS_PORT=6380\n", "set twice"),
])
def test_only_plain_lines_are_read(text, error):
    from keyshift.errors import ConfigurationError
    from keyshift.stack_env import parse_stack_env

    with pytest.raises(ConfigurationError, match=error):
        parse_stack_env(text)


def test_comments_and_blank_lines_are_skipped_and_a_missing_name_is_named(tmp_path):
    from keyshift.errors import ConfigurationError
    from keyshift.stack_env import parse_stack_env, stack_value

    assert parse_stack_env("# ports\n\nKEYSHIFT_REDIS_PORT=6379\n") == {"KEYSHIFT_REDIS_PORT": "6379"}
    path = tmp_path / "stack.env"
    path.write_text("KEYSHIFT_REDIS_PORT=6379\n")
    with pytest.raises(ConfigurationError, match="does not set KEYSHIFT_KAFKA_PORT"):
        stack_value("KEYSHIFT_KAFKA_PORT", path)
