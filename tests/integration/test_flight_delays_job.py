"""The flight delay job end to end on the real stack: Kafka, Redis and Spark.

100,000 real flights are replayed into a fresh 8-partition topic with 50 malformed records mixed
in; the job drains them in micro-batches of 40,000 records with a 1-hour watermark bound.
Spark reads the partitions in proportion to their offsets, so their event times drift apart by
about 1.6 hours at batch boundaries and a few events arrive after their window closed: they must
be in `flights-late`, counted, and missing from the windows. Checked: the windows table equals an
independent pandas computation over the flights minus the late ones, field by field; every late
event really was behind the watermark; every key's state sits on its assigned slot (the state
data source's partition_id); the 50 malformed records are in the dead-letter topic with their
reasons; events read = Σ window counts + late + dead letters.
"""

from __future__ import annotations

import json
import uuid

import numpy as np
import pandas as pd
import pytest
from kafka import KafkaProducer

from keyshift.names import DEAD_LETTER_TOPIC, LATE_TOPIC
from keyshift.placement.strategies import strategy_by_name
from keyshift.placement.tokens import slot_tokens, stateful_partition_of_slot
from keyshift.processing.job_config import JobConfig
from keyshift.processing.operators.processor import PENDING_STATE_NAME
from keyshift.topics import read_committed

pytestmark = pytest.mark.integration

FLIGHTS = 100_000
PARTITIONS = 8
MALFORMED = [
    # (key, value, reason the job must give)
    (b"ORD", b"not json at all", "malformed JSON"),
    (b"ORD", b'{"event_id": 1, "origin": "ORD"}', "missing destination"),
    (b"ATL", b'{"event_id": 2, "origin": "ATL", "destination": "LGA", "delay_min": "ten", "distance_mi": 1, "event_time": 978307260000}', "wrong type for delay_min"),
    (b"SFO", b'{"event_id": -4, "origin": "SFO", "destination": "LAX", "delay_min": 1, "distance_mi": 1, "event_time": 978307260000}', "negative event_id"),
    (b"XXX", b'{"event_id": 5, "origin": "DEN", "destination": "LAX", "delay_min": 1, "distance_mi": 1, "event_time": 978307260000}', "key does not match origin"),
]


def _read_run_records(settings, topic: str, run_id: str) -> list[dict]:
    records = [json.loads(m.value) for m in read_committed(settings, topic)]  # the job's side outputs are transactional
    return [r for r in records if r.get("run_id") == run_id]


@pytest.fixture(scope="module")
def run(settings, spark, tmp_path_factory):
    """Replay, mix in malformed records, run the job once; the tests read its outputs."""
    from keyshift.data.flights import flights_path
    from keyshift.data.replay import replay_flights
    from keyshift.runtime.driver import run_job
    from keyshift.topics import create_topics, describe_topics

    topic = f"it-flights-{uuid.uuid4().hex[:8]}"
    create_topics(settings, [topic], PARTITIONS)
    missing = [t for t in (DEAD_LETTER_TOPIC, LATE_TOPIC) if t not in describe_topics(settings, [t])]
    if missing:  # side outputs: any partition count will do (a P = 32 demo may have made them)
        create_topics(settings, missing, PARTITIONS)
    producer = KafkaProducer(bootstrap_servers=settings.bootstrap_servers, acks="all")
    strategy = strategy_by_name("hash", PARTITIONS)

    def send_malformed(copies: int) -> None:
        for i in range(copies):
            key, value, _ = MALFORMED[i % len(MALFORMED)]
            producer.send(topic, key=key, value=value, partition=i % PARTITIONS)
        producer.flush()

    send_malformed(25)  # before the flights ...
    replay = replay_flights(settings, topic, limit=FLIGHTS, strategy="hash", partitions=PARTITIONS, progress=False)
    send_malformed(25)  # ... and after them, on every partition
    producer.close()

    config = JobConfig.from_options(
        run_id=f"it-{uuid.uuid4().hex[:8]}", topic=topic, partitions=PARTITIONS,
        limit=FLIGHTS + 50, max_offsets_per_trigger=40_000, bound_ms=3_600_000, idle_timeout_s=240,
    )
    summary = run_job(settings, config, starting="earliest", spark=spark)
    flights = pd.read_parquet(flights_path(settings)).iloc[:FLIGHTS]
    late = _read_run_records(settings, LATE_TOPIC, config.run_id)
    return {"summary": summary, "late": late, "config": config, "replay": replay, "flights": flights, "strategy": strategy,
            "run_dir": settings.runs_dir / config.run_id}


def test_every_event_is_accounted_for(run):
    summary = run["summary"]
    assert run["replay"].events_produced == FLIGHTS
    assert summary["events_read"] == FLIGHTS + 50
    assert summary["dead_letters"] == 50
    assert summary["late_events"] == len(run["late"])
    assert summary["sum_window_counts"] == FLIGHTS - summary["late_events"]
    assert summary["events_read"] == summary["sum_window_counts"] + summary["late_events"] + summary["dead_letters"]
    assert summary["pending_events"] == 0  # read back from the state store: nothing left open
    assert summary["reconciled"] is True
    assert sum(summary["per_slot_events"]) == summary["events_read"]
    assert summary["batches"] >= 3  # the input really came in several micro-batches
    on_disk = json.loads((run["run_dir"] / "summary.json").read_text())
    assert on_disk["events_read"] == summary["events_read"]


def test_the_default_runs_one_stateful_partition_and_one_ingest_task_per_core(run, spark):
    from keyshift.placement.tokens import default_max_stateful_partitions

    stateful = min(PARTITIONS, default_max_stateful_partitions(spark.sparkContext.defaultParallelism))
    assert run["summary"]["stateful_partitions"] == stateful
    assert run["summary"]["source_tasks"] == stateful  # the ingest stage is coalesced to S tasks


def test_stateful_task_times_come_from_spark_rest_api(run):
    summary = run["summary"]
    stateful, ingest = summary["stateful_partitions"], summary["source_tasks"]
    assert len(summary["per_slot_task_seconds"]) == stateful
    assert all(seconds > 0 for seconds in summary["per_slot_task_seconds"])  # every stateful partition ran its tasks
    assert summary["stateful_batches_timed"] >= summary["batches"] - 1
    assert summary["stateful_makespan_ratio"] >= 1.0
    # the ingest stage's tasks each read a range of Kafka partitions: every task read and timed in each batch
    assert len(summary["per_slot_source_task_seconds"]) == ingest
    assert all(seconds > 0 for seconds in summary["per_slot_source_task_seconds"])
    progress = [json.loads(line) for line in (run["run_dir"] / "progress.jsonl").read_text().splitlines()]
    assert summary["source_batches_timed"] == sum(1 for batch in progress if batch["input_rows"] > 0)  # no-data batches read nothing
    assert summary["source_makespan_ratio"] >= 1.0
    assert set(summary["makespan_ratio_after_warmup"]) == {"source", "stateful"}
    per_batch = json.loads((run["run_dir"] / "task_seconds.json").read_text())
    assert len(per_batch["stateful"]) == summary["stateful_batches_timed"]
    assert all(len(seconds) == ingest for seconds in per_batch["source"].values())


def test_late_events_were_behind_the_watermark(run):
    for event in run["late"]:
        assert event["window_end_ms"] <= event["watermark_ms"]
        assert event["window_end_ms"] - 3_600_000 <= event["event_time"] < event["window_end_ms"]
    assert len({e["event_id"] for e in run["late"]}) == len(run["late"])  # each sent once


def test_windows_equal_an_independent_pandas_computation(run):
    late_ids = {event["event_id"] for event in run["late"]}
    flights = run["flights"].drop(index=list(late_ids))  # event_id = row number
    expected = (
        flights.assign(window_start=flights["date"].dt.floor("h").dt.tz_localize("UTC"))
        .groupby(["origin", "window_start"])["delay"]
        .agg(count="count", sum_delay_min="sum", max_delay_min="max")
        .reset_index()
    )
    expected["window_end"] = expected["window_start"] + pd.Timedelta(hours=1)
    expected["mean_delay_min"] = expected["sum_delay_min"] / expected["count"]
    expected["alert"] = (expected["mean_delay_min"] >= 30) & (expected["count"] >= 5)
    expected["slot"] = expected["origin"].map(run["strategy"].slot_of)
    expected["epoch"] = 0

    windows = pd.read_parquet(run["run_dir"] / "windows")
    assert list(windows.columns) == [
        "origin", "window_start", "window_end", "count", "sum_delay_min", "mean_delay_min", "max_delay_min", "alert", "slot", "epoch",
    ]
    assert str(windows["window_start"].dtype) == "datetime64[us, UTC]"
    assert not windows.duplicated(["origin", "window_start"]).any()  # each window emitted once
    ours = windows.sort_values(["origin", "window_start"]).reset_index(drop=True)
    theirs = expected.sort_values(["origin", "window_start"]).reset_index(drop=True)[list(ours.columns)]
    assert len(ours) == len(theirs)
    for column in ours.columns:
        left, right = ours[column], theirs[column]
        if column == "mean_delay_min":
            np.testing.assert_allclose(left.to_numpy(), right.to_numpy(), rtol=0, atol=1e-12)
        elif column in ("window_start", "window_end"):
            assert (left.dt.as_unit("us") == right.dt.as_unit("us")).all(), column
        else:
            assert (left.astype("int64") if left.dtype != object else left).tolist() == (right.astype("int64") if right.dtype != object else right).tolist(), column


def test_every_key_state_sits_on_its_assigned_slot(run, spark):
    """The state data source's partition_id of every key is the stateful partition of the slot its
    strategy chose (`stateful_partition_of_slot`), under the slot's own token."""
    state = (
        spark.read.format("statestore")
        .option("path", str(run["run_dir"] / "checkpoint"))
        .option("stateVarName", PENDING_STATE_NAME)
        .option("batchId", 0)  # after batch 0 every key seen so far still has open windows
        .load()
        .selectExpr("key.token AS token", "user_map_key.origin AS origin", "partition_id")
        .toPandas()
    )
    assert len(state) > 100  # most of the 229 origins appear in the first micro-batch
    stateful = run["summary"]["stateful_partitions"]
    tokens = slot_tokens(PARTITIONS, stateful)
    for row in state.itertuples():
        slot = run["strategy"].slot_of(row.origin)
        assert row.token == tokens[slot], row
        assert row.partition_id == stateful_partition_of_slot(slot, PARTITIONS, stateful), row
    assert set(state["partition_id"]) == set(range(stateful))


def test_malformed_records_land_in_the_dead_letter_topic_with_reasons(run, settings):
    letters = _read_run_records(settings, DEAD_LETTER_TOPIC, run["config"].run_id)
    assert len(letters) == 50
    expected = {raw.decode(): reason for _, raw, reason in MALFORMED}
    for letter in letters:
        assert letter["reason"] == expected[letter["raw_value"]]
        assert letter["kafka_offset"] >= 0
