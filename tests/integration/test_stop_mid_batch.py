"""A continuous run stopped while a micro-batch is in its sink stops at the batch boundary.

The race CI hit in `test_airflow_switch` (a summary off by the events one batch left in the
state): the stop came after a batch's windows file, side outputs and ledger were written and
before Spark committed it. Stopping the query there leaves the ledger one batch ahead of the
checkpoint, whose state (read for `pending_events`) is the batch before: events read != windows
+ late + dead letters + pending. A stop must instead let the batch in the sink finish and be
committed, refuse the next one, and write a summary in which ledger, windows table and
checkpoint agree.

Failpoint `sink.hold_after_outputs@2` holds batch 2 in the sink for `HOLD_SECONDS` after its
outputs; the test sends SIGTERM (what `supervisor.stop_driver` sends) as soon as batch 2's ledger file
appears, so the stop lands in that gap every time.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pandas as pd
import pytest

from keyshift.processing.failpoints import FAILPOINT_ENV

pytestmark = pytest.mark.integration

FLIGHTS = 40_000
PARTITIONS = 4
PER_TRIGGER = 5_000
HELD_BATCH = 2
KEYSHIFT = str(Path(sys.executable).parent / "keyshift")


@pytest.fixture
def topic(stack_settings):
    from keyshift.data.replay import replay_flights
    from keyshift.topics import create_topics, delete_topics

    name = f"it-stop-{uuid.uuid4().hex[:8]}"
    create_topics(stack_settings, [name], PARTITIONS)
    replay_flights(stack_settings, name, limit=FLIGHTS, strategy="hash", partitions=PARTITIONS, progress=False)
    yield name
    delete_topics(stack_settings, [name])


def _batch_ids(folder: Path) -> set[int]:
    return {int(p.name) for p in folder.iterdir() if p.name.isdigit()} if folder.exists() else set()


def _wait(predicate, process: subprocess.Popen, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        if process.poll() is not None:
            pytest.fail(f"the driver exited ({process.returncode}) before {what}")
        time.sleep(0.02)
    pytest.fail(f"timed out after {timeout_s} s waiting for {what}")


def test_stop_while_a_batch_is_in_the_sink_waits_for_its_commit(stack_settings, topic, tmp_path):
    run_id = topic
    run_dir = stack_settings.runs_dir / run_id
    env = {**os.environ, FAILPOINT_ENV: f"sink.hold_after_outputs@{HELD_BATCH}"}
    args = [KEYSHIFT, "job", "run", "flight_delays", "--topic", topic, "--run-id", run_id, "--partitions", str(PARTITIONS),
            "--max-offsets-per-trigger", str(PER_TRIGGER), "--starting", "earliest", "--no-progress"]
    with (tmp_path / "driver.out").open("wb") as out:
        process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        ledger_file = run_dir / "batches" / f"{HELD_BATCH:08d}.json"
        _wait(ledger_file.exists, process, 300, f"batch {HELD_BATCH}'s ledger file")
        assert not (run_dir / "checkpoint" / "commits" / str(HELD_BATCH)).exists(), "batch 2 committed before the stop: no race"
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=120) == 0, (tmp_path / "driver.out").read_text()[-3000:]
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)

    summary = json.loads((run_dir / "summary.json").read_text())
    commits = _batch_ids(run_dir / "checkpoint" / "commits")
    ledger = sorted(int(p.stem) for p in (run_dir / "batches").glob("*.json"))
    # the held batch was let finish and committed; nothing past it was run
    assert max(commits) == HELD_BATCH and ledger == sorted(commits), (commits, ledger)
    windows = pd.read_parquet(run_dir / "windows")
    assert int(windows["count"].sum()) == summary["sum_window_counts"]
    assert summary["pending_events"] > 0, "no events held in open windows: the check below would not see a lost batch"
    assert summary["reconciled"], {k: summary[k] for k in ("events_read", "sum_window_counts", "late_events", "dead_letters",
                                                           "filtered_events", "pending_events")}
    # the records the checkpoint's committed offsets cover are the events the ledger counts
    # (Spark's rate limit splits PER_TRIGGER over partitions by their backlog, rounding down)
    assert summary["events_read"] == summary["records_read"] > HELD_BATCH * PER_TRIGGER, summary
