"""`keyshift dq run` on a real finished run: real Kafka, Spark and Great Expectations.

One small run of the flight delay job (20,000 real flights, fresh 8-partition topic) is validated
by the CLI as a user would: it passes, with Data Docs in `runs/<run_id>/data_docs/`. Then copies
of that run are broken on purpose, each in its own runs folder (`KEYSHIFT_RUNS_DIR`) under the
same run id, and the CLI must exit 1 naming the failing expectation and its rows: a duplicated
window file, a summary whose counts do not add up, and an alert that matches no alerting window
(the run's real alert records copied to a fresh topic, plus one wrong record).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from keyshift.names import ALERTS_TOPIC, DEAD_LETTER_TOPIC, LATE_TOPIC

pytestmark = pytest.mark.integration

FLIGHTS = 20_000
PARTITIONS = 8


@pytest.fixture(scope="module")
def run(stack_settings, spark):
    """Replay 20,000 flights into a fresh topic and run the job once; returns its run folder and id."""
    from keyshift.data.replay import replay_flights
    from keyshift.runtime.driver import run_job
    from keyshift.processing.job_config import JobConfig
    from keyshift.topics import create_topics, describe_topics

    settings = stack_settings
    topic = f"it-dq-flights-{uuid.uuid4().hex[:8]}"
    create_topics(settings, [topic], PARTITIONS)
    missing = [t for t in (DEAD_LETTER_TOPIC, LATE_TOPIC, ALERTS_TOPIC) if t not in describe_topics(settings, [t])]
    if missing:
        create_topics(settings, missing, PARTITIONS)
    replay_flights(settings, topic, limit=FLIGHTS, strategy="hash", partitions=PARTITIONS, progress=False)
    config = JobConfig.from_options(run_id=f"it-dq-{uuid.uuid4().hex[:8]}", topic=topic, partitions=PARTITIONS,
                                  limit=FLIGHTS, bound_ms=3_600_000, idle_timeout_s=240)
    summary = run_job(settings, config, starting="earliest", spark=spark)
    assert summary["alerts"] > 0  # the wrong-alert case below needs real alerts to copy
    return {"run_id": config.run_id, "run_dir": Path(settings.runs_dir) / config.run_id, "summary": summary}


def dq(run_id: str, runs_dir: Path | None = None, *extra: str) -> subprocess.CompletedProcess:
    """`keyshift dq run --run RUN_ID [extra]` in a fresh interpreter, as a user types it."""
    env = {**os.environ, **({"KEYSHIFT_RUNS_DIR": str(runs_dir)} if runs_dir else {})}
    return subprocess.run([str(Path(sys.executable).parent / "keyshift"), "dq", "run", "--run", run_id, *extra],
                          env=env, capture_output=True, text=True, timeout=300)


def broken_copy(run, tmp_path: Path) -> Path:
    """A copy of the run's folder (summary, windows, progress) under tmp_path/runs/<run_id>/."""
    target = tmp_path / "runs" / run["run_id"]
    target.mkdir(parents=True)
    for name in ("summary.json", "progress.jsonl"):
        shutil.copy(run["run_dir"] / name, target / name)
    shutil.copytree(run["run_dir"] / "windows", target / "windows")
    return target


def test_a_real_run_passes_and_gets_data_docs(run):
    proc = dq(run["run_id"])
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    for suite in ("flight_delay_windows", "flight_delay_alerts", "run_reconciliation"):
        assert any(line.startswith(suite) and line.endswith("passed") for line in proc.stdout.splitlines()), proc.stdout
    index = run["run_dir"] / "data_docs" / "index.html"
    assert f"Data Docs: {index}" in proc.stdout and index.is_file()
    pages = {p.parts[-4] for p in (run["run_dir"] / "data_docs" / "validations").rglob("*.html")}
    assert pages == {"flight_delay_windows", "flight_delay_alerts", "run_reconciliation"}
    quality = json.loads((run["run_dir"] / "quality.json").read_text())
    rows = {s["suite"]: s["rows"] for s in quality["suites"]}
    assert rows == {"flight_delay_windows": run["summary"]["windows_emitted"],
                    "flight_delay_alerts": run["summary"]["alerts"], "run_reconciliation": 1}
    assert "great_expectations" not in proc.stderr  # GX's INFO lines stay quiet


def test_a_duplicated_window_fails(run, tmp_path):
    copy = broken_copy(run, tmp_path)
    first = sorted((copy / "windows").glob("*.parquet"))[0]
    shutil.copy(first, first.with_name("part-99999999.parquet"))  # the same windows written twice
    proc = dq(run["run_id"], copy.parent)
    assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]
    errors = proc.stderr.splitlines()
    assert any(line.startswith(f"error: run {run['run_id']} failed") for line in errors), proc.stderr[-3000:]
    line = next(line for line in errors if line.startswith("flight_delay_windows: expect_compound_columns_to_be_unique"))
    assert '"origin"' in line and '"window_start"' in line  # a sample of the duplicated rows
    # the summary now disagrees with the table, and every doubled alerting window lacks its second alert
    assert any(line.startswith("run_reconciliation: expect_column_pair_values_to_be_equal(column_A=windows_emitted") for line in errors)


def test_an_unreconciled_summary_fails(run, tmp_path):
    copy = broken_copy(run, tmp_path)
    summary = json.loads((copy / "summary.json").read_text())
    summary["late_events"] += 1  # one event counted twice
    (copy / "summary.json").write_text(json.dumps(summary))
    proc = dq(run["run_id"], copy.parent)
    assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]
    failing = [line for line in proc.stderr.splitlines() if line.startswith("run_reconciliation:")]
    assert len(failing) == 1 and "column_A=events_read, column_B=accounted_events" in failing[0], proc.stderr[-3000:]
    assert f'"run_id": "{run["run_id"]}"' in failing[0] and f'"events_read": {FLIGHTS}' in failing[0]


def test_a_wrong_alert_fails(run, tmp_path, stack_settings, read_topic):
    import pandas as pd
    from kafka import KafkaProducer

    from keyshift.topics import create_topics

    records = [json.loads(m.value) for m in read_topic(ALERTS_TOPIC)]
    alerts = [r for r in records if r.get("run_id") == run["run_id"]]
    assert len(alerts) == run["summary"]["alerts"]
    windows = pd.read_parquet(run["run_dir"] / "windows")
    quiet = windows[~windows["alert"]].iloc[0]  # a window of the run that did not alert
    wrong = {**alerts[0], "origin": quiet["origin"],
             "window_start_ms": int(quiet["window_start"].timestamp() * 1000),
             "window_end_ms": int(quiet["window_end"].timestamp() * 1000)}
    topic = f"it-dq-alerts-{uuid.uuid4().hex[:8]}"
    create_topics(stack_settings, [topic], 1)
    producer = KafkaProducer(bootstrap_servers=stack_settings.bootstrap_servers, acks="all")
    for record in [*alerts, wrong]:
        producer.send(topic, key=record["origin"].encode(), value=json.dumps(record).encode())
    producer.flush()
    producer.close()
    proc = dq(run["run_id"], None, "--alerts-topic", topic)
    assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]
    failing = [line for line in proc.stderr.splitlines() if line.startswith("flight_delay_alerts:")]
    assert any("column=window_alert" in line and f'"origin": "{quiet["origin"]}"' in line for line in failing), proc.stderr[-3000:]
    assert any("expect_table_row_count_to_equal" in line for line in failing)  # one record more than alerting windows
    assert not any(line.startswith(("flight_delay_windows:", "run_reconciliation:")) for line in proc.stderr.splitlines())
