"""End to end through the running Airflow: the balance monitor decides, `keyshift_switch` switches
the continuous job that `keyshift_pipeline` launched, with its state migrated.

1. `keyshift_pipeline` (REST API) for a continuous run with hash at P = 8: it replays the
   3,000,000 flights into the `flights` topic (the pipeline has no topic param: it is always
   `flights`) and launches the detached, supervised job, which reads that backlog in batches of
   250,000 (about two minutes here): the switch happens while it does, so the new query has
   records to commit its first batch with. Nothing else is produced: the run's summary counts
   the events produced by the pipeline's replay, and a stopped run may read fewer, never more.
2. Once the job has committed a batch, `keyshift_balance_monitor` with the threshold trigger at
   θ = 0.6 and candidates hash and least_count (hash's balance degree on the flights at P = 8 is
   about 0.29): it decides to switch and its `trigger_switch` starts `keyshift_switch` with the
   decision, naming the job run.
3. `keyshift_switch` records the request and switches the run inside its driver: the switch
   record in Redis is `done`, the run record and progress.jsonl show the new epoch; a dry
   evaluation afterwards takes least_count as in force from the run record.
4. The job is stopped through the pipeline's stop path (`launch.stop_job`); the pipeline's
   watch ends, `verify_summary` and `data_quality` succeed, and the summary (one run over both
   queries) reconciles and lists the switch.

Unpausing the monitor makes Airflow start a scheduled run of it at once (catch-up off still
runs the latest interval), with the DAG's defaults; it runs during the pipeline's replay, and
before its own monitor run the test waits for it to end and deletes the `keyshift_switch` runs
queued meanwhile (keyshift_switch is paused until then), so only the test's decision switches
the job; the monitor is paused again once the test's monitor run ended, since every scheduled
run evaluates every live run (this job too). Pause states are restored at the end.

Needs the whole local stack (`keyshift stack up`); skipped when the Airflow API does not answer.
About 6.5 minutes on 2 cores shared with other Spark jobs, most of it before the job's first
batch: the pipeline's replay of the 3,000,000 flights (190-220 s there) and a first batch of 250,000.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import redis
import requests

# the running Airflow's API session (module fixture) and its log-entry formatter, from the pipeline e2e test
from test_airflow_e2e import _log_line, api  # noqa: F401

from keyshift import names
from keyshift.orchestration import launch, pipeline

pytestmark = pytest.mark.integration

PARTITIONS = 8
DAGS = (names.PIPELINE_DAG_ID, names.BALANCE_MONITOR_DAG_ID, names.SWITCH_DAG_ID)
FIRST_BATCH_S = 720.0
"""Seconds from the pipeline's trigger to the job's first committed batch: the replay of 3,000,000 flights
(40 s on an idle machine, 190-220 s with other Spark jobs beside it on 2 cores), the launch, and a first
batch of 250,000 records (20 s idle, 90 s loaded)."""
MONITOR_CONF = {"topic": names.FLIGHTS_TOPIC, "strategy": "hash", "trigger": "threshold", "theta": 0.6, "sample_fraction": 1.0,
                "max_events": 20_000, "candidates": ["hash", "least_count"]}


def _get(api, path: str, **params) -> dict:
    for attempt in range(6):  # the API server may restart under us (`keyshift stack up` of another checkout)
        try:
            response = api.get(path, params=params or None, timeout=30)
            if response.status_code < 500:
                response.raise_for_status()
                return response.json()
        except requests.ConnectionError as exc:
            print(f"Airflow API not answering ({exc}); retrying")
        time.sleep(5)
    pytest.fail(f"Airflow API: GET {path} kept failing")


def _runs(api, dag_id: str) -> list[dict]:
    return _get(api, f"/api/v2/dags/{dag_id}/dagRuns", order_by="-run_after", limit=50)["dag_runs"]


def _report(api, dag_id: str, run_id: str) -> str:
    """Each task's state, and the tail of every failed task's log, for a failure message."""
    lines = [f"{dag_id} {run_id}:"]
    for ti in _get(api, f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances")["task_instances"]:
        lines.append(f"  {ti['task_id']}: {ti['state']}")
        if ti["state"] == "failed" and ti.get("try_number"):
            path = f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{ti['task_id']}/logs/{ti['try_number']}"
            lines.extend(f"      {_log_line(e)}" for e in _get(api, path, full_content="true").get("content", [])[-30:])
    return "\n".join(lines)


def _wait_run(api, dag_id: str, run_id: str, timeout_s: float, until=("success", "failed")) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = _get(api, f"/api/v2/dags/{dag_id}/dagRuns/{run_id}")["state"]
        if state in until:
            return state
        time.sleep(3)
    pytest.fail(f"{dag_id} run {run_id} not {'/'.join(until)} after {timeout_s:.0f} s\n{_report(api, dag_id, run_id)}")


def _trigger(api, dag_id: str, run_id: str, conf: dict) -> None:
    response = api.post(f"/api/v2/dags/{dag_id}/dagRuns", json={"dag_run_id": run_id, "logical_date": None, "conf": conf}, timeout=30)
    assert response.status_code in (200, 201), response.text


def _set_paused(api, dag_id: str, paused: bool) -> None:
    response = api.patch(f"/api/v2/dags/{dag_id}", json={"is_paused": paused}, timeout=30)
    assert response.status_code == 200, response.text


def _wait_parsed(api, timeout_s: float = 180.0) -> None:
    """Wait until Airflow lists the three DAGs, keyshift_switch with its `switch` task (this version)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        tasks = api.get(f"/api/v2/dags/{names.SWITCH_DAG_ID}/tasks", timeout=30)
        listed = all(api.get(f"/api/v2/dags/{d}", timeout=30).status_code == 200 for d in DAGS)
        if listed and tasks.ok and "switch" in {t["task_id"] for t in tasks.json()["tasks"]}:
            return
        errors = [e for e in _get(api, "/api/v2/importErrors").get("import_errors", []) if "keyshift_" in (e.get("filename") or "")]
        assert not errors, f"Airflow could not import a DAG: {errors[0].get('stack_trace')}"
        time.sleep(5)
    pytest.fail(f"Airflow did not list {DAGS} (keyshift_switch with its switch task) within {timeout_s:.0f} s")


def _quiet_monitor(api, since: str) -> None:
    """Let the monitor's scheduled runs (the unpause starts one) end; delete the switch runs queued since `since`."""
    deadline = time.monotonic() + 180
    while any(r["state"] in ("queued", "running") and r["run_type"] == "scheduled" for r in _runs(api, names.BALANCE_MONITOR_DAG_ID)):
        assert time.monotonic() < deadline, "the balance monitor's scheduled run did not end within 180 s"
        time.sleep(3)
    for run in _runs(api, names.SWITCH_DAG_ID):
        if run["state"] == "queued" and (run.get("queued_at") or "") >= since:
            print(f"deleting {names.SWITCH_DAG_ID} run {run['dag_run_id']} (conf {run.get('conf')}): not the test's decision")
            api.delete(f"/api/v2/dags/{names.SWITCH_DAG_ID}/dagRuns/{run['dag_run_id']}", timeout=30)


def _progress(run_dir: Path) -> list[dict]:
    path = run_dir / "progress.jsonl"
    if not path.is_file():
        return []
    lines = []
    for line in path.read_text().splitlines():
        try:
            lines.append(json.loads(line))
        except ValueError:  # the line the driver is writing
            pass
    return lines


def test_monitor_triggers_a_switch_of_the_pipelines_running_job(api, stack_settings):
    from keyshift.monitoring.stream import read_offsets
    from keyshift.orchestration.monitor import evaluate_topic, monitor_params

    started = time.monotonic()
    if names.FLIGHTS_TOPIC in _existing_topics(stack_settings):
        have = len(read_offsets(stack_settings, names.FLIGHTS_TOPIC).end)
        assert have == PARTITIONS, f"topic {names.FLIGHTS_TOPIC!r} has {have} partitions; the pipeline runs P = {PARTITIONS} (delete it first)"
    _wait_parsed(api)
    paused = {d: _get(api, f"/api/v2/dags/{d}")["is_paused"] for d in DAGS}
    client = redis.Redis.from_url(stack_settings.redis_url, decode_responses=True)
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    job_run = f"e2e_switch_{stamp}"
    run_dir = pipeline.run_dir(stack_settings, job_run)
    try:
        # 1. the continuous job, hash at P = 8 (the monitor's scheduled run, if the unpause starts one, runs meanwhile)
        since = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
        _set_paused(api, names.PIPELINE_DAG_ID, False)
        _trigger(api, names.PIPELINE_DAG_ID, job_run, {"limit": 0, "partitions": PARTITIONS, "strategy": "hash"})
        _set_paused(api, names.BALANCE_MONITOR_DAG_ID, False)
        deadline = time.monotonic() + FIRST_BATCH_S
        while len(_progress(run_dir)) < 1:
            state = _get(api, f"/api/v2/dags/{names.PIPELINE_DAG_ID}/dagRuns/{job_run}")["state"]
            assert state not in ("success", "failed"), f"the pipeline ended {state} before its job ran:\n{_report(api, names.PIPELINE_DAG_ID, job_run)}"
            assert time.monotonic() < deadline, f"no batch of run {job_run} within {FIRST_BATCH_S:.0f} s\n{_report(api, names.PIPELINE_DAG_ID, job_run)}"
            time.sleep(3)
        assert launch.read_run_record(stack_settings, job_run)["state"] == "running"
        print(f"[{time.monotonic() - started:5.0f} s] job {job_run} running, first batch committed; triggering the monitor")

        # 2. the monitor decides to switch and triggers keyshift_switch
        _quiet_monitor(api, since)
        _set_paused(api, names.SWITCH_DAG_ID, False)
        monitor_run = f"e2e_switch_monitor_{stamp}"
        _trigger(api, names.BALANCE_MONITOR_DAG_ID, monitor_run, {**MONITOR_CONF, "run_id": job_run})
        state = _wait_run(api, names.BALANCE_MONITOR_DAG_ID, monitor_run, 300)
        _set_paused(api, names.BALANCE_MONITOR_DAG_ID, True)  # no scheduled run (every live run) switches the job meanwhile
        assert state == "success", _report(api, names.BALANCE_MONITOR_DAG_ID, monitor_run)
        tasks = {t["task_id"]: t["state"] for t in _get(api, f"/api/v2/dags/{names.BALANCE_MONITOR_DAG_ID}/dagRuns/{monitor_run}/taskInstances")["task_instances"]}
        assert tasks["trigger_switch"] == "success", f"the monitor did not decide to switch: {tasks}"
        ours = [r for r in _runs(api, names.SWITCH_DAG_ID) if (r.get("conf") or {}).get("monitor_run_id") == monitor_run]
        assert len(ours) == 1, ours
        switch_run, conf = ours[0]["dag_run_id"], ours[0]["conf"]
        assert (conf["run_id"], conf["strategy_from"], conf["strategy"], conf["partitions_from"], conf["partitions"]) == \
            (job_run, "hash", "least_count", PARTITIONS, PARTITIONS), conf
        print(f"[{time.monotonic() - started:5.0f} s] monitor decided: {conf['reason']}; {names.SWITCH_DAG_ID} run {switch_run}")

        # 3. keyshift_switch switches the running job
        state = _wait_run(api, names.SWITCH_DAG_ID, switch_run, 420)
        assert state == "success", _report(api, names.SWITCH_DAG_ID, switch_run)
        record = json.loads(client.get(names.redis_switch_record_key(job_run)))
        assert (record["state"], record["strategy_from"], record["strategy_to"], record["partitions_to"]) == ("done", "hash", "least_count", PARTITIONS)
        assert record["in_driver"] and record["verify"]["placement"]["ok"] and record["verify"]["conservation"]["ok"], record["verify"]
        assert json.loads(client.lindex(names.redis_switch_history_key(job_run), 0))["switch_id"] == record["switch_id"]
        request = json.loads(client.lindex(names.redis_switch_requests_key(names.FLIGHTS_TOPIC), 0))
        assert request["dag_run_id"] == switch_run and request["run_id"] == job_run
        epoch = int(record["epoch_to"])
        assert epoch > int(record["epoch_from"])
        progress = _progress(run_dir)
        assert any(p["epoch"] == epoch and p["strategy"] == "least_count" for p in progress), [(p["batch_id"], p["epoch"]) for p in progress]
        assert all(p["epoch"] in (int(record["epoch_from"]), epoch) for p in progress)
        run_record = launch.read_run_record(stack_settings, job_run)
        assert (run_record["strategy"], run_record["partitions"], run_record["epoch"]) == ("least_count", str(PARTITIONS), str(epoch))
        print(f"[{time.monotonic() - started:5.0f} s] switch {record['switch_id']} done: pause {record['pause_seconds']} s, "
              f"steps {record['step_seconds']}, {sum(p['epoch'] == epoch for p in progress)} batches under epoch {epoch}")

        # the monitor now takes least_count as in force (a dry evaluation: nothing stored)
        again = evaluate_topic(stack_settings, monitor_params({**MONITOR_CONF, "run_id": job_run}), save=False)
        assert again["record"]["in_force_source"].startswith(f"run record {job_run}")
        assert again["switch_conf"] is None or again["switch_conf"]["strategy_from"] == "least_count"

        # 4. stop through the pipeline's stop path; the pipeline verifies and checks the run
        assert launch.stop_job(stack_settings, job_run)
        state = _wait_run(api, names.PIPELINE_DAG_ID, job_run, 420)
        assert state == "success", _report(api, names.PIPELINE_DAG_ID, job_run)
        verified = json.loads((run_dir / "pipeline.json").read_text())
        assert verified["verified"] is True and verified["mode"] == "continuous"
        summary = verified["summary"]
        accounted = summary["sum_window_counts"] + summary["late_events"] + summary["dead_letters"] + summary.get("pending_events", 0)
        assert summary["events_read"] == accounted, summary
        assert summary["switches"] == [record["switch_id"]] and summary["segments"] == 2
        print(f"[{time.monotonic() - started:5.0f} s] run {job_run} stopped and reconciled: {summary['events_read']} events read")
    finally:
        if launch.supervisor_record(stack_settings, job_run) or launch.driver_record(stack_settings, job_run):
            launch.stop_job(stack_settings, job_run)
        for dag_id, was in paused.items():
            _set_paused(api, dag_id, was)
        client.close()


def _existing_topics(settings) -> set[str]:
    from kafka import KafkaAdminClient

    from keyshift.kafka_clients import client_options

    admin = KafkaAdminClient(bootstrap_servers=settings.bootstrap_servers, **client_options(settings))
    try:
        return set(admin.list_topics())
    finally:
        admin.close()
