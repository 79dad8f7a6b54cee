"""The SparkSession every keyshift job runs in, configured from plain arguments.

The configuration follows DESIGN.md: RocksDB state store (transformWithState requires it) with
changelog checkpointing (`STATE_STORE_CONF`, shared with the benchmarks' baselines), shuffle
partitions = S (the stateful partitions the P slots are spread over), UTC session time zone,
Arrow for pandas, simplified Python tracebacks off (so that both Python stages share one pool of
workers), the Kafka connector jars set before the first `getOrCreate()`, and the project's
interpreter for Python workers.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from pyspark.sql import SparkSession

from keyshift.settings import DEFAULT_DRIVER_MEMORY, Settings

if TYPE_CHECKING:
    from keyshift.runtime.class_archive import DriverArchive

log = logging.getLogger(__name__)

ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"

STATE_STORE_CONF = {
    "spark.sql.streaming.stateStore.providerClass": ROCKSDB_PROVIDER,
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
}
"""The state store every stateful job here runs on, keyshift's and the benchmarks' baselines alike:
RocksDB (transformWithState requires it) with changelog checkpointing (Spark's structured
streaming guide documents it; Databricks' guide recommends it for every stateful query): a
commit uploads the changed rows instead of a snapshot of the store (measured here: 100 to 220 ms
per store and batch with snapshots, mostly `fileSync`), and snapshots are taken in the background
every `spark.sql.streaming.stateStore.minDeltasForSnapshot` versions. Spark's state data source, which
the migration reads, reads both layouts; a checkpoint written without changelogs resumes with them."""


def spark_conf(
    partitions: int,
    jars: Iterable[Path] = (),
    driver_memory: str = DEFAULT_DRIVER_MEMORY,
    extra: dict[str, str] | None = None,
) -> dict[str, str]:
    """The Spark configuration of a keyshift job.

    Args:
        partitions: S, the stateful partitions of the query (P slots spread over them,
            `keyshift.placement.tokens`); becomes `spark.sql.shuffle.partitions`.
        jars: jar files to put on the classpath (`spark.jars`), e.g. the Kafka connector.
        driver_memory: JVM heap of the driver (in local mode: of the whole engine), default
            `keyshift.settings.DEFAULT_DRIVER_MEMORY`.
        extra: further settings, applied last.

    Returns:
        A dict of Spark configuration keys to string values.
    """
    conf = {
        "spark.sql.shuffle.partitions": str(partitions),
        **STATE_STORE_CONF,
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.driver.memory": driver_memory,
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.streaming.numRecentProgressUpdates": "1000",
        # One pool of Python workers for both kinds of Python task: Spark pools idle workers by
        # their environment, and only the mapInArrow runner adds SPARK_SIMPLIFIED_TRACEBACK, so
        # with it on the stateful stage starts workers of its own (2 more per run, about 2.5 CPU
        # seconds each, all in batch 0). Off, a Python error shows its whole traceback.
        "spark.sql.execution.pyspark.udf.simplifiedTraceback.enabled": "false",
    }
    jar_list = ",".join(str(jar) for jar in jars)
    if jar_list:
        conf["spark.jars"] = jar_list
    conf.update(extra or {})
    return conf


def job_spark_conf(settings: Settings, partitions: int) -> tuple[dict[str, str], "DriverArchive | None"]:
    """`spark_conf` for a keyshift job whose driver JVM this process starts: the Kafka connector
    jars (and S3A's with an `s3a://` checkpoint location, `keyshift.stack.s3a`, with its
    settings), `settings.spark_driver_memory`, the driver's class archive
    (`keyshift.runtime.class_archive`) unless `settings.spark_class_archive` is off, and on a
    cluster master (not `local[...]`) the executors' packed environment and keyshift's code
    (`keyshift.stack.executor_env`, built on first use).

    Args:
        settings: the stack's settings (cache, driver memory, `spark_class_archive`).
        partitions: S, as in `spark_conf`.

    Returns:
        (the configuration, the archive decision or None).

    Raises:
        StackError: the jars cannot be fetched (`keyshift.stack.spark.job_jars`).
    """
    from keyshift.runtime.class_archive import driver_archive
    from keyshift.stack import s3a
    from keyshift.stack.spark import is_local_master, job_jars

    jars = job_jars(settings)
    archive = driver_archive(settings.cache, jars) if settings.spark_class_archive else None
    extra = {"spark.driver.extraJavaOptions": archive.java_options} if archive else {}
    extra.update(s3a.spark_conf(settings))
    if not is_local_master(settings.spark_master):
        from keyshift.stack import executor_env

        extra.update(executor_env.build(settings, settings.spark_executor_python).spark_conf())
    return spark_conf(partitions, jars=jars, driver_memory=settings.spark_driver_memory, extra=extra), archive


def build_spark_session(
    app_name: str, master: str, conf: dict[str, str], output: Path | None = None
) -> SparkSession:
    """Create (or reuse) the SparkSession with `conf`.

    Python workers run this interpreter unless `PYSPARK_PYTHON` says otherwise, or `conf` has
    `spark.pyspark.python` (a cluster's packed environment, `keyshift.stack.executor_env`), which
    wins as under spark-submit. When a session
    already exists (e.g. under spark-submit), settings that need a new JVM, such as `spark.jars`,
    must already be in place; they are logged when they differ.

    Args:
        app_name: shown in the Spark UI and logs.
        master: `local[*]`, `local[N]` or a cluster URL; ignored when spark-submit set one. A local
            master binds the driver and its UI to 127.0.0.1 (`SPARK_LOCAL_IP`, unless set).
        conf: from `spark_conf`.
        output: a driver log (`keyshift.runlog`): when this call starts the driver JVM, the JVM's
            stderr (Spark's log4j lines at WARN and above, the Python workers' output) is appended
            to this file and only Spark's ERROR lines reach this process's stderr, one line each.
            Ignored (logged) when the JVM runs already: under spark-submit, or after an earlier
            session in this process. None (the default): the JVM writes to this process's
            stdout and stderr, with Spark's own log4j defaults.

    Raises:
        StackError: the driver JVM exited while starting (with `output`; its words are in that file).
    """
    if conf.get("spark.pyspark.python"):  # as spark-submit does: the setting names the executors' interpreter
        os.environ["PYSPARK_PYTHON"] = conf["spark.pyspark.python"]
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if master.startswith("local"):  # nothing outside this host needs a local driver: its ports and UI on loopback
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    if _start_jvm(output, app_name, master, conf):
        builder = SparkSession.builder  # the SparkContext made there holds every setting
    else:
        builder = SparkSession.builder.appName(app_name)
        if "PYSPARK_GATEWAY_PORT" not in os.environ:  # not under spark-submit, which sets the master
            builder = builder.master(master)
        for key, value in conf.items():
            builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    actual_jars = spark.conf.get("spark.jars", "")
    if conf.get("spark.jars") and conf["spark.jars"] not in actual_jars:
        log.warning("spark.jars is %r, expected %r: the session existed before", actual_jars, conf["spark.jars"])
    log.info("Spark %s session %s on %s", spark.version, app_name, spark.sparkContext.master)
    return spark


def _driver_folder(conf: dict[str, str]) -> dict[str, str]:
    """`{"cwd": folder}` for the driver JVM when `spark.pyspark.python` is a path relative to the
    working directory (a cluster's packed environment, `./environment/bin/python`): a folder whose
    `environment` links to this venv (`keyshift.stack.executor_env.driver_folder`); else {}."""
    python = conf.get("spark.pyspark.python", "")
    if not python or os.path.isabs(python):
        return {}
    from keyshift.stack.executor_env import driver_folder

    folder = driver_folder()
    log.info("driver JVM in %s (environment -> %s), so that %s runs on the driver too", folder, sys.prefix, python)
    return {"cwd": str(folder)}


@contextmanager
def _worker_spark_home() -> Iterator[None]:
    """`SPARK_HOME` from `keyshift.stack.spark.worker_spark_home_env` while the driver JVM starts
    (pyspark's gateway reads it and hands it to the JVM, whose Python workers then import pyspark
    with its bytecode); the environment's own value is restored after."""
    from keyshift.stack.spark import worker_spark_home_env

    before = os.environ.get("SPARK_HOME")
    os.environ.update(worker_spark_home_env(Settings().cache))
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("SPARK_HOME", None)
        else:
            os.environ["SPARK_HOME"] = before


def _start_jvm(output: Path | None, app_name: str, master: str, conf: dict[str, str]) -> bool:
    """Start the driver JVM in a session (process group) of its own and make the SparkContext
    with `conf` on it. Returns False (nothing started) when a JVM exists already (under
    spark-submit, or after an earlier session in this process).

    Its own process group keeps a terminal's Ctrl-C, which goes to every process of the
    foreground group, from the JVM's Python workers: pyspark's workers restore Python's default
    SIGINT handler, so a Ctrl-C reaching them fails the running tasks and the batch with them.
    With the JVM apart, only this process sees the Ctrl-C and stops the run at a batch boundary
    (`keyshift.runtime.driver.StopSignals`). The JVM still ends with this process: it exits
    when its stdin, a pipe from this process, closes (pyspark's gateway contract).

    With `output`, the JVM's stderr is appended to `output` and its stdout goes to this process's
    stderr, log4j configured by `keyshift.runlog.LOG4J2_CONFIG`; without, it writes to this
    process's stdout and stderr with Spark's log4j defaults. pyspark's
    `launch_gateway(popen_kwargs=...)` is the documented way to set how the JVM is spawned; the
    JVM's Python workers inherit nothing from this process's streams, since Spark copies their
    output into the JVM's stderr.
    """
    from pyspark import SparkConf, SparkContext
    from pyspark.errors import PySparkRuntimeError
    from pyspark.java_gateway import launch_gateway

    from keyshift import runlog
    from keyshift.errors import StackError

    if "PYSPARK_GATEWAY_PORT" in os.environ or SparkContext._gateway is not None:
        log.info("the driver JVM runs already; its output goes where it went (not to %s)", output)
        return False
    settings = dict(conf)
    popen = {"start_new_session": True, **_driver_folder(conf)}
    if output is None:
        spark_conf = SparkConf().setAppName(app_name).setMaster(master).setAll(list(settings.items()))
        try:
            with _worker_spark_home():
                gateway = launch_gateway(spark_conf, popen_kwargs=popen)
        except PySparkRuntimeError as exc:
            raise StackError(f"the Spark driver JVM exited while starting ({exc}); its output is above") from exc
        SparkContext(conf=spark_conf, gateway=gateway)
        log.info("driver JVM pid %d (its own process group)", gateway.proc.pid)
        return True
    java_options = settings.get("spark.driver.extraJavaOptions", "")
    settings["spark.driver.extraJavaOptions"] = f"{java_options} {runlog.jvm_options()}".strip()
    spark_conf = SparkConf().setAppName(app_name).setMaster(master).setAll(list(settings.items()))
    output.parent.mkdir(parents=True, exist_ok=True)
    with output.open("ab") as jvm_stderr, _worker_spark_home():
        try:
            gateway = launch_gateway(spark_conf, popen_kwargs={"stdout": 2, "stderr": jvm_stderr, **popen})
        except PySparkRuntimeError as exc:
            raise StackError(f"the Spark driver JVM exited while starting ({exc}); its output is in {output}") from exc
    SparkContext(conf=spark_conf, gateway=gateway)
    log.info("driver JVM pid %d (its own process group): its output goes to %s", gateway.proc.pid, output)
    return True
