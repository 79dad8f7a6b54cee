"""One frozen settings object, built at the edge (CLI, Airflow task) and passed down.

Values come from environment variables prefixed `KEYSHIFT_` (e.g. `KEYSHIFT_KAFKA_PORT=19092`),
else the defaults below. The service ports and the partition count default to the values of
`infra/stack.env` (`keyshift.stack_env`), the file docker-compose.yml reads too, so the local
stack and the containers cannot drift apart. The core takes plain arguments or a `Settings`; it
never reads globals.

Passwords are `SecretStr`: `repr`, `str` and logs show `**********`; `.get_secret_value()` gives
the text. A JSON dump (`model_dump(mode="json")`) carries them in clear, so a settings dict handed
to a child process or an Airflow trigger rebuilds the same `Settings`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import quote

from pydantic import Field, SecretStr, field_serializer, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from keyshift.stack_env import DEFAULT_PARTITIONS, PROJECT_ROOT, stack_value

__all__ = ["DEFAULT_DRIVER_MEMORY", "DEFAULT_PARTITIONS", "PROJECT_ROOT", "Settings"]

DEFAULT_DRIVER_MEMORY = "2g"
"""The job driver's JVM heap (in local mode, the whole engine's). With 4 GB, G1 let the heap grow
to what it could use: one run each of all 3,000,000 flights at P = 8 peaked at 2.14 GB resident
with 4 GB and 1.29 GB with 2 GB, at the same speed (35,049 and 37,220 events/s); the bench of
2026-11-26 (night) with 2 GB: 1.44 to 1.90 GB at P = 8, 2.25 to 2.35 GB at P = 32. The job's
state lives in RocksDB, off the heap."""


class Settings(BaseSettings):
    """Where keyshift keeps its state and how it reaches the local stack.

    Attributes:
        home: state directory for services (pid files, logs, Kafka and Redis data, Airflow home).
        cache_dir: downloaded inputs (the flights data set, jars); reused across runs.
        runs_dir: one folder per job run: `runs/<run_id>/summary.json`, `windows/`, `progress.jsonl`.
        checkpoint_location: where new runs keep their Spark checkpoints: a Hadoop URI
            (`hdfs://namenode:8020/keyshift/checkpoints`, `s3a://bucket/keyshift`) or a path, each
            run's under `<location>/<run_id>/`; None (the default): in the run's folder. Every
            executor and a restarted driver must reach it (`keyshift.checkpoint_files`).
        kafka_host, kafka_port, kafka_controller_port: the broker's loopback listeners (of node 1;
            node i of a cluster listens 10 * (i - 1) ports higher, `kafka_nodes`).
        kafka_bootstrap: the bootstrap servers of a Kafka cluster whose brokers have hosts of their
            own (`kafka-1:19092,kafka-2:19092,kafka-3:19092`: docker compose's cluster profile, a
            production cluster), which clients use instead of `kafka_host` and the nodes' ports;
            None or "" (the default): `kafka_nodes` on `kafka_host`.
        kafka_brokers: Kafka nodes of the local stack, each a broker and a KRaft controller; 1
            (the default) or 3 for a production-like cluster: topics get replication factor
            min(3, brokers) and `min.insync.replicas` min(2, brokers) (`kafka_replication`).
        kafka_sasl_username, kafka_sasl_password: when both are set, the broker takes only
            SASL/PLAIN logins (listener SASL_PLAINTEXT) and every keyshift client logs in with
            them; None (the default) leaves the broker on PLAINTEXT.
        redis_host, redis_port: the coordinator's address.
        redis_password: when set, redis-server runs with `requirepass` and `redis_url` carries it;
            None (the default) runs it without a password.
        airflow_port: the Airflow API server and UI.
        airflow_user: the local Airflow's admin (simple auth manager, admin role).
        airflow_password: that admin's password; None (the default) uses the one `keyshift stack
            up` generated into the state directory (`keyshift.stack.airflow.admin_password`).
        spark_master: master URL for jobs (`local[*]`, or `spark://host:7077`).
        spark_driver_memory: the job driver's JVM heap (`spark.driver.memory`, e.g. `2g`, the
            default: `DEFAULT_DRIVER_MEMORY`); Airflow's launches pass
            it to spark-submit as `--driver-memory`.
        spark_class_archive: a job that starts its own driver JVM maps a class-data sharing
            archive of the classes an earlier run loaded, and the first run writes it
            (`keyshift.runtime.class_archive`); False: never.
        spark_cluster_host: the address the standalone cluster's master and workers bind to
            (`keyshift.stack.spark_cluster`); loopback by default.
        spark_master_port, spark_master_ui_port: the standalone master's port and web UI (the
            workers' UIs take the ports after it).
        spark_workers: workers of the standalone cluster. spark_worker_cores: cores each offers.
        spark_worker_memory: memory each offers to executors (`4g`).
        spark_executor_python: the interpreter a cluster's workers have, when not at the path of
            this venv's base interpreter: the packed executor environment links to it
            (`keyshift.stack.executor_env`); None: the base interpreter's path.
        hdfs_port: the NameNode port of the cluster stack's HDFS (`keyshift.stack.hdfs`), which
            also takes the five ports after it.
        s3_port: the port of the cluster stack's S3-compatible object store (`keyshift.stack.s3`).
        s3_endpoint: the S3 endpoint that `s3a://` checkpoint locations use (Hadoop's
            `fs.s3a.endpoint`, e.g. `http://127.0.0.1:9000` for the cluster stack's store, with
            path-style access); None (the default): AWS's own endpoints for the bucket's region.
        s3_access_key, s3_secret_key: S3A's credentials (`fs.s3a.access.key`/`secret.key`) when
            both are set; None (the default): S3A's default provider chain (AWS_* environment
            variables, a profile, the instance's or pod's role).
        partitions: P, the number of slots (Kafka partitions; Spark's stateful partitions are min(P, 1 per core)).
        monitor_interval_s: seconds between the scheduled runs of `keyshift_balance_monitor` (its
            schedule, read when the dag-processor parses the DAG, and the switch triggers' default
            horizon); 600 (the default) = every 10 minutes. A test stack shortens it.

    The defaults of the ports and of `partitions` are `infra/stack.env`'s.
    """

    model_config = SettingsConfigDict(env_prefix="KEYSHIFT_", frozen=True)

    home: Path = Field(default=PROJECT_ROOT / ".keyshift")
    cache_dir: Path | None = None
    runs_dir: Path = Field(default=PROJECT_ROOT / "runs")
    checkpoint_location: str | None = None
    kafka_host: str = "127.0.0.1"
    kafka_port: int = int(stack_value("KEYSHIFT_KAFKA_PORT"))
    kafka_controller_port: int = int(stack_value("KEYSHIFT_KAFKA_CONTROLLER_PORT"))
    kafka_bootstrap: str | None = None
    kafka_brokers: int = Field(default=1, ge=1, le=9)
    kafka_sasl_username: str | None = None
    kafka_sasl_password: SecretStr | None = None
    redis_host: str = "127.0.0.1"
    redis_port: int = int(stack_value("KEYSHIFT_REDIS_PORT"))
    redis_password: SecretStr | None = None
    airflow_port: int = int(stack_value("KEYSHIFT_AIRFLOW_PORT"))
    airflow_user: str = "admin"
    airflow_password: SecretStr | None = None
    spark_master: str = "local[*]"
    spark_driver_memory: str = DEFAULT_DRIVER_MEMORY
    spark_class_archive: bool = True
    spark_cluster_host: str = "127.0.0.1"
    spark_master_port: int = int(stack_value("KEYSHIFT_SPARK_MASTER_PORT"))
    spark_master_ui_port: int = int(stack_value("KEYSHIFT_SPARK_MASTER_UI_PORT"))
    spark_workers: int = Field(default=2, ge=1)
    spark_worker_cores: int = Field(default=1, ge=1)
    spark_worker_memory: str = "4g"
    spark_executor_python: str | None = None
    hdfs_port: int = int(stack_value("KEYSHIFT_HDFS_PORT"))
    s3_port: int = int(stack_value("KEYSHIFT_S3_PORT"))
    s3_endpoint: str | None = None
    s3_access_key: str | None = None
    s3_secret_key: SecretStr | None = None
    partitions: int = DEFAULT_PARTITIONS
    monitor_interval_s: float = Field(default=600.0, gt=0)

    @field_validator("kafka_bootstrap", "checkpoint_location", "s3_endpoint", "s3_access_key", "s3_secret_key", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: Any) -> Any:
        """An empty value (`KEYSHIFT_S3_ENDPOINT=`, as compose passes an unset variable) means unset."""
        return None if value == "" else value

    @field_serializer("kafka_sasl_password", "redis_password", "airflow_password", "s3_secret_key", when_used="json")
    def _reveal(self, value: SecretStr | None) -> str | None:
        return None if value is None else value.get_secret_value()

    @property
    def kafka_sasl(self) -> bool:
        """True when Kafka clients and the broker use SASL/PLAIN (username and password both set)."""
        return bool(self.kafka_sasl_username) and self.kafka_sasl_password is not None

    @property
    def cache(self) -> Path:
        """The cache directory (`cache_dir`, default `home/cache`)."""
        return self.cache_dir or self.home / "cache"

    @property
    def kafka_nodes(self) -> list[tuple[int, int, int]]:
        """The local Kafka nodes as (node id, client port, controller port): node 1 on
        `kafka_port`/`kafka_controller_port`, node i 10 * (i - 1) ports higher."""
        return [(i, self.kafka_port + 10 * (i - 1), self.kafka_controller_port + 10 * (i - 1))
                for i in range(1, self.kafka_brokers + 1)]

    @property
    def kafka_replication(self) -> tuple[int, int]:
        """(replication factor, `min.insync.replicas`) of keyshift's topics: (min(3, brokers),
        min(2, brokers)), Kafka's production advice on three brokers and (1, 1) on one."""
        return min(3, self.kafka_brokers), min(2, self.kafka_brokers)

    @property
    def bootstrap_servers(self) -> str:
        """Kafka bootstrap servers, `host:port[,host:port...]`: `kafka_bootstrap` when set, else
        every local node, so a client starts while one of them is down."""
        if self.kafka_bootstrap:
            return self.kafka_bootstrap
        return ",".join(f"{self.kafka_host}:{client}" for _, client, _ in self.kafka_nodes)

    @property
    def redis_url(self) -> str:
        """Redis URL of the coordinator, database 0, with the password when one is set.

        `redis://127.0.0.1:6379/0`, or `redis://:<password, URL-quoted>@127.0.0.1:6379/0`; give it
        to `redis.Redis.from_url` (which unquotes the password). Do not log it: see `redis_address`.
        """
        auth = ""
        if self.redis_password is not None:
            auth = f":{quote(self.redis_password.get_secret_value(), safe='')}@"
        return f"redis://{auth}{self.redis_host}:{self.redis_port}/0"

    SECRET_FIELDS: ClassVar[tuple[str, ...]] = ("kafka_sasl_password", "redis_password", "airflow_password", "s3_secret_key")
    """The passwords: never written where they are kept (an Airflow trigger's kwargs, a log)."""

    def without_secrets(self) -> dict[str, Any]:
        """These settings as JSON values without `SECRET_FIELDS`, for what gets stored: an Airflow
        trigger's kwargs go to Airflow's metadata database. `Settings(**values)` in the process
        that reads them back takes the passwords from its own `KEYSHIFT_*` environment."""
        return self.model_dump(mode="json", exclude=set(self.SECRET_FIELDS))

    @property
    def redis_address(self) -> str:
        """The coordinator's URL without the password, for messages and logs."""
        return f"redis://{self.redis_host}:{self.redis_port}/0"
