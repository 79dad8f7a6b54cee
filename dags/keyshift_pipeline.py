"""
### keyshift pipeline: input → Kafka → a keyshift Spark job → verified summary → data quality

Trigger it with the form's params (`job`: `flight_delays` or `ysb`; strategy, partitions P, `limit`
events, `rate` events/s, watermark `bound_ms`). Every run: `provision_topics` (the job's topics,
idempotent; for the flights' least_key, least_count and hot_split it also learns the assignment
from the first 10 % of the run's flights and publishes it in Redis with a new epoch) → `replay`
(real flights, or the YSB generator's ad events, which learns a least_key / least_count
assignment from its own first 10 %, into the job's input topic; the job starts reading where this
replay began) → `choose_mode`, then

* **bounded** (`limit` > 0): `spark_submit` (the provider's SparkSubmitOperator on connection
  `spark_default`, run in a driver folder on a cluster master: `JobSparkSubmitOperator`;
  blocks until the job has drained the `limit` events, flushed its windows and exited; a failed
  try is retried once, 15 s later, and the retry resumes the run from its checkpoint exactly);
* **continuous** (`limit` empty or 0; the replay sends the whole data set): `launch_job` (a
  detached supervisor and its driver; log in `runs/<run_id>/logs/driver.log`) → `watch_job`
  (deferred: the triggerer logs batches, consumer lag and restarts). A driver that dies is
  restarted from its checkpoint up to `max_restarts` times, `restart_delay_s` seconds after its
  death (Flink's fixed-delay restart strategy); past that the task fails naming the driver log.
  Stop the job with `keyshift.orchestration.launch.stop_job` (or SIGTERM to its supervisor).

Finally `verify_summary` checks `runs/<run_id>/summary.json`: events read = window counts + late
events + dead letters + filtered events (YSB's non-views) = events produced (= `limit` when
bounded), and writes
`runs/<run_id>/pipeline.json`; then `data_quality` runs the Great Expectations checkpoints of
`keyshift/quality/gx/` on the run (the job's suites: the windows table, the run's alert records
for the flights, YSB's counts against the generator's record, the reconciliation), builds the run's Data Docs in `runs/<run_id>/data_docs/index.html`, and fails
naming each failed expectation with a sample of its rows. The job's run id is the Airflow run id
made path-safe (`job_run_id`). All logic lives in `keyshift.orchestration`; this file only wires tasks and does
nothing at import.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from airflow.sdk import Param, dag, task

from keyshift import names
from keyshift.eventtime.watermarks import WATERMARK_MODES
from keyshift.processing.operators.exchange import EXCHANGES
from keyshift.orchestration import pipeline
from keyshift.orchestration.sensors import JobProgressSensor
from keyshift.orchestration.spark_submit import JobSparkSubmitOperator
from keyshift.orchestration.supervisor import DEFAULT_MAX_RESTARTS, DEFAULT_RESTART_DELAY_S
from keyshift.stack_env import DEFAULT_PARTITIONS

RUN_ID = "{{ job_run_id(run_id) }}"


@dag(
    dag_id=names.PIPELINE_DAG_ID,
    schedule=None,
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,  # runs share the input topic
    tags=["keyshift", "spark", "kafka", "flights", "ysb"],
    doc_md=__doc__,
    default_args={"owner": "keyshift", "retries": 0},
    user_defined_macros={"job_run_id": pipeline.job_run_id, "spark_env": pipeline.spark_env,
                         "connector_jars": pipeline.connector_jars_option, "job_topic": pipeline.job_topic,
                         "driver_java_options": pipeline.driver_java_options},
    params={
        "job": Param("flight_delays", type="string", enum=list(pipeline.JOBS),
                     description="The job: flight_delays (real flights, hourly delay windows per origin) or ysb "
                                 "(the Yahoo Streaming Benchmark: generated ad events, views per campaign per 10 s)."),
        "strategy": Param("hash", type="string", enum=list(pipeline.STRATEGIES),
                          description="Placement strategy: key → slot rule of producer and job "
                                      "(ysb: hash, least_key or least_count)."),
        "partitions": Param(DEFAULT_PARTITIONS, type="integer", minimum=1, maximum=1024,
                            description="P: slots = Kafka partitions; Spark runs them on min(P, 1 per core) stateful partitions."),
        "limit": Param(20000, type=["null", "integer"], minimum=0,
                       description="Events to replay and process (bounded run); empty or 0 = continuous."),
        "rate": Param(None, type=["null", "number"], exclusiveMinimum=0,
                      description="Replay rate in events/s; empty = as fast as possible."),
        "bound_ms": Param(3_600_000, type="integer", minimum=0,
                          description="Watermark bound in ms: how late an event may be before it counts as late."),
        "watermark": Param("global", type="string", enum=list(WATERMARK_MODES),
                           description="Watermark mode: global (one per query, Spark's: the fastest partition), partition (one per "
                                       "query: the slowest active Kafka partition, Flink's), key (one per key), "
                                       "nkey (one per group of keys), dynamic (per key, the bound follows the key's disorder up to bound_ms)."),
        "exchange": Param("local_merge", type="string", enum=list(EXCHANGES),
                          description="How events reach a key's windows (paper 000 §4.3): local_merge (partials per key "
                                      "and window before the shuffle), plain (every event crosses the shuffle) or "
                                      "global_merge (no shuffle: windows merged in Redis; needs watermark global or partition)."),
        "max_restarts": Param(DEFAULT_MAX_RESTARTS, type="integer", minimum=0, maximum=1000,
                              description="Continuous run: times a dead driver is restarted from its checkpoint "
                                          "before the run fails (restarts; Flink's fixed-delay attempts)."),
        "restart_delay_s": Param(DEFAULT_RESTART_DELAY_S, type="number", minimum=0, maximum=3600,
                                 description="Continuous run: seconds between a driver's death and its restart "
                                             "(Flink's fixed-delay delay)."),
    },
)
def keyshift_pipeline():
    @task
    def provision_topics(params=None) -> dict:
        from keyshift.settings import Settings

        settings, partitions, job = Settings(), int(params["partitions"]), params.get("job")
        pipeline.validate_strategy(params["strategy"], job)  # before anything is created
        pipeline.validate_exchange(params.get("exchange"), params.get("watermark"))
        topics = pipeline.provision(settings, partitions, job=job)
        assignment = pipeline.publish_assignment(settings, params["strategy"], partitions, params["limit"], job=job)
        return {"topics": topics, "assignment": assignment}

    @task
    def replay(run_id=None, params=None) -> dict:
        from keyshift.settings import Settings

        p = params
        return pipeline.replay(Settings(), p["limit"], p["rate"], p["strategy"], int(p["partitions"]),
                               job=p.get("job"), run_id=pipeline.job_run_id(run_id))

    @task.branch
    def choose_mode(params=None) -> str:
        return "spark_submit" if pipeline.is_bounded(params["limit"]) else "launch_job"

    @task
    def launch_job(run_id=None, params=None) -> dict:
        from keyshift.orchestration.launch import launch_job
        from keyshift.orchestration.supervisor import RestartPolicy
        from keyshift.settings import Settings

        policy = RestartPolicy(int(params["max_restarts"]), float(params["restart_delay_s"]))
        job = launch_job(Settings(), pipeline.job_run_id(run_id), strategy=params["strategy"],
                         partitions=int(params["partitions"]), bound_ms=int(params["bound_ms"]),
                         watermark=params.get("watermark") or "global", job=params.get("job"),
                         exchange=params.get("exchange") or "local_merge", policy=policy)
        return {"run_id": job.run_id, "pid": job.pid, "supervisor_pid": job.supervisor_pid,
                "log_path": str(job.log_path), "adopted": job.adopted}

    @task(trigger_rule="none_failed_min_one_success")
    def verify_summary(replayed: dict, run_id=None, params=None) -> dict:
        from keyshift.settings import Settings

        return pipeline.conclude_run(Settings(), pipeline.job_run_id(run_id), params,
                                     replayed=replayed, dag_run_id=run_id)

    @task
    def data_quality(run_id=None, params=None) -> dict:
        from airflow.sdk.exceptions import AirflowSkipException

        from keyshift.orchestration.quality import check_run_quality
        from keyshift.settings import Settings

        outcome = check_run_quality(Settings(), pipeline.job_run_id(run_id), params)
        if outcome["skipped"]:
            raise AirflowSkipException(outcome["reason"])
        return outcome

    spark_submit = JobSparkSubmitOperator(
        task_id="spark_submit",
        run_id=RUN_ID,
        retries=1,  # a retry resumes the run from its checkpoint (JobSparkSubmitOperator), exactly
        retry_delay=timedelta(seconds=15),
        conn_id="spark_default",
        application=str(pipeline.APPLICATION),
        jars="{{ connector_jars() }}",
        conf={"spark.driver.extraJavaOptions": "{{ driver_java_options() }}"},  # the class archive, when one exists
        name=f"keyshift-{RUN_ID}",
        application_args=pipeline.spark_submit_args(
            RUN_ID, "{{ params.strategy }}", "{{ params.partitions }}", "{{ params.bound_ms }}",
            "{{ params.limit }}", watermark="{{ params.watermark }}", job="{{ params.job }}",
            topic="{{ job_topic(params.job) }}", exchange="{{ params.exchange }}",
        ),
        env_vars={name: "{{ spark_env()['%s'] }}" % name
                  for name in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "PATH")},
        execution_timeout=timedelta(hours=2),
    )
    watch_job = JobProgressSensor(task_id="watch_job", run_id=RUN_ID, topic="{{ job_topic(params.job) }}")

    replayed, launched = replay(), launch_job()
    provision_topics() >> replayed >> choose_mode() >> [spark_submit, launched]
    launched >> watch_job
    [spark_submit, watch_job] >> verify_summary(replayed) >> data_quality()


keyshift_pipeline()
