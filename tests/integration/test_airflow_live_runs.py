"""End to end through the running Airflow: the balance monitor's schedule evaluates every live job
run, switches the poorly balanced one and leaves the other alone (issue 37).

1. Two continuous runs on two fresh topics, launched detached and supervised as the pipeline's
   `launch_job` task launches them (`keyshift.orchestration.launch.launch_job`; the pipeline DAG
   runs one job at a time, so both are launched beside it): the flight delay job with `hash` at
   P = 8 on 300,000 real flights replayed at 1,500 events/s (200 s of input, so the switch cuts a
   query that still has records to read; more when the monitor's next scheduled run is further
   away than the unpause, `_flights_to_replay`; hash's balance degree on the flights is about 0.3), and
   the YSB job with `least_count` at P = 4 on 20,000 generated ad events (100 campaigns, uniform;
   the generator learned and published the assignment). Key watermarks, so no event is late.
2. Once both have committed a batch, `keyshift_balance_monitor` is unpaused with its default
   params: the scheduler starts a scheduled run (the schedule is `KEYSHIFT_MONITOR_INTERVAL_S`;
   a test stack shortens it, e.g. to 120 s, which is also the trigger's horizon). Its `evaluate`
   is mapped over both runs (one instance each, named after the run); its cost_aware trigger
   decides to switch the flights run and to stay on the YSB run, and one `keyshift_switch` run is
   triggered, for the flights run; it succeeds with the state migrated in the driver. The monitor
   is paused again once that scheduled run ended, so later runs do not change what is checked.
3. When each run has read all its input, both are stopped (`launch.stop_job`) and compared with
   their oracles: the flights run's windows with pandas' windows of the same flights
   (`keyshift.quality.reference`: every emitted window equal, none twice, and the reference's
   windows not emitted hold exactly the run's pending events), the YSB run's windows with the
   generator's `expected_views.parquet` likewise; both summaries reconcile (events read = window
   counts + late + dead letters + filtered + pending), the flights summary lists the switch.
4. The keyshift page (`/keyshift/`, behind the Airflow login) lists both runs with their figures.

Needs the whole local stack (`keyshift stack up`); skipped when the Airflow API does not answer.
With the default schedule the scheduler starts the run at the unpause (catch-up off still runs
the latest interval) unless the DAG ran within the last interval; the test waits for it up to the
interval + 4 minutes. The trigger's horizon is the interval: the flights' expected gain is about
0.47 x the interval (56 s at 120 s), which must beat 1.2 x the measured switch cost (the median
pause of the newest switches in Redis, 10 s when none; 16-40 s on a loaded machine), so shorten
the schedule to no less than 120 s. On 2 shared cores: 3 min 44 s with a 120 s schedule, and
7 min 44 s with the default 600 s one when the monitor had run 6 minutes before (its next run
4 minutes away, so 660,000 flights replayed); about 4 minutes on a stack where it has not run yet.
Pause states are restored at the end; the topics and the Redis keys of both runs are removed.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from datetime import UTC, datetime

import pandas as pd
import pytest
import redis

import test_airflow_e2e
from test_airflow_switch import _get, _progress, _report, _runs, _set_paused, _wait_parsed, _wait_run
from ysb_runs import fresh_ysb_topic, generate, remove_ysb_run

from keyshift import names
from keyshift.orchestration import launch, pipeline

pytestmark = pytest.mark.integration

airflow_api = test_airflow_e2e.api  # the running Airflow's API session (module fixture of the pipeline e2e test)

FLIGHTS, FLIGHTS_P, FLIGHTS_RATE, FLIGHTS_PER_TRIGGER = 300_000, 8, 1_500.0, 25_000
YSB_P, YSB_RATE, YSB_DURATION, YSB_PER_TRIGGER, YSB_START_MS = 4, 100, 200, 2_000, 1_700_000_000_000
YSB_EVENTS = YSB_RATE * YSB_DURATION
FIRST_BATCH_S = 600.0
"""Seconds for both drivers to start and commit a batch (two JVMs starting on 2 shared cores)."""


def _latest_progress(settings, run_id: str) -> dict:
    lines = _progress(pipeline.run_dir(settings, run_id))
    return lines[-1] if lines else {}


def _wait(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s:.0f} s"
        time.sleep(3)


def _scheduled_run(api, since: str, timeout_s: float) -> str:
    """The first scheduled run of the monitor queued at or after `since` (ISO 8601 UTC)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for run in _runs(api, names.BALANCE_MONITOR_DAG_ID):
            if run["run_type"] == "scheduled" and (run.get("queued_at") or "") >= since:
                return run["dag_run_id"]
        time.sleep(3)
    pytest.fail(f"no scheduled run of {names.BALANCE_MONITOR_DAG_ID} within {timeout_s:.0f} s of its unpause")


def _flights_to_replay(api, settings) -> int:
    """Flights to replay at `FLIGHTS_RATE`: `FLIGHTS`, or more when the monitor's next scheduled run
    (`next_dagrun_run_after`) is further away, so that records still arrive when its switch's new
    query starts (its first commit ends the switch's pause); at most the 3,000,000 flights."""
    after = _get(api, f"/api/v2/dags/{names.BALANCE_MONITOR_DAG_ID}").get("next_dagrun_run_after")
    wait_s = (datetime.fromisoformat(after.replace("Z", "+00:00")) - datetime.now(UTC)).total_seconds() if after else settings.monitor_interval_s
    return int(min(3_000_000, max(FLIGHTS, FLIGHTS_RATE * (max(wait_s, 0.0) + 200.0))))


def _oracle_flights(settings, summary: dict, flights: int) -> dict:
    from keyshift.data.flights import flights_path
    from keyshift.quality.reference import compare_to_reference, reference_windows

    return compare_to_reference(pipeline.run_dir(settings, summary["run_id"]) / "windows", reference_windows(flights_path(settings), flights))


def test_the_schedule_balances_every_live_run(airflow_api, stack_settings):
    from keyshift.data.replay import replay_flights
    from keyshift.topics import create_topics, delete_topics

    api, settings, started = airflow_api, stack_settings, time.monotonic()
    _wait_parsed(api)
    dags = (names.BALANCE_MONITOR_DAG_ID, names.SWITCH_DAG_ID)
    paused = {d: _get(api, f"/api/v2/dags/{d}")["is_paused"] for d in dags}
    _set_paused(api, names.BALANCE_MONITOR_DAG_ID, True)  # no evaluation before both runs are live
    client = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    tag = uuid.uuid4().hex[:8]
    flights_topic, flights_run, ysb_run = f"it-live-flights-{tag}", f"it-live-flights-{tag}", f"it-live-ysb-{tag}"
    ysb_topic = fresh_ysb_topic(settings, f"live-ysb-{tag}", YSB_P)
    create_topics(settings, [flights_topic], FLIGHTS_P)
    replayed: dict = {}
    total = _flights_to_replay(api, settings)

    def replay() -> None:
        try:
            replayed["result"] = replay_flights(settings, flights_topic, limit=total, rate=FLIGHTS_RATE, strategy="hash",
                                                partitions=FLIGHTS_P, progress=False)
        except Exception as exc:  # reported by the main thread
            replayed["error"] = exc

    producer = threading.Thread(target=replay, name="flights-replay", daemon=True)
    try:
        # 1. the two continuous runs
        generate(ysb_topic, YSB_P, "--rate", str(YSB_RATE), "--duration", str(YSB_DURATION), "--start-ms", str(YSB_START_MS),
                 "--seed", "7", "--strategy", "least_count", "--run-id", ysb_run)
        producer.start()
        launch.launch_job(settings, flights_run, strategy="hash", partitions=FLIGHTS_P, bound_ms=3_600_000, topic=flights_topic,
                          max_offsets_per_trigger=FLIGHTS_PER_TRIGGER, watermark="key")
        launch.launch_job(settings, ysb_run, strategy="least_count", partitions=YSB_P, bound_ms=10_000, topic=ysb_topic,
                          max_offsets_per_trigger=YSB_PER_TRIGGER, watermark="key", job="ysb")
        _wait(lambda: all(_progress(pipeline.run_dir(settings, r)) for r in (flights_run, ysb_run)), FIRST_BATCH_S,
              "a committed batch of both runs")
        assert {launch.read_run_record(settings, r)["state"] for r in (flights_run, ysb_run)} == {"running"}
        print(f"[{time.monotonic() - started:5.0f} s] both runs live; unpausing the monitor")

        # 2. the monitor's scheduled run evaluates both and switches the flights run only
        since = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
        _set_paused(api, names.SWITCH_DAG_ID, False)
        _set_paused(api, names.BALANCE_MONITOR_DAG_ID, False)
        monitor_run = _scheduled_run(api, since, settings.monitor_interval_s + 240)
        state = _wait_run(api, names.BALANCE_MONITOR_DAG_ID, monitor_run, 600)
        _set_paused(api, names.BALANCE_MONITOR_DAG_ID, True)
        assert state == "success", _report(api, names.BALANCE_MONITOR_DAG_ID, monitor_run)
        tis = _get(api, f"/api/v2/dags/{names.BALANCE_MONITOR_DAG_ID}/dagRuns/{monitor_run}/taskInstances", limit=100)["task_instances"]
        evaluated = {ti["rendered_map_index"]: ti["state"] for ti in tis if ti["task_id"] == "evaluate"}
        assert {f"{flights_run} on {flights_topic}", f"{ysb_run} on {ysb_topic}"} <= set(evaluated), evaluated
        assert set(evaluated.values()) == {"success"}, evaluated

        def decision(topic: str, run_id: str) -> dict:
            from keyshift.monitoring.results import ResultStore

            ours = [r for r in ResultStore(client, topic).recent(20) if r.get("monitor_run_id") == monitor_run and r.get("job_run_id") == run_id]
            assert len(ours) == 1, ours
            return ours[0]

        flights_record, ysb_record = decision(flights_topic, flights_run), decision(ysb_topic, ysb_run)
        assert flights_record["decision"]["switch"] is True and flights_record["in_force_source"].startswith(f"run record {flights_run}")
        assert flights_record["switch_request"]["state"] == "requested", flights_record.get("switch_request")
        assert ysb_record["decision"]["switch"] is False, ysb_record["decision"]
        assert ysb_record["evaluation"]["in_force"] == "least_count" and "switch_request" not in ysb_record
        print(f"[{time.monotonic() - started:5.0f} s] monitor {monitor_run}: flights {flights_record['decision']['reason']}; "
              f"ysb {ysb_record['decision']['reason']}")

        switches = [r for r in _runs(api, names.SWITCH_DAG_ID) if (r.get("conf") or {}).get("monitor_run_id") == monitor_run]
        assert [r["conf"]["run_id"] for r in switches] == [flights_run], switches
        state = _wait_run(api, names.SWITCH_DAG_ID, switches[0]["dag_run_id"], 600)
        assert state == "success", _report(api, names.SWITCH_DAG_ID, switches[0]["dag_run_id"])
        record = json.loads(client.get(names.redis_switch_record_key(flights_run)))
        assert (record["state"], record["strategy_from"], record["in_driver"]) == ("done", "hash", True), record
        assert record["verify"]["placement"]["ok"] and record["verify"]["conservation"]["ok"], record["verify"]
        assert client.get(names.redis_switch_record_key(ysb_run)) is None  # the YSB run was left alone
        print(f"[{time.monotonic() - started:5.0f} s] switch {record['switch_id']}: hash -> {record['strategy_to']}, "
              f"pause {record['pause_seconds']} s")

        # 3. both read everything, are stopped, reconcile and equal their oracles
        producer.join(timeout=total / FLIGHTS_RATE + 300)
        assert "error" not in replayed and replayed["result"].events_produced == total, replayed
        _wait(lambda: _latest_progress(settings, flights_run).get("events_read") == total
              and _latest_progress(settings, ysb_run).get("events_read") == YSB_EVENTS, 600, "both runs reading all their input")
        assert launch.stop_job(settings, flights_run) and launch.stop_job(settings, ysb_run)
        summaries = {r: json.loads((pipeline.run_dir(settings, r) / "summary.json").read_text()) for r in (flights_run, ysb_run)}
        for run_id, summary in summaries.items():
            accounted = (summary["sum_window_counts"] + summary["late_events"] + summary["dead_letters"]
                         + summary.get("filtered_events", 0) + summary["pending_events"])
            assert summary["reconciled"] and summary["events_read"] == accounted, summary
            assert (summary["late_events"], summary["dead_letters"]) == (0, 0), (run_id, summary.get("dead_letters_by_reason"))
        flights, ysb = summaries[flights_run], summaries[ysb_run]
        assert flights["events_read"] == total and flights["switches"] == [record["switch_id"]], flights
        assert ysb["events_read"] == YSB_EVENTS and not ysb.get("switches"), ysb

        compared = _oracle_flights(settings, flights, total)
        assert compared["field_mismatches"] == compared["only_ours"] == compared["duplicated"] == 0, compared
        assert compared["reference_events"] - compared["events"] == flights["pending_events"], (compared, flights["pending_events"])

        expected = pd.read_parquet(settings.runs_dir / f"ysb-{ysb_run}" / "expected_views.parquet")
        windows = pd.read_parquet(pipeline.run_dir(settings, ysb_run) / "windows")
        ours = pd.DataFrame({"campaign_id": windows["campaign_id"], "views": windows["count"].astype("int64"),
                             "window_start_ms": [int(t.timestamp() * 1000) for t in windows["window_start"]]})
        assert not ours.duplicated(["campaign_id", "window_start_ms"]).any()
        merged = ours.merge(expected, on=["campaign_id", "window_start_ms"], how="outer", suffixes=("", "_expected"), indicator=True)
        assert (merged["_merge"] != "left_only").all(), merged[merged["_merge"] == "left_only"]
        both = merged[merged["_merge"] == "both"]
        assert (both["views"] == both["views_expected"]).all(), both[both["views"] != both["views_expected"]]
        assert int(merged.loc[merged["_merge"] == "right_only", "views_expected"].sum()) == ysb["pending_events"]
        print(f"[{time.monotonic() - started:5.0f} s] both stopped and equal to their oracles: flights {flights['windows_emitted']} windows "
              f"({flights['pending_events']} events pending), ysb {len(ours)} windows ({ysb['pending_events']} pending)")

        # 4. the keyshift page lists both runs with their figures
        rows = {r["run_id"]: r for r in _get(api, "/keyshift/api/runs", limit=200)}
        assert rows[flights_run]["figures"]["events_read"] == total and len(rows[flights_run]["switches"]) == 1
        assert rows[ysb_run]["figures"]["events_read"] == YSB_EVENTS and rows[ysb_run]["switches"] == []
        page = api.get("/keyshift/", headers={"Accept": "text/html"}, timeout=60)
        assert page.ok, page.status_code
        for run_id, events in ((flights_run, total), (ysb_run, YSB_EVENTS)):
            row = page.text.split(f'href="./runs/{run_id}">{run_id}</a>', 1)[1].split("</tr>", 1)[0]  # its row of the runs table
            assert f"{events:,}" in row and "ok" in row, row
    finally:
        for run_id in (flights_run, ysb_run):
            if launch.supervisor_record(settings, run_id) or launch.driver_record(settings, run_id):
                launch.stop_job(settings, run_id)
        if producer.is_alive():
            producer.join(timeout=300)
        for dag_id, was in paused.items():
            _set_paused(api, dag_id, was)
        from keyshift.monitoring.results import ResultStore

        for topic in (flights_topic, ysb_topic):
            ResultStore(client, topic).delete()
            client.delete(names.redis_switch_requests_key(topic))
        for run_id in (flights_run, ysb_run):  # its measured pause would raise the next tests' cost_aware cost
            client.delete(names.redis_switch_record_key(run_id), names.redis_switch_history_key(run_id))
        remove_ysb_run(settings, client, ysb_topic, ysb_run)
        delete_topics(settings, [flights_topic])
        client.delete(names.redis_replay_key(flights_topic))
        client.close()
