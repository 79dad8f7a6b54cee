"""A single-process HDFS on loopback, for checkpoints on a real Hadoop FileSystem on one machine.

Not part of the default stack: `keyshift stack up --only hdfs` (or `--cluster`) starts it. On a
cluster, Spark's checkpoints live on a filesystem every executor and a restarted driver reach
(HDFS, S3); this service gives the cluster stack one, so that `KEYSHIFT_CHECKPOINT_LOCATION=
hdfs://127.0.0.1:8020/keyshift/checkpoints` is tested the way it runs there, through Hadoop's
`FileSystem` and never as a local path.

It is Hadoop's own `MiniDFSCluster` (one NameNode and one DataNode in one JVM, from
`hadoop-client-minicluster` at the Hadoop version pyspark bundles, 3.5.0), started by
`infra/hdfs/MiniHdfs.java` with every port fixed on loopback (`hdfs_port` to `hdfs_port` + 5)
and one replica. Its Hadoop client and logging jars are pyspark's own; `infra/hdfs/pom.xml`
fetches the one jar more (56 MB, once, into the cache). The NameNode's namespace is formatted at
each start: what it holds lives only as long as the service (a test store, not a data store).
"""

from __future__ import annotations

import logging
import shutil
import subprocess
from pathlib import Path

from keyshift.errors import StackError
from keyshift.settings import PROJECT_ROOT, Settings
from keyshift.stack import maven, process
from keyshift.stack.service import BLOCKED, EXTERNAL, HEALTHY, STOPPED, UNHEALTHY, ProcessState, ServiceStatus

log = logging.getLogger("keyshift.stack.hdfs")

NAME = "hdfs"
"""The service's name and its process's (pid file `run/hdfs.pid`, log `logs/hdfs.log`)."""
INFRA = PROJECT_ROOT / "infra" / "hdfs"
POM = INFRA / "pom.xml"
PYSPARK_JARS = ("hadoop-client-api-", "hadoop-client-runtime-", "slf4j-api-", "log4j-slf4j2-impl-", "log4j-api-", "log4j-core-",
                "log4j-1.2-api-", "jcl-over-slf4j-", "jsr305-", "snappy-java-")
"""Prefixes of the jars of pyspark's `jars/` that the HDFS process runs with."""


def url(settings: Settings) -> str:
    """The HDFS URI of the service: `hdfs://127.0.0.1:<hdfs_port>`."""
    return f"hdfs://127.0.0.1:{settings.hdfs_port}"


def _state_dir(settings: Settings) -> Path:
    return settings.home / "hdfs"


def _ready_file(settings: Settings) -> Path:
    return _state_dir(settings) / "ready"


def classpath(settings: Settings) -> str:
    """The JVM class path: the minicluster jar (fetched with Maven once), the compiled launcher
    and pyspark's Hadoop client and logging jars.

    Raises:
        StackError: Maven or javac failed, or pyspark lacks a jar.
    """
    import pyspark

    jars = maven.copy_dependencies(POM, settings.cache / "hdfs-jars")
    spark_jars = Path(pyspark.__file__).parent / "jars"
    for prefix in PYSPARK_JARS:
        found = sorted(spark_jars.glob(f"{prefix}*.jar"))
        if not found:
            raise StackError(f"pyspark's jars/ ({spark_jars}) has no {prefix}*.jar, which the HDFS service needs")
        jars.append(found[0])
    classes = settings.cache / "hdfs-classes"
    source = INFRA / "MiniHdfs.java"
    compiled = classes / "MiniHdfs.class"
    path = ":".join(str(j) for j in jars)
    if not compiled.exists() or compiled.stat().st_mtime < source.stat().st_mtime:
        javac = shutil.which("javac")
        if javac is None:
            raise StackError("javac is not on PATH; the HDFS service compiles infra/hdfs/MiniHdfs.java (install a JDK 17)")
        classes.mkdir(parents=True, exist_ok=True)
        done = subprocess.run([javac, "-cp", path, "-d", str(classes), str(source)], capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise StackError(f"javac failed on {source}:\n{done.stderr[-2000:]}")
    return f"{classes}:{path}"


def argv(settings: Settings) -> list[str]:
    """The HDFS process's command line (a small heap, the serial GC and C1 only: it starts in
    7-10 s instead of 13-18 s on 2 cores and holds checkpoint files, not data)."""
    return ["java", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
            f"-Dlog4j2.configurationFile={INFRA / 'log4j2.properties'}", "-cp", classpath(settings), "MiniHdfs",
            str(_state_dir(settings) / "data"), str(settings.hdfs_port), str(_ready_file(settings))]


def is_healthy(settings: Settings) -> bool:
    """True when the process reported its URI and the NameNode's port answers."""
    return _ready_file(settings).exists() and process.port_open("127.0.0.1", settings.hdfs_port)


def start(settings: Settings) -> bool:
    """Start the HDFS process unless it runs; do not wait (`wait_healthy`).

    Returns:
        True when it was started, False when it was running.

    Raises:
        StackError: the NameNode's port is taken by something keyshift did not start; Maven,
            javac or the process failed to start.
    """
    if process.is_running(settings.home, NAME):
        return False
    process.refuse_taken_port(settings.hdfs_port, "KEYSHIFT_HDFS_PORT")
    shutil.rmtree(_state_dir(settings), ignore_errors=True)
    _state_dir(settings).mkdir(parents=True)
    process.start(settings.home, NAME, argv(settings), cwd=_state_dir(settings))
    return True


def wait_healthy(settings: Settings, *, timeout_s: float) -> float:
    """Wait until the NameNode and DataNode are up; return the seconds waited.

    Raises:
        StackError: after `timeout_s` seconds, or as soon as the process exits (naming its log).
    """
    return process.wait_until(lambda: is_healthy(settings), timeout_s=timeout_s, what=f"HDFS at {url(settings)}",
                              log_path=process.log_file(settings.home, NAME), alive=lambda: process.is_running(settings.home, NAME),
                              interval_s=0.5)


def stop(settings: Settings) -> bool:
    """Stop the HDFS process keyshift started (its namespace goes with it).

    Returns:
        True when it was running and was stopped.
    """
    stopped = process.stop(settings.home, NAME, timeout_s=30.0)
    _ready_file(settings).unlink(missing_ok=True)
    return stopped


def status(settings: Settings) -> ServiceStatus:
    """The service's state, URI and process."""
    record = process.running_record(settings.home, NAME)
    processes = (ProcessState(NAME, record.pid if record else None, str(process.log_file(settings.home, NAME))),)
    detail = f"HDFS (Hadoop 3.5.0 MiniDFSCluster), NameNode UI http://127.0.0.1:{settings.hdfs_port + 1}"
    if not process.port_open("127.0.0.1", settings.hdfs_port):
        return ServiceStatus(NAME, UNHEALTHY if record else STOPPED, url(settings), processes, "" if not record else "NameNode not answering")
    if not record:
        return ServiceStatus(NAME, EXTERNAL if _ready_file(settings).exists() else BLOCKED, url(settings), processes, detail)
    return ServiceStatus(NAME, HEALTHY if is_healthy(settings) else UNHEALTHY, url(settings), processes, detail)
