"""keyshift on a cluster (issue 35): three Kafka brokers and a Spark standalone master with two
workers, started by keyshift's own stack code beside the default stack (a home and ports of
their own), the workers' Python a bare interpreter.

- The Kafka cluster: all three brokers registered, keyshift's topics created with replication
  factor 3 and `min.insync.replicas` 2.
- The flight delay job submitted to the standalone master from `keyshift job run`: its executors
  run the packed environment (`keyshift package`: venv-pack of the executor dependencies) and the
  shipped code, not this venv; the windows equal pandas' and the run reconciles.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.cluster]

FLIGHTS = 20_000
PARTITIONS = 4
KEYSHIFT = str(Path(sys.executable).parent / "keyshift")
PORTS = {"kafka_port": 29092, "kafka_controller_port": 29093, "spark_master_port": 17077, "spark_master_ui_port": 18091}


@pytest.fixture(scope="module")
def cluster(stack_settings, tmp_path_factory):
    """Settings of a 3-broker Kafka and a 2-worker Spark cluster, up for the module's tests."""
    from keyshift import stack

    home = tmp_path_factory.mktemp("cluster-home")
    settings = stack_settings.model_copy(update={
        **PORTS, "home": home, "cache_dir": stack_settings.cache, "runs_dir": home / "runs", "kafka_brokers": 3,
        "spark_master": f"spark://127.0.0.1:{PORTS['spark_master_port']}", "spark_class_archive": False,
    })
    try:
        stack.up(settings, "kafka,spark", timeout_s=300)
        yield settings
    finally:
        stack.down(settings, "kafka,spark")


def _environment(settings) -> dict[str, str]:
    """`KEYSHIFT_*` variables that point a `keyshift` command at `settings`."""
    env = dict(os.environ)
    for name in ("home", "cache_dir", "runs_dir", "kafka_port", "kafka_controller_port", "kafka_brokers", "spark_master",
                 "spark_master_port", "spark_master_ui_port", "spark_class_archive"):
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


def test_the_flight_job_on_the_standalone_cluster_ships_its_python_and_equals_pandas(cluster):
    from keyshift.data.flights import flights_path
    from keyshift.data.replay import replay_flights
    from keyshift.names import DEAD_LETTER_TOPIC, LATE_TOPIC, ALERTS_TOPIC
    from keyshift.quality.reference import compare_to_reference, reference_windows
    from keyshift.topics import create_topics

    topic = f"it-cluster-{uuid.uuid4().hex[:8]}"
    create_topics(cluster, [topic], PARTITIONS)
    create_topics(cluster, [DEAD_LETTER_TOPIC, LATE_TOPIC, ALERTS_TOPIC], PARTITIONS)
    replay_flights(cluster, topic, limit=FLIGHTS, strategy="hash", partitions=PARTITIONS, progress=False)
    run_id = f"{topic}-run"
    done = subprocess.run([KEYSHIFT, "job", "run", "flight_delays", "--topic", topic, "--run-id", run_id, "--partitions",
                           str(PARTITIONS), "--limit", str(FLIGHTS), "--starting", "earliest", "--max-offsets-per-trigger",
                           "10000", "--watermark", "key", "--bound-ms", "60000", "--no-progress"], env=_environment(cluster), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run_dir = cluster.runs_dir / run_id
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["reconciled"] and summary["events_read"] == FLIGHTS, summary
    comparison = compare_to_reference(run_dir / "windows", reference_windows(flights_path(cluster), limit=FLIGHTS))
    assert comparison["equal"], comparison
    # the executors ran the packed environment the driver shipped, unpacked in their work folders
    unpacked = list((cluster.home / "spark").glob("worker-*/app-*/*/environment/bin/python"))
    code = list((cluster.home / "spark").glob("worker-*/app-*/*/keyshift_code/keyshift/__init__.py"))
    assert unpacked and code, sorted(str(p) for p in (cluster.home / "spark").rglob("*"))[:50]
