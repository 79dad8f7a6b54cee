"""
### keyshift balance monitor: sample the stream, measure the real per-slot loads, decide, request a switch

Every 10 minutes (one run at a time, no catch-up) `evaluate` looks at the records that arrived
on `topic` since the previous run:

* **arrivals**: Kafka end-offset deltas per partition (= slot) since the previous run;
* **processed**: the job's per-slot processed events since the previous run (`run_id`, else the
  latest job run recorded for the topic; from its `summary.json` or `progress.jsonl`);
* **sample**: at most `max_events` of the arrived records (the most recent), keys sampled every
  `sample_every`-th event or with probability `sample_fraction`; every candidate strategy is
  scored on the sample (balance degree, paper 000 eq. 1; extra compute time, eq. 2; max/mean);
* **decision**: the `trigger` (paper 000 Table 6 `periodic` / `count` / `threshold`, or our
  `cost_aware` with its switch history in Redis) says stay or switch, with the reason and the
  expected gain (seconds of makespan saved over `horizon_s`; empty = this schedule's period).
  `cost_aware` counts the measured pause of the topic's last switch, else `cost_s`, else the
  median pause of the newest measured switches of any run, else a default; its reason names both.

The record goes to Redis (`keyshift:balance:<topic>:latest` and the recent series
`keyshift:balance:<topic>:series`) and to the Parquet history under
`runs/balance/topics/<topic>/history/`; `keyshift balance show --topic <topic>` prints it.
When the decision is to switch, `switch_decided` passes the decision on and `trigger_switch`
starts `keyshift_switch` with it as conf; otherwise both are skipped. All logic lives in
`keyshift.orchestration.monitor`; this file only wires tasks and does nothing at import.
"""

from __future__ import annotations

from datetime import UTC, datetime

from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator
from airflow.sdk import Param, dag, task

from keyshift import names
from keyshift.orchestration import monitor


@dag(
    dag_id=names.BALANCE_MONITOR_DAG_ID,
    schedule=monitor.EVALUATION_INTERVAL,  # also the default horizon_s
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,  # each run starts where the previous one's offsets ended
    tags=["keyshift", "monitoring", "kafka"],
    doc_md=__doc__,
    default_args={"owner": "keyshift", "retries": 0},
    params={
        "topic": Param(names.FLIGHTS_TOPIC, type="string", description="The monitored input topic."),
        "strategy": Param("hash", type="string", description="Label of the strategy in force (hash, modulo, least_key, least_count, weight, weight/random, hot_split)."),
        "partitions": Param(None, type=["null", "integer"], minimum=1, description="P of the evaluation; empty = the topic's partition count."),
        "trigger": Param("cost_aware", type="string", enum=["periodic", "count", "threshold", "cost_aware"],
                         description="Switch trigger: paper 000 Table 6, or ours (switch only when it pays)."),
        "theta": Param(0.6, type="number", minimum=0, maximum=1, description="threshold: balance degree below which to switch."),
        "period_s": Param(3600.0, type="number", exclusiveMinimum=0, description="periodic: seconds between firings."),
        "every_events": Param(1_000_000, type="integer", minimum=1, description="count: events between firings."),
        "horizon_s": Param(None, type=["null", "number"], exclusiveMinimum=0,
                           description=f"Seconds over which the expected gain is counted; empty = the schedule's period ({monitor.EVALUATION_INTERVAL_S:.0f} s)."),
        "cost_s": Param(None, type=["null", "number"], minimum=0,
                        description="cost_aware: migration cost in seconds until the topic has a measured switch; empty = the median "
                                    "pause of the newest measured switches of any run, else a default (see the README)."),
        "margin": Param(0.2, type="number", minimum=0, description="cost_aware: the gain must exceed cost x (1 + margin)."),
        "cooldown_s": Param(300.0, type="number", minimum=0, description="cost_aware: seconds after a switch during which switching back is refused."),
        "sample_fraction": Param(0.1, type="number", exclusiveMinimum=0, maximum=1, description="Share of the read events sampled (seeded); used when sample_every is empty."),
        "sample_every": Param(None, type=["null", "integer"], minimum=1, description="Sample every n-th read event instead of a fraction."),
        "max_events": Param(100_000, type="integer", minimum=1, description="At most this many of the arrived records are read (the most recent)."),
        "run_id": Param(None, type=["null", "string"], description="Job run whose per-slot counts are read; empty = the latest run on the topic."),
        "candidates": Param(list(monitor.DEFAULT_CANDIDATES), type="array", items={"type": "string"},
                            description="Strategies scored and possibly recommended (the one in force always is)."),
    },
)
def keyshift_balance_monitor():
    @task
    def evaluate(params=None, run_id=None) -> dict:
        from keyshift.settings import Settings

        return monitor.evaluate_topic(Settings(), monitor.monitor_params(dict(params)), monitor_run_id=run_id)

    @task.short_circuit
    def switch_decided(result: dict) -> dict | None:
        return result["switch_conf"]

    TriggerDagRunOperator(
        task_id="trigger_switch",
        trigger_dag_id=names.SWITCH_DAG_ID,
        conf=switch_decided(evaluate()),
        wait_for_completion=False,
    )


keyshift_balance_monitor()
