"""One frozen settings object, built at the edge (CLI, Airflow task) and passed down.

Values come from environment variables prefixed `KEYSHIFT_` (e.g. `KEYSHIFT_KAFKA_PORT=19092`),
else the defaults below. The core takes plain arguments or a `Settings`; it never reads globals.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

PROJECT_ROOT = Path(__file__).resolve().parents[1]
"""The repository checkout this package lives in (editable install)."""


class Settings(BaseSettings):
    """Where keyshift keeps its state and how it reaches the local stack.

    Attributes:
        home: state directory for services (pid files, logs, Kafka and Redis data, Airflow home).
        cache_dir: downloaded inputs (the flights data set, jars); reused across runs.
        runs_dir: one folder per job run: `runs/<run_id>/summary.json`, `windows/`, `progress.jsonl`.
        kafka_host, kafka_port, kafka_controller_port: the broker's loopback listeners.
        redis_host, redis_port: the coordinator's address. airflow_port: the Airflow API server and UI.
        airflow_user, airflow_password: the local Airflow's login (simple auth manager, admin role).
        spark_master: master URL for jobs (`local[*]`, or `spark://host:7077`).
        partitions: P, the number of slots (Kafka partitions = Spark shuffle partitions).
    """

    model_config = SettingsConfigDict(env_prefix="KEYSHIFT_", frozen=True)

    home: Path = Field(default=PROJECT_ROOT / ".keyshift")
    cache_dir: Path | None = None
    runs_dir: Path = Field(default=PROJECT_ROOT / "runs")
    kafka_host: str = "127.0.0.1"
    kafka_port: int = 9092
    kafka_controller_port: int = 9093
    redis_host: str = "127.0.0.1"
    redis_port: int = 6379
    airflow_port: int = 8080
    airflow_user: str = "admin"
    airflow_password: str = "admin"
    spark_master: str = "local[*]"
    partitions: int = 8

    @property
    def cache(self) -> Path:
        """The cache directory (`cache_dir`, default `home/cache`)."""
        return self.cache_dir or self.home / "cache"

    @property
    def bootstrap_servers(self) -> str:
        """Kafka bootstrap servers, `host:port`."""
        return f"{self.kafka_host}:{self.kafka_port}"

    @property
    def redis_url(self) -> str:
        """Redis URL of the coordinator, database 0."""
        return f"redis://{self.redis_host}:{self.redis_port}/0"
