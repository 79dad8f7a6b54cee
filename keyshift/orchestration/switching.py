"""The body of `keyshift_switch`'s `switch` task: carry out a recorded switch request.

`record_switch_request` (`keyshift.orchestration.monitor`) has validated the request and named
the running job run; `carry_out` hands it to `keyshift.migration.switch.request_switch`, which
plans the new assignment, writes the switch record in Redis and waits while the run's driver
cuts, migrates, publishes and verifies. Each step is logged as the record reaches it, so the
Airflow task log reads as the switch's timeline. A run that has not started its query yet
(`keyshift.errors.SwitchNotReady`) skips the task rather than failing it: nothing was switched,
and the balance monitor asks again at its next evaluation. Nothing here connects to anything at
import.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from keyshift.errors import JobError, SwitchNotReady, SwitchSkipped
from keyshift.migration.switch_record import SwitchRecord
from keyshift.settings import Settings

log = logging.getLogger(__name__)

WAIT_TIMEOUT_S = 600.0
"""Seconds the task waits for the driver to finish the switch (a switch on this machine takes
seconds; a driver restarted from its checkpoint to carry it out, about a minute)."""

RESULT_FIELDS = ("switch_id", "run_id", "topic", "state", "step", "strategy_from", "strategy_to", "partitions_from",
                 "partitions_to", "epoch_from", "epoch_to", "pause_seconds", "step_seconds", "in_driver", "plan", "verify",
                 "migration", "error")
"""The switch record's fields returned as the task's XCom (the assignments themselves stay in Redis)."""


def record_request(settings: Settings, conf: Mapping[str, Any], dag_run_id: str | None = None) -> dict[str, Any]:
    """The body of `keyshift_switch`'s `record_request` task: `monitor.record_switch_request`,
    with a run that has not started its query yet, or a monitor's decision that no longer fits its
    run (`SwitchSkipped`: the run is not running, or its placement changed since), skipping the task
    (and so the DAG run's `switch`) instead of failing it; nothing is recorded as a request then.
    A skipped decision's reason is also written into the monitor's record of it (`monitor.note_on_decision`).

    Raises:
        airflow.sdk.exceptions.AirflowSkipException: `SwitchNotReady` or `SwitchSkipped` (the message kept).
        ConfigurationError, StackError: from `record_switch_request`.
    """
    from keyshift.orchestration.monitor import note_on_decision, record_switch_request

    try:
        return record_switch_request(settings, dict(conf), dag_run_id=dag_run_id)
    except (SwitchNotReady, SwitchSkipped) as exc:
        from airflow.sdk.exceptions import AirflowSkipException

        log.warning("switch request not recorded: %s", exc)
        if isinstance(exc, SwitchSkipped) and note_on_decision(settings, dict(conf), "skipped", str(exc)):
            log.info("the reason is in the monitor's record of the decision of %s (keyshift:balance:%s:series)",
                     conf.get("decided_at"), conf.get("topic"))
        raise AirflowSkipException(str(exc)) from exc


def carry_out(settings: Settings, request: Mapping[str, Any], *, wait_timeout_s: float = WAIT_TIMEOUT_S) -> dict[str, Any]:
    """Switch `request["run_id"]` to `request["strategy"]` (and `request["partitions"]`) and wait until done.

    Args:
        settings: the stack. request: the record `record_switch_request` stored (run_id,
            strategy, partitions, partitions_from, reason). wait_timeout_s: seconds to wait.

    Returns:
        The finished switch record's `RESULT_FIELDS` (state `done`).

    Raises:
        airflow.sdk.exceptions.AirflowSkipException: the run is alive but has not started its
            query yet (`SwitchNotReady` from `request_switch`, its message kept, the error
            chained): nothing was switched or written, so the task is skipped, not failed.
        JobError: the switch failed or rolled back (the record's error and step), timed out, or
            its driver died; or another switch of the run holds the lock.
        ConfigurationError, StackError: from `request_switch`.
    """
    from keyshift.migration.switch import request_switch

    run_id = request["run_id"]
    partitions = request.get("partitions")
    keep_p = partitions is None or partitions == request.get("partitions_from")
    log.info("run %s: switching %s/P=%s -> %s/P=%s: %s", run_id, request.get("strategy_from"), request.get("partitions_from"),
             request["strategy"], request.get("partitions_from") if keep_p else partitions, request["reason"])

    def on_update(record: SwitchRecord) -> None:
        seconds = record.step_seconds.get(record.step)
        log.info("switch %s of run %s: %s at step %s%s (epoch %s -> %s)", record.switch_id, run_id, record.state,
                 record.step, f" ({seconds} s)" if seconds is not None else "", record.epoch_from, record.epoch_to)

    try:
        record = request_switch(settings, run_id, request["strategy"], None if keep_p else int(partitions), reason=request["reason"],
                                wait_timeout_s=wait_timeout_s, on_update=on_update)
    except SwitchNotReady as exc:
        from airflow.sdk.exceptions import AirflowSkipException

        log.warning("switch of run %s not carried out: %s", run_id, exc)
        raise AirflowSkipException(str(exc)) from exc
    if record.state != "done":
        raise JobError(f"switch {record.switch_id} of run {run_id} {record.state} at step {record.step}: "
                       f"{record.error}")
    plan, verify = record.plan or {}, record.verify or {}
    log.info("switch %s of run %s done: epoch %s in force, pause %s s, moved share %.3f (minimum %.3f), placement ok %s, "
             "conservation ok %s, in driver %s", record.switch_id, run_id, record.epoch_to, record.pause_seconds,
             plan.get("moved_share", 0.0), plan.get("min_moved_share", 0.0), (verify.get("placement") or {}).get("ok"),
             (verify.get("conservation") or {}).get("ok"), record.in_driver)
    return {field: getattr(record, field) for field in RESULT_FIELDS}
