"""
### keyshift switch: accept a request to move a topic's placement to another strategy

Started by `keyshift_balance_monitor` when its trigger decides to switch (or by hand, with a
conf). The conf carries the decision: `topic`, `strategy` (to move to), `strategy_from` (in
force), `reason`, `expected_gain_s` (seconds of makespan saved over the trigger's horizon),
`trigger`, `partitions`, `decided_at` (ISO 8601) and `monitor_run_id`.

Its only task, `record_request`, validates the conf and records the request in Redis
(`keyshift:switch:<topic>:requests`, newest first) with state `requested`, and logs it.

**The migration itself is not here yet**: stopping the job at a batch boundary, moving its state
to the new assignment and restarting it (DESIGN.md, "How a job restarts with migrated state")
is a later issue. Until then a run of this DAG is the record that a switch was asked for.
"""

from __future__ import annotations

from datetime import UTC, datetime

from airflow.sdk import dag, task

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
)
def keyshift_switch():
    @task
    def record_request(dag_run=None, run_id=None) -> dict:
        from keyshift.settings import Settings

        return monitor.record_switch_request(Settings(), dict(dag_run.conf or {}), dag_run_id=run_id)

    record_request()


keyshift_switch()
