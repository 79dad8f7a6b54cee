"""Start a job's Python workers while its driver is still setting up the query.

A keyed job runs Python in two kinds of Spark tasks: the ingest stage (`mapInArrow`) and the
stateful stage (`transformWithStateInPandas`). Spark keeps idle Python worker processes and
reuses them from task to task (`spark.python.worker.reuse`, on by default); keyshift's session
makes both kinds share one pool (`keyshift.runtime.session.spark_conf`). Still, the first
task on each core starts a worker and imports pandas, pyarrow and keyshift's modules into it:
measured on the 2-core machine, 3.6 s (boot 1.2 s, init 2.4 s) for each of batch 0's first two
ingest tasks.

`start_python_workers` runs one small batch job in a background thread right after the session
starts: a `mapInArrow` stage with as many tasks as the session has cores, whose function imports
`WORKER_MODULES`. The workers it leaves in the pool are the ones the query's batch 0 takes, for
both stages. Meanwhile the driver plans the query and runs the stateful
processor's driver-side initialisation, a Python process of its own that Spark starts for
transformWithState and that no warm-up can share. A warm-up that fails is logged and ignored: the
query then starts its workers itself, as without it.
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
import time
from typing import Iterator

from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

WORKER_MODULES = (
    "keyshift.processing.operators.ingest",
    "keyshift.processing.operators.processor",
    "keyshift.processing.operators.key_window_processor",
)
"""Modules the job's Python tasks import: the ingest functions (`mapInArrow`) and the stateful
processors (`transformWithStateInPandas`), which run in the same pool of workers."""


def import_worker_modules(batches: Iterator) -> Iterator:
    """`mapInArrow` function: import `WORKER_MODULES` in this worker, yield one row (its pid)
    per input batch. Input: any Arrow record batches; output schema `pid long`."""
    import pyarrow as pa

    for name in WORKER_MODULES:
        importlib.import_module(name)
    for batch in batches:
        yield pa.RecordBatch.from_pydict({"pid": [os.getpid()] * batch.num_rows})


def warm_python_workers(spark: SparkSession, workers: int | None = None) -> set[int]:
    """Run the warm-up job now and return the worker pids it saw.

    Args:
        spark: the job's session.
        workers: Python workers to start (default: `defaultParallelism`, the cores).

    Returns:
        The pids of the Python workers that ran its tasks.

    Raises:
        Whatever Spark raises when the job fails (`start_python_workers` logs it instead).
    """
    workers = workers or spark.sparkContext.defaultParallelism
    spark.sparkContext.setJobDescription("keyshift: start Python workers")  # this thread's jobs only
    try:
        rows = spark.range(workers, numPartitions=workers).mapInArrow(import_worker_modules, "pid long").collect()
        return {row.pid for row in rows}
    finally:
        spark.sparkContext.setJobDescription(None)


def start_python_workers(spark: SparkSession, workers: int | None = None) -> threading.Thread:
    """`warm_python_workers` in a daemon thread, started now; join it to wait for the end.

    Logs how long it took and how many workers it started; a failure is logged at WARNING and
    otherwise ignored (the query starts its workers itself).
    """

    def run() -> None:
        started = time.monotonic()
        try:
            pids = warm_python_workers(spark, workers)
        except Exception as exc:  # a warm-up must never stop the job
            log.warning("starting Python workers ahead of the query failed (%s); batch 0 starts them", exc)
            return
        log.info("%d Python workers started ahead of the query in %.1f s", len(pids), time.monotonic() - started)

    thread = threading.Thread(target=run, name="keyshift-python-warmup", daemon=True)
    thread.start()
    return thread
