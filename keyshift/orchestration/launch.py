"""Detached launch of a continuous job: a supervised driver process and its run record.

SparkSubmitOperator blocks until spark-submit exits and has no deferrable mode (DESIGN.md,
pitfalls), so a job that runs until stopped is started here instead: `spark-submit
spark_jobs/flight_delays.py --run-id ...` as a process supervised by `keyshift.stack.process`
with `runs/<run_id>/` as its home and `driver` as its name: its own session (neither the Airflow
task that launched it nor a signal to that task's process group takes it down), stdout and stderr
appended to `runs/<run_id>/logs/driver.log`, a pid file `runs/<run_id>/run/driver.pid` holding the
pid and the process's creation time (a recycled pid never counts), and its run record in the
Redis hash `names.redis_run_key(run_id)`:

| field | written by | meaning |
| --- | --- | --- |
| run_id, strategy, partitions, bound_ms, limit | launcher | what was asked |
| pid, pid_create_time, host | launcher (the job may overwrite `pid` with its Python driver's) | the process and its host |
| log_path | launcher | the driver log |
| state | launcher (`starting`), then the job (`running`, `succeeded`, `stopped`, `failed`) | lifecycle |
| started_at | launcher | ISO-8601 UTC |
| summary_path, finished_at | the job | its results |
| stop_requested_at | `stop_job` | a stop was asked for: a driver gone after this is not a crash |

The deferrable `JobProgressSensor` then watches the record (see `triggers.py`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import signal
import socket
import time
from datetime import UTC, datetime
from pathlib import Path

from keyshift import names
from keyshift.errors import JobError, StackError
from keyshift.orchestration import pipeline
from keyshift.settings import PROJECT_ROOT, Settings
from keyshift.stack import process
from keyshift.stack.spark import jars_option

log = logging.getLogger(__name__)

ACTIVE_STATES = frozenset({"starting", "running"})
"""Run states in which a live driver is expected."""

TERMINAL_STATES = frozenset({"succeeded", "stopped", "failed"})
"""Run states the job writes when it ends (`stopped`: a continuous run ended on SIGTERM/SIGINT)."""

DRIVER = pipeline.DRIVER_NAME
"""The supervised process's name under `runs/<run_id>/` (pid file `run/driver.pid`, log `logs/driver.log`)."""


@dataclasses.dataclass(frozen=True)
class LaunchedJob:
    """A detached driver process.

    Attributes:
        run_id: the keyshift run id. pid: the driver's process id (also its session and
        process group id). log_path: its stdout+stderr. command: the argv it runs.
        adopted: True when a live driver of this run id was already running and was reused
        rather than started twice (an Airflow retry of the launch task).
    """

    run_id: str
    pid: int
    log_path: Path
    command: tuple[str, ...]
    adopted: bool = False


def _utcnow_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def _redis(settings: Settings):
    import redis

    return redis.Redis.from_url(settings.redis_url, decode_responses=True, socket_timeout=10)


def spark_submit_binary() -> str:
    """Path of `spark-submit`: the environment's `bin/` first, then PATH.

    Raises:
        StackError: not found (install pyspark into the environment: `make env`).
    """
    candidate = pipeline.venv_bin() / pipeline.SPARK_SUBMIT
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    found = shutil.which(pipeline.SPARK_SUBMIT)
    if found:
        return found
    raise StackError(f"{pipeline.SPARK_SUBMIT} not found in {pipeline.venv_bin()} nor on PATH; run `make env`")


def driver_record(settings: Settings, run_id: str) -> process.ProcessRecord | None:
    """The pid-file record of the run's driver when that very process still runs, else None."""
    return process.running_record(pipeline.run_dir(settings, run_id), DRIVER)


def record_alive(settings: Settings, record: dict[str, str]) -> bool | None:
    """Whether the driver named by a Redis run record is alive, if this host can tell.

    The driver is alive when its pid file (`runs/<run_id>/run/driver.pid`) names a live process
    with the creation time recorded there (the spark-submit process leading the driver's session).
    The record's `pid` is not compared: the job overwrites it with its Python driver's pid, a
    child of that process.

    Returns:
        True/False for a record launched on this host with a pid; None when the record has no
        pid yet or was launched on another host (then only the job's `state` can be trusted).
    """
    if not record.get("pid") or not record.get("run_id"):
        return None
    if record.get("host") not in (None, "", socket.gethostname()):
        return None
    return driver_record(settings, record["run_id"]) is not None


def read_run_record(settings: Settings, run_id: str) -> dict[str, str]:
    """The Redis run record of `run_id` (empty dict if there is none).

    Raises:
        StackError: Redis cannot be reached (start it with `keyshift stack up`).
    """
    import redis

    client = _redis(settings)
    try:
        return client.hgetall(names.redis_run_key(run_id))
    except redis.RedisError as exc:
        raise StackError(f"cannot read run {run_id} from Redis at {settings.redis_url}: {exc}") from exc
    finally:
        client.close()


def launch_job(
    settings: Settings,
    run_id: str,
    *,
    strategy: str,
    partitions: int,
    bound_ms: int,
    limit: int | None = None,
    application: Path = pipeline.APPLICATION,
    startup_check_s: float = 3.0,
) -> LaunchedJob:
    """Start the job's driver detached, record it in Redis, and return without waiting.

    Idempotent per run id: if the record shows a live driver (state starting/running), it is
    adopted rather than started twice.

    Args:
        settings: Redis, runs folder and `spark_master`.
        run_id: keyshift run id (`pipeline.job_run_id`).
        strategy, partitions, bound_ms, limit: the job's arguments (`pipeline.spark_submit_args`).
        application: the Spark application file.
        startup_check_s: seconds to watch the new driver; a driver dead by then fails the launch.

    Returns:
        The `LaunchedJob`.

    Raises:
        JobError: the run already succeeded (choose another run id), or the driver died within
            `startup_check_s` (the message names the log and quotes its tail).
        StackError: Redis unreachable, or `spark-submit` missing.
    """
    import redis

    pipeline.validate_strategy(strategy)
    key = names.redis_run_key(run_id)
    home = pipeline.run_dir(settings, run_id)
    client = _redis(settings)
    try:
        existing = client.hgetall(key)
        live = driver_record(settings, run_id)
        if existing.get("state") in ACTIVE_STATES and live is not None:
            log.info("Run %s already has a live driver (pid %d); adopting it", run_id, live.pid)
            return LaunchedJob(run_id, live.pid, Path(live.log_file), live.argv, adopted=True)
        if existing.get("state") == "succeeded":
            raise JobError(f"run {run_id} already succeeded (record {key}); launch with a new run id")
        if existing:
            log.warning("Run %s has a stale record (state %s, no live driver); launching again",
                        run_id, existing.get("state"))

        argv = (
            spark_submit_binary(), "--master", settings.spark_master, "--name", f"keyshift-{run_id}",
            "--jars", jars_option(settings),  # the driver JVM exists before the job's code runs
            str(application),
            *pipeline.spark_submit_args(run_id, strategy, partitions, bound_ms, limit),
        )
        log_path = pipeline.driver_log_path(settings, run_id)
        client.delete(key)
        client.hset(key, mapping={
            "run_id": run_id, "state": "starting", "log_path": str(log_path),
            "strategy": strategy, "partitions": str(partitions), "bound_ms": str(bound_ms),
            "limit": "" if limit is None else str(limit), "started_at": _utcnow_iso(),
            "host": socket.gethostname(),
        })
        started = process.start(home, DRIVER, argv, env={**os.environ, **pipeline.spark_env()}, cwd=PROJECT_ROOT)
        client.hset(key, mapping={"pid": str(started.pid), "pid_create_time": repr(started.create_time)})
        log.info("Launched run %s: driver pid %d, log %s", run_id, started.pid, log_path)

        deadline = time.monotonic() + startup_check_s
        while time.monotonic() < deadline:
            if not process.is_running(home, DRIVER):
                client.hset(key, mapping={"state": "failed", "finished_at": _utcnow_iso()})
                raise JobError(
                    f"driver of run {run_id} exited within {startup_check_s:.0f} s of its start; "
                    f"see {log_path}:\n{process.tail(log_path)}"
                )
            time.sleep(0.2)
        return LaunchedJob(run_id, started.pid, log_path, argv)
    except redis.RedisError as exc:
        raise StackError(f"cannot record run {run_id} in Redis at {settings.redis_url}: {exc}") from exc
    finally:
        client.close()


def stop_job(settings: Settings, run_id: str, timeout_s: float = 60.0) -> bool:
    """Stop a detached driver gracefully: SIGTERM to the job's Python driver, then its group.

    The job stops at a batch boundary on SIGTERM and writes its summary (state `stopped`); the
    spark-submit JVM that leads the session then exits by itself. Signalling the whole group at
    once would take the JVM down under the Python driver mid-stop, so the Python driver (the
    record's `pid`, written by the job) is signalled first, and only if it is a member of the
    driver's session. Whatever still runs after `timeout_s` is stopped by
    `keyshift.stack.process.stop` (SIGTERM to the group, SIGKILL after another `timeout_s`).
    `stop_requested_at` is recorded first, so the monitor reads the driver's end as requested.

    Args:
        settings: Redis and the runs folder. run_id: the run. timeout_s: seconds to wait at each
            step.

    Returns:
        True if a live driver was stopped, False if there was none (already ended, or unknown).

    Raises:
        StackError: Redis unreachable.
    """
    live = driver_record(settings, run_id)
    if live is None:
        log.info("Run %s has no live driver to stop", run_id)
        return False
    client = _redis(settings)
    try:
        key = names.redis_run_key(run_id)
        client.hset(key, "stop_requested_at", _utcnow_iso())
        job_pid = int(client.hget(key, "pid") or 0)
    finally:
        client.close()
    if job_pid and job_pid != live.pid and _in_session(job_pid, live.pid):
        log.info("Stopping run %s: SIGTERM to its Python driver %d", run_id, job_pid)
        os.kill(job_pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and driver_record(settings, run_id) is not None:
            time.sleep(0.5)
    if driver_record(settings, run_id) is not None:
        log.info("Stopping run %s: SIGTERM to the process group of %d", run_id, live.pid)
    process.stop(pipeline.run_dir(settings, run_id), DRIVER, timeout_s=timeout_s)
    log.info("Run %s stopped", run_id)
    return True


def _in_session(pid: int, session_id: int) -> bool:
    """Whether live process `pid` belongs to the session led by `session_id` (never signal strangers)."""
    try:
        return os.getsid(pid) == session_id
    except (ProcessLookupError, PermissionError):
        return False
