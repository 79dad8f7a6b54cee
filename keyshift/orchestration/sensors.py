"""`JobProgressSensor`: hands the watch of a detached job to the triggerer.

A continuous job runs for hours; a worker slot must not sit in a poll loop for it. `execute()`
therefore only defers to `JobProgressTrigger`; the triggerer polls, logs progress and lag into
this task's log (and each restart of a dead driver by the run's supervisor: "driver died (signal
9), restart 1 of 3 in 10 s from its checkpoint"), and resumes the task in `execute_complete()`
once the job has ended. The shape
follows the Kafka provider's `AwaitMessageSensor`: a `BaseOperator` whose work is all deferred.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException

from keyshift import names
from keyshift.orchestration.triggers import JobProgressTrigger


class JobProgressSensor(BaseOperator):
    """Wait, deferred, for a detached job to end; fail the task if the job failed.

    Args:
        run_id: keyshift run id (templated: `"{{ job_run_id(run_id) }}"` in the pipeline DAG).
        topic: the job's input topic, for the consumer lag in the logs (templated: the pipeline
            DAG renders `"{{ job_topic(params.job) }}"`).
        poll_interval: seconds between the trigger's polls.
        start_grace_s: seconds the trigger waits for the run record to appear.
        max_wait: give up after this long (None: wait as long as the job runs).
        **kwargs: BaseOperator arguments (task_id, ...).

    Returns (from `execute_complete`): the trigger's event payload, pushed as XCom.

    Raises (from `execute_complete`): AirflowException naming the run, the reason and the
    driver log when the job failed, its driver died (past the restart limit, for a supervised
    run: the reason then says how the last attempt died and the limit), or Redis was unreachable.
    """

    template_fields: Sequence[str] = ("run_id", "topic")
    ui_color = "#c9e4ff"

    def __init__(
        self,
        *,
        run_id: str,
        topic: str = names.FLIGHTS_TOPIC,
        poll_interval: float = 10.0,
        start_grace_s: float = 120.0,
        max_wait: timedelta | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.run_id = run_id
        self.topic = topic
        self.poll_interval = poll_interval
        self.start_grace_s = start_grace_s
        self.max_wait = max_wait

    def execute(self, context: Any) -> None:
        """Defer to `JobProgressTrigger`; nothing else happens on the worker."""
        from keyshift.settings import Settings

        self.defer(
            trigger=JobProgressTrigger(
                run_id=self.run_id,
                settings=Settings().without_secrets(),  # stored in Airflow's database: no passwords
                topic=self.topic,
                poll_interval=self.poll_interval,
                start_grace_s=self.start_grace_s,
            ),
            method_name="execute_complete",
            timeout=self.max_wait,
        )

    def execute_complete(self, context: Any, event: dict[str, Any] | None = None) -> dict[str, Any]:
        """Resume after the trigger fired: return its payload, or fail naming the driver log."""
        if not event:
            raise AirflowException(f"run {self.run_id}: the trigger returned no event")
        if event.get("status") != "succeeded":
            message = f"run {event.get('run_id', self.run_id)} {event.get('status')}: {event.get('message')}"
            log_path = event.get("log_path")
            if not log_path or log_path not in message:
                message += f" (driver log: {log_path or 'unknown'})"
            if event.get("restarts"):
                message += f"; the driver was restarted {event['restarts']} time(s) before"
            raise AirflowException(message)
        self.log.info("%s; last batch %s; driver restarts %s", event.get("message"), event.get("last_batch"),
                      event.get("restarts", 0))
        return event
