"""The same hourly windows by the plain Spark job a user would write: the yardstick of the demo.

The demo runs, after its keyshift run, the baseline of `keyshift bench throughput`
(`plain_windows`, the query of `keyshift.bench.plain_job`: `from_json` with the record schema, rows without
origin or time dropped, `withWatermark`, `groupBy(window(ts, "1 hour"), origin).agg(count, sum,
max)`, append mode) over the same topic and offsets, to compare speed (events/s) and to check
that both produce the same windows. For a bounded comparison two things are added to it: records
past the compared run's end offsets are ignored, and the run's end-of-input markers move the
watermark (without being aggregated) so that the last windows close. The plain job drops late
events and malformed records silently (neither is counted here); the comparison is meaningful
when the keyshift run had neither.
"""

from __future__ import annotations

import json
import logging
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from keyshift.errors import JobError
from keyshift.eventtime.windows import HOUR_MS
from keyshift.jobs.flight_delays import WINDOW_COLUMNS
from keyshift.names import END_OF_INPUT_PREFIX
from keyshift.names import RunDir

log = logging.getLogger(__name__)

RECORD_SCHEMA = T.StructType(
    [
        T.StructField("event_id", T.LongType()),
        T.StructField("origin", T.StringType()),
        T.StructField("destination", T.StringType()),
        T.StructField("delay_min", T.LongType()),
        T.StructField("distance_mi", T.LongType()),
        T.StructField("event_time", T.LongType()),
    ]
)
"""The flight record as a user would declare it for `from_json` (event time in epoch ms UTC)."""

BOUND = "48 hours"
"""The watermark delay a plain job needs to lose no flight in a backfill at P = 8 (DESIGN.md: the
partitions drift apart by up to 37 h); Spark drops later rows silently."""


def plain_windows(kafka_rows: DataFrame, bound: str = BOUND, window: str = "1 hour", closing: Column | None = None) -> DataFrame:
    """The plain job's query, from Kafka rows (`value` binary) to window rows.

    Args:
        kafka_rows: Kafka source rows.
        bound: the watermark delay. window: the window size.
        closing: None for the plain job as a user writes it. For a bounded comparison (the
            demo's, `keyshift.processing.builtin`): a condition on the Kafka rows that marks
            rows whose event time should move the watermark without being aggregated (a run's
            end-of-input markers, which have no origin), so that the last windows close.

    Returns:
        A streaming DataFrame: origin, window_start, window_end (timestamps), count,
        sum_delay_min, max_delay_min (longs); append mode.
    """
    parsed = kafka_rows.select(F.from_json(F.col("value").cast("string"), RECORD_SCHEMA).alias("f"),
                               (closing if closing is not None else F.lit(False)).alias("_closing")).select("f.*", "_closing")
    flights = (
        parsed.where((F.col("origin").isNotNull() | F.col("_closing")) & F.col("event_time").isNotNull())
        .withColumn("ts", F.timestamp_millis("event_time"))
    )
    if closing is None:
        flights = flights.drop("_closing")
    timed = flights.withWatermark("ts", bound)
    if closing is not None:
        # after the watermark operator, which Spark keeps below a filter on its event-time column
        timed = timed.where(~(F.col("_closing") & F.col("ts").isNotNull()))
    return (
        timed.groupBy(F.window("ts", window), F.col("origin"))
        .agg(F.count(F.lit(1)).alias("count"), F.sum("delay_min").alias("sum_delay_min"), F.max("delay_min").alias("max_delay_min"))
        .select("origin", F.col("window.start").alias("window_start"), F.col("window.end").alias("window_end"),
                "count", "sum_delay_min", "max_delay_min")
    )


def builtin_window_stream(
    kafka_rows: DataFrame, marker_run_id: str, bound_ms: int, end_offsets: dict[int, int] | None = None, window_ms: int = HOUR_MS
) -> DataFrame:
    """Hourly windows per origin by the plain job's query (module docstring), append mode.

    Args:
        kafka_rows: Kafka source rows of the flights topic.
        marker_run_id: the run whose end-of-input markers close the last windows.
        bound_ms: watermark bound in ms of event time. window_ms: window size in ms.
        end_offsets: read only records before these offsets (the compared run's input).

    Returns:
        A streaming DataFrame with origin, window_start, window_end (timestamps), count,
        sum_delay_min, max_delay_min; malformed records are dropped.
    """
    text = F.col("value").cast("string")
    marker = F.coalesce(text.startswith(END_OF_INPUT_PREFIX) & (F.get_json_object(text, "$.run_id") == F.lit(marker_run_id)),
                        F.lit(False))
    rows = kafka_rows
    if end_offsets:
        limit = F.create_map(*[F.lit(v) for p, o in sorted(end_offsets.items()) for v in (int(p), int(o))])
        in_range = F.col("offset") < F.coalesce(F.element_at(limit, F.col("partition")), F.lit(0).cast("long"))
        rows = rows.where(marker | (~F.coalesce(text.startswith(END_OF_INPUT_PREFIX), F.lit(False)) & in_range))
    return plain_windows(rows, f"{bound_ms} milliseconds", f"{window_ms} milliseconds", closing=marker)


def run_builtin_windows(
    kafka_rows: DataFrame,
    out_dir: Path,
    marker_run_id: str,
    bound_ms: int,
    marker_end_ms: int,
    end_offsets: dict[int, int] | None = None,
    idle_timeout_s: float = 300.0,
) -> dict[str, Any]:
    """Run the built-in aggregation until the end-of-input watermark has closed every window.

    Args:
        kafka_rows: the Kafka source (same topic and start offsets as the run it is compared with).
        out_dir: windows are written here as Parquet, one file per batch.
        marker_run_id: whose end-of-input markers end the input (they must already be in Kafka).
        bound_ms: watermark bound (ms). marker_end_ms: the markers' event time (ms).
        end_offsets: the compared run's end offsets (records past them are ignored).

    Returns:
        {"events": events aggregated, "windows": n, "wall_seconds": s, "events_per_second": r,
         "batches": n, "windows_path": str}.

    Raises:
        JobError: the query failed or stalled for `idle_timeout_s`.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    totals = {"events": 0, "windows": 0}

    def write(batch: DataFrame, batch_id: int) -> None:
        frame = batch.toPandas()
        if len(frame):
            frame.to_parquet(out_dir / f"part-{batch_id:08d}.parquet", index=False)
        totals["events"] += int(frame["count"].sum()) if len(frame) else 0
        totals["windows"] += len(frame)

    started = time.monotonic()
    query = (
        builtin_window_stream(kafka_rows, marker_run_id, bound_ms, end_offsets)
        .writeStream.outputMode("append")
        .foreachBatch(write)
        .option("checkpointLocation", str(out_dir.parent / RunDir.BUILTIN_CHECKPOINT))
        .start()
    )
    final_watermark_ms = marker_end_ms - bound_ms
    seen, batches, last_batch_at = set(), 0, started
    try:
        while True:
            if query.exception() is not None:
                raise JobError(f"built-in aggregation failed: {query.exception()}")
            done = False
            for progress in query.recentProgress:
                record = json.loads(progress.json)
                if record["batchId"] in seen:
                    continue
                seen.add(record["batchId"])
                batches += 1
                last_batch_at = time.monotonic()
                watermark = record.get("eventTime", {}).get("watermark")
                if watermark and _iso_to_ms(watermark) >= final_watermark_ms:
                    done = True  # the batch that ran at the final watermark has emitted every window
            if done:
                break
            if time.monotonic() - last_batch_at > idle_timeout_s:
                raise JobError(f"built-in aggregation made no progress for {idle_timeout_s:.0f} s")
            time.sleep(0.5)
    finally:
        query.stop()
    wall = last_batch_at - started
    return {
        "events": totals["events"],
        "windows": totals["windows"],
        "batches": batches,
        "wall_seconds": round(wall, 3),
        "events_per_second": round(totals["events"] / wall, 1) if wall > 0 else None,
        "windows_path": str(out_dir),
    }


def _iso_to_ms(text: str) -> int:
    """Epoch ms of an ISO-8601 UTC time as Spark reports it (years up to 9999)."""
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


def compare_windows(ours_dir: Path, builtin_dir: Path) -> dict[str, Any]:
    """Compare keyshift's windows table with the built-in's, field by field.

    Returns:
        {"equal": bool, "ours": n, "builtin": n, "only_ours": n, "only_builtin": n,
         "field_mismatches": n} over the key (origin, window_start).
    """
    ours = pd.read_parquet(ours_dir)[list(WINDOW_COLUMNS)]
    theirs = pd.read_parquet(builtin_dir)
    theirs["window_start"] = pd.to_datetime(theirs["window_start"], utc=True)
    merged = ours.merge(theirs, on=["origin", "window_start"], how="outer", suffixes=("", "_builtin"), indicator=True)
    both = merged[merged["_merge"] == "both"]
    mismatches = int(
        (
            (both["count"] != both["count_builtin"])
            | (both["sum_delay_min"] != both["sum_delay_min_builtin"])
            | (both["max_delay_min"] != both["max_delay_min_builtin"])
            | (both["window_end"] != pd.to_datetime(both["window_end_builtin"], utc=True))
        ).sum()
    )
    only_ours = int((merged["_merge"] == "left_only").sum())
    only_builtin = int((merged["_merge"] == "right_only").sum())
    return {
        "equal": mismatches == 0 and only_ours == 0 and only_builtin == 0,
        "ours": len(ours),
        "builtin": len(theirs),
        "only_ours": only_ours,
        "only_builtin": only_builtin,
        "field_mismatches": mismatches,
    }
