"""keyshift on a cluster (issue 35), started by keyshift's own stack code beside the default stack
(a home, ports and a Redis of their own): three Kafka brokers, an HDFS, an S3 store (moto) and a
Spark standalone master with two workers whose Python is a bare interpreter.

- The Kafka cluster: all three brokers registered, keyshift's topics created with replication
  factor 3 and `min.insync.replicas` 2.
- The flight delay job from `keyshift job run`, checkpoints on HDFS: killed (`kill -9`) mid-run,
  resumed, switched to least_count inside the driver; windows equal pandas'; its executors ran
  the packed environment and the shipped code, not this venv.
- YSB as Airflow's `launch_job` runs it (the supervisor's spark-submit), checkpoints on S3: two
  switches (a strategy, then P 4 -> 6), then an executor and a whole worker killed; windows equal
  the generator's record.
- Kafka nodes killed: the input's partition leader mid-run, the side outputs' transaction
  coordinator mid-transaction; windows equal pandas', every alert once for `read_committed`.
- Global Merge with checkpoints on S3: windows equal pandas', no shuffle bytes.
- The pipeline DAG through an Airflow of the cluster's settings: a bounded run on the master.
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
from pydantic import SecretStr

pytestmark = [pytest.mark.integration, pytest.mark.cluster]

PARTITIONS = 4
KEYSHIFT = str(Path(sys.executable).parent / "keyshift")
PORTS = {"kafka_port": 29092, "kafka_controller_port": 29093, "spark_master_port": 17077, "spark_master_ui_port": 18091,
         "hdfs_port": 28020, "s3_port": 29000, "redis_port": 16379}
"""The cluster's services, a Redis of its own among them: keyshift's Redis records are keyed by topic
and run (the replay record of `flights`, ...), and this Kafka has topics of the default stack's names."""
CHECKPOINTS = f"hdfs://127.0.0.1:{PORTS['hdfs_port']}/keyshift/checkpoints"
S3_CHECKPOINTS = "s3a://keyshift/checkpoints"
S3 = {"s3_endpoint": f"http://127.0.0.1:{PORTS['s3_port']}", "s3_access_key": "keyshift", "s3_secret_key": SecretStr("keyshift")}


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
        stack.up(settings, "redis,kafka,hdfs,s3,spark", timeout_s=300)
        yield settings
    finally:
        stack.down(settings, "redis,kafka,hdfs,s3,spark")


def _environment(settings) -> dict[str, str]:
    """`KEYSHIFT_*` variables that point a `keyshift` command at `settings`."""
    env = dict(os.environ)
    for name in ("home", "cache_dir", "runs_dir", "redis_port", "kafka_port", "kafka_controller_port", "kafka_brokers", "spark_master",
                 "spark_master_port", "spark_master_ui_port", "spark_class_archive", "hdfs_port", "checkpoint_location"):
        env[f"KEYSHIFT_{name.upper()}"] = str(getattr(settings, name))
    for name in ("s3_endpoint", "s3_access_key", "s3_secret_key"):
        value = getattr(settings, name)
        if value is not None:
            env[f"KEYSHIFT_{name.upper()}"] = value.get_secret_value() if isinstance(value, SecretStr) else str(value)
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


def _executors(cluster) -> list:
    """The executor JVMs (`CoarseGrainedExecutorBackend`) the cluster's workers run, as psutil processes."""
    import psutil

    from keyshift.stack import process, spark_cluster

    found = []
    for index in range(cluster.spark_workers):
        record = process.read_record(cluster.home, spark_cluster.worker_name(index))
        if record is None or not psutil.pid_exists(record.pid):
            continue
        for child in psutil.Process(record.pid).children(recursive=True):
            try:
                if "CoarseGrainedExecutorBackend" in " ".join(child.cmdline()):
                    found.append(child)
            except psutil.Error:  # gone, or a zombie (an executor of an earlier run)
                continue
    return found


def _wait_run(settings, run_id: str, timeout_s: float) -> dict:
    """The run record once its state is terminal (succeeded, stopped or failed)."""
    import time

    from keyshift.runs import TERMINAL_STATES, read_run_record

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        record = read_run_record(settings, run_id)
        if record.get("state") in TERMINAL_STATES:
            return record
        time.sleep(2)
    raise AssertionError(f"run {run_id} did not end in {timeout_s} s: {read_run_record(settings, run_id)}")


def test_ysb_launched_by_the_supervisor_survives_two_switches_and_lost_executors_and_a_worker(cluster, tmp_path):
    """YSB on the cluster as Airflow's `launch_job` runs it (the supervisor's spark-submit with the
    packed environment, checkpoints on the S3 store): switched hash -> least_count, then P 4 -> 6;
    then one executor killed (`kill -9`), then a whole worker (its JVM and executors): the run
    finishes on what is left with windows equal to the generator's record and exact accounting."""
    import time


    from keyshift.data.ysb import generate_ysb
    from keyshift.names import YSB_DEAD_LETTER_TOPIC, YSB_LATE_TOPIC
    from keyshift.orchestration.launch import launch_job
    from keyshift.topics import create_topics
    from tests.integration.flight_runs import batches_done

    settings = cluster.model_copy(update={"checkpoint_location": S3_CHECKPOINTS, **S3})
    # 24,000 events over 240 s of event time, 30 batches: the switches, the executor kill and the worker kill
    # take about 16 of them (more when the first switch's state-reader warm-up, which runs while the
    # query goes on, is slow on S3), and the worker kill must find the run still reading
    rate, duration, per_trigger = 100, 240, 800
    topic = run_id = f"it-cluster-ysb-{uuid.uuid4().hex[:8]}"
    create_topics(settings, [topic], PARTITIONS)
    create_topics(settings, [YSB_DEAD_LETTER_TOPIC, YSB_LATE_TOPIC], PARTITIONS)
    generate_ysb(settings, topic, rate=rate, duration=duration, start_ms=1_700_000_000_000, seed=5, zipf=1.0, strategy="hash",
                 partitions=PARTITIONS, run_id=run_id, progress=False)
    run_dir = settings.runs_dir / run_id
    launched = launch_job(settings, run_id, strategy="hash", partitions=PARTITIONS, bound_ms=10_000, limit=rate * duration,
                          topic=topic, max_offsets_per_trigger=per_trigger, watermark="key", job="ysb", startup_check_s=5.0)
    assert not launched.adopted

    def _batches(n: int, timeout_s: float = 600) -> None:
        from keyshift.runs import TERMINAL_STATES, read_run_record

        deadline = time.monotonic() + timeout_s
        while batches_done(run_dir) < n:
            assert time.monotonic() < deadline, f"batch {n} not done in {timeout_s} s; driver log {launched.log_path}"
            state = read_run_record(settings, run_id).get("state")
            assert state not in TERMINAL_STATES, f"the run ended ({state}) before batch {n}: the test needs a longer input"
            time.sleep(1)

    try:
        _switch_and_kill(settings, cluster, run_id, run_dir, launched, _batches)
    finally:
        from keyshift import stack
        from keyshift.orchestration.launch import stop_job
        from keyshift.runs import TERMINAL_STATES, read_run_record

        if read_run_record(settings, run_id).get("state") not in TERMINAL_STATES:
            stop_job(settings, run_id)  # a failed test leaves no supervisor behind
        stack.up(cluster, "spark", timeout_s=120)  # the killed worker back, for the module's other tests
    _assert_ysb_equals_the_generator(settings, run_id, rate * duration, launched.log_path)


def _switch_and_kill(settings, cluster, run_id: str, run_dir: Path, launched, wait_batches) -> None:
    """Two switches, then `kill -9` of an executor, then of the second worker (its JVM and executors); waits
    until the run succeeded."""
    from keyshift.migration.switch import request_switch
    from keyshift.runs import TERMINAL_STATES, read_run_record
    from keyshift.stack import process, spark_cluster
    from tests.integration.flight_runs import batches_done

    _batches = wait_batches
    switches = []
    _batches(3)
    switches.append(request_switch(settings, run_id, "least_count", None, reason="cluster test 1", wait_timeout_s=300))
    _batches(batches_done(run_dir) + 2)
    switches.append(request_switch(settings, run_id, "least_count", 6, reason="cluster test 2", wait_timeout_s=300))
    for record in switches:
        assert record.state == "done" and record.in_driver and record.verify["placement"]["ok"], record
        assert record.verify["conservation"]["ok"], record.verify["conservation"]

    _batches(batches_done(run_dir) + 2)
    executors = _executors(cluster)
    assert len(executors) == cluster.spark_workers, [p.cmdline() for p in executors]  # one per worker
    executors[0].kill()  # kill -9 of one executor mid-run: the master starts another on its worker
    _batches(batches_done(run_dir) + 3)
    worker = process.read_record(cluster.home, spark_cluster.worker_name(1))
    assert worker is not None
    assert read_run_record(settings, run_id).get("state") not in TERMINAL_STATES, "the run ended before the worker kill"
    os.killpg(worker.pid, signal.SIGKILL)  # kill -9 of a whole worker: its JVM and its executors
    record = _wait_run(settings, run_id, 900)
    assert record["state"] == "succeeded", (record, Path(launched.log_path).read_text()[-4000:])
    log = Path(launched.log_path).read_text()
    assert "Lost executor" in log, "the driver log tells of no lost executor"


def _assert_ysb_equals_the_generator(settings, run_id: str, events: int, log_path) -> None:
    """The run's summary, windows and segments against the generator's record (`ysb-<run_id>/`)."""
    import pandas as pd

    run_dir = settings.runs_dir / run_id
    summary = json.loads((run_dir / "summary.json").read_text())
    record_dir = settings.runs_dir / f"ysb-{run_id}"
    by_type = json.loads((record_dir / "ysb.json").read_text())["events_by_type"]
    expected = pd.read_parquet(record_dir / "expected_views.parquet")
    assert summary["reconciled"] and summary["events_read"] == events, summary
    assert (summary["late_events"], summary["dead_letters"], summary["pending_events"]) == (0, 0, 0)
    assert summary["sum_window_counts"] == by_type["view"] == int(expected["views"].sum())
    assert len(summary["switches"]) == 2 and summary["strategy"] == "least_count" and summary["partitions"] == 6
    windows = pd.read_parquet(run_dir / "windows")
    assert not windows.duplicated(["campaign_id", "window_start"]).any()
    ours = pd.DataFrame({"campaign_id": windows["campaign_id"],
                         "window_start_ms": [int(t.timestamp() * 1000) for t in windows["window_start"]],
                         "views": windows["count"].astype("int64")})
    key = ["campaign_id", "window_start_ms"]
    pd.testing.assert_frame_equal(ours.sort_values(key).reset_index(drop=True), expected.sort_values(key).reset_index(drop=True),
                                  check_dtype=False)
    segments = json.loads((run_dir / "job.json").read_text())["segments"]
    assert [s["checkpoint"] for s in segments] == [f"{S3_CHECKPOINTS}/{run_id}/checkpoint{suffix}" for suffix in ("", "-1", "-2")]
    assert not list(run_dir.glob("checkpoint*"))


def _java_string_hash(text: str) -> int:
    """Java's `String.hashCode` (a signed 32-bit int), which Kafka hashes transactional ids with."""
    value = 0
    for char in text:
        value = (31 * value + ord(char)) & 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def _transaction_coordinator(settings, transactional_id: str) -> int:
    """The node leading the `__transaction_state` partition of `transactional_id`: its transaction
    coordinator (Kafka's `TransactionStateManager.partitionFor`: `Utils.abs(id.hashCode) % partitions`)."""
    from keyshift.topics import describe_topics

    state = describe_topics(settings, ["__transaction_state"])["__transaction_state"]
    code = _java_string_hash(transactional_id)
    return state.leaders[(0 if code == -(1 << 31) else abs(code)) % state.partitions]


def _kill_broker(settings, node: int) -> None:
    """`kill -9` of Kafka node `node`'s process group."""
    from keyshift.stack import kafka, process

    record = process.read_record(settings.home, kafka.process_name(settings, node))
    assert record is not None, f"no process record of Kafka node {node}"
    os.killpg(record.pid, signal.SIGKILL)


def test_broker_kills_mid_run_and_mid_transaction_lose_and_duplicate_nothing(cluster, tmp_path):
    """The flight job on the cluster while Kafka nodes die: `kill -9` of the leader of the input
    topic's partition 0 after batch 2 (the source reads on from the new leaders; the node is
    restarted two batches later), then of the side outputs' transaction coordinator while batch
    5's transaction is open (held by a failpoint, its records sent, not committed). The run
    finishes with windows equal to pandas' and exact accounting, and a `read_committed` reader sees
    every alert of the run exactly once."""
    import time

    from keyshift import stack
    from keyshift.names import ALERTS_TOPIC
    from keyshift.processing.outputs.side_outputs import sink_transactional_id
    from keyshift.topics import describe_topics
    from tests.integration.flight_runs import batches_done, side_outputs, wait_for

    flights = 40_000
    topic = _flights_topic(cluster, flights)
    run_id = f"{topic}-run"
    run_dir = cluster.runs_dir / run_id
    log_path = tmp_path / "driver.log"
    env = {**_environment(cluster), "KEYSHIFT_FAILPOINT": "side_outputs.hold_in_transaction@5"}
    job = subprocess.Popen(_job(topic, run_id, flights, 4_000), env=env, stdout=log_path.open("ab"), stderr=subprocess.STDOUT,
                           start_new_session=True)
    try:
        wait_for(lambda: batches_done(run_dir) >= 2, job, 600, "batch 2")
        leader = describe_topics(cluster, [topic])[topic].leaders[0]
        _kill_broker(cluster, leader)
        wait_for(lambda: batches_done(run_dir) >= 4, job, 600, "batch 4 with a Kafka node down")
        stack.up(cluster, "kafka", timeout_s=180)  # the killed node back: a second kill must leave a quorum
        holding = "failpoint side_outputs.hold_in_transaction@5: holding"
        wait_for(lambda: holding in (run_dir / "driver.log").read_text(errors="replace"), job, 600, "batch 5's open transaction")
        coordinator = _transaction_coordinator(cluster, sink_transactional_id(run_id))
        _kill_broker(cluster, coordinator)
        killed_at = time.monotonic()
        assert job.wait(timeout=900) == 0, log_path.read_text()[-4000:]
        assert time.monotonic() - killed_at < 900
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
        stack.up(cluster, "kafka", timeout_s=180)
    summary = _assert_equals_pandas(cluster, run_id, flights)
    alerts = side_outputs(cluster, run_id)[ALERTS_TOPIC]
    assert set(alerts.values()) == {1} and sum(alerts.values()) == summary["alerts"] > 0, (summary["alerts"], alerts.most_common(3))


def test_global_merge_on_the_cluster_equals_pandas(cluster, tmp_path):
    """Global Merge (no keyed exchange: each task's partial windows merged in the driver through
    Redis) on the cluster, checkpoints on the S3 store: windows equal to pandas', exact accounting,
    no shuffle bytes. (A kill and resume of a Global Merge run is `test_exchange_strategies`'s, on
    `local[*]`; the cluster's resume test is the flight job's above.)"""
    flights = 20_000
    settings = cluster.model_copy(update={"checkpoint_location": S3_CHECKPOINTS, **S3})
    topic = _flights_topic(settings, flights)
    run_id = f"{topic}-gm"
    # Global Merge closes windows on the global watermark: a one-day bound leaves no event late
    args = [*_job(topic, run_id, flights, 5_000), "--exchange", "global_merge"]
    args[args.index("--watermark") + 1], args[args.index("--bound-ms") + 1] = "global", str(86_400_000)
    done = subprocess.run(args, env=_environment(settings), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    summary = _assert_equals_pandas(settings, run_id, flights)
    assert summary["exchange"] == "global_merge" and summary["shuffle_write_bytes"] == 0, summary
    segment = json.loads((settings.runs_dir / run_id / "job.json").read_text())["segments"][0]
    assert segment["checkpoint"] == f"{S3_CHECKPOINTS}/{run_id}/checkpoint"


@pytest.fixture(scope="module")
def cluster_airflow(cluster):
    """An Airflow of the cluster's settings (its own home and port): its tasks' `KEYSHIFT_*`
    environment and its `spark_default` connection point at the standalone master, the 3-broker
    Kafka and the S3 store."""
    from keyshift import stack
    from keyshift.stack.airflow import api_session

    settings = cluster.model_copy(update={"airflow_port": 18080, "checkpoint_location": S3_CHECKPOINTS, **S3})
    try:
        stack.up(settings, "airflow", timeout_s=300)
        session = api_session(settings)
        yield settings, session
        session.close()
    finally:
        stack.down(settings, "airflow")


def test_the_pipeline_dag_runs_a_bounded_job_on_the_cluster(cluster_airflow):
    """`keyshift_pipeline` triggered through the REST API of an Airflow whose settings point at the
    cluster: its `spark_submit` task (JobSparkSubmitOperator on `spark_default`) runs the flight
    job on the standalone master with its checkpoints on S3; the run reconciles, equals pandas and
    the pipeline verifies it."""
    import time

    from keyshift import names
    from keyshift.orchestration import pipeline
    from keyshift.stack import spark_cluster
    from tests.integration.test_airflow_e2e import _task_report, _wait_for_dag

    settings, api = cluster_airflow
    dag, flights = names.PIPELINE_DAG_ID, 20_000
    _wait_for_dag(api)
    assert api.patch(f"/api/v2/dags/{dag}", json={"is_paused": False}, timeout=30).status_code == 200
    run_id = f"cluster_{uuid.uuid4().hex[:8]}"
    triggered = api.post(f"/api/v2/dags/{dag}/dagRuns", json={"dag_run_id": run_id, "logical_date": None,
                                                              "conf": {"limit": flights, "partitions": PARTITIONS, "strategy": "hash",
                                                                       "watermark": "key", "bound_ms": 60_000}},
                         timeout=30)
    assert triggered.status_code in (200, 201), triggered.text
    deadline, state = time.monotonic() + 900, None
    while time.monotonic() < deadline and state not in ("success", "failed"):
        time.sleep(5)
        state = api.get(f"/api/v2/dags/{dag}/dagRuns/{run_id}", timeout=30).json()["state"]
    assert state == "success", f"run {run_id} ended {state!r}:\n{_task_report(api, run_id)}"
    job_run = pipeline.job_run_id(run_id)
    run_dir = settings.runs_dir / job_run
    _assert_equals_pandas(settings, job_run, flights)
    assert json.loads((run_dir / "pipeline.json").read_text())["verified"] is True
    segment = json.loads((run_dir / "job.json").read_text())["segments"][0]
    assert segment["checkpoint"] == f"{S3_CHECKPOINTS}/{job_run}/checkpoint"
    apps = [app["name"] for app in spark_cluster.master_state(settings)["completedapps"]]
    assert any(name.endswith(job_run) for name in apps), apps  # the run's application, on the standalone master
