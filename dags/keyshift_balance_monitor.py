"""
### keyshift balance monitor: every live job run, sampled, measured, decided, switched

On its schedule (`KEYSHIFT_MONITOR_INTERVAL_S`, default every 10 minutes; one run at a time, no
catch-up) `live_runs` lists every live job run keyshift knows (its run record in Redis in state
`running` or `restarting`; finished runs are never evaluated or switched) and `evaluate` runs once
per run (dynamic task mapping: one mapped instance per run, named after it in the grid). Each
evaluation looks at the records that arrived on the run's topic since that run's previous
evaluation, against the strategy and P in force in the run's record:

* **arrivals**: Kafka end-offset deltas per partition (= slot) since the previous evaluation;
* **processed**: the run's per-slot processed events since the previous evaluation (from its
  `summary.json` or `progress.jsonl`);
* **sample**: at most `max_events` of the arrived records (the most recent), keys sampled every
  `sample_every`-th event or with probability `sample_fraction`; every candidate strategy is
  scored on the sample (balance degree, paper 000 eq. 1; extra compute time, eq. 2; max/mean);
* **decision**: the `trigger` (paper 000 Table 6 `periodic` / `count` / `threshold`, or our
  `cost_aware` with its switch history in Redis) says stay or switch, with the reason and the
  expected gain (seconds of makespan saved over `horizon_s`; empty = this schedule's period).
  `cost_aware` counts the measured pause of the topic's last switch, else `cost_s`, else the
  median pause of the newest measured switches of any run, else a default; its reason names both.

By hand, `topic` evaluates that topic alone (its live runs; with none, the topic's arrivals
against `strategy` and `partitions`, and nothing is switched), and `run_id` that live run alone.
Two live runs on one topic are evaluated each with its own cursor; at most one of them is
switched per monitor run (the larger expected gain), since the topic's assignment is shared.

The records go to Redis (`keyshift:balance:<topic>:latest`, the recent series
`keyshift:balance:<topic>:series`) and to the Parquet history under
`runs/balance/topics/<topic>/history/`; `keyshift balance show --topic <topic>` prints them.
`switches_decided` re-reads each deciding run's record: a run that is no longer running, or whose
placement changed since, is skipped with the reason in the task log and in the monitor's record
(`switch_request`); `trigger_switch` starts one `keyshift_switch` run per remaining decision
(none: the mapped task is skipped). A run whose evaluation fails does not hold the others'
switches (`switches_decided` runs whatever became of `evaluate`); `all_evaluated` then fails the
monitor's run, naming it. All logic lives in `keyshift.orchestration.monitor`; this file
only wires tasks and does nothing at import.
"""

from __future__ import annotations

from datetime import UTC, datetime

from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator
from airflow.sdk import Param, dag, get_current_context, task

from keyshift import names
from keyshift.orchestration import monitor
from keyshift.settings import Settings


@dag(
    dag_id=names.BALANCE_MONITOR_DAG_ID,
    schedule=monitor.evaluation_interval(Settings()),  # also the default horizon_s
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,  # each run starts where the previous one's offsets ended
    tags=["keyshift", "monitoring", "kafka"],
    doc_md=__doc__,
    default_args={"owner": "keyshift", "retries": 0},
    params={
        "topic": Param(None, type=["null", "string"], description="Empty = every live job run on its own topic (the schedule's "
                       "runs); a topic = that topic alone (its live runs, else its arrivals against strategy and partitions)."),
        "strategy": Param("hash", type="string", description="A topic no live run reads: label of the strategy in force "
                          "(hash, modulo, least_key, least_count, weight, weight/random, hot_split); a run's record says it otherwise."),
        "partitions": Param(None, type=["null", "integer"], minimum=1, description="A topic no live run reads: P of the evaluation; empty = the topic's partition count."),
        "trigger": Param("cost_aware", type="string", enum=["periodic", "count", "threshold", "cost_aware"],
                         description="Switch trigger: paper 000 Table 6, or ours (switch only when it pays)."),
        "theta": Param(0.6, type="number", minimum=0, maximum=1, description="threshold: balance degree below which to switch."),
        "period_s": Param(3600.0, type="number", exclusiveMinimum=0, description="periodic: seconds between firings."),
        "every_events": Param(1_000_000, type="integer", minimum=1, description="count: events between firings."),
        "horizon_s": Param(None, type=["null", "number"], exclusiveMinimum=0,
                           description=f"Seconds over which the expected gain is counted; empty = the schedule's period (KEYSHIFT_MONITOR_INTERVAL_S; default {monitor.EVALUATION_INTERVAL_S:.0f} s)."),
        "cost_s": Param(None, type=["null", "number"], minimum=0,
                        description="cost_aware: migration cost in seconds until the topic has a measured switch; empty = the median "
                                    "pause of the newest measured switches of any run, else a default (see the README)."),
        "margin": Param(0.2, type="number", minimum=0, description="cost_aware: the gain must exceed cost x (1 + margin)."),
        "cooldown_s": Param(300.0, type="number", minimum=0, description="cost_aware: seconds after a switch during which switching back is refused."),
        "sample_fraction": Param(0.1, type="number", exclusiveMinimum=0, maximum=1, description="Share of the read events sampled (seeded); used when sample_every is empty."),
        "sample_every": Param(None, type=["null", "integer"], minimum=1, description="Sample every n-th read event instead of a fraction."),
        "max_events": Param(100_000, type="integer", minimum=1, description="At most this many of the arrived records are read (the most recent)."),
        "run_id": Param(None, type=["null", "string"], description="One live job run to evaluate alone; empty = every live run (of the topic, when given)."),
        "candidates": Param(list(monitor.DEFAULT_CANDIDATES), type="array", items={"type": "string"},
                            description="Strategies scored and possibly recommended, of those the run's job runs (the one in force always is)."),
    },
)
def keyshift_balance_monitor():
    @task
    def live_runs(params=None) -> list[dict]:
        return monitor.evaluation_targets(Settings(), dict(params))

    @task(map_index_template="{{ evaluated }}")
    def evaluate(target: dict, params=None, run_id=None) -> dict:
        get_current_context()["evaluated"] = target["label"]
        return monitor.evaluate_target(Settings(), dict(params), target, monitor_run_id=run_id)

    @task(trigger_rule="all_done")  # a run whose evaluation failed does not hold the others' switches
    def switches_decided(results: list[dict]) -> list[dict]:
        return monitor.switch_requests(Settings(), list(results))

    @task(trigger_rule="all_done")
    def all_evaluated(targets: list[dict], results: list[dict]) -> int:
        return monitor.check_evaluations(targets, list(results))

    targets = live_runs()
    results = evaluate.expand(target=targets)
    all_evaluated(targets, results)
    TriggerDagRunOperator.partial(
        task_id="trigger_switch",
        trigger_dag_id=names.SWITCH_DAG_ID,
        wait_for_completion=False,
    ).expand(conf=switches_decided(results))


keyshift_balance_monitor()
