"""The session every keyshift job runs in: state store settings shared with the baselines, one
pool of Python workers for both kinds of Python task, and the warm-up that fills it (real Spark)."""

from __future__ import annotations

import os

import pandas as pd
import pytest
from pyspark.sql.streaming import StatefulProcessor

from keyshift.bench.plain_job import baseline_conf
from keyshift.runtime.session import STATE_STORE_CONF, spark_conf
from keyshift.runtime.warmup import WORKER_MODULES, start_python_workers, warm_python_workers


def test_job_and_baseline_run_the_same_state_store():
    job = spark_conf(8)
    for key, value in STATE_STORE_CONF.items():
        assert job[key] == value
    assert job["spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"] == "true"
    assert job["spark.sql.execution.pyspark.udf.simplifiedTraceback.enabled"] == "false"
    assert spark_conf(8, extra={"spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "false"})[
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"] == "false"


def test_baseline_conf_is_a_plain_users(settings):
    conf = baseline_conf(32, settings)
    assert conf["spark.sql.shuffle.partitions"] == "32"
    assert {key: conf[key] for key in STATE_STORE_CONF} == STATE_STORE_CONF
    assert not any(key.startswith("spark.sql.execution.pyspark") or "arrow" in key for key in conf)
    assert baseline_conf(8, settings, {"spark.sql.shuffle.partitions": "4"})["spark.sql.shuffle.partitions"] == "4"


def test_warm_workers_serve_the_ingest_and_the_stateful_stage(spark):
    class Pid(StatefulProcessor):  # local: pickled by value, the workers cannot import this module
        """Yields its Python worker's pid per key."""

        def init(self, handle):
            pass

        def handleInputRows(self, key, rows, timerValues):
            for _ in rows:
                pass
            yield pd.DataFrame({"pid": [os.getpid()]})

        def close(self):
            pass

    warmed = warm_python_workers(spark)
    assert 1 <= len(warmed) <= spark.sparkContext.defaultParallelism

    def pids(batches):
        import pyarrow as pa

        for batch in batches:
            yield pa.RecordBatch.from_pydict({"pid": [os.getpid()] * batch.num_rows})

    ingest = {r.pid for r in spark.range(4, numPartitions=2).mapInArrow(pids, "pid long").collect()}
    spark.streams.active  # noqa: B018 -- batch transformWithState needs the state store coordinator
    stateful = {r.pid for r in spark.range(4).groupBy("id").transformWithStateInPandas(Pid(), "pid long", "Append", "None").collect()}
    # one pool: the stateful tasks ran in workers that ran mapInArrow tasks before (separate pools,
    # as with simplified tracebacks on, would start new workers for them)
    assert stateful <= warmed | ingest


def test_warm_up_imports_the_job_modules_and_survives_failure(spark, caplog):
    thread = start_python_workers(spark)
    thread.join(timeout=120)
    assert not thread.is_alive()

    def loaded(batches):
        import sys

        import pyarrow as pa

        for batch in batches:
            yield pa.RecordBatch.from_pydict({"loaded": [all(name in sys.modules for name in WORKER_MODULES)] * batch.num_rows})

    assert all(r.loaded for r in spark.range(2, numPartitions=2).mapInArrow(loaded, "loaded boolean").collect())

    class Broken:
        sparkContext = spark.sparkContext

        def range(self, *args, **kwargs):
            raise RuntimeError("no session")

    with caplog.at_level("WARNING", logger="keyshift.runtime.warmup"):
        failing = start_python_workers(Broken(), workers=2)
        failing.join(timeout=10)
    assert "starting Python workers ahead of the query failed (no session)" in caplog.text


@pytest.mark.parametrize(("master", "cores"), [("local", 1), ("local[3]", 3), ("local[4,2]", 4), ("local[*]", os.cpu_count()),
                                               ("spark://host:7077", None), ("yarn", None), ("local[x]", None)])
def test_local_master_cores(master, cores):
    from keyshift.stack.spark import local_master_cores

    assert local_master_cores(master) == cores


def test_the_driver_jvm_starts_with_the_worker_spark_home_and_the_environment_gets_its_own_back(monkeypatch, tmp_path):
    from keyshift.runtime import session

    monkeypatch.setenv("KEYSHIFT_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("SPARK_HOME", raising=False)
    with session._worker_spark_home():
        assert os.environ["SPARK_HOME"].startswith(str(tmp_path / "spark-home-"))
    assert "SPARK_HOME" not in os.environ
    monkeypatch.setenv("SPARK_HOME", str(tmp_path / "spark-4.2.0-bin-hadoop3"))  # a distribution of the user's: kept
    with session._worker_spark_home():
        assert os.environ["SPARK_HOME"] == str(tmp_path / "spark-4.2.0-bin-hadoop3")


def test_master_cores_reads_a_standalone_masters_ui(caplog):
    """A standalone master's cores come from its UI's `GET /json` (served here by a stand-in on
    loopback); a master whose UI does not answer has no known cores, and the log says why."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from keyshift.settings import Settings
    from keyshift.stack.spark_cluster import master_cores

    class MasterUI(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            body = json.dumps({"status": "ALIVE", "aliveworkers": 3, "cores": 6, "coresused": 0}).encode()
            self.send_response(200 if self.path == "/json" else 404)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), MasterUI)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        settings = Settings(spark_master="spark://127.0.0.1:7077", spark_master_ui_port=server.server_address[1])
        assert master_cores(settings) == 6
        assert master_cores(settings, "local[3]") == 3
    finally:
        server.shutdown()
        server.server_close()
    with caplog.at_level("WARNING", logger="keyshift.stack.spark_cluster"):
        assert master_cores(settings, timeout_s=0.5) is None
    assert "does not say its cores" in caplog.text
    assert master_cores(settings, "yarn") is None
