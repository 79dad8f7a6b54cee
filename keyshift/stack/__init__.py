"""The local stack: Kafka, Redis and Airflow started, checked and stopped by keyshift; Spark's jars.

Each service module (`kafka`, `redis`, `airflow`) has the same functions: `start(settings)` (start
what is down, without waiting), `wait_healthy(settings, timeout_s=...)`, `is_healthy(settings)`,
`stop(settings)` (only what keyshift started, by pid file) and `status(settings)`. This module
runs them together; `keyshift stack up|down|status|fetch` is its command line.

Everything lives under `settings.home` (default `.keyshift/` in the checkout): `run/*.pid`,
`logs/*.log`, `kafka/`, `redis/`, `airflow/`; jars under `settings.cache`.
"""

from __future__ import annotations

import fcntl
import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

from keyshift.errors import ConfigurationError, StackError
from keyshift.settings import Settings
from keyshift.stack.service import ServiceStatus

log = logging.getLogger("keyshift.stack")

SERVICES = ("redis", "kafka", "airflow")
"""The services `keyshift stack up` starts, in start order (Airflow, the slowest, last)."""
CLUSTER_SERVICES = ("hdfs", "s3", "spark")
"""Services started only when asked for (`keyshift stack up --cluster`, or `--only hdfs,s3,spark`):
an HDFS and an S3-compatible object store for checkpoints (`keyshift.stack.hdfs`,
`keyshift.stack.s3`) and a Spark standalone master and workers
(`keyshift.stack.spark_cluster`)."""
START_ORDER = ("redis", "kafka", "hdfs", "s3", "spark", "airflow")
"""Every service in start order."""
DEFAULT_TIMEOUT_S = 300.0
"""Seconds `up` waits for each service to become healthy, counted from its start."""


def service_module(name: str) -> ModuleType:
    """The module that runs service `name` (`keyshift.stack.kafka`, ...).

    Raises:
        ConfigurationError: for a name not in SERVICES.
    """
    from keyshift.stack import airflow, hdfs, kafka, redis, s3, spark_cluster

    modules = {"kafka": kafka, "redis": redis, "airflow": airflow, "hdfs": hdfs, "s3": s3, "spark": spark_cluster}
    if name not in modules:
        raise ConfigurationError(f"unknown service {name!r}; choose from {', '.join(START_ORDER)}")
    return modules[name]


def select(only: Iterable[str] | str | None, *, cluster: bool = False) -> tuple[str, ...]:
    """The services to act on, in start order (`START_ORDER`): `SERVICES` for None or '' (and
    `CLUSTER_SERVICES` with `cluster`), else those named.

    Args:
        only: service names, as an iterable or a comma-separated string (`"kafka,redis"`).
        cluster: add the cluster services to the default set.

    Raises:
        ConfigurationError: when a name is not a service.
    """
    default = SERVICES + (CLUSTER_SERVICES if cluster else ())
    if only is None:
        names = list(default)
    else:
        names = [n.strip() for n in (only.split(",") if isinstance(only, str) else only)]
        names = [n for n in names if n] or list(default)
    unknown = sorted(set(names) - set(START_ORDER))
    if unknown:
        raise ConfigurationError(
            f"unknown service(s) {', '.join(unknown)}; choose from {', '.join(START_ORDER)}"
        )
    return tuple(n for n in START_ORDER if n in names)


def _wait_healthy(name: str, settings: Settings, started: float, timeout_s: float) -> float:
    remaining = max(1.0, timeout_s - (time.monotonic() - started))
    service_module(name).wait_healthy(settings, timeout_s=remaining)
    return time.monotonic() - started


@contextmanager
def _stack_lock(settings: Settings) -> Iterator[None]:
    """Serialise `up` and `down` across processes (two `make test` runs at once, say)."""
    path = settings.home / "run" / "stack.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def fetch(settings: Settings) -> dict[str, list[Path]]:
    """Fetch the Kafka broker's jars and Spark's Kafka connector jars, once; start nothing.

    Returns:
        `{"kafka": [...jars], "spark": [...jars]}`.

    Raises:
        StackError: when Maven is missing or fails.
    """
    from keyshift.stack import kafka, spark

    return {"kafka": kafka.fetch(settings), "spark": spark.connector_jars(settings)}


def up(
    settings: Settings,
    only: Iterable[str] | str | None = None,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    cluster: bool = False,
) -> dict[str, float]:
    """Start the services that are down and wait until every selected one is healthy.

    Services already running (keyshift's, or another's answering on the same address) are reused.
    The services start one after another (Redis, Kafka, Airflow); each one's health is awaited
    in the background from its start on, so they boot side by side.

    Args:
        settings: the stack's settings.
        only: services to act on (see `select`); None for all.
        timeout_s: seconds each service may take to become healthy, counted from its start.
        cluster: also start the cluster services (`CLUSTER_SERVICES`) when `only` is None.

    Returns:
        Per service, the seconds from its start call until it answered healthy.

    Raises:
        StackError: when a service cannot start or is not healthy in time; the message names its
            log file.
        ConfigurationError: for an unknown service name.
    """
    names = select(only, cluster=cluster)
    took: dict[str, float] = {}
    waits: dict[str, Future[float]] = {}
    with _stack_lock(settings), ThreadPoolExecutor(max_workers=len(names)) as pool:
        for name in names:  # start one after another, await health side by side
            started = time.monotonic()
            service_module(name).start(settings)
            waits[name] = pool.submit(_wait_healthy, name, settings, started, timeout_s)
        errors = []
        for name, future in waits.items():
            try:
                took[name] = future.result()
                log.info("%s is healthy (%.1f s after its start)", name, took[name])
            except Exception as exc:  # noqa: BLE001 - every wait ends; the first error is raised
                errors.append(exc)
        if errors:
            raise errors[0]
    return took


def down(settings: Settings, only: Iterable[str] | str | None = None) -> list[str]:
    """Stop the services keyshift started (by pid file), in reverse start order; with `only`
    None, the cluster services too.

    Returns:
        The names of the services that had something running and were stopped.

    Raises:
        ConfigurationError: for an unknown service name.
    """
    stopped = []
    with _stack_lock(settings):
        for name in reversed(select(only, cluster=only is None)):
            if service_module(name).stop(settings):
                stopped.append(name)
    return stopped


def require(settings: Settings, *names: str) -> None:
    """Fail fast, with the fix, unless each named service answers (no names: all of them).

    `kafka`: something accepts connections at `settings.bootstrap_servers` (a TCP connect, under
    a second; the client that follows reports a refused login). `redis`: the coordinator answers
    PING with the settings' password (`keyshift.stack.redis.check_server`). `airflow`: the health
    endpoint answers.

    Raises:
        StackError: the first service that does not answer, with `keyshift stack up` (or the
            setting to fix) in the message.
        ConfigurationError: for an unknown service name.
    """
    select(names)  # known names only
    for name in names or SERVICES:  # in the order given: the first one down is reported
        if name == "kafka":
            from keyshift.stack.kafka import check_broker

            check_broker(settings)
        elif name == "redis":
            from keyshift.stack.redis import check_server

            check_server(settings)
        elif name == "spark":
            from keyshift.stack import spark_cluster

            if not spark_cluster.is_healthy(settings):
                raise StackError(f"no Spark master with {settings.spark_workers} worker(s) answers at "
                                 f"{spark_cluster.master_url(settings)}; start it with `keyshift stack up --cluster`")
        elif name == "hdfs":
            from keyshift.stack import hdfs

            if not hdfs.is_healthy(settings):
                raise StackError(f"no HDFS answers at {hdfs.url(settings)}; start it with `keyshift stack up --only hdfs`")
        elif name == "s3":
            from keyshift.stack import s3

            if not s3.is_healthy(settings):
                raise StackError(f"no S3 server with bucket {s3.BUCKET} answers at {s3.endpoint(settings)}; "
                                 "start it with `keyshift stack up --only s3`")
        else:
            from keyshift.stack import airflow

            try:
                airflow.health(settings, timeout_s=5.0)
            except StackError as exc:
                raise StackError(f"{exc}; start it with `keyshift stack up`") from exc


def status(settings: Settings, only: Iterable[str] | str | None = None) -> list[ServiceStatus]:
    """The state, address and processes of each selected service, in start order; with `only`
    None, the cluster services when any of their processes has a pid file."""
    from keyshift.stack import hdfs, process, s3, spark_cluster

    running_cluster = only is None and any(process.read_record(settings.home, name) is not None
                                           for name in (spark_cluster.MASTER, hdfs.NAME, s3.NAME))
    return [service_module(name).status(settings) for name in select(only, cluster=running_cluster)]
