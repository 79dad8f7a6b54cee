"""The SparkSession every keyshift job runs in, configured from plain arguments.

The configuration follows DESIGN.md: RocksDB state store (transformWithState requires it), shuffle
partitions = P slots, UTC session time zone, Arrow for pandas, the Kafka connector jars set before
the first `getOrCreate()`, and the project's interpreter for Python workers.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Iterable

from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


def spark_conf(
    partitions: int,
    jars: Iterable[Path] = (),
    driver_memory: str = "4g",
    extra: dict[str, str] | None = None,
) -> dict[str, str]:
    """The Spark configuration of a keyshift job.

    Args:
        partitions: P, the number of slots; becomes `spark.sql.shuffle.partitions`.
        jars: jar files to put on the classpath (`spark.jars`), e.g. the Kafka connector.
        driver_memory: JVM heap of the driver (in local mode: of the whole engine).
        extra: further settings, applied last.

    Returns:
        A dict of Spark configuration keys to string values.
    """
    conf = {
        "spark.sql.shuffle.partitions": str(partitions),
        "spark.sql.streaming.stateStore.providerClass": ROCKSDB_PROVIDER,
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.driver.memory": driver_memory,
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.streaming.numRecentProgressUpdates": "1000",
    }
    jar_list = ",".join(str(jar) for jar in jars)
    if jar_list:
        conf["spark.jars"] = jar_list
    conf.update(extra or {})
    return conf


def build_spark_session(
    app_name: str, master: str, conf: dict[str, str]
) -> SparkSession:
    """Create (or reuse) the SparkSession with `conf`.

    Python workers run this interpreter unless `PYSPARK_PYTHON` says otherwise. When a session
    already exists (e.g. under spark-submit), settings that need a new JVM, such as `spark.jars`,
    must already be in place; they are logged when they differ.

    Args:
        app_name: shown in the Spark UI and logs.
        master: `local[*]`, `local[N]` or a cluster URL; ignored when spark-submit set one. A local
            master binds the driver and its UI to 127.0.0.1 (`SPARK_LOCAL_IP`, unless set).
        conf: from `spark_conf`.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if master.startswith("local"):  # nothing outside this host needs a local driver: its ports and UI on loopback
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
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
