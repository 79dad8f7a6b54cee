"""The plain YSB baseline (`keyshift.bench.plain_ysb`) on the real stack, in this process.

`keyshift replay ysb`'s generator backfills 20,000 ad events (seed 7, 100 events/s of event time
over 200 s, `--zipf 1.0`) into a fresh 4-partition topic; the plain Structured Streaming job reads
it with availableNow in 5,000-record batches through the shared SparkSession (local[2], P = 4,
RocksDB). Checked: every record read, no view dropped by the watermark, the windows the final
watermark closed (Parquet and Redis `seen_count`) equal the generator's `expected_views.parquet`,
the windows past it stay open, and the query's shuffle bytes, read from Spark's REST API, are
positive and add up per stage.
"""

from __future__ import annotations

import time

import pandas as pd
import pytest

from ysb_runs import fresh_ysb_topic, remove_ysb_run

from keyshift.data.ysb import EVENT_TYPES, WINDOW_MS, EventStream, campaign_map, generate_ysb
from keyshift.runs import redis_client

pytestmark = pytest.mark.integration

PARTITIONS = 4
START_MS = 1_700_000_000_000
RATE, DURATION = 100, 200  # 20,000 events, 200 s of event time: 20 windows of 10 s per campaign
PER_TRIGGER = 5_000
BOUND_MS = 60_000  # plain_ysb.BOUND
SEED, ZIPF = 7, 1.0


@pytest.fixture(scope="module")
def plain_run(spark, stack_settings, tmp_path_factory):
    """Generate the topic, run the plain YSB job on it; yield its figures and what the tests read."""
    from keyshift.bench.plain_ysb import BOUND, delete_redis_windows, read_redis_windows, run_plain_ysb

    assert BOUND == "1 minute" and spark.conf.get("spark.sql.session.timeZone") == "UTC"
    settings = stack_settings.model_copy(update={"runs_dir": tmp_path_factory.mktemp("plain-ysb-runs")})
    topic = fresh_ysb_topic(settings, "plain-ysb", PARTITIONS)
    client = redis_client(settings)
    previous = spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set("spark.sql.shuffle.partitions", str(PARTITIONS))
    try:
        generated = generate_ysb(settings, topic, rate=RATE, duration=DURATION, start_ms=START_MS, seed=SEED, zipf=ZIPF,
                                 partitions=PARTITIONS, run_id=topic, progress=False)
        out = tmp_path_factory.mktemp("plain-ysb") / topic
        started_ms = int(time.time() * 1000)
        result = run_plain_ysb(spark, settings.bootstrap_servers, topic, out, PER_TRIGGER, settings.redis_url, label=topic)
        ended_ms = int(time.time() * 1000)
        yield {"result": result, "generated": generated, "expected_path": generated.run_dir / "expected_views.parquet",
               "windows": pd.read_parquet(result["windows_path"]), "redis": read_redis_windows(client, topic),
               "started_ms": started_ms, "ended_ms": ended_ms, "spark": spark}
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", previous)
        delete_redis_windows(client, topic)
        remove_ysb_run(settings, client, topic, topic)


def test_every_record_is_read_and_no_view_is_dropped(plain_run):
    result = plain_run["result"]
    assert result["events"] == sum(b["input_rows"] for b in result["progress"]) == RATE * DURATION
    reading = [b for b in result["progress"] if b["input_rows"] > 0]
    assert len(reading) >= RATE * DURATION // PER_TRIGGER and all(b["input_rows"] <= PER_TRIGGER for b in reading)
    assert result["batches"] > len(reading)  # then the no-data batch that moves the watermark and closes windows
    assert result["dropped_by_watermark"] == 0
    assert result["first_batch_seconds"] > 0 and result["steady_events_per_second"] > 0
    # the final watermark: the last view's time (the watermark sees views only) - 1 minute
    stream = EventStream(campaign_map(seed=SEED), SEED, START_MS, RATE, ZIPF)
    last_view_ms = max(int(b.event_times[b.event_types == EVENT_TYPES.index("view")].max()) for b in stream.batches(RATE * DURATION))
    assert result["final_watermark_ms"] == last_view_ms - BOUND_MS


def test_closed_windows_equal_the_generators_record(plain_run):
    from keyshift.bench.plain_ysb import compare_to_expected

    result, windows = plain_run["result"], plain_run["windows"]
    assert list(windows.columns) == ["campaign_id", "window_start", "window_end", "count", "window_start_ms"]
    check = compare_to_expected(windows, plain_run["expected_path"], watermark_ms=result["final_watermark_ms"])
    assert check["identical"], check
    assert check["windows"] == result["windows"] == result["redis_windows"] > 0
    assert int(windows["count"].sum()) == result["views"]
    # every window the watermark closed was written; the last ones stay open, as documented
    expected = pd.read_parquet(plain_run["expected_path"])
    closed = expected[expected["window_start_ms"] + WINDOW_MS <= result["final_watermark_ms"]]
    assert len(closed) == result["windows"] < len(expected)
    assert (windows["window_end"] - windows["window_start"] == pd.Timedelta(milliseconds=WINDOW_MS)).all()
    assert windows["window_start_ms"].max() + WINDOW_MS <= result["final_watermark_ms"]


def test_redis_windows_equal_the_generators_record(plain_run):
    from keyshift.bench.plain_ysb import compare_to_expected

    result, redis_windows = plain_run["result"], plain_run["redis"]
    check = compare_to_expected(redis_windows, plain_run["expected_path"], watermark_ms=result["final_watermark_ms"])
    assert check["identical"], check
    assert len(redis_windows) == result["windows"]
    assert redis_windows["time_updated"].between(plain_run["started_ms"], plain_run["ended_ms"]).all()


def test_shuffle_write_bytes_are_read_from_the_rest_api(plain_run):
    from keyshift.monitoring.shuffle import shuffle_bytes_by_stage, shuffle_write_bytes

    result, spark = plain_run["result"], plain_run["spark"]
    assert result["shuffle_write_bytes"] > 0
    ours = shuffle_bytes_by_stage(spark, query_run_id=result["query_run_id"])
    assert sum(s.shuffle_write_bytes for s in ours) == result["shuffle_write_bytes"]
    # each batch that read records ran one map stage: it read them from Kafka and wrote the shuffle
    for batch in (b for b in result["progress"] if b["input_rows"] > 0):
        reads = [s for s in ours if s.batch_id == batch["batch_id"] and s.input_records > 0]
        assert len(reads) == 1 and reads[0].input_records == batch["input_rows"] and reads[0].shuffle_write_bytes > 0
    # the application's sum holds this query's and whatever earlier tests shuffled in this session
    assert shuffle_write_bytes(spark) >= result["shuffle_write_bytes"]
