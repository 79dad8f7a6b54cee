"""keyshift on a cluster (issue 35): three Kafka brokers, an HDFS and a Spark standalone master
with two workers, started by keyshift's own stack code beside the default stack (a home and
ports of their own), the workers' Python a bare interpreter, every checkpoint on HDFS.

- The Kafka cluster: all three brokers registered, keyshift's topics created with replication
  factor 3 and `min.insync.replicas` 2.
- The flight delay job submitted to the standalone master from `keyshift job run`, its
  checkpoints on HDFS (`KEYSHIFT_CHECKPOINT_LOCATION=hdfs://...`, none in the run folder), killed
  (`kill -9`) mid-run, resumed from its HDFS checkpoint, then switched to least_count inside the
  driver (the state reader on HDFS): the windows equal pandas' and the run reconciles. Its
  executors ran the packed environment (`keyshift package`: venv-pack of the executor
  dependencies) and the shipped code, not this venv.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.cluster]

PARTITIONS = 4
KEYSHIFT = str(Path(sys.executable).parent / "keyshift")
PORTS = {"kafka_port": 29092, "kafka_controller_port": 29093, "spark_master_port": 17077, "spark_master_ui_port": 18091,
         "hdfs_port": 28020}
CHECKPOINTS = f"hdfs://127.0.0.1:{PORTS['hdfs_port']}/keyshift/checkpoints"


@pytest.fixture(scope="module")
def cluster(stack_settings, tmp_path_factory):
    """Settings of a 3-broker Kafka and a 2-worker Spark cluster, up for the module's tests."""
    from keyshift import stack

    home = tmp_path_factory.mktemp("cluster-home")
    settings = stack_settings.model_copy(update={
        **PORTS, "home": home, "cache_dir": stack_settings.cache, "runs_dir": home / "runs", "kafka_brokers": 3,
        "spark_master": f"spark://127.0.0.1:{PORTS['spark_master_port']}", "spark_class_archive": False,
        "checkpoint_location": CHECKPOINTS,
    })
    try:
        stack.up(settings, "kafka,hdfs,spark", timeout_s=300)
        yield settings
    finally:
        stack.down(settings, "kafka,hdfs,spark")


def _environment(settings) -> dict[str, str]:
    """`KEYSHIFT_*` variables that point a `keyshift` command at `settings`."""
    env = dict(os.environ)
    for name in ("home", "cache_dir", "runs_dir", "kafka_port", "kafka_controller_port", "kafka_brokers", "spark_master",
                 "spark_master_port", "spark_master_ui_port", "spark_class_archive", "hdfs_port", "checkpoint_location"):
        env[f"KEYSHIFT_{name.upper()}"] = str(getattr(settings, name))
    env.pop("PYSPARK_PYTHON", None)
    return env


def test_the_kafka_cluster_has_three_brokers_and_replicates_keyshifts_topics(cluster):
    from keyshift.stack import kafka
    from keyshift.topics import create_topics, describe_topics

    assert len(kafka.probe(cluster).broker_ids) == 3
    topic = f"it-cluster-{uuid.uuid4().hex[:8]}"
    create_topics(cluster, [topic], PARTITIONS)
    info = describe_topics(cluster, [topic])[topic]
    assert (info.partitions, info.replication) == (PARTITIONS, 3)


def _flights_topic(cluster, flights: int) -> str:
    """A fresh topic of the cluster's Kafka holding the first `flights` flights (and the job's side-output topics)."""
    from keyshift.data.replay import replay_flights
    from keyshift.names import ALERTS_TOPIC, DEAD_LETTER_TOPIC, LATE_TOPIC
    from keyshift.topics import create_topics

    topic = f"it-cluster-{uuid.uuid4().hex[:8]}"
    create_topics(cluster, [topic], PARTITIONS)
    create_topics(cluster, [DEAD_LETTER_TOPIC, LATE_TOPIC, ALERTS_TOPIC], PARTITIONS)
    replay_flights(cluster, topic, limit=flights, strategy="hash", partitions=PARTITIONS, progress=False)
    return topic


def _job(topic: str, run_id: str, flights: int, per_trigger: int) -> list[str]:
    return [KEYSHIFT, "job", "run", "flight_delays", "--topic", topic, "--run-id", run_id, "--partitions", str(PARTITIONS),
            "--limit", str(flights), "--starting", "earliest", "--max-offsets-per-trigger", str(per_trigger), "--watermark", "key",
            "--bound-ms", "60000", "--no-progress"]


def _assert_equals_pandas(cluster, run_id: str, flights: int) -> dict:
    from keyshift.data.flights import flights_path
    from keyshift.quality.reference import compare_to_reference, reference_windows

    run_dir = cluster.runs_dir / run_id
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["reconciled"] and summary["events_read"] == flights and summary["late_events"] == 0, summary
    comparison = compare_to_reference(run_dir / "windows", reference_windows(flights_path(cluster), limit=flights))
    assert comparison["equal"], comparison
    return summary


def test_a_run_on_the_cluster_killed_resumed_and_switched_equals_pandas(cluster, spark, tmp_path):
    """The flight job on the standalone cluster, its checkpoints on HDFS: killed (`kill -9` of the
    driver's process group) after 3 batches, resumed from its HDFS checkpoint, switched to
    least_count inside the driver after 5 (the state read from HDFS, the new query's checkpoint
    beside the old one): windows equal to pandas; its executors ran the shipped environment."""
    from keyshift.checkpoint_files import CheckpointFiles
    from keyshift.migration.switch import request_switch
    from tests.integration.flight_runs import batches_done, wait_for

    flights = 40_000
    topic = _flights_topic(cluster, flights)
    run_id = f"{topic}-run"
    run_dir = cluster.runs_dir / run_id
    log = (tmp_path / "driver.log").open("ab")
    first = subprocess.Popen(_job(topic, run_id, flights, 5_000), env=_environment(cluster), stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True)
    wait_for(lambda: batches_done(run_dir) >= 3, first, 600, "batch 3")
    os.killpg(first.pid, signal.SIGKILL)  # the driver, its JVM and its Python workers: a crash
    first.wait(timeout=60)
    resumed = subprocess.Popen([KEYSHIFT, "job", "run", "flight_delays", "--resume", run_id, "--no-progress"], env=_environment(cluster),
                               stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    wait_for(lambda: batches_done(run_dir) >= 5, resumed, 600, "batch 5")
    record = request_switch(cluster, run_id, "least_count", None, reason="cluster test", wait_timeout_s=300)
    assert record.state == "done" and record.in_driver and record.verify["placement"]["ok"], record
    assert resumed.wait(timeout=900) == 0, (tmp_path / "driver.log").read_text()[-4000:]
    summary = _assert_equals_pandas(cluster, run_id, flights)
    assert summary["resumes"] >= 1 and len(summary["switches"]) == 1
    segments = json.loads((run_dir / "job.json").read_text())["segments"]
    assert [s["checkpoint"] for s in segments] == [f"{CHECKPOINTS}/{run_id}/checkpoint", f"{CHECKPOINTS}/{run_id}/checkpoint-1"]
    for segment in segments:  # on HDFS, read through Hadoop's FileSystem; the run folder holds no checkpoint
        files = CheckpointFiles(segment["checkpoint"], spark)
        assert files.names("commits") and files.exists("offsets/0") and files.exists("state")
    assert not list(run_dir.glob("checkpoint*"))
    # the executors ran the packed environment the driver shipped, unpacked in their work folders
    unpacked = list((cluster.home / "spark").glob("worker-*/app-*/*/environment/bin/python"))
    code = list((cluster.home / "spark").glob("worker-*/app-*/*/keyshift_code/keyshift/__init__.py"))
    assert unpacked and code, sorted(str(p) for p in (cluster.home / "spark").rglob("*"))[:50]
