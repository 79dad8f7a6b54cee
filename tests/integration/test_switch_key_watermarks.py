"""A switch migrates key-level watermarks with the windows: nothing becomes late, nothing is lost.

60,000 real flights (plus 40 malformed records) in a fresh 8-partition topic, read in batches of
3,000 (20 batches: the second switch, asked once the first is verified, still comes while the run
reads; with 8 batches of 8,000 the run had read its whole input by then once, so no state was left
to move) with `key` watermarks and a one-minute bound, so the run loses no flight (the windows
equal pandas) only if every key keeps its own watermark through the switches. The run is
switched twice while it reads: hash -> hot_split (a hot key's clock is split over its pieces'
slots and their window pieces are held by the sink until every piece closed them), then
hot_split -> least_count with P = 8 -> 12 (the pieces' clocks and windows merge back).
"""

from __future__ import annotations

import json

import pandas as pd
import pytest
from flight_runs import batches_done, fresh_topic, job_args, start, wait_for

pytestmark = pytest.mark.integration

FLIGHTS = 60_000
PER_TRIGGER = 3_000


def test_switches_carry_key_watermarks_and_lose_no_flight(stack_settings, tmp_path):
    from keyshift.data.flights import flights_path
    from keyshift.eventtime.watermarks import KeyClock
    from keyshift.processing.operators.state_variables import STATE_VAR_COLUMN
    from keyshift.processing.operators.processor import PENDING_STATE_NAME
    from keyshift.migration.switch import request_switch
    from keyshift.quality.reference import compare_to_reference, reference_windows

    topic = run_id = fresh_topic(stack_settings, "keywm", FLIGHTS)
    run_dir = stack_settings.runs_dir / run_id
    args = job_args(topic, run_id, FLIGHTS, PER_TRIGGER) + ["--watermark", "key", "--bound-ms", "60000"]
    process = start(args, tmp_path / "driver.log")
    records = []
    for number, (strategy, partitions) in enumerate((("hot_split", None), ("least_count", 12))):
        wait_for(lambda: batches_done(run_dir) >= 2 + 2 * number, process, 600, f"batch {2 + 2 * number}")
        record = request_switch(stack_settings, run_id, strategy, partitions, reason=f"key watermarks {number + 1}", wait_timeout_s=300)
        assert record.state == "done", record.error
        assert record.verify["placement"]["ok"] and record.verify["conservation"]["ok"], record.verify
        # key mode keeps each key's clock in its pending-windows value: the clocks moved with the windows
        migrated = pd.read_parquet(run_dir / "switches" / record.switch_id / "initial_state.parquet")
        windows = migrated[migrated[STATE_VAR_COLUMN] == PENDING_STATE_NAME]
        assert sum(KeyClock.unpack(c) is not None for c in windows["clock"]) > 0, "no clock moved with the windows"
        records.append(record)
    assert process.wait(timeout=1200) == 0, f"the switching run failed; see {tmp_path / 'driver.log'}"

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["reconciled"] and summary["pending_events"] == 0
    assert summary["late_events"] == 0, "a switch made events late"
    assert summary["dead_letters"] == 40 and summary["events_read"] == FLIGHTS + 40
    comparison = compare_to_reference(run_dir / "windows", reference_windows(flights_path(stack_settings), limit=FLIGHTS))
    assert comparison["equal"], comparison
    for r in records:
        print(f"{r.strategy_from}/{r.partitions_from} -> {r.strategy_to}/{r.partitions_to}: pause {r.pause_seconds} s, "
              f"state rows {r.migration['state_rows_written']}")
