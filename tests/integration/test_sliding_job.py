"""The sliding flights job (`flight_delays_sliding`: key windows, paper 003) end to end on the real
stack: Kafka, Redis and Spark, through `run_job` as the CLI runs it.

20,000 real flights are replayed into a fresh 4-partition topic (hash placement, key = origin),
with 10 malformed records before them and 10 after, on every partition in turn. The job drains
them in micro-batches of 7,000 records with key-level watermarks (bound one minute of event
time): sliding windows of 1 h every 1 min per origin as key window updates. Every origin is on
one partition and replayed in event-time order, so no flight is late.

Checked: events read = events retired from the key windows + late + dead letters + pending,
exactly (`reconciled`), with 0 late and 0 pending; the 20 malformed records are in the dead-letter
topic with their reasons; the key_windows table, expanded with `expand_updates`, equals Spark's
native batch `groupBy(window(ts, "1 hour", "1 minute"), origin).agg(count, sum, max)` over the same
flights row for row, with at most 2 updates per flight; each origin's updates come from its hash
slot.
"""

from __future__ import annotations

import json
import time
import uuid

import numpy as np
import pandas as pd
import pytest
from kafka import KafkaProducer

from keyshift.eventtime.key_windows import SlidingWindow, expand_updates
from keyshift.names import DEAD_LETTER_TOPIC, LATE_TOPIC
from keyshift.processing.job_config import JobConfig
from keyshift.topics import read_committed

pytestmark = pytest.mark.integration

FLIGHTS = 20_000
PARTITIONS = 4
MINUTE_MS = 60_000
WINDOW = SlidingWindow(60 * MINUTE_MS, MINUTE_MS)
MALFORMED = [
    # (key, value, reason the job must give)
    (b"ORD", b"not json at all", "malformed JSON"),
    (b"ORD", b'{"event_id": 1, "origin": "ORD"}', "missing destination"),
    (b"ATL", b'{"event_id": 2, "origin": "ATL", "destination": "LGA", "delay_min": "ten", "distance_mi": 1, "event_time": 978307260000}',
     "wrong type for delay_min"),
    (b"XXX", b'{"event_id": 5, "origin": "DEN", "destination": "LAX", "delay_min": 1, "distance_mi": 1, "event_time": 978307260000}',
     "key does not match origin"),
]


def _run_records(settings, topic: str, run_id: str) -> list[dict]:
    records = [json.loads(m.value) for m in read_committed(settings, topic)]
    return [r for r in records if r.get("run_id") == run_id]


def _flights(settings) -> pd.DataFrame:
    """The replayed flights as the job sees them: origin, event_time_ms, delay_min."""
    import pyarrow as pa

    from keyshift.data.flights import flights_path
    from keyshift.data.replay import event_time_ms, iter_flight_batches

    table = pa.Table.from_batches([batch for _, batch in iter_flight_batches(flights_path(settings), limit=FLIGHTS)])
    return pd.DataFrame({"origin": table.column("origin").to_pandas().astype(object),
                         "event_time_ms": event_time_ms(table.column("date")).astype(np.int64),
                         "delay_min": table.column("delay").to_numpy().astype(np.int64)})


def _native(spark, flights: pd.DataFrame) -> pd.DataFrame:
    """Spark's own sliding windows over the flights, in batch."""
    from pyspark.sql import functions as F

    native = (
        spark.createDataFrame(flights).withColumn("ts", F.timestamp_millis("event_time_ms"))
        .groupBy(F.window("ts", "1 hour", "1 minute"), "origin")
        .agg(F.count(F.lit(1)).alias("count"), F.sum("delay_min").alias("sum"), F.max("delay_min").alias("max"))
        .select("origin", F.unix_millis("window.start").alias("window_start_ms"), F.unix_millis("window.end").alias("window_end_ms"),
                "count", "sum", "max")
    )
    return native.toPandas().astype({c: np.int64 for c in ("window_start_ms", "window_end_ms", "count", "sum", "max")}).sort_values(
        ["origin", "window_start_ms"], ignore_index=True)


@pytest.fixture(scope="module")
def run(settings, stack_settings, spark):
    """Replay, mix in malformed records, run the sliding job once; the tests read its outputs."""
    from keyshift.data.replay import replay_flights
    from keyshift.runtime.driver import run_job
    from keyshift.topics import create_topics, describe_topics

    topic = f"kw-sliding-{uuid.uuid4().hex[:8]}"
    create_topics(settings, [topic], PARTITIONS)
    missing = [t for t in (DEAD_LETTER_TOPIC, LATE_TOPIC) if t not in describe_topics(settings, [t])]
    if missing:
        create_topics(settings, missing, PARTITIONS)
    producer = KafkaProducer(bootstrap_servers=settings.bootstrap_servers, acks="all")

    def send_malformed(copies: int) -> None:
        for i in range(copies):
            key, value, _ = MALFORMED[i % len(MALFORMED)]
            producer.send(topic, key=key, value=value, partition=i % PARTITIONS)
        producer.flush()

    send_malformed(10)
    replay = replay_flights(settings, topic, limit=FLIGHTS, strategy="hash", partitions=PARTITIONS, progress=False)
    send_malformed(10)
    producer.close()

    config = JobConfig.from_options(
        run_id=f"kw-{uuid.uuid4().hex[:8]}", job="flight_delays_sliding", topic=topic, partitions=PARTITIONS, limit=FLIGHTS + 20,
        max_offsets_per_trigger=7_000, watermark="key", bound_ms=MINUTE_MS, idle_timeout_s=240,
    )
    started = time.monotonic()
    summary = run_job(settings, config, starting="earliest", spark=spark)
    job_seconds = time.monotonic() - started
    flights = _flights(settings)
    started = time.monotonic()
    native = _native(spark, flights)
    native_seconds = time.monotonic() - started
    updates = pd.read_parquet(settings.runs_dir / config.run_id / "key_windows")
    print(f"\nsliding job: {FLIGHTS} flights, {summary['key_window_updates']} updates, {len(native)} native rows, "
          f"{summary['batches']} batches, job {job_seconds:.1f} s (wall {summary['wall_seconds']} s), native batch {native_seconds:.1f} s")
    return {"summary": summary, "replay": replay, "config": config, "updates": updates, "native": native,
            "dead": _run_records(settings, DEAD_LETTER_TOPIC, config.run_id), "late": _run_records(settings, LATE_TOPIC, config.run_id)}


def test_every_event_is_accounted_for_and_none_is_late(run):
    summary = run["summary"]
    assert run["replay"].events_produced == FLIGHTS
    assert summary["job"] == "flight_delays_sliding" and summary["window"] == "key_windows"
    assert summary["events_read"] == FLIGHTS + 20
    assert summary["late_events"] == 0 and run["late"] == []
    assert summary["dead_letters"] == 20
    assert summary["events_retired"] == summary["sum_window_counts"] == FLIGHTS
    assert summary["pending_events"] == 0
    assert summary["reconciled"] is True
    assert summary["batches"] >= 3


def test_dead_letters_carry_their_reasons(run):
    assert sorted(r["reason"] for r in run["dead"]) == sorted([MALFORMED[i % 4][2] for i in range(10)] * 2)
    assert run["summary"]["dead_letters_by_reason"] == {
        reason: sum(1 for r in run["dead"] if r["reason"] == reason) for reason in {r["reason"] for r in run["dead"]}}


def test_key_windows_expanded_equal_spark_native_sliding_windows(run):
    from keyshift.placement.strategies import strategy_by_name

    table, native, summary = run["updates"], run["native"], run["summary"]
    assert list(table.columns) == ["origin", "start_ms", "count", "sum", "max", "watermark_ms", "slot", "epoch", "run_id"]
    assert (table["run_id"] == run["config"].run_id).all()
    hashed = strategy_by_name("hash", PARTITIONS)
    assert all(hashed.slot_of(origin) == slot for origin, slot in table[["origin", "slot"]].drop_duplicates().itertuples(index=False))
    assert (table["start_ms"] + WINDOW.size_ms <= table["watermark_ms"]).all()  # final when written
    updates = (table[["origin", "start_ms", "count", "sum", "max"]].astype({"origin": object, "max": "Int64"})
               .sort_values(["origin", "start_ms"], ignore_index=True))
    assert not updates.duplicated(["origin", "start_ms"]).any()
    assert len(updates) == summary["key_window_updates"] <= 2 * FLIGHTS < len(native)
    assert summary["native_window_rows"] == len(native)
    pd.testing.assert_frame_equal(expand_updates(updates, WINDOW), native, check_dtype=False)
