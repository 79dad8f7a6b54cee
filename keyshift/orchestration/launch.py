"""Detached launch of a continuous job: a supervisor, its restartable driver, and the run record.

SparkSubmitOperator blocks until spark-submit exits and has no deferrable mode (DESIGN.md,
pitfalls), so a job that runs until stopped is started here instead. `launch_job` starts a small
supervisor process (`python -m keyshift.orchestration.supervisor`, supervised by
`keyshift.stack.process` with `runs/<run_id>/` as its home and `supervisor` as its name), and the
supervisor runs `spark-submit spark_jobs/keyshift_job.py --run-id ...` as its child, named
`driver`. Each of the two leads its own session: neither the Airflow task that launched them nor a
signal to its process group takes them down, and a driver that kills its own group (a crash test's
`kill -9 -<pgid>`, a failpoint) leaves the supervisor alive. Files under `runs/<run_id>/`: the
driver's stdout and stderr appended to `logs/driver.log` across attempts, the supervisor's to
`logs/supervisor.log`; pid files `run/driver.pid` and `run/supervisor.pid` (the pid and the
process's creation time: a recycled pid never counts); the supervisor's spec `run/supervisor.json`.

When the driver dies (non-zero exit or a signal) without a stop having been requested, the
supervisor restarts it from its checkpoint (`--resume RUN_ID`) after `restart_delay_s` seconds, at
most `max_restarts` times: Flink's fixed-delay restart strategy (see `supervisor.py`). The run
record is the Redis hash `names.redis_run_key(run_id)`, typed as `keyshift.runs.RunRecord` (every
writer encodes its fields with `RunRecord.encode`, which refuses an undeclared one):

| field | written by | meaning |
| --- | --- | --- |
| run_id, job, strategy, partitions, bound_ms, limit, topic | launcher | what was asked |
| max_restarts, restart_delay_s | launcher | the restart policy (restarts; seconds) |
| supervisor_pid, supervisor_pid_create_time, supervisor_log_path | launcher | the supervisor |
| pid, pid_create_time, host | supervisor, per attempt (the job overwrites `pid` with its Python driver's) | the driver process and its host |
| attempt | supervisor | the driver's current attempt (1 = the first run) |
| restarts, restart_history, last_exit | supervisor | restarts so far; a JSON list of `{restart, at, exit_code, signal, signal_name, delay_s, from, log_path, error}`; how the last driver ended |
| resumes | the job (`--resume`) | times the job resumed from its checkpoint (= restarts from a checkpoint) |
| log_path | launcher | the driver log |
| state | launcher (`starting`), the job (`running`, `succeeded`, `stopped`, `failed`), the supervisor (`restarting` during the delay; `failed` past the limit; `stopped` if a stopped driver wrote nothing) | lifecycle |
| error | the job, or the supervisor past the limit (naming the driver log) | why it failed |
| started_at | launcher, then the job | start time |
| summary_path, finished_at | the job (the supervisor when it ends the run) | its results |
| stop_requested_at, stop_timeout_s | `stop_job` | a stop was asked for: a driver gone after this is not a crash and is not restarted |

The deferrable `JobProgressSensor` then watches the record (see `triggers.py`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import signal
import socket
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from keyshift import names
from keyshift.errors import JobError, StackError
from keyshift.orchestration import pipeline
from keyshift.runs import ACTIVE_STATES, TERMINAL_STATES, RunRecord, read_run_record  # noqa: F401 (launch.read_run_record)
from keyshift.orchestration.supervisor import SUPERVISOR_NAME, RestartPolicy, SupervisorSpec, driver_record, spec_path, stop_driver
from keyshift.settings import PROJECT_ROOT, Settings
from keyshift.stack import process
from keyshift.stack import executor_env
from keyshift.stack.spark import is_local_master, jars_option, loopback_env, worker_spark_home_env

log = logging.getLogger(__name__)

DRIVER = pipeline.DRIVER_NAME
"""The driver's process name under `runs/<run_id>/` (pid file `run/driver.pid`, log `logs/driver.log`)."""

SUPERVISOR = SUPERVISOR_NAME
"""The supervisor's process name under `runs/<run_id>/` (pid file `run/supervisor.pid`, log `logs/supervisor.log`)."""


@dataclasses.dataclass(frozen=True)
class LaunchedJob:
    """A detached, supervised driver.

    Attributes:
        run_id: the keyshift run id. pid: the driver's process id (also its session and
        process group id; the spark-submit process). log_path: its stdout+stderr. command: the
        argv of its first start. adopted: True when a live run of this run id was already running
        and was reused rather than started twice (an Airflow retry of the launch task).
        supervisor_pid: the supervisor's process id (None for a run launched without one).
    """

    run_id: str
    pid: int
    log_path: Path
    command: tuple[str, ...]
    adopted: bool = False
    supervisor_pid: int | None = None


def _utcnow_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def _redis(settings: Settings):
    import redis

    return redis.Redis.from_url(settings.redis_url, decode_responses=True, socket_timeout=10)


def settings_env(settings: Settings) -> dict[str, str]:
    """`KEYSHIFT_*` variables that rebuild `settings` in a child process (`Settings()` reads them).

    The supervisor and the driver are separate processes that build their own `Settings`; these
    make them use the launcher's runs folder, Redis and broker even when the launcher was given
    settings other than its environment's. Unset (None) fields are left out.
    """
    return {
        f"KEYSHIFT_{name.upper()}": str(value)
        for name, value in settings.model_dump(mode="json").items()
        if value is not None
    }


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


def supervisor_record(settings: Settings, run_id: str) -> process.ProcessRecord | None:
    """The pid-file record of the run's supervisor when that very process still runs, else None."""
    return process.running_record(pipeline.run_dir(settings, run_id), SUPERVISOR)


def record_alive(settings: Settings, record: dict[str, str]) -> bool | None:
    """Whether the run named by a Redis run record still has a live process, if this host can tell.

    Alive means its supervisor (`runs/<run_id>/run/supervisor.pid`) or its driver
    (`run/driver.pid`) names a live process with the creation time recorded there: between two
    attempts only the supervisor lives, and a driver outlives a supervisor killed on its own. The
    record's `pid` is not compared: the job overwrites it with its Python driver's pid, a child of
    the spark-submit process.

    Returns:
        True/False for a record launched on this host with a pid; None when the record has no
        pid yet or was launched on another host (then only the job's `state` can be trusted).
    """
    if not (record.get("pid") or record.get("supervisor_pid")) or not record.get("run_id"):
        return None
    if record.get("host") not in (None, "", socket.gethostname()):
        return None
    run_id = record["run_id"]
    return supervisor_record(settings, run_id) is not None or driver_record(settings, run_id) is not None


def _address(settings: Settings) -> str:
    """Redis's address for messages, without a password."""
    return getattr(settings, "redis_address", None) or f"redis://{settings.redis_host}:{settings.redis_port}/0"


def launch_job(
    settings: Settings,
    run_id: str,
    *,
    strategy: str,
    partitions: int,
    bound_ms: int,
    limit: int | None = None,
    topic: str | None = None,
    max_offsets_per_trigger: int | None = None,
    watermark: str | None = None,
    job: str | None = None,
    exchange: str | None = None,
    policy: RestartPolicy = RestartPolicy(),
    application: Path = pipeline.APPLICATION,
    startup_check_s: float = 3.0,
) -> LaunchedJob:
    """Start the job's supervisor and driver detached, record them in Redis, return without waiting.

    Idempotent per run id: a run whose supervisor is alive, or whose record says
    starting/running/restarting with its driver alive, is adopted rather than started twice.

    Args:
        settings: Redis, runs folder and `spark_master`; handed to the supervisor and the driver
            as `KEYSHIFT_*` variables (`settings_env`).
        run_id: keyshift run id (`pipeline.job_run_id`).
        strategy, partitions, bound_ms, limit, topic, max_offsets_per_trigger, watermark, job,
            exchange: the job's arguments (`pipeline.spark_submit_args`; None: the job's default; `job` one of
            `pipeline.JOBS`, default flight_delays, and `topic` None means that job's input topic).
        policy: the restart policy (`max_restarts` restarts, `restart_delay_s` seconds apart).
        application: the Spark application file (it must accept `--run-id …` and `--resume RUN_ID`).
        startup_check_s: seconds to watch the first attempt; a driver dead by then (or a
            supervisor dead) fails the launch without a restart: a driver that cannot even start
            will not start on a second try either.

    Returns:
        The `LaunchedJob`.

    Raises:
        JobError: the run already succeeded (choose another run id), a process of the run is
            alive but its record does not say it runs (stop it with `stop_job` first), or the
            first attempt died within `startup_check_s` (the message names the log and quotes
            its tail).
        StackError: Redis unreachable, or `spark-submit` missing.
    """
    import redis

    job = pipeline.validate_job(job)
    pipeline.validate_strategy(strategy, job)
    pipeline.validate_exchange(exchange, watermark)
    topic = topic or pipeline.job_topic(job)
    key = names.redis_run_key(run_id)
    home = pipeline.run_dir(settings, run_id)
    client = _redis(settings)
    try:
        stored = client.hgetall(key)
        existing = RunRecord.from_redis(stored)
        live, supervisor = driver_record(settings, run_id), supervisor_record(settings, run_id)
        # a live supervisor owns the run whatever the state says (a dying job writes `failed`
        # just before its supervisor restarts it)
        if supervisor is not None or (existing.active and live is not None):
            pid = live.pid if live is not None else existing.pid or 0
            log.info("Run %s already runs (driver pid %s, supervisor pid %s); adopting it", run_id,
                     live.pid if live else None, supervisor.pid if supervisor else None)
            command = live.argv if live is not None else supervisor.argv
            return LaunchedJob(run_id, pid, pipeline.driver_log_path(settings, run_id), command, adopted=True,
                               supervisor_pid=supervisor.pid if supervisor else None)
        if existing.state == "succeeded":
            raise JobError(f"run {run_id} already succeeded (record {key}); launch with a new run id")
        if (live or supervisor) is not None:
            alive = live or supervisor
            raise JobError(
                f"run {run_id} has a live {alive.name} (pid {alive.pid}) while its record says state "
                f"{existing.state!r}; stop it with keyshift.orchestration.launch.stop_job first"
            )
        if stored:
            log.warning("Run %s has a stale record (state %s, no live driver); launching again",
                        run_id, existing.state)

        java_options = pipeline.driver_java_options(settings)  # the driver's class archive, when one exists
        base = (
            spark_submit_binary(), "--master", settings.spark_master, "--name", f"keyshift-{run_id}",
            "--driver-memory", settings.spark_driver_memory,
            "--jars", jars_option(settings),  # the driver JVM exists before the job's code runs
            *(("--driver-java-options", java_options) if java_options else ()),
            str(application),
        )
        argv = (*base, *pipeline.spark_submit_args(run_id, strategy, partitions, bound_ms, limit, topic=topic,
                                                   max_offsets_per_trigger=max_offsets_per_trigger, watermark=watermark,
                                                   job=job, exchange=exchange))
        # on a cluster the driver's Python setting is the executors' relative path: the driver
        # runs in a folder where it names this venv (keyshift.stack.executor_env.driver_folder)
        cwd = PROJECT_ROOT if is_local_master(settings.spark_master) else executor_env.driver_folder(home)
        spec = SupervisorSpec(run_id=run_id, argv=argv, resume_argv=(*base, *pipeline.resume_args(run_id)),
                              policy=policy, cwd=str(cwd))
        spec.write(spec_path(home))
        process.pid_file(home, DRIVER).unlink(missing_ok=True)  # a dead attempt's: not this launch's driver
        log_path = pipeline.driver_log_path(settings, run_id)
        client.delete(key)
        client.hset(key, mapping=RunRecord.encode(
            run_id=run_id, state="starting", log_path=log_path, job=job, strategy=strategy, partitions=partitions,
            bound_ms=bound_ms, watermark=watermark or "global", limit="" if limit is None else limit, topic=topic or "",
            started_at=_utcnow_iso(), host=socket.gethostname(), max_restarts=policy.max_restarts,
            restart_delay_s=policy.restart_delay_s, restarts=0, restart_history=[], attempt=0,
            supervisor_log_path=process.log_file(home, SUPERVISOR),
        ))
        supervisor = process.start(
            home, SUPERVISOR, (sys.executable, "-m", "keyshift.orchestration.supervisor", "--spec", str(spec_path(home))),
            # a local driver binds to loopback unless SPARK_LOCAL_IP is set (keyshift.stack.spark)
            env={**loopback_env(settings), **os.environ, **pipeline.spark_env(), **settings_env(settings),
                 **worker_spark_home_env(settings.cache)},  # the driver's Python workers import pyspark with its bytecode
            cwd=PROJECT_ROOT,
        )
        client.hset(key, mapping=RunRecord.encode(supervisor_pid=supervisor.pid,
                                                  supervisor_pid_create_time=repr(supervisor.create_time)))
        log.info("Launched run %s: supervisor pid %d (max_restarts %d, restart_delay_s %g), driver log %s",
                 run_id, supervisor.pid, policy.max_restarts, policy.restart_delay_s, log_path)
        driver = _check_first_attempt(settings, client, run_id, startup_check_s)
        log.info("Run %s: driver pid %d", run_id, driver.pid)
        return LaunchedJob(run_id, driver.pid, log_path, argv, supervisor_pid=supervisor.pid)
    except redis.RedisError as exc:
        raise StackError(f"cannot record run {run_id} in Redis at {_address(settings)}: {exc}") from exc
    finally:
        client.close()


_DRIVER_START_LIMIT_S = 60.0
"""Seconds the launch waits at most for the supervisor to start the first driver."""


def _check_first_attempt(settings: Settings, client, run_id: str, startup_check_s: float) -> process.ProcessRecord:
    """Watch the first attempt for `startup_check_s` seconds (and until its driver exists).

    Returns:
        The driver's pid-file record.

    Raises:
        JobError: the supervisor died, or the first driver ended (the supervisor recorded a
            restart, or the run failed) within the window; the launch then stops the
            supervisor and marks the run `failed`, naming the log.
    """
    key, home = names.redis_run_key(run_id), pipeline.run_dir(settings, run_id)
    log_path = pipeline.driver_log_path(settings, run_id)
    started = time.monotonic()
    driver = None
    while True:
        record = RunRecord.from_redis(client.hgetall(key))
        failed = (record.restarts > 0 or record.state == "failed"
                  or supervisor_record(settings, run_id) is None)
        if failed:
            process.stop(home, SUPERVISOR, timeout_s=10)
            process.stop(home, DRIVER, timeout_s=10)
            client.hset(key, mapping=RunRecord.encode(state="failed", finished_at=_utcnow_iso()))
            waited = time.monotonic() - started
            supervisor_log = process.log_file(home, SUPERVISOR)
            raise JobError(
                f"driver of run {run_id} exited within {waited:.0f} s of its start; see {log_path} "
                f"(supervisor: {supervisor_log}):\n{process.tail(log_path)}"
            )
        driver = driver_record(settings, run_id) or driver
        waited = time.monotonic() - started
        if waited >= startup_check_s and driver is not None:
            return driver
        if waited >= max(startup_check_s, _DRIVER_START_LIMIT_S):
            process.stop(home, SUPERVISOR, timeout_s=10)
            raise JobError(f"the supervisor of run {run_id} started no driver within {waited:.0f} s; "
                           f"see {process.log_file(home, SUPERVISOR)}")
        time.sleep(0.2)


def stop_job(settings: Settings, run_id: str, timeout_s: float = 60.0) -> bool:
    """Stop a detached run gracefully, and make sure it is not restarted.

    `stop_requested_at` (and `stop_timeout_s`) is recorded first, so neither the supervisor nor
    the monitor reads the driver's end as a crash. Then SIGTERM goes to the supervisor, which stops
    the driver gracefully (`stop_driver`) and exits without a restart; this waits for it. A driver
    still alive after that (a run without a supervisor, or one whose supervisor was killed) is
    stopped here with `stop_driver`.

    Args:
        settings: Redis and the runs folder. run_id: the run. timeout_s: seconds to wait at each
            step of the driver's stop (the supervisor gets twice that plus 30 s in all).

    Returns:
        True if a live supervisor or driver was stopped, False if there was none (already ended,
        or unknown).

    Raises:
        StackError: Redis unreachable.
    """
    supervisor, live = supervisor_record(settings, run_id), driver_record(settings, run_id)
    if supervisor is None and live is None:
        log.info("Run %s has no live supervisor or driver to stop", run_id)
        return False
    client = _redis(settings)
    try:
        client.hset(names.redis_run_key(run_id), mapping=RunRecord.encode(stop_requested_at=_utcnow_iso(), stop_timeout_s=timeout_s))
    finally:
        client.close()
    home = pipeline.run_dir(settings, run_id)
    if supervisor is not None:
        log.info("Stopping run %s: SIGTERM to its supervisor %d", run_id, supervisor.pid)
        try:
            os.kill(supervisor.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + 2 * timeout_s + 30
        while time.monotonic() < deadline and supervisor_record(settings, run_id) is not None:
            time.sleep(0.5)
        if supervisor_record(settings, run_id) is not None:
            log.warning("The supervisor of run %s did not exit; stopping it", run_id)
        process.stop(home, SUPERVISOR, timeout_s=10)  # also drops its pid file
    if driver_record(settings, run_id) is not None:
        stop_driver(settings, run_id, timeout_s)
    log.info("Run %s stopped", run_id)
    return True
