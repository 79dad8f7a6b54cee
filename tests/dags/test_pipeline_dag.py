"""The keyshift_pipeline DAG and its orchestration pieces.

Pure tests (no services): the DAG's wiring and rendered spark-submit arguments, the trigger's
serialization round trip, the sensor's defer-only `execute`, and the pipeline's small functions.

Integration tests (`-m integration`, need `keyshift stack up`; skipped when Kafka or Redis does
not answer): `dag.test()` of the provisioning task against the real broker, and the trigger
against real processes and the real Redis.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import socket
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from keyshift import names
from keyshift.errors import ConfigurationError
from keyshift.orchestration import pipeline
from keyshift.orchestration.triggers import JobProgressTrigger
from keyshift.settings import Settings

REPO = Path(__file__).resolve().parents[2]
DAG_FILE = REPO / "dags" / "keyshift_pipeline.py"


# ---------------------------------------------------------------- the DAG (pure)


@pytest.fixture(scope="module")
def dag():
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(DAG_FILE))
    assert not bag.import_errors, bag.import_errors
    return bag.dags[names.PIPELINE_DAG_ID]


def test_dag_shape(dag):
    upstream = {t.task_id: sorted(t.upstream_task_ids) for t in dag.tasks}
    assert upstream == {
        "provision_topics": [],
        "replay": ["provision_topics"],
        "choose_mode": ["replay"],
        "spark_submit": ["choose_mode"],
        "launch_job": ["choose_mode"],
        "watch_job": ["launch_job"],
        "verify_summary": ["replay", "spark_submit", "watch_job"],
        "data_quality": ["verify_summary"],  # after the job on both paths
    }
    assert dag.task_dict["verify_summary"].trigger_rule == "none_failed_min_one_success"
    assert dag.catchup is False


def test_dag_params_defaults(dag):
    params = dag.params.dump()
    assert params == {"job": "flight_delays", "strategy": "hash", "partitions": 8, "limit": 20000, "rate": None,
                      "bound_ms": 3_600_000, "watermark": "global", "exchange": "local_merge", "max_restarts": 3,
                      "restart_delay_s": 10.0}
    assert dag.params.get_param("exchange").schema["enum"] == ["local_merge", "plain", "global_merge"]
    assert dag.params.get_param("job").schema["enum"] == ["flight_delays", "ysb"]
    assert set(dag.params.get_param("watermark").schema["enum"]) == {"global", "partition", "key", "nkey", "dynamic"}
    # The trigger form accepts a continuous run (null limit) and rejects a negative one.
    schema = dag.params.get_param("limit").schema
    assert "null" in schema["type"] and schema["minimum"] == 0


@pytest.mark.parametrize(
    "limit, branch",
    [
        (20000, "spark_submit"),  # the default: a bounded run
        (1, "spark_submit"),  # the smallest bounded run
        (0, "launch_job"),  # 0 means continuous
        (None, "launch_job"),  # so does an empty field
    ],
)
def test_branch_choice(dag, limit, branch):
    assert dag.task_dict["choose_mode"].python_callable(params={"limit": limit}) == branch


def test_spark_submit_operator_renders_args_from_params(dag):
    op = dag.task_dict["spark_submit"]
    assert op._conn_id == "spark_default"
    assert op.application == str(REPO / "spark_jobs" / "keyshift_job.py")
    assert op.jars == "{{ connector_jars() }}"  # rendered at run time: under spark-submit the JVM exists before the job runs
    assert op.conf == {"spark.driver.extraJavaOptions": "{{ driver_java_options() }}"}  # the class archive, at run time
    env = dag.get_template_env()
    java_options = env.from_string(op.conf["spark.driver.extraJavaOptions"]).render()
    assert java_options == "" or Path(java_options.removeprefix("-XX:SharedArchiveFile=")).exists(), java_options
    context = {
        "params": {"job": "flight_delays", "strategy": "hash", "partitions": 4, "limit": 20000, "rate": None, "bound_ms": 60000,
                   "watermark": "key", "exchange": "local_merge"},
        "run_id": "manual__2026-01-02T03:04:05.678901+00:00",
    }
    rendered = [env.from_string(arg).render(**context) for arg in op.application_args]
    assert rendered == [
        "--run-id", "manual__2026-01-02T03_04_05.678901_00_00", "--job", "flight_delays",
        "--strategy", "hash", "--partitions", "4", "--bound-ms", "60000", "--limit", "20000", "--topic", "flights",
        "--watermark", "key", "--exchange", "local_merge",
    ]
    ysb = {**context, "params": {**context["params"], "job": "ysb", "strategy": "least_count"}}
    rendered = [env.from_string(arg).render(**ysb) for arg in op.application_args]
    assert rendered[2:4] == ["--job", "ysb"] and rendered[rendered.index("--topic") + 1] == "ysb-ad-events"
    watch = dag.task_dict["watch_job"]
    assert "topic" in watch.template_fields
    assert env.from_string(watch.topic).render(**ysb) == "ysb-ad-events"
    rendered_env = {k: env.from_string(v).render(**context) for k, v in op.env_vars.items()}
    assert rendered_env["PYSPARK_PYTHON"] == str(Path(sys.executable).parent / "python")
    assert rendered_env["PATH"].split(os.pathsep)[0] == str(Path(sys.executable).parent)
    assert (Path(rendered_env["PATH"].split(os.pathsep)[0]) / "spark-submit").exists()


def test_watch_job_run_id_is_templated(dag):
    op = dag.task_dict["watch_job"]
    assert "run_id" in op.template_fields
    rendered = dag.get_template_env().from_string(op.run_id).render(run_id="scheduled__x:y+z")
    assert rendered == "scheduled__x_y_z"


# ---------------------------------------------------------------- trigger and sensor (pure)


def _trigger(**overrides) -> JobProgressTrigger:
    kwargs = dict(run_id="r1", settings=Settings().model_dump(mode="json"), topic="flights",
                  poll_interval=0.5, start_grace_s=3.0, redis_error_limit=5)
    kwargs.update(overrides)
    return JobProgressTrigger(**kwargs)


def test_trigger_serialize_round_trip():
    from airflow.sdk._shared.module_loading import import_string

    trigger = _trigger()
    classpath, kwargs = trigger.serialize()
    assert classpath == "keyshift.orchestration.triggers.JobProgressTrigger"
    json.dumps(kwargs)  # the triggerer stores the kwargs: they must be plain JSON
    rebuilt = import_string(classpath)(**kwargs)
    assert rebuilt.serialize() == (classpath, kwargs)


def test_trigger_serialize_mirrors_constructor():
    params = set(inspect.signature(JobProgressTrigger.__init__).parameters) - {"self"}
    assert set(_trigger().serialize()[1]) == params


def test_trigger_rejects_zero_poll_interval():
    with pytest.raises(ValueError, match="poll_interval"):
        _trigger(poll_interval=0)


@pytest.mark.parametrize(
    "record, alive, status",
    [
        ({"state": "running"}, True, None),  # a live job: keep watching
        ({"state": "starting"}, None, None),  # another host or no pid yet: trust the state only
        ({"state": "succeeded"}, False, "succeeded"),  # a bounded run drained and exited
        ({"state": "stopped"}, False, "succeeded"),  # a continuous run ended on SIGTERM
        ({"state": "failed", "error": "JobError: boom"}, True, "failed"),  # the job says so, even while still exiting
        ({"state": "running"}, False, "failed"),  # crashed without a final state
        ({"state": "running", "stop_requested_at": "t"}, False, "succeeded"),  # stopped by stop_job
        ({"state": "failed", "supervisor_pid": "7"}, True, None),  # a supervised driver died: its supervisor decides
        ({"state": "restarting", "supervisor_pid": "7"}, True, None),  # in the restart delay
        ({"state": "failed", "supervisor_pid": "7", "error": "driver died (signal 9) on attempt 2 of 2"}, False, "failed"),  # past the limit
        ({"state": "restarting", "supervisor_pid": "7"}, False, "failed"),  # the supervisor was killed in the delay
    ],
)
def test_trigger_outcome_table(record, alive, status):
    outcome = _trigger()._outcome({"log_path": "/runs/r1/logs/driver.log", **record}, alive)
    assert (outcome[0] if outcome else None) == status
    if status == "failed":
        assert "/runs/r1/logs/driver.log" in outcome[1]
        assert record.get("error", "") in outcome[1]  # the job's own error text is passed on


def test_sensor_execute_only_defers():
    from airflow.sdk.exceptions import TaskDeferred

    from keyshift.orchestration.sensors import JobProgressSensor

    sensor = JobProgressSensor(task_id="watch", run_id="run-7", poll_interval=2.0)
    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute(context={})
    assert deferred.value.method_name == "execute_complete"
    classpath, kwargs = deferred.value.trigger.serialize()
    assert classpath.endswith("JobProgressTrigger")
    assert kwargs["run_id"] == "run-7" and kwargs["poll_interval"] == 2.0
    assert kwargs["settings"]["redis_port"] == Settings().redis_port


def test_sensor_execute_complete():
    from airflow.sdk.exceptions import AirflowException

    from keyshift.orchestration.sensors import JobProgressSensor

    sensor = JobProgressSensor(task_id="watch", run_id="run-7")
    ok = {"status": "succeeded", "run_id": "run-7", "message": "run run-7 succeeded", "log_path": "/x"}
    assert sensor.execute_complete({}, ok) == ok
    failed = {"status": "failed", "run_id": "run-7", "message": "driver process 42 is gone",
              "log_path": "/runs/run-7/logs/driver.log"}
    with pytest.raises(AirflowException, match="/runs/run-7/logs/driver.log"):
        sensor.execute_complete({}, failed)
    with pytest.raises(AirflowException, match="no event"):
        sensor.execute_complete({}, None)


# ---------------------------------------------------------------- pipeline functions (pure)


@pytest.mark.parametrize(
    "airflow_run_id, expected",
    [
        ("e2e_1700000000", "e2e_1700000000"),  # already clean: unchanged
        ("manual__2026-01-02T03:04:05+00:00", "manual__2026-01-02T03_04_05_00_00"),  # Airflow's form
        ("a/b c", "a_b_c"),  # path separator and space
    ],
)
def test_job_run_id(airflow_run_id, expected):
    assert pipeline.job_run_id(airflow_run_id) == expected
    assert pipeline.job_run_id(expected) == expected  # idempotent


@pytest.mark.parametrize("bad", ["", ".", ".."])
def test_job_run_id_rejects_empty(bad):
    with pytest.raises(ConfigurationError):
        pipeline.job_run_id(bad)


def test_is_bounded_rejects_negative():
    with pytest.raises(ConfigurationError, match="-5"):
        pipeline.is_bounded(-5)


@pytest.mark.parametrize(
    "job, topics",
    [
        (None, ("flights", "flights-dead-letter", "flights-late", "flight-delay-alerts")),  # the default job
        ("flight_delays", ("flights", "flights-dead-letter", "flights-late", "flight-delay-alerts")),
        ("ysb", ("ysb-ad-events", "ysb-ad-events-dead-letter", "ysb-ad-events-late")),  # no alerts topic
    ],
)
def test_job_topics_follow_the_jobs_spec(job, topics):
    assert pipeline.job_topics(job) == topics
    assert pipeline.job_topic(job) == topics[0]


def test_pipeline_jobs_are_registered_tumbling_jobs():
    from keyshift.jobs import job_spec

    assert pipeline.JOBS == ("flight_delays", "ysb")
    assert all(not job_spec(job).key_windows for job in pipeline.JOBS)
    assert set(pipeline.STRATEGIES) == {s for offered in pipeline.JOB_STRATEGIES.values() for s in offered}


@pytest.mark.parametrize(
    "job, strategy, message",
    [
        ("ysb", "hot_split", "for job ysb; choose one of ['hash', 'least_key', 'least_count']"),
        ("ysb", "round_robin", "for job ysb"),
        ("flight_delays", "modulo", "for job flight_delays"),
        ("flight_delays_sliding", "hash", "job 'flight_delays_sliding' is not run by the pipeline; choose one of ['flight_delays', 'ysb']"),
        ("nope", "hash", "choose one of ['flight_delays', 'ysb']"),
    ],
)
def test_unsupported_job_and_strategy_combinations_are_refused(job, strategy, message, tmp_path):
    with pytest.raises(ConfigurationError) as refused:
        pipeline.validate_strategy(strategy, job)
    assert message in str(refused.value)
    settings = Settings(runs_dir=tmp_path)  # the tasks refuse them before touching a service
    with pytest.raises(ConfigurationError):
        pipeline.publish_assignment(settings, strategy, 4, 100, job=job)
    with pytest.raises(ConfigurationError):
        pipeline.replay(settings, 100, None, strategy, 4, job=job, run_id="r")
    if job not in pipeline.JOBS:
        with pytest.raises(ConfigurationError, match="not run by the pipeline"):
            pipeline.provision(settings, 4, job=job)


def test_ysb_replay_needs_the_run_id_for_its_record(tmp_path):
    with pytest.raises(ConfigurationError, match="run id"):
        pipeline.replay(Settings(runs_dir=tmp_path), 100, None, "hash", 4, job="ysb")


@pytest.mark.parametrize("events", [1, 7, 20_000, 19_999, 1_000_000])
@pytest.mark.parametrize("rate", [None, 3.0, 100.0, 777.7])
def test_ysb_generation_makes_exactly_the_limit(events, rate):
    import math

    plan = pipeline.ysb_generation(events, rate, now_ms=1_800_000_000_000)
    assert math.floor(plan["rate"] * plan["duration"]) == events  # the generator's own count
    if rate is None:  # a backfill that ends by now
        assert plan["rate"] == pipeline.YSB_BACKFILL_EVENT_RATE
        last_ms = plan["start_ms"] + math.floor((events - 1) * 1000 / plan["rate"])
        assert last_ms <= 1_800_000_000_000
    else:  # paced in real time from now
        assert plan["rate"] == rate and plan["start_ms"] is None


def test_spark_submit_args_name_the_job():
    args = pipeline.spark_submit_args("r", "least_count", 4, 10_000, 20_000, topic="ysb-ad-events", job="ysb")
    assert args[:4] == ["--run-id", "r", "--job", "ysb"] and args[args.index("--topic") + 1] == "ysb-ad-events"
    assert "--job" not in pipeline.spark_submit_args("r", "hash", 8, 1, None)


def test_exchange_param_reaches_the_job_and_is_checked_against_the_watermark_mode():
    args = pipeline.spark_submit_args("r", "hash", 8, 1, 100, watermark="global", exchange="global_merge")
    assert args[-4:] == ["--watermark", "global", "--exchange", "global_merge"]
    assert "--exchange" not in pipeline.spark_submit_args("r", "hash", 8, 1, 100)
    assert pipeline.validate_exchange(None) == "local_merge" and pipeline.validate_exchange("plain", "key") == "plain"
    assert pipeline.validate_exchange("global_merge", "global") == "global_merge"
    with pytest.raises(ConfigurationError, match="choose watermark global"):
        pipeline.validate_exchange("global_merge", "key")
    with pytest.raises(ConfigurationError, match="unknown exchange"):
        pipeline.validate_exchange("keyby")


def test_spark_submit_args_continuous_has_no_limit():
    assert pipeline.spark_submit_args("r", "hash", 8, 3_600_000, None) == [
        "--run-id", "r", "--strategy", "hash", "--partitions", "8", "--bound-ms", "3600000",
    ]
    assert "--limit" not in pipeline.spark_submit_args("r", "hash", 8, 1, 0)


@pytest.mark.parametrize(
    "ends, offsets, lag",
    [
        ({0: 10, 1: 5}, {"0": 10, "1": 5}, {0: 0, 1: 0}),  # caught up
        ({0: 10, 1: 5}, {"0": 4}, {0: 6, 1: 5}),  # partition 1 not read yet: counts from 0
        ({0: 10}, {"0": 12}, {0: 0}),  # stale end offsets: never negative
        ({}, {}, {}),  # empty topic
    ],
)
def test_consumer_lag(ends, offsets, lag):
    assert pipeline.consumer_lag(ends, offsets) == lag


GOOD_SUMMARY = {"run_id": "r", "events_read": 100, "events_produced": 100, "sum_window_counts": 97,
                "late_events": 2, "dead_letters": 1}


@pytest.mark.parametrize(
    "change, kwargs, problem",
    [
        ({}, {"expected_events": 100, "events_replayed": 100, "run_id": "r"}, None),  # reconciles
        ({"late_events": 3}, {}, "sum_window_counts"),  # one event counted twice
        ({"events_produced": 101}, {}, "events_produced 101"),  # job read less than produced
        ({}, {"expected_events": 200}, "limit 200"),  # bounded run stopped early
        ({}, {"events_replayed": 99}, "replayed 99"),  # replay and job disagree
        ({}, {"run_id": "other"}, "run_id"),  # somebody else's summary
        ({"dead_letters": None}, {}, "dead_letters"),  # missing field
        ({"events_produced": 500}, {"complete": False}, None),  # a continuous run stopped early
        ({"late_events": 3}, {"complete": False}, "sum_window_counts"),  # ... still accounts every event
        ({"events_read": 130, "events_produced": 130, "filtered_events": 30}, {}, None),  # YSB: non-views filtered
        ({"events_read": 130, "events_produced": 130, "filtered_events": 29}, {}, "filtered_events 29"),
    ],
)
def test_summary_problems(change, kwargs, problem):
    problems = pipeline.summary_problems({**GOOD_SUMMARY, **change}, **kwargs)
    if problem is None:
        assert problems == []
    else:
        assert len(problems) == 1 and problem in problems[0], problems


def test_conclude_run_bounded_without_summary_fails_and_records(tmp_path):
    from keyshift.errors import JobError

    settings = Settings(runs_dir=tmp_path)
    with pytest.raises(JobError, match="wrote no summary"):
        pipeline.conclude_run(settings, "r", {"limit": 100}, replayed={"events_produced": 100})
    record = json.loads((tmp_path / "r" / "pipeline.json").read_text())
    assert record["verified"] is False and "no summary" in record["error"]


def test_conclude_run_bounded_with_summary(tmp_path):
    settings = Settings(runs_dir=tmp_path)
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "summary.json").write_text(json.dumps(GOOD_SUMMARY))
    record = pipeline.conclude_run(settings, "r", {"limit": 100}, replayed={"events_produced": 100}, dag_run_id="r")
    assert record["verified"] is True and record["mode"] == "bounded"
    assert json.loads((tmp_path / "r" / "pipeline.json").read_text())["summary"] == GOOD_SUMMARY


def test_conclude_run_continuous_without_summary(tmp_path):
    record = pipeline.conclude_run(Settings(runs_dir=tmp_path), "r", {"limit": None})
    assert record["verified"] is False and record["mode"] == "continuous"


# ---------------------------------------------------------------- integration



@pytest.fixture
def redis_client(stack_settings):
    import redis

    client = redis.Redis.from_url(stack_settings.redis_url, decode_responses=True)
    yield client
    client.close()


def _dag_test_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment of a `dag.test()` subprocess: its own AIRFLOW_HOME and SQLite metadata
    database under `tmp_path` (migrated here), this checkout's dags/, plus `extra` variables."""
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(tmp_path / "airflow"),
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAG_FILE.parent),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{tmp_path / 'airflow.db'}",
        **extra,
    }
    migrate = subprocess.run([str(Path(sys.executable).parent / "airflow"), "db", "migrate"],
                             env=env, capture_output=True, text=True, timeout=300)
    assert migrate.returncode == 0, migrate.stderr[-3000:]
    return env


# dag.test() needs a metadata database; it runs in a fresh interpreter with its own AIRFLOW_HOME
# (SQLite), so it neither touches the running Airflow's database nor inherits another test's
# Airflow configuration. Every task but provision_topics is marked success without running.
_DAG_TEST = textwrap.dedent(
    """
    import json, sys
    from airflow.dag_processing.dagbag import DagBag
    bag = DagBag(dag_folder=sys.argv[1])
    dag = bag.dags["keyshift_pipeline"]
    run = dag.test(run_conf={"partitions": int(sys.argv[2])}, mark_success_pattern=r"(?!provision_topics$).*")
    from airflow.utils.session import create_session
    with create_session() as session:
        states = {ti.task_id: str(ti.state) for ti in run.get_task_instances(session=session)}
    print("RESULT " + json.dumps({"state": str(run.state), "tasks": states}))
    """
)


@pytest.mark.integration
def test_dag_test_provisions_topics_idempotently(stack_settings, tmp_path):
    from keyshift.topics import end_offsets

    env = _dag_test_env(tmp_path)
    partitions = stack_settings.partitions
    for attempt in (1, 2):  # the second run finds the topics and must succeed all the same
        proc = subprocess.run([sys.executable, "-c", _DAG_TEST, str(DAG_FILE), str(partitions)],
                              env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        assert proc.returncode == 0 and lines, f"dag.test() run {attempt} failed:\n{proc.stderr[-4000:]}"
        result = json.loads(lines[-1][len("RESULT "):])
        assert result["state"] == "success", (attempt, result, proc.stderr[-4000:])
        assert result["tasks"]["provision_topics"] == "success"
    for topic in names.FLIGHT_TOPICS:
        assert len(end_offsets(stack_settings, topic)) == partitions, topic


# The continuous path for real: `launch_job` starts the flight delay job detached, `watch_job`
# defers and dag.test() runs its trigger inline; a helper thread stops the job once its query
# runs, the trigger reports the clean end, and `verify_summary` checks the summary the job wrote.
# The replay is marked success (a continuous replay sends all 3,000,000 flights).
_DAG_TEST_CONTINUOUS = textwrap.dedent(
    """
    import json, sys, threading, time
    from pathlib import Path
    from airflow.dag_processing.dagbag import DagBag
    from keyshift import names
    from keyshift.orchestration import launch, pipeline
    from keyshift.runs import redis_client
    from keyshift.settings import Settings

    settings = Settings()
    stopped = {}

    def stopper():
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            runs = [p.name for p in Path(settings.runs_dir).iterdir()] if Path(settings.runs_dir).exists() else []
            if runs:
                run_id = runs[0]
                log_path = pipeline.driver_log_path(settings, run_id)
                record = launch.read_run_record(settings, run_id)
                started = log_path.exists() and "query started" in log_path.read_text(errors="replace")
                batch_done = redis_client(settings).hget(names.redis_progress_key(run_id), "latest")
                if record.get("state") == "running" and started and batch_done:
                    time.sleep(5)  # the trigger polls: let it see and log the batch
                    stopped["run_id"], stopped["stopped"] = run_id, launch.stop_job(settings, run_id, 60)
                    return
            time.sleep(1)

    stopper_thread = threading.Thread(target=stopper, daemon=True)
    stopper_thread.start()
    dag = DagBag(dag_folder=sys.argv[1]).dags["keyshift_pipeline"]
    run = dag.test(run_conf={"limit": 0, "partitions": int(sys.argv[2])}, mark_success_pattern=r"replay")
    # the job can end, and the DAG run with it, before stop_job() returns to the stopper
    # (it also waits for the run record): wait for the stopper's own answer
    stopper_thread.join(timeout=120)
    from airflow.utils.session import create_session
    with create_session() as session:
        states = {ti.task_id: str(ti.state) for ti in run.get_task_instances(session=session)}
    print("RESULT " + json.dumps({"state": str(run.state), "tasks": states, **stopped}))
    """
)


@pytest.mark.integration
def test_dag_test_continuous_path_launch_watch_stop(stack_settings, tmp_path):
    if not (REPO / "spark_jobs" / "keyshift_job.py").exists():
        pytest.skip("spark_jobs/keyshift_job.py is not there yet")
    runs = tmp_path / "runs"
    env = _dag_test_env(tmp_path, KEYSHIFT_RUNS_DIR=str(runs))
    proc = subprocess.run([sys.executable, "-c", _DAG_TEST_CONTINUOUS, str(DAG_FILE), str(stack_settings.partitions)],
                          env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    driver_logs = "\n".join(p.read_text(errors="replace")[-3000:] for p in runs.glob("*/logs/driver.log"))
    assert proc.returncode == 0 and lines, f"dag.test() failed:\n{proc.stderr[-4000:]}\n{driver_logs}"
    result = json.loads(lines[-1][len("RESULT "):])
    assert result.get("stopped") is True, (result, driver_logs)
    assert result["state"] == "success", (result, proc.stderr[-4000:], driver_logs)
    assert result["tasks"]["spark_submit"] == "skipped"
    assert result["tasks"]["launch_job"] == result["tasks"]["watch_job"] == "success"
    assert result["tasks"]["verify_summary"] == "success"
    assert result["tasks"]["data_quality"] == "success"
    run_dir = runs / result["run_id"]
    record = json.loads((run_dir / "pipeline.json").read_text())
    assert record["mode"] == "continuous"
    # the GX checkpoints ran on the stopped run (partial: it may have read less than produced)
    assert record["quality"]["success"] is True, record["quality"]
    assert {s["suite"] for s in record["quality"]["suites"]} == {"flight_delay_windows", "flight_delay_alerts", "run_reconciliation"}
    assert (run_dir / "data_docs" / "index.html").is_file()
    assert "consumer lag" in proc.stdout + proc.stderr  # the trigger logged the job's lag


# The bounded YSB path for real: provision the YSB topics, generate 20,000 ad events (a backfill),
# spark-submit the YSB job through the provider's SparkSubmitOperator (the `spark_default`
# connection given as AIRFLOW_CONN_SPARK_DEFAULT, `local[*]`), verify the summary with its filtered
# events, and run the YSB suites against the generator's record.
_DAG_TEST_YSB = textwrap.dedent(
    """
    import json, sys
    from airflow.dag_processing.dagbag import DagBag
    dag = DagBag(dag_folder=sys.argv[1]).dags["keyshift_pipeline"]
    run = dag.test(run_conf={"job": "ysb", "strategy": "least_count", "limit": 20000, "partitions": int(sys.argv[2]),
                             "watermark": "key", "bound_ms": 10000})
    from airflow.utils.session import create_session
    with create_session() as session:
        states = {ti.task_id: str(ti.state) for ti in run.get_task_instances(session=session)}
    print("RESULT " + json.dumps({"state": str(run.state), "tasks": states}))
    """
)


@pytest.mark.integration
def test_dag_test_bounded_ysb_run(stack_settings, tmp_path):
    from keyshift.stack.airflow import spark_connection
    from keyshift.topics import describe_topics

    existing = describe_topics(stack_settings, [names.YSB_TOPIC]).get(names.YSB_TOPIC)
    partitions = existing.partitions if existing else 4  # the pipeline refuses another P than the topic's
    runs = tmp_path / "runs"
    env = _dag_test_env(tmp_path, AIRFLOW_CONN_SPARK_DEFAULT=spark_connection(stack_settings), KEYSHIFT_RUNS_DIR=str(runs))
    proc = subprocess.run([sys.executable, "-c", _DAG_TEST_YSB, str(DAG_FILE), str(partitions)],
                          env=env, capture_output=True, text=True, timeout=900, cwd=tmp_path)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"dag.test() failed:\n{proc.stderr[-6000:]}"
    result = json.loads(lines[-1][len("RESULT "):])
    assert result["state"] == "success", (result, proc.stderr[-6000:])
    assert result["tasks"]["spark_submit"] == "success" and result["tasks"]["launch_job"] == "skipped"
    assert result["tasks"]["data_quality"] == "success"
    (run_dir,) = [p for p in runs.iterdir() if not p.name.startswith("ysb-")]
    record = json.loads((run_dir / "pipeline.json").read_text())
    summary, replayed = record["summary"], record["replay"]
    assert summary["job"] == "ysb" and summary["topic"] == names.YSB_TOPIC and summary["strategy"] == "least_count"
    assert summary["events_read"] == replayed["events_produced"] == 20_000
    assert summary["filtered_events"] == 20_000 - replayed["views"] and summary["sum_window_counts"] == replayed["views"]
    assert {s["suite"] for s in record["quality"]["suites"]} == {"ysb_windows", "run_reconciliation"}
    assert Path(replayed["record_dir"]) == runs / f"ysb-{run_dir.name}"


def _record_running_driver(client, settings: Settings, run_id: str, argv: list[str]):
    """Start a real process the way `launch_job` does and write its Redis run record."""
    from keyshift.stack import process

    started = process.start(pipeline.run_dir(settings, run_id), pipeline.DRIVER_NAME, argv)
    client.hset(names.redis_run_key(run_id), mapping={
        "run_id": run_id, "state": "running", "pid": str(started.pid),
        "pid_create_time": repr(started.create_time), "host": socket.gethostname(),
        "log_path": started.log_file,
    })
    return started


async def _first_event(trigger: JobProgressTrigger, timeout_s: float = 60.0):
    async def first():
        async for event in trigger.run():
            return event
    return await asyncio.wait_for(first(), timeout_s)


@pytest.fixture
def run_id(redis_client):
    run_id = f"test-trigger-{uuid.uuid4().hex[:8]}"
    yield run_id
    redis_client.delete(names.redis_run_key(run_id), names.redis_progress_key(run_id))


@pytest.mark.integration
def test_trigger_fails_when_recorded_driver_dies(stack_settings, redis_client, run_id, tmp_path):
    import signal

    settings = Settings(runs_dir=tmp_path)
    driver = _record_running_driver(redis_client, settings, run_id, [sys.executable, "-c", "import time; time.sleep(120)"])
    trigger = _trigger(run_id=run_id, settings=settings.model_dump(mode="json"), poll_interval=0.2)

    async def scenario():
        watch = asyncio.ensure_future(_first_event(trigger))
        await asyncio.sleep(1.0)
        assert not watch.done(), "the trigger fired while the driver was alive"
        os.killpg(driver.pid, signal.SIGKILL)  # a crash: the job never writes a final state
        return await watch

    event = asyncio.run(scenario())
    assert event.payload["status"] == "failed"
    assert event.payload["pid"] == driver.pid
    assert "is gone" in event.payload["message"] and driver.log_file in event.payload["message"]
    assert event.payload["log_path"] == driver.log_file
    assert trigger._client is None  # cleanup closed the Redis client


@pytest.mark.integration
def test_trigger_reports_progress_then_success(stack_settings, redis_client, run_id, tmp_path, capfd, caplog):
    settings = Settings(runs_dir=tmp_path)
    driver = _record_running_driver(redis_client, settings, run_id, [sys.executable, "-c", "import time; time.sleep(120)"])
    progress = {"batch_id": 3, "input_rows": 10, "processed_rows_per_slot": [5, 5],
                "offsets": {"0": 0}, "watermark_ms": 1_000, "timestamp_ms": 2_000}
    redis_client.hset(names.redis_progress_key(run_id), "latest", json.dumps(progress))
    trigger = _trigger(run_id=run_id, settings=settings.model_dump(mode="json"), poll_interval=0.2)

    async def scenario():
        watch = asyncio.ensure_future(_first_event(trigger))
        await asyncio.sleep(1.5)
        redis_client.hset(names.redis_run_key(run_id), mapping={"state": "succeeded"})
        return await watch

    try:
        with caplog.at_level("INFO"):
            event = asyncio.run(scenario())
    finally:
        from keyshift.stack import process

        process.stop(pipeline.run_dir(settings, run_id), pipeline.DRIVER_NAME, timeout_s=5)
    assert event.payload["status"] == "succeeded", event.payload
    assert event.payload["last_batch"]["batch_id"] == 3
    logged = capfd.readouterr().out + caplog.text  # Airflow's structlog writes to stdout
    assert "consumer lag" in logged and "batch 3" in logged
    assert driver.pid == event.payload["pid"]


@pytest.mark.integration
def test_trigger_fails_without_run_record(stack_settings, run_id):
    event = asyncio.run(_first_event(_trigger(run_id=run_id, poll_interval=0.2, start_grace_s=0.5)))
    assert event.payload["status"] == "failed" and "no run record" in event.payload["message"]


@pytest.mark.integration
def test_detached_launch_adopt_and_stop(stack_settings, redis_client, run_id, tmp_path):
    """A real spark-submit launch of a stand-in application, adopted on relaunch, then stopped."""
    from keyshift.orchestration import launch

    app = tmp_path / "app.py"
    app.write_text("import time\nprint('stand-in driver up', flush=True)\ntime.sleep(300)\n")
    settings = Settings(runs_dir=tmp_path / "runs")
    job = launch.launch_job(settings, run_id, strategy="hash", partitions=2, bound_ms=1000,
                            application=app, startup_check_s=2.0)
    try:
        record = redis_client.hgetall(names.redis_run_key(run_id))
        assert record["state"] == "starting" and record["pid"] == str(job.pid)
        assert record["log_path"] == str(job.log_path) == str(pipeline.driver_log_path(settings, run_id))
        assert "--run-id" in job.command and run_id in job.command
        again = launch.launch_job(settings, run_id, strategy="hash", partitions=2, bound_ms=1000, application=app)
        assert again.adopted and again.pid == job.pid
        trigger = _trigger(run_id=run_id, settings=settings.model_dump(mode="json"), poll_interval=0.2)

        async def scenario():
            watch = asyncio.ensure_future(_first_event(trigger))
            await asyncio.sleep(0.5)
            assert await asyncio.to_thread(launch.stop_job, settings, run_id, 20.0)
            return await watch

        event = asyncio.run(scenario())
        assert event.payload["status"] == "succeeded" and "stopped on request" in event.payload["message"]
        assert launch.driver_record(settings, run_id) is None
    finally:
        launch.stop_job(settings, run_id, timeout_s=5)


@pytest.mark.integration
def test_detached_launch_fails_fast_naming_log(stack_settings, run_id, tmp_path):
    from keyshift.errors import JobError
    from keyshift.orchestration import launch

    app = tmp_path / "crash.py"
    app.write_text("raise SystemExit('stand-in driver crashed on purpose')\n")
    settings = Settings(runs_dir=tmp_path / "runs")
    with pytest.raises(JobError) as failure:
        launch.launch_job(settings, run_id, strategy="hash", partitions=2, bound_ms=1000,
                          application=app, startup_check_s=60.0)
    assert str(pipeline.driver_log_path(settings, run_id)) in str(failure.value)
    assert launch.read_run_record(settings, run_id)["state"] == "failed"


def test_provisioning_publishes_a_learned_strategy_and_nothing_for_hash(stack_settings):
    from keyshift.placement.assignment_store import AssignmentStore

    topic = f"keyshift-test-pipeline-{uuid.uuid4().hex[:8]}"
    store = AssignmentStore.from_settings(stack_settings, topic)
    try:
        assert pipeline.publish_assignment(stack_settings, "hash", 4, 20_000, topic=topic) is None
        published = pipeline.publish_assignment(stack_settings, "least_count", 4, 20_000, topic=topic)
        assert published["epoch"] == 1 and published["events"] == 2_000 and published["split"] == {}  # first 10 % of 20,000
        snapshot = store.snapshot()
        assert snapshot["strategy"] == "least_count" and snapshot["partitions"] == 4 and len(snapshot["mapping"]) == published["keys"]
        again = pipeline.publish_assignment(stack_settings, "hot_split", 4, 20_000, topic=topic)
        assert again["epoch"] == 2 and store.snapshot()["strategy"] == "hot_split"
        with pytest.raises(ConfigurationError, match="modulo"):
            pipeline.publish_assignment(stack_settings, "modulo", 4, 20_000, topic=topic)
    finally:
        store.delete()
