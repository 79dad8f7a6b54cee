"""`keyshift bench ... --master`: the child environment, the event-log breakdown and the comparison
of two reports (pure logic; the event log's lines follow Spark's JsonProtocol, and the integration
test of `bench throughput` reads a real one)."""

from __future__ import annotations

import json
import shlex

import pytest

from keyshift.bench import masters, spark_events
from keyshift.errors import JobError
from keyshift.settings import Settings


def _task(launch: int, finish: int, deserialize: int, run: int, result: int = 0, fetch_wait: int = 0, remote: int = 0,
          local: int = 0, written: int = 0, write_ns: int = 0, cpu_ns: int = 0, gc: int = 0) -> dict:
    return {"Event": "SparkListenerTaskEnd", "Stage ID": 1, "Task End Reason": {"Reason": "Success"},
            "Task Info": {"Launch Time": launch, "Finish Time": finish, "Getting Result Time": 0, "Executor ID": "0"},
            "Task Metrics": {"Executor Deserialize Time": deserialize, "Executor Run Time": run, "Executor CPU Time": cpu_ns,
                             "JVM GC Time": gc, "Result Serialization Time": result,
                             "Shuffle Read Metrics": {"Fetch Wait Time": fetch_wait, "Remote Bytes Read": remote, "Local Bytes Read": local},
                             "Shuffle Write Metrics": {"Shuffle Bytes Written": written, "Shuffle Write Time": write_ns}}}


def _write(path, events):
    path.write_text("".join(json.dumps(e) + "\n" for e in events))


def test_breakdown_sums_task_metrics_and_executor_start(tmp_path):
    _write(tmp_path / "app-1", [
        {"Event": "SparkListenerApplicationStart", "App ID": "app-1", "Timestamp": 1_000},
        {"Event": "SparkListenerEnvironmentUpdate", "Spark Properties": {"spark.master": "spark://127.0.0.1:7077"}},
        {"Event": "SparkListenerExecutorAdded", "Timestamp": 1_000, "Executor ID": "driver"},
        {"Event": "SparkListenerExecutorAdded", "Timestamp": 3_500, "Executor ID": "0"},
        {"Event": "SparkListenerExecutorAdded", "Timestamp": 4_200, "Executor ID": "1"},
        {"Event": "SparkListenerJobStart", "Job ID": 0},
        _task(10_000, 10_500, deserialize=100, run=300, result=20, fetch_wait=50, remote=1_000, local=24, cpu_ns=250_000_000),
        _task(10_000, 11_000, deserialize=0, run=1_000, written=4_096, write_ns=30_000_000, gc=7),
    ])
    figures = spark_events.breakdown(tmp_path)
    assert figures["executors_ready_seconds"] == 3.2
    assert figures["task_seconds"] == 1.5
    assert figures["scheduler_delay_seconds"] == 0.08  # 500 - 100 - 300 - 20 of the first task; 0 of the second
    assert (figures["deserialize_seconds"], figures["run_seconds"], figures["result_serialization_seconds"]) == (0.1, 1.3, 0.02)
    assert (figures["shuffle_fetch_wait_seconds"], figures["shuffle_write_seconds"], figures["cpu_seconds"], figures["gc_seconds"]) \
        == (0.05, 0.03, 0.25, 0.007)
    assert (figures["shuffle_remote_bytes"], figures["shuffle_local_bytes"], figures["shuffle_written_bytes"]) == (1_000, 24, 4_096)
    assert (figures["tasks"], figures["jobs"]) == (2, 1)
    assert figures["applications"] == ["app-1"] and figures["master"] == "spark://127.0.0.1:7077"
    assert list(figures)[:len(spark_events.FIGURES)] == list(spark_events.FIGURES)


def test_breakdown_adds_up_every_application_of_a_relaunched_driver(tmp_path):
    for name, start in (("local-1", 0), ("local-2", 50_000)):
        _write(tmp_path / name, [{"Event": "SparkListenerApplicationStart", "App ID": name, "Timestamp": start},
                                 _task(start + 10, start + 110, deserialize=0, run=100)])
    figures = spark_events.breakdown(tmp_path)
    assert figures["tasks"] == 2 and figures["run_seconds"] == 0.2
    assert figures["executors_ready_seconds"] == 0  # local: the driver is the executor
    assert figures["applications"] == ["local-1", "local-2"]


def test_breakdown_without_an_event_log_says_where_it_looked(tmp_path):
    with pytest.raises(JobError, match="no Spark event log"):
        spark_events.breakdown(tmp_path / "missing")


def test_child_env_carries_the_master_and_the_event_log(tmp_path):
    settings = Settings(spark_master="spark://127.0.0.1:17077", runs_dir=tmp_path / "runs")
    env = masters.child_env(settings, tmp_path / "events", base={"PATH": "/bin", "KEYSHIFT_FAILPOINT": "x"})
    assert env["KEYSHIFT_SPARK_MASTER"] == "spark://127.0.0.1:17077"
    assert env["KEYSHIFT_RUNS_DIR"] == str(tmp_path / "runs")
    assert "KEYSHIFT_FAILPOINT" not in env and env["PATH"] == "/bin"
    args = shlex.split(env["PYSPARK_SUBMIT_ARGS"])
    assert args[-1] == "pyspark-shell"
    assert f"spark.eventLog.dir={(tmp_path / 'events').as_uri()}" in args and "spark.eventLog.enabled=true" in args
    assert (tmp_path / "events").is_dir()
    assert "PYSPARK_SUBMIT_ARGS" not in masters.child_env(settings, None, base={})


def test_child_env_refuses_submit_args_of_the_caller(tmp_path):
    with pytest.raises(JobError, match="PYSPARK_SUBMIT_ARGS"):
        masters.child_env(Settings(), tmp_path, base={"PYSPARK_SUBMIT_ARGS": "--conf a=b pyspark-shell"})


def _throughput_report(master: str, plain_eps: float, ours_eps: float, run_seconds: float) -> dict:
    rows = []
    for job, eps in (("plain", plain_eps), ("keyshift", ours_eps)):
        for run, scale in enumerate((0.9, 1.0, 1.2)):
            rows.append({"job": job, "partitions": 8, "strategy": "hash" if job == "keyshift" else "kafka_default", "run": run,
                         "events_per_second": eps * scale, "process_seconds": 100 / scale,
                         "spark": {"run_seconds": run_seconds * scale, "shuffle_fetch_wait_seconds": 1.0}})
    return {"rows": rows, "ratio_by_config": [{"partitions": 8, "strategy": "hash"}], "settings": {"spark_master": master}}


def test_compare_reports_of_throughput_gives_medians_and_differences():
    comparison = masters.compare_reports(_throughput_report("local[*]", 10_000, 9_000, 20.0),
                                         _throughput_report("spark://127.0.0.1:7077", 8_000, 7_000, 30.0))
    assert comparison["bench"] == "throughput" and comparison["masters"] == ["local[*]", "spark://127.0.0.1:7077"]
    ours = comparison["jobs"]["keyshift"]
    assert ours["events_per_second"] == {"first": 9_000, "second": 7_000, "difference": -2_000}
    assert ours["spark_run_seconds"] == {"first": 20.0, "second": 30.0, "difference": 10.0}
    assert comparison["jobs"]["plain"]["spark_shuffle_fetch_wait_seconds"]["difference"] == 0
    assert comparison["jobs"]["plain"]["spark_tasks"] == {"first": None, "second": None, "difference": None}


def test_compare_reports_of_switch_and_plot(tmp_path):
    def report(pause: float) -> dict:
        return {"switches": [{}], "median_pause_seconds": pause, "median_step_seconds": {"stopped": 1.0, "migrated": pause / 2},
                "spark": {"switching": {"run_seconds": 12.0}}, "settings": {}}

    comparison = masters.compare_reports(report(5.0), report(9.0))
    assert comparison["masters"] == ["local[*]", "local[*]"]
    assert comparison["jobs"]["keyshift"]["median_pause_seconds"]["difference"] == 4.0
    assert comparison["jobs"]["keyshift"]["step_migrated"] == {"first": 2.5, "second": 4.5, "difference": 2.0}
    assert masters.plot_comparison(comparison, tmp_path / "c.png").stat().st_size > 0


def test_compare_reports_refuses_two_kinds_of_bench():
    with pytest.raises(JobError, match="same bench"):
        masters.compare_reports(_throughput_report("local[*]", 1, 1, 1), {"switches": []})


def test_breakdown_reads_spark_4s_rolling_layout_in_order(tmp_path):
    folder = tmp_path / "eventlog_v2_app-7"
    folder.mkdir()
    (folder / "appstatus_app-7").write_text("")
    _write(folder / "events_10_app-7", [_task(5_000, 5_100, deserialize=0, run=100)])
    _write(folder / "events_2_app-7", [{"Event": "SparkListenerExecutorAdded", "Timestamp": 2_000, "Executor ID": "0"}])
    _write(folder / "events_1_app-7", [{"Event": "SparkListenerApplicationStart", "App ID": "app-7", "Timestamp": 500}])
    figures = spark_events.breakdown(tmp_path)
    assert figures["executors_ready_seconds"] == 1.5  # the start (part 1) read before the executor (part 2)
    assert figures["tasks"] == 1 and figures["applications"] == ["app-7"]
