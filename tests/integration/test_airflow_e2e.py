"""End to end through the running Airflow: trigger `keyshift_pipeline` over the REST API for a
bounded run of 20,000 real flights and check the run's summary reconciles.

Needs the whole local stack (`keyshift stack up`: Kafka, Redis, Airflow on 127.0.0.1:8080 with the
repository's dags/ and the `spark_default` connection). Skipped when the Airflow API does not
answer; fails, with the failed tasks' logs, when the run does not succeed within the timeout.
"""

from __future__ import annotations

import json
import time
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


@pytest.mark.integration
def test_bounded_run_through_airflow_reconciles(api, settings):
    _wait_for_dag(api)
    unpaused = api.patch(f"/api/v2/dags/{DAG}", json={"is_paused": False}, timeout=30)
    assert unpaused.status_code == 200, unpaused.text

    run_id = f"e2e_{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}"
    assert pipeline.job_run_id(run_id) == run_id  # the job's runs/<run_id>/ is this very id
    triggered = api.post(
        f"/api/v2/dags/{DAG}/dagRuns",
        json={"dag_run_id": run_id, "logical_date": None,
              "conf": {"limit": LIMIT, "partitions": settings.partitions, "strategy": "hash"}},
        timeout=30,
    )
    assert triggered.status_code in (200, 201), triggered.text

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

    run_dir = Path(settings.runs_dir) / run_id
    summary = json.loads((run_dir / "summary.json").read_text())
    accounted = summary["sum_window_counts"] + summary["late_events"] + summary["dead_letters"]
    assert summary["events_read"] == accounted, summary
    assert summary["events_read"] == summary["events_produced"] == LIMIT, summary
    assert summary["run_id"] == run_id and summary["partitions"] == settings.partitions

    record = json.loads((run_dir / "pipeline.json").read_text())
    assert record["verified"] is True and record["mode"] == "bounded"
    assert record["replay"]["events_produced"] == LIMIT
