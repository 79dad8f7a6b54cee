"""Key windows equal Spark's native sliding-window aggregation on the real flights.

Spark's batch `groupBy(window(ts, "1 hour", "1 minute"), origin).agg(count, sum, max)` over the
first flights is compared with the key window updates of the same events: expanded to every
window start they must give exactly Spark's rows (no row more, none less), and at every emitted
update point the update must be Spark's row of that window (or no row for an empty result).
Needs Spark (the session fixture, local[2], UTC) and the cached flights, not Kafka or Redis.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from keyshift.eventtime.key_windows import (
    FLUSH_MS,
    SlidingWindow,
    advance_keys,
    expand_updates,
    key_window_updates_by_key,
)

pytestmark = pytest.mark.integration

FLIGHTS = 200_000
"""The first flights of the file (about 12 days, 2001-01-01 onwards)."""

HOUR = SlidingWindow(3_600_000, 60_000)


@pytest.fixture(scope="module")
def flights(settings) -> pd.DataFrame:
    """origin, event_time_ms (epoch ms UTC), delay_min of the first FLIGHTS flights, as replay encodes them."""
    import pyarrow.parquet as pq

    from keyshift.data.flights import flights_path
    from keyshift.data.replay import event_time_ms

    table = pq.read_table(flights_path(settings), columns=["date", "delay", "origin"]).slice(0, FLIGHTS)
    return pd.DataFrame({
        "origin": table.column("origin").to_pandas().astype(object),
        "event_time_ms": event_time_ms(table.column("date")),
        "delay_min": table.column("delay").to_numpy().astype(np.int64),
    })


def native_windows(spark, frame: pd.DataFrame, size: str, slide: str) -> pd.DataFrame:
    """Spark's own sliding-window aggregation: origin, window_start_ms, window_end_ms, count, sum, max."""
    from pyspark.sql import functions as F

    assert spark.conf.get("spark.sql.session.timeZone") == "UTC"
    events = spark.createDataFrame(frame).withColumn("ts", F.timestamp_millis("event_time_ms"))
    native = (
        events.groupBy(F.window("ts", size, slide), "origin")
        .agg(F.count(F.lit(1)).alias("count"), F.sum("delay_min").alias("sum"), F.max("delay_min").alias("max"))
        .select("origin", F.unix_millis("window.start").alias("window_start_ms"), F.unix_millis("window.end").alias("window_end_ms"),
                "count", "sum", "max")
    )
    rows = native.toPandas()
    return rows.astype({c: np.int64 for c in ("window_start_ms", "window_end_ms", "count", "sum", "max")}).sort_values(
        ["origin", "window_start_ms"], ignore_index=True)


def test_hand_made_events_incl_before_1970(spark):
    """Window edges at ms precision, ties and negative times: Spark aligns exactly as key windows do."""
    rng = np.random.default_rng(3)
    times = np.r_[rng.integers(-40, 40, 300), [-6, -4, -2, 0, 2, 4, 6, 6, 6]]
    frame = pd.DataFrame({"origin": rng.choice(np.array(["A", "B", "C"], dtype=object), len(times)),
                          "event_time_ms": times.astype(np.int64), "delay_min": rng.integers(-9, 9, len(times))})
    window = SlidingWindow(6, 2)
    native = native_windows(spark, frame, "6 milliseconds", "2 milliseconds")
    mine = expand_updates(key_window_updates_by_key(frame, window), window)
    pd.testing.assert_frame_equal(mine, native, check_dtype=False)


def test_key_windows_equal_spark_on_real_flights(spark, flights):
    updates = key_window_updates_by_key(flights, HOUR)
    native = native_windows(spark, flights, "1 hour", "1 minute")

    # every native window: the expansion is exactly Spark's rows
    expanded = expand_updates(updates, HOUR)
    assert len(expanded) == len(native)
    pd.testing.assert_frame_equal(expanded, native, check_dtype=False)

    # every emitted update point: Spark's row of the window starting there, or none when empty
    at = updates.merge(native, how="left", left_on=["origin", "start_ms"], right_on=["origin", "window_start_ms"],
                       suffixes=("", "_native"), indicator=True)
    empty = at["count"] == 0
    assert (at.loc[empty, "_merge"] == "left_only").all()
    full = at[~empty]
    assert (full["_merge"] == "both").all()
    for column in ("count", "sum", "max"):
        assert (full[column].astype(np.int64).to_numpy() == full[f"{column}_native"].astype(np.int64).to_numpy()).all(), column

    # what paper 003 promises: at most 2n updates, and far fewer than Spark's rows
    n = len(flights)
    assert len(updates) <= 2 * n < len(native) <= HOUR.native_window_bound(n)


def test_incremental_equals_batch_on_real_flights(flights):
    """The flights in event-time order, micro-batches of 25,000, watermark = max event time - 10 min."""
    bound_ms = 600_000
    states, emitted = {}, []
    for start in range(0, len(flights), 25_000):
        batch = flights.iloc[start:start + 25_000]
        watermark = int(flights["event_time_ms"].iloc[: start + len(batch)].max()) - bound_ms
        states, updates = advance_keys(states, batch["origin"].to_numpy(), batch["event_time_ms"], batch["delay_min"], watermark, HOUR)
        emitted.append(updates)
    states, updates = advance_keys(states, [], [], [], FLUSH_MS, HOUR)
    emitted.append(updates)
    assert all(state is None for state in states.values())
    incremental = (pd.concat(emitted, ignore_index=True).rename(columns={"key": "origin"})
                   .sort_values(["origin", "start_ms"], kind="stable", ignore_index=True))
    pd.testing.assert_frame_equal(incremental, key_window_updates_by_key(flights, HOUR))
