"""
### keyshift switch: move a running job to another strategy or P, its state migrated

Started by `keyshift_balance_monitor` when its trigger decides to switch (its decision is the
conf), or by hand from the trigger form: `strategy` to move to, optionally `partitions` (a new P)
and the job's `run_id` (empty = the latest job run on `topic`), and a `reason`. The monitor's
conf adds `strategy_from` and `partitions_from` (what it saw in force), `expected_gain_s`
(seconds of makespan saved over its horizon), `trigger`, `decided_at` and `monitor_run_id`.

1. `record_request` validates the request, names the job run (it must be running, with no switch
   under way), takes what is in force from the run's record and records the request in Redis
   (`keyshift:switch:<topic>:requests`, newest first). A monitor's decision for a run that is no
   longer running, or whose placement (strategy, P) changed since the decision, is skipped, not
   failed: the reason is in the task log and in the monitor's record of the decision
   (`switch_request` in `keyshift:balance:<topic>:series`), and the monitor decides again.
2. `switch` carries it out (`keyshift.migration.switch.request_switch`): plan the new assignment
   on a sample of the topic (least state moved), then the running driver cuts its query at a
   batch boundary, migrates every key's state to the new slots, starts the new query from the
   committed Kafka offsets, publishes epoch e+1 and verifies placement and conservation. Each
   step is logged as it completes; the switch record is `keyshift:switch:run:<run_id>:record`
   (history `...:history`; `keyshift switch --run RUN_ID --history` prints it). The task fails
   with the record's error when the switch fails or rolls back (the run then goes on under the
   old assignment). It is skipped, not failed, when the run is alive but has not started its
   query yet (its driver is starting, or a bounded run waits for its `--limit` records): the
   log says so, nothing was switched, and the monitor asks again at its next evaluation.

All logic lives in `keyshift.orchestration.monitor` and `keyshift.orchestration.switching`; this
file only wires tasks and does nothing at import.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from airflow.sdk import Param, dag, task

from keyshift import names
from keyshift.orchestration import monitor


@dag(
    dag_id=names.SWITCH_DAG_ID,
    schedule=None,
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    tags=["keyshift", "migration"],
    doc_md=__doc__,
    default_args={"owner": "keyshift", "retries": 0},
    params={
        "run_id": Param(None, type=["null", "string"], description="The job run to switch; empty = the latest job run on the topic."),
        "strategy": Param("least_count", type="string", enum=list(monitor.DEFAULT_CANDIDATES), description="Strategy to move to."),
        "partitions": Param(None, type=["null", "integer"], minimum=1, description="P to move to (slots); empty = keep P."),
        "reason": Param("requested by hand from the Airflow UI", type="string", minLength=1, description="Why; recorded with the switch."),
        "topic": Param(names.FLIGHTS_TOPIC, type="string", description="The job's input topic (finds the run when run_id is empty)."),
        "strategy_from": Param(None, type=["null", "string"], description="Monitor: the strategy it saw in force; empty = the run's."),
        "partitions_from": Param(None, type=["null", "integer"], minimum=1, description="Monitor: the P it saw in force; empty = the run's."),
        "expected_gain_s": Param(None, type=["null", "number"], description="Monitor: seconds of makespan saved over its horizon."),
        "trigger": Param("manual", type="string", enum=list(monitor.REQUEST_TRIGGERS), description="Who decided: a monitor trigger, or manual."),
        "decided_at": Param(None, type=["null", "string"], description="Monitor: when it decided (ISO 8601)."),
        "monitor_run_id": Param(None, type=["null", "string"], description="Monitor: its DAG run."),
    },
)
def keyshift_switch():
    @task
    def record_request(params=None, run_id=None) -> dict:
        from keyshift.orchestration.switching import record_request as record
        from keyshift.settings import Settings

        return record(Settings(), dict(params), dag_run_id=run_id)

    @task(execution_timeout=timedelta(minutes=15))
    def switch(request: dict) -> dict:
        from keyshift.orchestration.switching import carry_out
        from keyshift.settings import Settings

        return carry_out(Settings(), request)

    switch(record_request())


keyshift_switch()
