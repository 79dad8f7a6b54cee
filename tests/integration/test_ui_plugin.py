"""The keyshift page in the Airflow UI, in a real browser, against the stack's Airflow and Redis.

The stack's Airflow (`keyshift stack up`) may have been started before this checkout's plugin
changed, and Airflow loads plugins once per api-server; so the test starts an api-server of its
own, on a free port, with the stack's environment (`keyshift.stack.airflow.airflow_env`: the same
Airflow home, metadata database, JWT secret and admin login, the checkout's `plugins/`) and a
runs folder of the test's own. The stack's processes are not touched.

The test writes a run's records for a topic of its own through keyshift's own writers
(`RunRecorder`: run record, progress and summary; `AssignmentStore.publish`; `ResultStore.save`
of monitor evaluations scored by `evaluate_sample`; `SwitchControl` steps of a switch;
`validate_frames`: a real Great Expectations validation with Data Docs), then:

* checks the login: no token is 401 for a script and a redirect to the login page for a browser,
  a token signed with another secret is 401, the admin's token reads the run as JSON;
* logs in through Airflow's login page in headless Chromium (Debian's `chromium`, driven by
  Playwright, which downloads no browser), opens the keyshift entry of the UI's navigation,
  follows the topic and the run inside the UI's frame, checks what the run page shows (placement
  and epoch in force, charts, the switch, the quality result) and that its Data Docs link is served
  behind the same login, and saves screenshots under the test's output folder;
* with two more runs (`troubled`): one that lost events to the late output and to dead letters and
  whose Great Expectations suite failed (a real validation of a windows table with slots out of
  range), and one recorded as `keyshift run demo` records its passing suite (in its summary):
  the overview marks the first and shows the figures of both and the demo's quality as passed,
  and the first's run page says what went wrong.

The Redis keys it wrote are deleted at the end.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import requests

from keyshift.errors import StackError
from keyshift.settings import Settings
from keyshift.stack import airflow, process

pytestmark = pytest.mark.integration

START_TIMEOUT_S = 180.0
P = 4
SKEWED = [[900, 300, 150, 150], [880, 320, 140, 160], [910, 290, 160, 140]]
"""Per-slot events of the batches under `hash` (epoch 0); the batches after the switch are even."""
EVEN = [[375, 380, 370, 375], [372, 378, 376, 374], [380, 370, 375, 375]]
CHROMIUM = os.environ.get("KEYSHIFT_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def ui_settings(tmp_path_factory) -> Settings:
    """The stack's settings with a runs folder of this test's own; skips when Redis or Airflow's home is missing."""
    shared = Settings()
    if not process.port_open(shared.redis_host, shared.redis_port):
        pytest.skip(f"Redis does not answer on {shared.redis_address}; start the stack with `keyshift stack up`")
    try:
        airflow.admin_password(shared)
    except StackError as exc:
        pytest.skip(f"the stack's Airflow has no login yet ({exc})")
    if not (airflow.airflow_home(shared) / "airflow.db").is_file():
        pytest.skip(f"the stack's Airflow has no metadata database in {airflow.airflow_home(shared)}; run `keyshift stack up`")
    return Settings(**{**shared.model_dump(), "runs_dir": tmp_path_factory.mktemp("ui") / "runs"})


@pytest.fixture(scope="module")
def api_server(ui_settings, tmp_path_factory):
    """`airflow api-server` of the stack's Airflow home on a free port, loading this checkout's plugins/; its base URL."""
    port = _free_port()
    home = tmp_path_factory.mktemp("ui-api-server")
    env = airflow.airflow_env(ui_settings)
    env.update({"AIRFLOW__API__PORT": str(port), "AIRFLOW__CORE__PLUGINS_FOLDER": str(airflow.PLUGINS_FOLDER)})
    name = "airflow-api-server-ui-test"
    record = process.start(home, name, [airflow.airflow_executable(), "api-server", "--host", airflow.HOST, "--port", str(port)],
                           env=env, cwd=airflow.airflow_home(ui_settings))
    base = f"http://{airflow.HOST}:{port}"
    try:
        process.wait_until(lambda: requests.get(f"{base}/api/v2/monitor/health", timeout=3).ok, timeout_s=START_TIMEOUT_S,
                           what=f"the test's api-server on {base}", log_path=record.log_file,
                           alive=lambda: process.is_running(home, name), interval_s=1.0)
        yield base
    finally:
        process.stop(home, name, timeout_s=30.0)


def _monitor_record(at: datetime, in_force: str, run_id: str, lag: int, processed: list[int], switch_to: str | None) -> dict:
    """One balance-monitor record, scored by the monitor's own functions on a skewed sample of origins."""
    from keyshift.monitoring.evaluate import evaluate_sample, evaluation_record
    from keyshift.monitoring.loads import measured_loads
    from keyshift.monitoring.switch_policies import Decision

    sample = {"ORD": 900, "ATL": 700, "DFW": 650, "LAX": 500, "PHX": 300, "DEN": 280, "LAS": 200, "SFO": 150, "BOS": 90, "MIA": 60}
    evaluation = evaluate_sample(sample, P, in_force, labels=("hash", "least_key", "least_count", "hot_split"))
    decision = (Decision(True, switch_to, f"threshold: balance degree {evaluation.current.balance_degree:.3f} < 0.600", 12.5, "threshold")
                if switch_to else Decision(False, in_force, "threshold: balanced enough", 0.0, "threshold"))
    context = {"job_run_id": run_id, "consumer_lag": {"total": lag, "per_partition": {str(s): lag // P for s in range(P)}}}
    return evaluation_record(evaluation, decision, at=at, context=context, measured=[measured_loads("processed", processed)])


def _windows_frame(run_id: str):
    """A small windows table of the flights job (the columns its quality suite requires)."""
    import pandas as pd

    hour = pd.Timedelta(hours=1)
    t0 = pd.Timestamp("2001-01-01", tz="UTC")
    return pd.DataFrame({
        "origin": ["ORD", "ORD", "ATL"], "window_start": [t0, t0 + hour, t0], "window_end": [t0 + hour, t0 + 2 * hour, t0 + hour],
        "count": [5, 2, 1], "sum_delay_min": [150, 10, -3], "mean_delay_min": [30.0, 5.0, -3.0], "max_delay_min": [60, 9, -3],
        "alert": [True, False, False], "slot": [1, 1, 3], "epoch": [0, 1, 1],
    })


@pytest.fixture(scope="module")
def recorded(ui_settings):
    """A run of a topic of the test's own, recorded through keyshift's writers: its ids; the Redis keys are removed after."""
    from keyshift import names
    from keyshift.migration.switch import SwitchControl
    from keyshift.migration.switch_record import SwitchRecord
    from keyshift.monitoring.balance import balance_degree
    from keyshift.monitoring.results import ResultStore
    from keyshift.placement.assignment_store import AssignmentStore
    from keyshift.quality.checkpoints import validate_frames
    from keyshift.runs import RunRecorder, redis_client

    tag = uuid.uuid4().hex[:8]
    topic, run_id = f"ui-test-{tag}", f"ui-test-run-{tag}"
    now = datetime.now(UTC)
    client = redis_client(ui_settings)
    results, assignment, control = ResultStore(client, topic), AssignmentStore(client, topic), SwitchControl(client, run_id)
    try:
        recorder = RunRecorder(ui_settings, run_id)
        recorder.start(topic=topic, strategy="hash", partitions=P, epoch=0, segment=0)
        started = now - timedelta(minutes=20)
        batches = [("hash", 0, 0, loads) for loads in SKEWED] + [("least_count", 1, 1, loads) for loads in EVEN]
        for batch, (strategy, epoch, segment, loads) in enumerate(batches):
            recorder.progress({"run_id": run_id, "batch_id": batch, "segment": segment, "strategy": strategy, "epoch": epoch,
                               "input_rows": sum(loads), "processed_rows_per_slot": loads,
                               "timestamp_ms": int((started + timedelta(minutes=3 * batch)).timestamp() * 1000)})
        (recorder.run_dir / "task_seconds.json").write_text(json.dumps({  # TaskTimeRecorder's format
            "source": {str(b): [round(0.002 * n, 3) for n in loads] for b, (_, _, _, loads) in enumerate(batches)},
            "stateful": {str(b): [round(0.001 * n, 3) for n in loads] for b, (_, _, _, loads) in enumerate(batches)}}))

        results.save(_monitor_record(now - timedelta(minutes=15), "hash", run_id, 4_000, SKEWED[0], None))
        results.save(_monitor_record(now - timedelta(minutes=11), "hash", run_id, 6_500, SKEWED[1], "least_count"))
        results.save(_monitor_record(now - timedelta(minutes=4), "least_count", run_id, 800, EVEN[0], None))

        assignment.publish("least_count", P, {"ORD": 0, "ATL": 1, "DFW": 2, "LAX": 3, "PHX": 3, "DEN": 2}, loads=[900, 700, 930, 800])
        requested = (now - timedelta(minutes=10)).timestamp()
        record = SwitchRecord(switch_id=f"sw-ui-{tag}", run_id=run_id, topic=topic, reason="threshold: balance degree 0.167 < 0.600",
                              requested_at=requested, stop_requested_at=requested, strategy_from="hash", strategy_to="least_count",
                              partitions_from=P, partitions_to=P, epoch_from=0, epoch_to=1, in_driver=True)
        record = control.advance(record, "requested", 1.1)
        record = control.advance(record, "stopped", 2.3, cut_batch=2)
        record = control.advance(record, "migrated", 3.4, migration={"keys_moved": 4, "keys_total": 10, "state_bytes": 52_000,
                                                                     "state_bytes_moved": 20_800})
        record = control.advance(record, "segment", 0.1)
        record = control.advance(record, "published", 0.02, published_at=requested + 7)
        record = control.advance(record, "verified", 1.5, pause_seconds=9.87,
                                 verify={"placement": {"ok": True, "misplaced": [], "state_rows": 10}, "conservation": {"ok": True}})
        control.conclude(control.advance(record, "done"), "done")
        recorder.update(strategy="least_count", epoch=1, segment=1)

        per_slot = [sum(column) for column in zip(*(loads for *_, loads in batches))]
        windows = _windows_frame(run_id)
        recorder.finish({"run_id": run_id, "topic": topic, "strategy": "least_count", "partitions": P, "epoch": 1,
                         "events_read": sum(per_slot), "per_slot_events": per_slot, "balance_degree": balance_degree(per_slot),
                         "wall_seconds": 1080.0, "events_per_second": round(sum(per_slot) / 1080.0, 1), "late_events": 0,
                         "dead_letters": 0, "reconciled": True, "windows_emitted": len(windows), "batches": len(batches)})
        report = validate_frames(recorder.run_dir, run_id, windows=windows, summary=None, alerts=None, partitions=P)
        assert report.success, report.failure_lines()
        yield {"topic": topic, "run_id": run_id, "events": sum(per_slot)}
    finally:
        results.delete()
        assignment.delete()
        client.delete(names.redis_run_key(run_id), names.redis_progress_key(run_id), control.record_key, control.history_key,
                      control.lock_key)


LATE, DEAD = 1_183_168, 528_768
"""The late events and dead letters of the troubled run: the flights backfill of issue 37's report."""


@pytest.fixture(scope="module")
def troubled(ui_settings):
    """A finished run with late events, dead letters and a failed windows suite, and a demo run whose suite passed: their ids."""
    from keyshift import names
    from keyshift.quality.checkpoints import validate_frames
    from keyshift.quality.windows import validate_windows
    from keyshift.runs import RunRecorder, redis_client

    tag = uuid.uuid4().hex[:8]
    bad, demo = f"ui-test-late-{tag}", f"ui-test-demo-{tag}"
    client = redis_client(ui_settings)
    try:
        recorder = RunRecorder(ui_settings, bad)
        recorder.start(topic=f"ui-test-{tag}", strategy="hash", partitions=P, epoch=0, segment=0)
        recorder.finish({"run_id": bad, "topic": f"ui-test-{tag}", "strategy": "hash", "partitions": P, "events_read": 3_000_000,
                         "late_events": LATE, "dead_letters": DEAD + 2, "pending_events": 0, "windows_emitted": 3,
                         "dead_letters_by_reason": {"too far behind the stream": DEAD, "unparseable JSON": 2}, "reconciled": True})
        windows = _windows_frame(bad).assign(slot=[1, 7, 9])  # slots outside [0, P): the suite must fail
        report = validate_frames(recorder.run_dir, bad, windows=windows, summary=None, alerts=None, partitions=P)
        assert not report.success, "the windows suite passed a table with slots outside [0, P)"

        recorder = RunRecorder(ui_settings, demo)
        recorder.start(topic=f"ui-test-{tag}", strategy="hash", partitions=P, epoch=0, segment=0)
        quality = validate_windows(_windows_frame(demo), P, run_dir=recorder.run_dir, run_id=demo)  # as `keyshift run demo` does
        assert quality["success"], quality
        recorder.finish({"run_id": demo, "topic": f"ui-test-{tag}", "strategy": "hash", "partitions": P, "events_read": 8,
                         "late_events": 0, "dead_letters": 0, "pending_events": 0, "windows_emitted": 3, "quality": quality})
        yield {"bad": bad, "demo": demo}
    finally:
        client.delete(*(k for r in (bad, demo) for k in (names.redis_run_key(r), names.redis_progress_key(r))))


def test_the_page_needs_the_airflow_login(api_server, ui_settings, recorded):
    import jwt

    url = f"{api_server}/keyshift/api/runs/{recorded['run_id']}"
    assert requests.get(url, timeout=30).status_code == 401
    page = requests.get(f"{api_server}/keyshift/runs/{recorded['run_id']}", headers={"accept": "text/html"}, allow_redirects=False, timeout=30)
    assert page.status_code == 303 and page.headers["location"].startswith("/auth/login?next=")
    forged = jwt.encode({"sub": "admin", "role": "admin", "exp": int(time.time()) + 600}, "not-the-api-servers-secret-" * 3, "HS512")
    assert requests.get(url, headers={"Authorization": f"Bearer {forged}"}, timeout=30).status_code == 401
    assert requests.get(url, cookies={"_token": forged}, timeout=30).status_code == 401

    token = airflow.token(Settings(**{**ui_settings.model_dump(), "airflow_port": int(api_server.rsplit(":", 1)[1])}))
    view = requests.get(url, headers={"Authorization": f"Bearer {token}"}, timeout=60).json()
    assert (view["in_force"]["strategy"], view["in_force"]["epoch"]) == ("least_count", 1)
    assert [b["slot_events"] for b in view["batches"]] == SKEWED + EVEN
    assert [(s["strategy_from"], s["strategy_to"], s["state"], s["pause_s"]) for s in view["switches"]] == [("hash", "least_count", "done", 9.87)]
    assert view["quality"]["success"] is True and view["quality"]["data_docs"] == "data_docs/index.html"
    assert view["topic"]["assignment"]["epoch"] == 1 and len(view["monitor"]) == 3


def _browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sync_playwright = None
    if sync_playwright is None or not Path(CHROMIUM).is_file():
        why = f"the browser test needs playwright (pip) and Chromium at {CHROMIUM} (apt-get install chromium); `make env` installs both"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    return sync_playwright


def test_the_page_in_a_real_browser(api_server, ui_settings, recorded, troubled, tmp_path):
    sync_playwright = _browser()
    run_id, topic = recorded["run_id"], recorded["topic"]
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 2650})
            page.set_default_timeout(60_000)
            # not logged in: the run page sends the browser to Airflow's login page, which returns to it
            page.goto(f"{api_server}/keyshift/runs/{run_id}")
            assert "/auth/login" in page.url
            page.fill("input[name=username]", ui_settings.airflow_user)
            page.fill("input[name=password]", airflow.admin_password(ui_settings))
            page.click("button[type=submit]")
            page.wait_for_url(f"**/keyshift/runs/{run_id}")
            assert page.locator("h1").inner_text() == f"run {run_id}"

            # the UI's navigation has the keyshift entry; its page shows /keyshift/ in a frame
            page.goto(f"{api_server}/")
            page.locator("a[href$='plugin/keyshift']").first.click()
            page.wait_for_url("**/plugin/keyshift")
            frame = page.frame_locator("iframe[title=keyshift]")
            assert frame.locator("h1").first.inner_text() == "keyshift"
            # the overview: per run its figures, a mark on the one that lost events and failed its suite
            row = frame.locator("tr", has_text=troubled["bad"]).inner_text()
            assert f"{LATE:,}" in row and f"{DEAD + 2:,}" in row and f"too far behind the stream: {DEAD:,}" in row, row
            assert f"⚠ {LATE:,} late events; {DEAD + 2:,} dead letters; quality failed" in row, row
            assert frame.locator("tr.attention", has_text=troubled["bad"]).count() == 1
            demo_row = frame.locator("tr", has_text=troubled["demo"])
            assert "passed" in demo_row.inner_text() and "ok" in demo_row.inner_text()  # the demo's suite, not "–"
            assert demo_row.get_attribute("class") == "fine"
            own = frame.locator("tr", has_text=recorded["run_id"]).inner_text()
            assert f"{recorded['events']:,}" in own and "1 (pause 9.87 s)" in own, own  # its switch with the pause it achieved
            page.screenshot(path=str(tmp_path / "keyshift-overview.png"))
            frame.locator("a", has_text=topic).first.click()
            frame.locator("h1", has_text=f"topic {topic}").wait_for()
            topic_text = frame.locator("body").inner_text()
            assert "switch to least_count" in topic_text and "least_count, P = 4, epoch 1" in topic_text
            assert frame.locator("svg").count() == 2  # balance degree of every strategy, consumer lag

            frame.locator("a", has_text=run_id).first.click()
            frame.locator("h1", has_text=f"run {run_id}").wait_for()
            page.wait_for_url(f"**/plugin/keyshift/keyshift/runs/{run_id}")  # the UI mirrors the frame's address
            text = frame.locator("body").inner_text()
            assert "least_count, P = 4, epoch 1, segment 1" in text  # the run's placement in force
            assert f"{recorded['events']:,}" in text and "hash/P=4 → least_count/P=4" in text and "0 → 1" in text
            assert "threshold: balance degree 0.167 < 0.600" in text and "9.87" in text and "4 of 10 keys" in text
            assert "verified" in text and "flight_delay_windows" in text and "passed" in text
            assert "800 (0: 200, 1: 200, 2: 200, 3: 200)" in text  # the last consumer lag, per partition
            charts = frame.locator("div.plot svg")
            assert charts.count() == 4  # per-slot load, task seconds, balance degree of every strategy, consumer lag
            assert "least_count e1" in charts.nth(0).inner_html()  # the switch marked on the per-slot load
            page.screenshot(path=str(tmp_path / "keyshift-run-in-airflow.png"))

            # the Data Docs link is served behind the same login (GX's pages load their styles from
            # public CDNs, so only their HTML is checked here)
            href = frame.locator("a", has_text="Data Docs").get_attribute("href")
            docs = page.request.get(f"{api_server}/keyshift/runs/{href.removeprefix('./')}")
            assert docs.ok and "flight_delay_windows" in docs.text(), (href, docs.status)
            assert requests.get(f"{api_server}/keyshift/runs/{href.removeprefix('./')}", timeout=30).status_code == 401

            page.goto(f"{api_server}/keyshift/runs/{run_id}")
            page.screenshot(path=str(tmp_path / "keyshift-run.png"), full_page=True)

            # the troubled run's page says what went wrong, with the failed expectations
            page.goto(f"{api_server}/keyshift/runs/{troubled['bad']}")
            assert page.locator("p.alert").inner_text() == f"⚠ {LATE:,} late events; {DEAD + 2:,} dead letters; quality failed"
            text = page.locator("body").inner_text()
            assert "flight_delay_windows" in text and "failed" in text and "slot" in text
            page.screenshot(path=str(tmp_path / "keyshift-run-troubled.png"), full_page=True)
        finally:
            browser.close()
    for name in ("keyshift-overview.png", "keyshift-run-in-airflow.png", "keyshift-run.png", "keyshift-run-troubled.png"):
        assert (tmp_path / name).stat().st_size > 10_000
    print(f"screenshots in {tmp_path}")
