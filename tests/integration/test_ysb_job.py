"""The YSB job end to end on the real stack: `keyshift replay ysb` backfills 20,000 ad events
into a fresh 4-partition topic (plus bad records the test writes: malformed, a missing field,
views of unknown ads, a view under another campaign's key, a click of an unknown ad), then
`keyshift job run ysb --limit N` runs in its own process with key watermarks.

Checked: records read = Σ window counts + late + dead letters + filtered + pending, with the
filtered = the generator's clicks and purchases + the test's click; the windows table's count per
(campaign, 10 s window) equals the generator's `expected_views.parquet` exactly, and so do the
counts the job wrote to Redis (`seen_count`, with a `time_updated` inside the run); every bad
record is in the dead-letter topic with its reason; every campaign's state sits on its hash slot
(the state data source's partition_id).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid

import pandas as pd
import pytest
from click.testing import CliRunner
from kafka import KafkaProducer

from keyshift.cli.replay import command as replay_command
from ysb_runs import fresh_ysb_topic, remove_ysb_run

from keyshift.names import YSB_DEAD_LETTER_TOPIC, redis_ysb_ad_campaign_key
from keyshift.placement.strategies import HashStrategy
from keyshift.placement.tokens import slot_tokens, stateful_partition_of_slot
from keyshift.processing.operators.processor import PENDING_STATE_NAME
from keyshift.processing.outputs.redis_windows import read_windows
from keyshift.runs import redis_client
from keyshift.topics import read_committed

pytestmark = pytest.mark.integration

PARTITIONS = 4
START_MS = 1_700_000_000_000
RATE, DURATION = 100, 200  # 20,000 events over 200 s of event time: 20 windows of 10 s per campaign


def bad_records(ad_campaign: dict[str, str]) -> list[tuple[bytes | None, bytes, str | None]]:
    """(Kafka key, value, the reason the job must give; None for a record it must filter)."""
    ad, campaign = next(iter(ad_campaign.items()))
    other = next(c for c in ad_campaign.values() if c != campaign)

    def event(n, **changes):
        fields = {"event_id": 10**9 + n, "user_id": "u", "page_id": "p", "ad_id": ad, "ad_type": "banner", "event_type": "view",
                  "event_time": START_MS + 50_000, "ip_address": "1.2.3.4", **changes}
        return json.dumps({k: v for k, v in fields.items() if v is not ...}).encode()

    return [
        (campaign.encode(), b"not json at all", "malformed JSON"),
        (campaign.encode(), event(1, ad_id=...), "missing ad_id"),
        (campaign.encode(), event(2, ad_id="no-such-ad"), "unknown ad_id"),
        (campaign.encode(), event(3, ad_id="another-unknown-ad"), "unknown ad_id"),
        (other.encode(), event(4), "key does not match campaign_id"),
        (campaign.encode(), event(5, ad_id="no-such-ad", event_type="click"), None),  # not a view: filtered
    ]


def _read_run_records(settings, topic: str, run_id: str) -> list[dict]:
    records = [json.loads(m.value) for m in read_committed(settings, topic)]
    return [r for r in records if r.get("run_id") == run_id]


@pytest.fixture(scope="module")
def run(stack_settings, tmp_path_factory):
    """Replay, add the bad records, run `keyshift job run ysb` in a subprocess; the tests read its outputs."""
    runs_dir = tmp_path_factory.mktemp("ysb-runs")
    topic = fresh_ysb_topic(stack_settings, "ysb", PARTITIONS)
    env = {**os.environ, "KEYSHIFT_RUNS_DIR": str(runs_dir)}
    old_runs_dir = os.environ.get("KEYSHIFT_RUNS_DIR")
    os.environ["KEYSHIFT_RUNS_DIR"] = str(runs_dir)
    try:
        outcome = CliRunner().invoke(replay_command, ["ysb", "--topic", topic, "--rate", str(RATE), "--duration", str(DURATION),
                                                      "--start-ms", str(START_MS), "--partitions", str(PARTITIONS), "--seed", "7",
                                                      "--run-id", "it", "--no-progress"])
    finally:
        if old_runs_dir is None:
            os.environ.pop("KEYSHIFT_RUNS_DIR")
        else:
            os.environ["KEYSHIFT_RUNS_DIR"] = old_runs_dir
    assert outcome.exit_code == 0, outcome.output
    client = redis_client(stack_settings)
    ad_campaign = client.hgetall(redis_ysb_ad_campaign_key(topic))
    bad = bad_records(ad_campaign)
    producer = KafkaProducer(bootstrap_servers=stack_settings.bootstrap_servers, acks="all")
    for i, (key, value, _) in enumerate(bad):
        producer.send(topic, key=key, value=value, partition=i % PARTITIONS)
    producer.flush()
    producer.close()

    run_id = f"it-ysb-{uuid.uuid4().hex[:8]}"
    records = RATE * DURATION + len(bad)
    started_ms = int(time.time() * 1000)
    job = subprocess.run(
        [sys.executable, "-m", "keyshift.cli", "job", "run", "ysb", "--topic", topic, "--run-id", run_id,
         "--partitions", str(PARTITIONS), "--limit", str(records), "--starting", "earliest", "--watermark", "key",
         "--bound-ms", "10000", "--max-offsets-per-trigger", "8000", "--idle-timeout", "240", "--json", "--no-progress"],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
    summary = json.loads(job.stdout[job.stdout.index("{"):])
    yield {"summary": summary, "topic": topic, "run_id": run_id, "run_dir": runs_dir / run_id, "bad": bad, "client": client,
           "ysb": json.loads((runs_dir / "ysb-it" / "ysb.json").read_text()), "started_ms": started_ms,
           "expected": pd.read_parquet(runs_dir / "ysb-it" / "expected_views.parquet"), "records": records}
    remove_ysb_run(stack_settings, client, topic, run_id)


def test_every_record_is_accounted_for(run):
    summary, ysb = run["summary"], run["ysb"]
    by_type = ysb["events_by_type"]
    views = int(run["expected"]["views"].sum())
    assert views == by_type["view"]
    assert summary["events_read"] == run["records"]
    assert summary["filtered_events"] == by_type["click"] + by_type["purchase"] + 1  # the test's click of an unknown ad
    assert summary["dead_letters"] == 5
    assert summary["late_events"] == 0
    assert summary["pending_events"] == 0
    assert summary["sum_window_counts"] == views
    assert summary["events_read"] == (summary["sum_window_counts"] + summary["late_events"] + summary["dead_letters"]
                                      + summary["filtered_events"] + summary["pending_events"])
    assert summary["reconciled"] is True and summary["batches"] >= 3


def test_windows_equal_the_generators_expected_views(run):
    windows = pd.read_parquet(run["run_dir"] / "windows")
    assert list(windows.columns) == ["campaign_id", "window_start", "window_end", "count", "slot", "epoch"]
    assert not windows.duplicated(["campaign_id", "window_start"]).any()
    ours = pd.DataFrame({"campaign_id": windows["campaign_id"],
                         "window_start_ms": [int(t.timestamp() * 1000) for t in windows["window_start"]],
                         "views": windows["count"].astype("int64")}).sort_values(["campaign_id", "window_start_ms"]).reset_index(drop=True)
    expected = run["expected"].sort_values(["campaign_id", "window_start_ms"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(ours, expected, check_dtype=False)
    assert ((windows["window_end"] - windows["window_start"]) == pd.Timedelta(seconds=10)).all()
    assert (windows["slot"] == windows["campaign_id"].map(HashStrategy(partitions=PARTITIONS).slot_of)).all()


def test_redis_holds_each_windows_count_and_update_time(run):
    written = read_windows(run["client"], run["run_id"])
    expected = run["expected"].sort_values(["campaign_id", "window_start_ms"]).reset_index(drop=True)
    assert written["campaign_id"].tolist() == expected["campaign_id"].tolist()
    assert written["window_start_ms"].tolist() == expected["window_start_ms"].tolist()
    assert written["seen_count"].tolist() == expected["views"].tolist()
    assert written["time_updated"].between(run["started_ms"], int(time.time() * 1000)).all()


def test_bad_records_land_in_the_dead_letter_topic_with_reasons(run, stack_settings):
    letters = _read_run_records(stack_settings, YSB_DEAD_LETTER_TOPIC, run["run_id"])
    expected = sorted(reason for _, _, reason in run["bad"] if reason)
    assert sorted(letter["reason"] for letter in letters) == expected
    assert run["summary"]["dead_letters_by_reason"] == {r: expected.count(r) for r in set(expected)}
    raw = {value.decode(): reason for _, value, reason in run["bad"] if reason}
    for letter in letters:
        assert raw[letter["raw_value"]] == letter["reason"]  # the raw bytes travel with a lookup's dead letter too


def test_every_campaigns_state_sits_on_its_hash_slot(run, spark):
    spark.streams.active  # the state reader needs the driver's state store coordinator, made with the streams manager
    state = (
        spark.read.format("statestore")
        .option("path", str(run["run_dir"] / "checkpoint"))
        .option("stateVarName", PENDING_STATE_NAME)
        .option("batchId", 0)
        .load()
        .selectExpr("key.token AS token", "user_map_key.campaign_id AS campaign_id", "partition_id")
        .toPandas()
    )
    assert len(state) >= 50  # most of the 100 campaigns have an open window after batch 0
    stateful = run["summary"]["stateful_partitions"]
    strategy, tokens = HashStrategy(partitions=PARTITIONS), slot_tokens(PARTITIONS, stateful)
    for row in state.itertuples():
        slot = strategy.slot_of(row.campaign_id)
        assert (row.token, row.partition_id) == (tokens[slot], stateful_partition_of_slot(slot, PARTITIONS, stateful)), row
