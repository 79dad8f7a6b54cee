"""A run stopped while a switch's new query runs its first batch still finishes the switch.

A stop request (SIGTERM, what `supervisor.stop_driver` sends) that comes after a switch's new query
started and before the driver verified the switch used to return at once: the switch record
stayed at step `published`, state `running`, for as long as the run stayed stopped, and a
`keyshift switch` or the `keyshift_switch` DAG waiting on it waited in vain. The stop waits for
the batch in the sink (`stop_at_batch_boundary`), so that first batch is committed when the
query stops, and the driver now verifies the switch then (`driver._settle_switch_at_stop`).

Failpoint `switch.hold_first_batch@1` holds the first batch of switch 1's new query in the sink
for `HOLD_SECONDS` after its outputs; the test sends SIGTERM while it is held.
"""

from __future__ import annotations

import json
import os
import signal
from concurrent.futures import ThreadPoolExecutor

import pandas as pd
import pytest

from flight_runs import batches_done, fresh_topic, job_args, start, wait_for

pytestmark = pytest.mark.integration

FLIGHTS = 60_000
PER_TRIGGER = 10_000


def test_a_stop_during_a_switchs_first_batch_finishes_the_switch(stack_settings, tmp_path):
    from keyshift.migration.switch import SwitchControl, request_switch
    from keyshift.processing.job_record import load_segments

    topic = run_id = fresh_topic(stack_settings, "stop", FLIGHTS)
    run_dir = stack_settings.runs_dir / run_id
    driver_log = tmp_path / "driver.log"
    args = job_args(topic, run_id, FLIGHTS, PER_TRIGGER)
    limit = args.index("--limit")
    del args[limit:limit + 2]  # a continuous run: it ends when stopped
    process = start([*args, "--no-progress"], driver_log, failpoint="switch.hold_first_batch@1")
    with ThreadPoolExecutor(1) as pool:  # leaving it waits for the request, so the driver must be gone first
        try:
            wait_for(lambda: batches_done(run_dir) >= 1, process, 600, "batch 1")
            requested = pool.submit(request_switch, stack_settings, run_id, "least_count", None, reason="test: stop during a switch",
                                    wait_timeout_s=600)
            held = "failpoint switch.hold_first_batch"
            wait_for(lambda: held in driver_log.read_text(errors="replace"), process, 600, "the new query's first batch, held")
            base = load_segments(run_dir)[-1].batch_base
            assert not (run_dir / "checkpoint-1" / "commits" / "0").exists(), "the new query committed before the stop: no race"
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=300) == 0, driver_log.read_text(errors="replace")[-3000:]
            record = requested.result(timeout=60)
        finally:
            if process.poll() is None:  # the driver, its JVM and its Python workers
                os.killpg(process.pid, signal.SIGKILL)

    assert record.state == "done" and record.step == "done", record
    assert SwitchControl.from_settings(stack_settings, run_id).pending() is None
    segments = load_segments(run_dir)
    assert len(segments) == 2 and segments[-1].strategy == "least_count"
    commits = sorted(int(p.name) for p in (run_dir / segments[-1].checkpoint / "commits").iterdir() if p.name.isdigit())
    assert commits == [0], commits  # the held batch was let finish and committed; nothing past it ran
    ledger = sorted(int(p.stem) for p in (run_dir / "batches").glob("*.json"))
    assert ledger[-1] == base, (ledger, base)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["reconciled"], summary
    assert int(pd.read_parquet(run_dir / "windows")["count"].sum()) == summary["sum_window_counts"]
