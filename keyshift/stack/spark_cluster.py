"""A Spark standalone cluster on loopback: one master and `spark_workers` workers, started by keyshift.

Not part of the default stack: `keyshift stack up --only spark` (or `KEYSHIFT_SPARK_MASTER=
spark://127.0.0.1:<port>` and `keyshift stack up --cluster`) starts it. It runs pyspark's own
`bin/spark-class` with Spark's documented main classes (Spark's "Spark Standalone Mode"):

    spark-class org.apache.spark.deploy.master.Master --host 127.0.0.1 --port 7077 --webui-port 8091
    spark-class org.apache.spark.deploy.worker.Worker spark://127.0.0.1:7077 --host 127.0.0.1 \\
        --cores 1 --memory 4g --webui-port 8092 --work-dir <home>/spark/worker-0

each with `SPARK_LOCAL_IP=127.0.0.1`, one pid file and log per process (`spark-master`,
`spark-worker-0`, ...). The master's web UI answers `GET /json` with its state and its alive
workers: the service is healthy when the master is ALIVE with every worker registered.

The workers start executors for whatever driver connects; which Python those run is the
driver's choice (`spark.pyspark.python`), not the worker's.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import requests

from keyshift.errors import StackError
from keyshift.settings import Settings
from keyshift.stack import process
from keyshift.stack.spark import SPARK_VERSION
from keyshift.stack.service import BLOCKED, EXTERNAL, HEALTHY, STOPPED, UNHEALTHY, ProcessState, ServiceStatus

log = logging.getLogger("keyshift.stack.spark_cluster")

NAME = "spark"
"""The service's name (`keyshift stack up --only spark`)."""
MASTER = "spark-master"
"""The master's process name (pid file `run/spark-master.pid`, log `logs/spark-master.log`)."""
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


def worker_name(index: int) -> str:
    """Process name of worker `index` (0-based): `spark-worker-<index>`."""
    return f"spark-worker-{index}"


def master_url(settings: Settings) -> str:
    """The master's URL for drivers and workers: `spark://127.0.0.1:<spark_master_port>`."""
    return f"spark://{settings.spark_cluster_host}:{settings.spark_master_port}"


def master_ui(settings: Settings) -> str:
    """The master's web UI: `http://127.0.0.1:<spark_master_ui_port>`."""
    return f"http://{settings.spark_cluster_host}:{settings.spark_master_ui_port}"


def spark_home() -> Path:
    """pyspark's installation, the SPARK_HOME of the cluster (its `bin/spark-class` and `jars/`).

    Raises:
        StackError: pyspark is not installed in this environment.
    """
    try:
        import pyspark
    except ImportError as exc:  # pragma: no cover - pyspark is a dependency
        raise StackError("pyspark is not installed; run `make env`") from exc
    return Path(pyspark.__file__).parent


def _environment(settings: Settings) -> dict[str, str]:
    """The workers' environment: this one without keyshift's venv (no `VIRTUAL_ENV`, its `bin/`
    off `PATH`, no `PYTHONPATH` or `PYSPARK_PYTHON`), so executors find only what the driver
    ships them, as on a cluster whose workers have a bare interpreter."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}
    venv_bin = str(Path(sys.prefix) / "bin")
    env["PATH"] = os.pathsep.join(d for d in env.get("PATH", "").split(os.pathsep) if d and d != venv_bin)
    env.update({"SPARK_HOME": str(spark_home()), "SPARK_LOCAL_IP": settings.spark_cluster_host,
                "SPARK_NO_DAEMONIZE": "1", "SPARK_LOG_DIR": str(process.log_dir(settings.home))})
    return env


def master_argv(settings: Settings) -> list[str]:
    """The master's command line (module docstring)."""
    return [str(spark_home() / "bin" / "spark-class"), MASTER_CLASS, "--host", settings.spark_cluster_host,
            "--port", str(settings.spark_master_port), "--webui-port", str(settings.spark_master_ui_port)]


def worker_argv(settings: Settings, index: int) -> list[str]:
    """Worker `index`'s command line: `spark_worker_cores` cores, `spark_worker_memory`, its web
    UI on the port after the master's plus `index`, its work folder under `<home>/spark/`."""
    return [str(spark_home() / "bin" / "spark-class"), WORKER_CLASS, master_url(settings), "--host", settings.spark_cluster_host,
            "--cores", str(settings.spark_worker_cores), "--memory", settings.spark_worker_memory,
            "--webui-port", str(settings.spark_master_ui_port + 1 + index), "--work-dir", str(work_dir(settings, index))]


def work_dir(settings: Settings, index: int) -> Path:
    """Worker `index`'s work folder (executors' files and logs): `<home>/spark/worker-<index>`."""
    return settings.home / "spark" / f"worker-{index}"


def master_state(settings: Settings, *, timeout_s: float = 2.0) -> dict:
    """The master's `GET /json`: `status` (`ALIVE`), `aliveworkers`, `cores`, `workers`, ...

    Raises:
        StackError: the web UI does not answer with JSON.
    """
    try:
        response = requests.get(f"{master_ui(settings)}/json", timeout=timeout_s)
        response.raise_for_status()
        return response.json()
    except (requests.RequestException, ValueError) as exc:
        raise StackError(f"the Spark master's UI at {master_ui(settings)} does not answer ({exc})") from exc


def master_cores(settings: Settings, master: str | None = None, *, timeout_s: float = 2.0) -> int | None:
    """The task slots a job on `master` (default `settings.spark_master`) gets, before its
    session starts: `local_master_cores` for a local master; for a standalone master
    (`spark://host:port`), the cores of its alive workers from its web UI's `GET /json`
    (`http://host:<spark_master_ui_port>/json`, Spark's "Spark Standalone Mode" monitoring),
    as `SparkContext.defaultParallelism` counts them once the executors register (one executor
    per worker, all its cores); None when the master is neither or its UI does not answer.

    Spark's tuning guide asks for 2-3 tasks per core at most; keyshift's runs take one stateful
    partition per core (`keyshift.placement.tokens.default_max_stateful_partitions`), on a
    cluster as on `local[*]`.
    """
    from urllib.parse import urlsplit

    from keyshift.stack.spark import local_master_cores

    master = master or settings.spark_master
    local = local_master_cores(master)
    if local is not None or not master.startswith("spark://"):
        return local
    host = urlsplit(master).hostname or settings.spark_cluster_host
    url = f"http://{host}:{settings.spark_master_ui_port}/json"
    try:
        response = requests.get(url, timeout=timeout_s)
        response.raise_for_status()
        cores = int(response.json().get("cores") or 0)
    except (requests.RequestException, ValueError, TypeError, AttributeError) as exc:
        log.warning("the Spark master's UI at %s does not say its cores (%s)", url, exc)
        return None
    return cores or None


def is_healthy(settings: Settings) -> bool:
    """True when the master is ALIVE with at least `spark_workers` alive workers."""
    try:
        state = master_state(settings)
    except StackError as exc:
        log.debug("spark not healthy: %s", exc)
        return False
    return state.get("status") == "ALIVE" and int(state.get("aliveworkers") or 0) >= settings.spark_workers


def start(settings: Settings) -> bool:
    """Start the master and the workers that are not running; do not wait (`wait_healthy`).

    Returns:
        True when a process was started, False when all were running.

    Raises:
        StackError: the master's port is taken by something keyshift did not start, or a
            process cannot start.
    """
    home, started = settings.home, False
    if not process.is_running(home, MASTER):
        if process.port_open(settings.spark_cluster_host, settings.spark_master_port):
            owner = process.port_owner(settings.spark_master_port)
            raise StackError(f"port {settings.spark_cluster_host}:{settings.spark_master_port} is in use "
                             f"({owner.describe() if owner else 'owner unknown'}); stop it, or choose another port "
                             "with KEYSHIFT_SPARK_MASTER_PORT")
        process.start(home, MASTER, master_argv(settings), env=_environment(settings), cwd=home)
        started = True
    for index in range(settings.spark_workers):
        if not process.is_running(home, worker_name(index)):
            work_dir(settings, index).mkdir(parents=True, exist_ok=True)
            process.start(home, worker_name(index), worker_argv(settings, index), env=_environment(settings),
                          cwd=work_dir(settings, index))
            started = True
    return started


def wait_healthy(settings: Settings, *, timeout_s: float) -> float:
    """Wait until the master is ALIVE with every worker registered; return the seconds waited.

    Raises:
        StackError: after `timeout_s` seconds, or as soon as the master exits; the message
            names `<home>/logs/spark-master.log`.
    """
    return process.wait_until(
        lambda: is_healthy(settings), timeout_s=timeout_s,
        what=f"the Spark master at {master_url(settings)} with {settings.spark_workers} worker(s)",
        log_path=process.log_file(settings.home, MASTER), alive=lambda: process.is_running(settings.home, MASTER),
        interval_s=0.5,
    )


def stop(settings: Settings) -> bool:
    """Stop the workers, then the master, that keyshift started.

    Returns:
        True when anything was running and was stopped.
    """
    names = [worker_name(i) for i in range(max(settings.spark_workers, _recorded_workers(settings)))] + [MASTER]
    return any([process.stop(settings.home, name, timeout_s=30.0) for name in names])


def _recorded_workers(settings: Settings) -> int:
    """Workers with a pid file (a cluster started with more workers than the settings now say)."""
    run = process.run_dir(settings.home)
    return len(list(run.glob("spark-worker-*.pid"))) if run.exists() else 0


def status(settings: Settings) -> ServiceStatus:
    """The cluster's state, master URL and processes, with its alive workers and cores."""
    names = [MASTER] + [worker_name(i) for i in range(settings.spark_workers)]
    records = {name: process.running_record(settings.home, name) for name in names}
    processes = tuple(ProcessState(name, record.pid if record else None, str(process.log_file(settings.home, name)))
                      for name, record in records.items())
    try:
        state = master_state(settings)
    except StackError as exc:
        if records[MASTER]:
            return ServiceStatus(NAME, UNHEALTHY, master_url(settings), processes, str(exc))
        if process.port_open(settings.spark_cluster_host, settings.spark_master_port):
            return ServiceStatus(NAME, BLOCKED, master_url(settings), processes, str(exc))
        return ServiceStatus(NAME, STOPPED, master_url(settings), processes, "")
    detail = (f"Spark {SPARK_VERSION} master {state.get('status')}, {state.get('aliveworkers', 0)} worker(s) "
              f"alive, {state.get('cores', 0)} core(s), UI {master_ui(settings)}")
    if not records[MASTER]:
        return ServiceStatus(NAME, EXTERNAL, master_url(settings), processes, detail)
    return ServiceStatus(NAME, HEALTHY if is_healthy(settings) else UNHEALTHY, master_url(settings), processes, detail)
