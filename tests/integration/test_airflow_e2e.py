"""End to end through the running Airflow: trigger `keyshift_pipeline` over the REST API for a
bounded run of 20,000 real flights and check the run's summary reconciles; then kill a bounded
run's driver mid-batch and check Airflow's retry resumes it exactly.

Needs the whole local stack (`keyshift stack up`: Kafka, Redis, Airflow on 127.0.0.1:8080 with the
repository's dags/ and the `spark_default` connection). Skipped when the Airflow API does not
answer; fails, with the failed tasks' logs, when the run does not succeed within the timeout.
"""

from __future__ import annotations

import json
import os
import signal
import time
import warnings
from pathlib import Path

import pytest
import requests

from keyshift import names
from keyshift.orchestration import pipeline
from keyshift.settings import Settings

LIMIT = 20_000
RUN_TIMEOUT_S = 600.0
PARSE_TIMEOUT_S = 180.0
"""The dag-processor lists new files every 30 s on the local stack; allow a few rounds."""
DAG = names.PIPELINE_DAG_ID


@pytest.fixture(scope="module")
def settings() -> Settings:
    return Settings()


@pytest.fixture(scope="module")
def api(settings):
    from keyshift.errors import StackError
    from keyshift.stack.airflow import api_session

    try:
        session = api_session(settings)
    except StackError as exc:
        pytest.skip(f"Airflow API not available ({exc}); start the stack with `keyshift stack up`")
    yield session
    session.close()


def _wait_for_dag(api) -> dict:
    """Wait until the dag-processor has parsed the DAG; fail with its import error if any."""
    deadline = time.monotonic() + PARSE_TIMEOUT_S
    while time.monotonic() < deadline:
        response = api.get(f"/api/v2/dags/{DAG}", timeout=30)
        if response.status_code == 200:
            return response.json()
        errors = api.get("/api/v2/importErrors", timeout=30).json().get("import_errors", [])
        ours = [e for e in errors if "keyshift_pipeline" in (e.get("filename") or "")]
        assert not ours, f"Airflow could not import the DAG: {ours[0].get('stack_trace')}"
        time.sleep(5)
    pytest.fail(f"Airflow did not list DAG {DAG} within {PARSE_TIMEOUT_S:.0f} s")


def _task_report(api, run_id: str) -> str:
    """Each task's state, and the log of every task that failed, for the failure message."""
    tis = api.get(f"/api/v2/dags/{DAG}/dagRuns/{run_id}/taskInstances", timeout=30).json()
    lines = []
    for ti in tis.get("task_instances", []):
        lines.append(f"{ti['task_id']}: {ti['state']}")
        if ti["state"] in ("failed", "upstream_failed") and ti.get("try_number"):
            log = api.get(
                f"/api/v2/dags/{DAG}/dagRuns/{run_id}/taskInstances/{ti['task_id']}/logs/{ti['try_number']}",
                params={"full_content": "true"}, timeout=60,
            )
            content = log.json().get("content", []) if log.ok else [log.text]
            lines.extend(f"    {_log_line(entry)}" for entry in content[-40:])
    return "\n".join(lines)


def _log_line(entry) -> str:
    """One structured task-log entry as text, with the exception types and messages it carries."""
    if not isinstance(entry, dict):
        return str(entry)
    errors = "; ".join(f"{e.get('exc_type')}: {e.get('exc_value')}" for e in entry.get("error_detail") or [])
    return f"{entry.get('event', '')} {errors}".strip()


def _trigger(api, prefix: str, conf: dict) -> str:
    """Unpause the DAG and trigger a run of it with `conf`; its run id (= the job's run id)."""
    _wait_for_dag(api)
    unpaused = api.patch(f"/api/v2/dags/{DAG}", json={"is_paused": False}, timeout=30)
    assert unpaused.status_code == 200, unpaused.text
    run_id = f"{prefix}_{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}"
    assert pipeline.job_run_id(run_id) == run_id  # the job's runs/<run_id>/ is this very id
    triggered = api.post(f"/api/v2/dags/{DAG}/dagRuns", json={"dag_run_id": run_id, "logical_date": None, "conf": conf},
                         timeout=30)
    assert triggered.status_code in (200, 201), triggered.text
    return run_id


def _wait_for_run(api, run_id: str) -> None:
    """Wait for the DAG run to end; fail with the failed tasks' logs unless it succeeded."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    state = None
    while time.monotonic() < deadline:
        try:  # the API server may restart under us (`keyshift stack up` of another checkout, ...)
            state = api.get(f"/api/v2/dags/{DAG}/dagRuns/{run_id}", timeout=30).json()["state"]
        except requests.ConnectionError as exc:
            print(f"Airflow API not answering, retrying: {exc}")
        if state in ("success", "failed"):
            break
        time.sleep(5)
    assert state == "success", f"run {run_id} ended {state!r}:\n{_task_report(api, run_id)}"


@pytest.mark.integration
def test_bounded_run_through_airflow_reconciles(api, settings):
    run_id = _trigger(api, "e2e", {"limit": LIMIT, "partitions": settings.partitions, "strategy": "hash"})
    _wait_for_run(api, run_id)

    run_dir = Path(settings.runs_dir) / run_id
    summary = json.loads((run_dir / "summary.json").read_text())
    accounted = summary["sum_window_counts"] + summary["late_events"] + summary["dead_letters"]
    assert summary["events_read"] == accounted, summary
    assert summary["events_read"] == summary["events_produced"] == LIMIT, summary
    assert summary["run_id"] == run_id and summary["partitions"] == settings.partitions

    record = json.loads((run_dir / "pipeline.json").read_text())
    assert record["verified"] is True and record["mode"] == "bounded"
    assert record["replay"]["events_produced"] == LIMIT
    _warn_if_retried(api, run_id)


def _spark_submit_tries(api, run_id: str) -> int:
    """The try number of the run's `spark_submit` task instance (1 = never retried)."""
    ti = api.get(f"/api/v2/dags/{DAG}/dagRuns/{run_id}/taskInstances/spark_submit", timeout=30).json()
    return int(ti["try_number"])


def _warn_if_retried(api, run_id: str) -> None:
    """A retried `spark_submit` is correct (it resumed) but worth seeing in the test summary."""
    tries = _spark_submit_tries(api, run_id)
    if tries > 1:
        first = api.get(f"/api/v2/dags/{DAG}/dagRuns/{run_id}/taskInstances/spark_submit/logs/1",
                        params={"full_content": "true"}, timeout=60)
        content = first.json().get("content", []) if first.ok else [first.text]
        warnings.warn(f"run {run_id}: spark_submit needed {tries} tries; the first ended: "
                      + " | ".join(_log_line(entry) for entry in content[-3:]), stacklevel=2)


KILLED_LIMIT = 100_000
"""The killed run's events: one micro-batch of them (the job's 250,000-record limit) runs for
several seconds, the window in which the test kills its driver."""


@pytest.mark.integration
def test_a_killed_bounded_driver_is_retried_and_resumed_exactly(api, settings):
    """kill -9 of a bounded run's Python driver in the middle of its first batch: spark-submit
    fails, Airflow retries `spark_submit` 15 s later, the retry resumes the run from its
    checkpoint (`--resume`, not a new run that its checkpoint would refuse) and the run
    reconciles with every event counted once."""
    from keyshift.names import RunDir
    from keyshift.runs import read_run_record

    run_id = _trigger(api, "e2e_killed", {"limit": KILLED_LIMIT, "partitions": settings.partitions, "strategy": "hash"})
    checkpoint = RunDir(Path(settings.runs_dir) / run_id).checkpoint()
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while not (checkpoint / "offsets" / "0").exists():  # the first batch is planned: the run is resumable
        assert time.monotonic() < deadline, f"run {run_id} never started its first batch:\n{_task_report(api, run_id)}"
        time.sleep(0.05)
    assert not (checkpoint / "commits" / "0").exists(), "the first batch was already committed: the kill would come too late"
    pid = int(read_run_record(settings, run_id)["pid"])
    os.kill(pid, signal.SIGKILL)

    _wait_for_run(api, run_id)
    assert _spark_submit_tries(api, run_id) == 2
    summary = json.loads((Path(settings.runs_dir) / run_id / "summary.json").read_text())
    assert summary["resumes"] == 1, summary["resumes"]
    accounted = summary["sum_window_counts"] + summary["late_events"] + summary["dead_letters"] + summary["pending_events"]
    assert summary["events_read"] == accounted == KILLED_LIMIT == summary["events_produced"], summary
