"""Switches of a running job with migrated state: nothing lost, nothing counted twice.

300,000 real flights (plus 40 malformed records) in a fresh 8-partition topic, read in
micro-batches of 25,000 records with a one-hour bound (so the run has late events, dead letters
and alerts). The oracle runs without a switch. The switching run reads the same records (a fresh
topic with the same records at the same offsets) and is switched three times while it reads
them: hash -> least_count, least_count -> hot_split, hot_split -> least_count with P = 8 -> 12,
each through `keyshift.migration.switch.request_switch` (what `keyshift switch` and the Airflow
DAG call), each carried out inside the running driver. Its windows table must be the oracle's row
by row (apart from `slot` and `epoch`), its counts and side outputs the oracle's, and after each
switch every key's state on its new slot (the state reader's `partition_id`).

A third run reads the same records with its 8 slots spread over 3 stateful partitions
(`--max-stateful-partitions 3`, slots 0-2, 3-5 and 6-7): again the oracle's windows, counts
and side outputs, with every key's state on its slot's stateful partition.
"""

from __future__ import annotations

import json
import os

import pytest
from flight_runs import assert_equals_the_oracle, batches_done, fresh_topic, job_args, run_oracle, start, wait_for

pytestmark = pytest.mark.integration

SWITCHES = (("least_count", None), ("hot_split", None), ("least_count", 12))


@pytest.fixture(scope="module")
def oracle(stack_settings, tmp_path_factory):
    return run_oracle(stack_settings, tmp_path_factory)


def test_three_switches_while_reading_equal_the_run_without(stack_settings, oracle, spark, tmp_path):
    from keyshift.migration.switch import SwitchControl, request_switch
    from keyshift.placement.tokens import default_max_stateful_partitions

    topic = run_id = fresh_topic(stack_settings, "switching")
    run_dir = stack_settings.runs_dir / run_id
    process = start(job_args(topic, run_id), tmp_path / "driver.log")
    records = []
    for number, (strategy, partitions) in enumerate(SWITCHES):
        # the switch cuts after the next batch (its barrier batch): the third well before the input's end
        wait_for(lambda: batches_done(run_dir) >= 1 + 3 * number, process, 600, f"batch {1 + 3 * number}")
        record = request_switch(stack_settings, run_id, strategy, partitions, reason=f"test switch {number + 1}", wait_timeout_s=300)
        assert record.state == "done" and record.in_driver
        assert record.verify["placement"]["ok"] and record.verify["placement"]["state_rows"] > 0
        assert record.verify["conservation"]["ok"], record.verify["conservation"]
        records.append(record)
    assert process.wait(timeout=1200) == 0, f"the switching run failed; see {tmp_path / 'driver.log'}"

    summary = assert_equals_the_oracle(stack_settings, run_id, oracle)
    assert summary["late_events"] == oracle["summary"]["late_events"]  # late events caused by switches: 0
    assert len(summary["switches"]) == 3 and summary["partitions"] == 12
    # the driver's default: 1 stateful partition per core, so on 2 cores P = 8 and P = 12 run on 2
    segments = json.loads((run_dir / "job.json").read_text())["segments"]
    cap = default_max_stateful_partitions(os.cpu_count())
    assert [s["stateful_partitions"] for s in segments] == [min(p, cap) for p in (8, 8, 8, 12)]
    assert summary["stateful_partitions"] == min(12, cap)
    history = SwitchControl.from_settings(stack_settings, run_id).history()
    assert [h.switch_id for h in history] == [r.switch_id for r in reversed(records)]
    epochs = [r.epoch_to for r in records]
    assert epochs == sorted(epochs) and len(set(epochs)) == 3
    progress = [json.loads(line) for line in (run_dir / "progress.jsonl").read_text().splitlines()]
    assert {p["epoch"] for p in progress} >= set(epochs)
    # each switch's state came from its barrier batch, and that snapshot is what Spark's state
    # data source reads from the old checkpoint at the cut, row for row
    assert [r.state_source for r in records] == ["handover"] * 3
    for r, old in zip(records, segments):
        assert r.step_seconds["barrier_batch"] > 0
        assert_snapshot_is_the_checkpoint_state(spark, run_dir, old, r.switch_id, r.cut_batch)
    (tmp_path / "switches.json").write_text(json.dumps([
        {k: getattr(r, k) for k in ("switch_id", "strategy_from", "strategy_to", "partitions_from", "partitions_to", "pause_seconds",
                               "step_seconds", "migration", "plan")} for r in records], indent=1, default=str))
    for r in records:
        print(f"{r.strategy_from}/{r.partitions_from} -> {r.strategy_to}/{r.partitions_to}: pause {r.pause_seconds} s, "
              f"steps {r.step_seconds}, state rows {r.migration['state_rows_written']}")


def test_slots_over_fewer_stateful_partitions_equal_the_run_with_one_per_slot(stack_settings, oracle, spark, tmp_path):
    from keyshift.placement.strategies import strategy_by_name
    from keyshift.placement.tokens import slot_tokens, stateful_partition_of_slot
    from keyshift.processing.operators.processor import PENDING_STATE_NAME

    topic = run_id = fresh_topic(stack_settings, "stateful3")
    run_dir = stack_settings.runs_dir / run_id
    process = start([*job_args(topic, run_id), "--max-stateful-partitions", "3"], tmp_path / "driver.log")
    assert process.wait(timeout=1200) == 0, f"the run failed; see {tmp_path / 'driver.log'}"

    summary = assert_equals_the_oracle(stack_settings, run_id, oracle)
    assert summary["stateful_partitions"] == 3 and summary["partitions"] == 8
    assert len(summary["per_slot_task_seconds"]) == 3 and all(s > 0 for s in summary["per_slot_task_seconds"])
    assert summary["source_tasks"] == 3 and len(summary["per_slot_source_task_seconds"]) == 3  # the ingest stage, coalesced
    assert sum(summary["per_slot_events"]) == summary["events_read"]  # loads stay per slot
    spark.streams.active  # noqa: B018 - the state store coordinator the reader's tasks report to (no query ran in this session)
    state = (spark.read.format("statestore").option("path", str(run_dir / "checkpoint")).option("stateVarName", PENDING_STATE_NAME)
             .option("batchId", 0).load().selectExpr("key.token AS token", "user_map_key.origin AS origin", "partition_id").toPandas())
    assert len(state) > 100
    hash_strategy, tokens = strategy_by_name("hash", 8), slot_tokens(8, 3)
    for row in state.itertuples():
        slot = hash_strategy.slot_of(row.origin)
        assert (row.token, row.partition_id) == (tokens[slot], stateful_partition_of_slot(slot, 8, 3)), row
    assert set(state["partition_id"]) == {0, 1, 2}


def assert_snapshot_is_the_checkpoint_state(spark, run_dir, segment, switch_id, cut_batch):
    """The barrier batch's snapshot file (`keyshift.processing.outputs.handover`) holds exactly the
    state and timers the state reader finds in the segment's checkpoint at the cut."""
    from keyshift.jobs.flight_delays import FLIGHT_DELAYS
    from keyshift.migration.state import read_state
    from keyshift.names import RunDir
    from keyshift.placement.tokens import slot_tokens
    from keyshift.processing.operators.processor import state_variables
    from keyshift.processing.outputs.handover import read_snapshot

    variables = state_variables(FLIGHT_DELAYS)
    tokens = slot_tokens(segment["partitions"], segment["stateful_partitions"])
    handed = read_snapshot(RunDir(run_dir).handover(switch_id, segment["batch_base"] + cut_batch), variables, tokens)
    assert handed is not None, f"no complete snapshot for batch {segment['batch_base'] + cut_batch}"
    read = read_state(spark, RunDir(run_dir).checkpoint(segment["checkpoint"]), variables, cut_batch)

    def rows(frame, columns):
        return sorted(tuple(bytes(v) if isinstance(v, (bytes, bytearray)) else v for v in row)
                      for row in frame[list(columns)].itertuples(index=False))

    for variable in variables:
        columns = ("old_token", "partition_id", "key", *variable.value_fields)
        assert rows(handed[0][variable.name], columns) == rows(read[0][variable.name], columns), variable.name
    assert rows(handed[1], ("old_token", "expiry_ms", "partition_id")) == rows(read[1], ("old_token", "expiry_ms", "partition_id"))
    assert len(read[0]["pending_windows"]) > 0
