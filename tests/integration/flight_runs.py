"""Helpers of the integration tests that run the flight delay job as an operator would: a
driver subprocess on a fresh topic, an oracle run to compare with, and the comparison."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest
from kafka import KafkaProducer

from keyshift.names import ALERTS_TOPIC, DEAD_LETTER_TOPIC, LATE_TOPIC

FLIGHTS = 300_000
PARTITIONS = 8
PER_TRIGGER = 25_000
KEYSHIFT = str(Path(sys.executable).parent / "keyshift")
COUNTS = ("events_read", "windows_emitted", "sum_window_counts", "alerts", "late_events", "dead_letters", "pending_events",
          "dead_letters_by_reason")


def job_args(topic: str, run_id: str, flights: int = FLIGHTS, per_trigger: int = PER_TRIGGER) -> list[str]:
    return [KEYSHIFT, "job", "run", "flight_delays", "--topic", topic, "--run-id", run_id, "--limit", str(flights + 40),
            "--partitions", str(PARTITIONS), "--max-offsets-per-trigger", str(per_trigger), "--starting", "earliest",
            "--idle-timeout", "240"]


def start(args: list[str], log: Path, failpoint: str | None = None) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "KEYSHIFT_FAILPOINT"}
    if failpoint:
        env["KEYSHIFT_FAILPOINT"] = failpoint
    with log.open("ab") as out:
        return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def fresh_topic(settings, label: str, flights: int = FLIGHTS) -> str:
    """A new 8-partition topic holding the same records at the same offsets as every other."""
    from keyshift.data.replay import replay_flights
    from keyshift.topics import create_topics

    name = f"it-switch-{uuid.uuid4().hex[:8]}-{label}"
    create_topics(settings, [name], PARTITIONS)
    producer = KafkaProducer(bootstrap_servers=settings.bootstrap_servers, acks="all")
    for i in range(20):
        producer.send(name, key=b"ORD", value=b"not json at all", partition=i % PARTITIONS)
    producer.flush()
    replay_flights(settings, name, limit=flights, strategy="hash", partitions=PARTITIONS, progress=False)
    for i in range(20):
        producer.send(name, key=b"ORD", value=b'{"event_id": 1, "origin": "ORD"}', partition=i % PARTITIONS)
    producer.flush()
    producer.close()
    return name


def side_outputs(settings, run_id: str) -> dict[str, Counter]:
    """Every record of the run in each side output (read_committed, to the end offsets: a consumer
    that stopped after 5 s without a record lost records of these shared topics on a busy
    machine), run id and epoch removed."""
    from keyshift.topics import read_committed

    found = {}
    for topic in (ALERTS_TOPIC, LATE_TOPIC, DEAD_LETTER_TOPIC):
        records = Counter()
        for message in read_committed(settings, topic, timeout_s=300):
            value = json.loads(message.value)
            value.pop("epoch", None)
            if value.pop("run_id", None) == run_id:
                records[json.dumps(value, sort_keys=True)] += 1
        found[topic] = records
    return found


def windows(settings, run_id: str) -> pd.DataFrame:
    table = pd.read_parquet(settings.runs_dir / run_id / "windows").drop(columns=["slot", "epoch"])
    return table.sort_values(["origin", "window_start"]).reset_index(drop=True)


def wait_for(predicate, process: subprocess.Popen, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if process.poll() is not None:
            pytest.fail(f"the driver exited ({process.returncode}) before {what}")
        time.sleep(0.2)
    pytest.fail(f"timed out after {timeout_s} s waiting for {what}")


def batches_done(run_dir: Path) -> int:
    return len(list((run_dir / "batches").glob("*.json"))) if (run_dir / "batches").exists() else 0


def switch_at_the_markers(settings, tmp_path: Path, label: str, flights: int, per_trigger: int, failpoint: str,
                          strategy: str, partitions: int | None = None) -> tuple[Path, dict]:
    """Run the job on a fresh topic (key watermarks, one-minute bound) with `failpoint` armed,
    switch it once to `strategy` (and P) after its first batch, and wait for the run's end.

    Returns:
        (the run's folder, the done switch record). Fails the test if the switch or the run failed.
    """
    from keyshift.migration.switch import request_switch

    topic = run_id = fresh_topic(settings, label, flights)
    run_dir = settings.runs_dir / run_id
    driver_log = tmp_path / "driver.log"
    args = job_args(topic, run_id, flights, per_trigger) + ["--watermark", "key", "--bound-ms", "60000"]
    process = start(args, driver_log, failpoint=failpoint)
    wait_for(lambda: batches_done(run_dir) >= 1, process, 600, "batch 1")
    record = request_switch(settings, run_id, strategy, partitions, reason=f"failpoint {failpoint}", wait_timeout_s=600)
    assert record.state == "done", record.error
    assert process.wait(timeout=600) == 0, f"the run failed; see {driver_log}"
    return run_dir, record


def run_oracle(settings, tmp_path_factory, flights: int = FLIGHTS, per_trigger: int = PER_TRIGGER) -> dict:
    topic = run_id = fresh_topic(settings, "oracle", flights)
    # one stateful partition and one ingest task per slot (S = P): the runs under test take the
    # default (S = 1 per core, the ingest stage coalesced to S tasks) and must equal it exactly
    process = start([*job_args(topic, run_id, flights, per_trigger), "--max-stateful-partitions", str(PARTITIONS)],
                    tmp_path_factory.mktemp("oracle") / "driver.log")
    assert process.wait(timeout=1200) == 0, f"the oracle run failed; see {settings.runs_dir / run_id}"
    summary = json.loads((settings.runs_dir / run_id / "summary.json").read_text())
    assert summary["reconciled"] and summary["events_read"] == flights + 40
    return {"summary": summary, "windows": windows(settings, run_id), "outputs": side_outputs(settings, run_id)}


def assert_equals_the_oracle(settings, run_id: str, oracle: dict) -> dict:
    summary = json.loads((settings.runs_dir / run_id / "summary.json").read_text())
    assert summary["reconciled"]
    for count in COUNTS:
        assert summary[count] == oracle["summary"][count], count
    pd.testing.assert_frame_equal(windows(settings, run_id), oracle["windows"])
    outputs = side_outputs(settings, run_id)
    for topic, records in oracle["outputs"].items():
        assert outputs[topic] == records, f"{topic}: not the oracle's records exactly once"
    return summary


def assert_lossless(summary: dict, reference, flights: int) -> None:
    """A run's summary reconciles all `flights` with 0 late events, 0 dead letters and 0 pending,
    and its windows equal pandas' `reference` row by row."""
    from pathlib import Path

    from keyshift.quality.reference import compare_to_reference

    assert summary["reconciled"] and summary["events_read"] == flights and summary["pending_events"] == 0
    assert summary["late_events"] == 0, f"{summary['watermark']} mode made {summary['late_events']} events late"
    assert summary["dead_letters"] == 0, summary.get("dead_letters_by_reason")
    comparison = compare_to_reference(Path(summary["windows_path"]), reference)
    assert comparison["equal"], comparison
