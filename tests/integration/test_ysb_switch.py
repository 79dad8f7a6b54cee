"""A switch of a running YSB job: hash -> least_count on a Zipf-skewed topic, state migrated.

`keyshift replay ysb --zipf 1.0` backfills 20,000 ad events (seed 11) into a fresh 4-partition
topic, placed by hash. `keyshift job run ysb` reads them in micro-batches of at most 2,000
records with key watermarks (10 s bound) in its own process; after its second batch the test
switches it to least_count through `keyshift.migration.switch.request_switch` (what `keyshift
switch` and the `keyshift_switch` DAG call), carried out inside the running driver.

Checked: the switch is done in the driver, with every campaign's state on its new slot
(the switch's own verification) and events conserved across the cut; the windows table and the
counts the job wrote to Redis equal the generator's `expected_views.parquet` exactly (each window
once, though campaigns moved mid-window); the accounting is exact (events read = Σ window counts
+ late + dead letters + filtered + pending, with 0 late and 0 pending); the state of the new
segment's checkpoint sits, campaign by campaign, on the slot the new assignment gives it; the
windows written after the switch carry the new epoch and slot.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest
from flight_runs import KEYSHIFT, batches_done, start, wait_for
from ysb_runs import fresh_ysb_topic, generate, remove_ysb_run

from keyshift.monitoring.balance import balance_degree
from keyshift.processing.operators.processor import PENDING_STATE_NAME
from keyshift.processing.outputs.redis_windows import read_windows
from keyshift.runs import redis_client

pytestmark = pytest.mark.integration

PARTITIONS = 4
START_MS = 1_700_000_000_000
RATE, DURATION = 100, 200  # 20,000 events over 200 s of event time
PER_TRIGGER = 2_000


@pytest.fixture(scope="module")
def switched(stack_settings, tmp_path_factory):
    """Generate, run the YSB job in a subprocess, switch it after its second batch; yield what the tests read."""
    from keyshift.migration.switch import request_switch

    topic = run_id = fresh_ysb_topic(stack_settings, "ysb-switch", PARTITIONS)
    generate(topic, PARTITIONS, "--rate", str(RATE), "--duration", str(DURATION), "--start-ms", str(START_MS),
             "--seed", "11", "--zipf", "1.0", "--run-id", run_id)
    record_dir = stack_settings.runs_dir / f"ysb-{run_id}"
    run_dir = stack_settings.runs_dir / run_id
    log = tmp_path_factory.mktemp("ysb-switch") / "driver.log"
    process = start([KEYSHIFT, "job", "run", "ysb", "--topic", topic, "--run-id", run_id, "--partitions", str(PARTITIONS),
                     "--limit", str(RATE * DURATION), "--starting", "replay", "--watermark", "key", "--bound-ms", "10000",
                     "--max-offsets-per-trigger", str(PER_TRIGGER), "--idle-timeout", "240", "--json", "--no-progress"], log)
    client = redis_client(stack_settings)
    try:
        wait_for(lambda: batches_done(run_dir) >= 2, process, 400, "the job's second batch")
        record = request_switch(stack_settings, run_id, "least_count", reason="test: YSB switch", wait_timeout_s=300)
        assert process.wait(timeout=600) == 0, f"the switched YSB run failed; see {log}"
        yield {"record": record, "run_id": run_id, "run_dir": run_dir, "client": client,
               "summary": json.loads((run_dir / "summary.json").read_text()),
               "ysb": json.loads((record_dir / "ysb.json").read_text()),
               "expected": pd.read_parquet(record_dir / "expected_views.parquet")}
    finally:
        if process.poll() is None:
            process.kill()
        remove_ysb_run(stack_settings, client, topic, run_id)


def _expected(switched) -> pd.DataFrame:
    return switched["expected"].sort_values(["campaign_id", "window_start_ms"]).reset_index(drop=True)


def test_the_switch_is_done_in_the_driver_with_state_on_its_new_slots(switched):
    record = switched["record"]
    assert record.state == "done" and record.in_driver
    assert (record.strategy_from, record.strategy_to) == ("hash", "least_count")
    assert record.verify["placement"]["ok"] and record.verify["placement"]["state_rows"] > 0
    assert record.verify["conservation"]["ok"], record.verify["conservation"]
    summary = switched["summary"]
    assert summary["switches"] == [record.switch_id] and summary["strategy"] == "least_count"
    assert summary["epoch"] == record.epoch_to


def test_accounting_is_exact_across_the_switch(switched):
    summary, by_type = switched["summary"], switched["ysb"]["events_by_type"]
    assert summary["events_read"] == RATE * DURATION
    assert summary["filtered_events"] == by_type["click"] + by_type["purchase"]
    assert summary["sum_window_counts"] == by_type["view"] == int(switched["expected"]["views"].sum())
    assert (summary["late_events"], summary["dead_letters"], summary["pending_events"]) == (0, 0, 0)
    assert summary["events_read"] == (summary["sum_window_counts"] + summary["late_events"] + summary["dead_letters"]
                                      + summary["filtered_events"] + summary["pending_events"])
    assert summary["reconciled"] is True


def test_windows_equal_the_generators_expected_views(switched):
    windows = pd.read_parquet(switched["run_dir"] / "windows")
    assert not windows.duplicated(["campaign_id", "window_start"]).any()
    ours = pd.DataFrame({
        "campaign_id": windows["campaign_id"],
        "window_start_ms": [int(t.timestamp() * 1000) for t in windows["window_start"]],
        "views": windows["count"].astype("int64"),
    }).sort_values(["campaign_id", "window_start_ms"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(ours, _expected(switched), check_dtype=False)
    record = switched["record"]
    after = windows[windows["epoch"] == record.epoch_to]
    assert len(after) > 0 and set(windows["epoch"]) <= {record.epoch_from, record.epoch_to}
    assert (after["slot"] == after["campaign_id"].map(lambda c: int(record.mapping[c]))).all()


def test_redis_window_counts_equal_the_generators(switched):
    written = read_windows(switched["client"], switched["run_id"])
    expected = _expected(switched)
    assert written["campaign_id"].tolist() == expected["campaign_id"].tolist()
    assert written["window_start_ms"].tolist() == expected["window_start_ms"].tolist()
    assert written["seen_count"].tolist() == expected["views"].tolist()


def test_state_of_the_new_segment_sits_on_the_new_slots(switched, spark):
    from keyshift.placement.tokens import slot_tokens, stateful_partition_of_slot

    spark.streams.active  # the state reader needs the driver's state store coordinator
    segments = json.loads((switched["run_dir"] / "job.json").read_text())["segments"]
    assert len(segments) == 2 and segments[-1]["strategy"] == "least_count"
    state = (
        spark.read.format("statestore")
        .option("path", str(switched["run_dir"] / segments[-1]["checkpoint"]))
        .option("stateVarName", PENDING_STATE_NAME)
        .option("batchId", 0)
        .load()
        .selectExpr("key.token AS token", "user_map_key.campaign_id AS campaign_id", "partition_id")
        .toPandas()
    )
    assert len(state) > 0
    stateful = segments[-1]["stateful_partitions"]
    mapping, tokens = switched["record"].mapping, slot_tokens(PARTITIONS, stateful)
    for row in state.itertuples():
        slot = int(mapping[row.campaign_id])
        assert (row.token, row.partition_id) == (tokens[slot], stateful_partition_of_slot(slot, PARTITIONS, stateful)), row


def test_the_plan_balances_the_skewed_campaigns_better_than_hash(switched):
    hash_loads = list(switched["ysb"]["per_partition"].values())  # the generator placed by hash
    assert switched["record"].plan["balance_degree"] > balance_degree(hash_loads), (switched["record"].plan, hash_loads)
