"""The same hourly windows by Spark's built-in streaming aggregation: the yardstick.

`groupBy(window(event_ts, "1 hour"), origin).agg(count, sum, max)` with the same watermark bound
over the same topic and offsets as a flight delay run, in append mode. The demo runs it after the
job to compare speed (events/s) and to check that both produce the same windows. Spark's built-in
aggregation drops late events silently (they are not counted here); the comparison is meaningful
when the keyshift run had no late events.
"""

from __future__ import annotations

import json
import logging
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from keyshift.errors import JobError
from keyshift.eventtime.windows import HOUR_MS
from keyshift.processing.flight_delays import run_records
from keyshift.jobs.flight_delays import FLIGHT_DELAYS, WINDOW_COLUMNS
from keyshift.processing.records import parse_records

log = logging.getLogger(__name__)


def builtin_window_stream(
    kafka_rows: DataFrame, marker_run_id: str, bound_ms: int, end_offsets: dict[int, int] | None = None, window_ms: int = HOUR_MS
) -> DataFrame:
    """Hourly windows per origin by Spark's built-in aggregation (append mode).

    Args:
        kafka_rows: Kafka source rows of the flights topic.
        marker_run_id: the run whose end-of-input markers close the last windows.
        bound_ms: watermark bound in ms of event time. window_ms: window size in ms.
        end_offsets: read only records before these offsets (the compared run's input).

    Returns:
        A streaming DataFrame with origin, window_start, window_end (timestamps), count,
        sum_delay_min, max_delay_min; dead letters are excluded.
    """
    parsed = run_records(parse_records(kafka_rows, FLIGHT_DELAYS), marker_run_id, end_offsets)
    kept = parsed.where(F.col("dead_letter_reason").isNull() | F.col("is_control")).withColumn(
        "event_ts", F.timestamp_millis("event_time_ms")
    )
    events = kept.withWatermark("event_ts", f"{bound_ms} milliseconds").where(
        ~(F.col("is_control") & F.col("event_ts").isNotNull())
    )
    return (
        events.groupBy(F.window("event_ts", f"{window_ms} milliseconds"), F.col("origin"))
        .agg(
            F.count(F.lit(1)).alias("count"),
            F.sum("delay_min").alias("sum_delay_min"),
            F.max("delay_min").alias("max_delay_min"),
        )
        .select(
            "origin",
            F.col("window.start").alias("window_start"),
            F.col("window.end").alias("window_end"),
            "count",
            "sum_delay_min",
            "max_delay_min",
        )
    )


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
        .option("checkpointLocation", str(out_dir.parent / "builtin_checkpoint"))
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
