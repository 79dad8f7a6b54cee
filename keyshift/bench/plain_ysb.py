"""The baseline of a YSB bench: plain Spark Structured Streaming running the Yahoo Streaming Benchmark.

The published Spark job (yahoo/streaming-benchmarks, `spark/src/main/scala/AdvertisingSpark.scala`)
parses each ad event's JSON, keeps `event_type == "view"`, projects `ad_id` and `event_time`,
joins each ad to its campaign through Redis, counts the views per campaign per 10-second window
and writes each window's `seen_count` and `time_updated` to Redis. Written the way a data engineer
writes that today in Structured Streaming, and nothing more:

    Kafka source (`startingOffsets` earliest, `maxOffsetsPerTrigger`)
    -> `from_json(value, <record schema>)` -> where event_type = 'view' -> select ad_id, event_time
    -> inner join with a static DataFrame of the ad -> campaign map, read once from Redis
       (HGETALL of `keyshift.names.redis_ysb_ad_campaign_key(topic)`), broadcast
    -> `timestamp_millis(event_time)` -> `withWatermark(ts, BOUND)`
    -> `groupBy(window(ts, "10 seconds"), campaign_id).count()`, append mode
    -> `foreachBatch`: the batch's final windows to Parquet and to Redis (one HSET of
       `seen_count` and `time_updated` per window, one pipeline per batch), `availableNow`

Set up as `keyshift.bench.plain_job` (the flights baseline) is: `spark.sql.shuffle.partitions`
= P, the RocksDB state store, UTC session time, the same driver memory and connector jars, plus
the UI settings `keyshift.monitoring.shuffle` needs to read the shuffle bytes. It has no
dead-letter output (a record that does not parse, or a view of an ad the map lacks, disappears),
no late output (Spark drops late views silently; `dropped_by_watermark` reports Spark's count), no
accounting and no placement.

Departures from the published job, each what Structured Streaming makes the natural choice: the
join table is read once when the query is built (the published job asks Redis per partition with
a cache), windows are event-time windows with a watermark (the published job divides the event
time into 10-second buckets and adds to Redis what each micro-batch saw), so each window is
written once, final, with `seen_count` set rather than incremented; and the foreachBatch collects
the batch's windows (a few hundred rows) to the driver once and writes both sinks from there,
instead of writing from each partition, so the stateful aggregation runs once per batch.

Bounded runs and the last windows: no end-of-input marker is written (the plain job reads the
topic as it is). A window closes when the watermark (the latest view's event time seen − bound:
the watermark sees only the rows that reach it, views of known ads) reaches its end, so at the
end of a run the windows ending after the final watermark (`final_watermark_ms`: the watermark of
the last batch, the no-data batch Spark runs after the input to move it) stay open and are never
written: about bound + 10 s of event time at the end. Results are compared on the windows the
watermark closed (`compare_to_expected`).

Run as a process of its own (`python -m keyshift.bench.plain_ysb --topic T --partitions P --out
DIR [--expected runs/ysb-<id>/expected_views.parquet]`); it prints one JSON line:
`{"events", "batches", "query_seconds", "first_batch_seconds", "steady_events_per_second",
"progress", "shuffle_write_bytes", "windows", "views", "redis_windows", "final_watermark_ms",
"dropped_by_watermark", "bound", "label", "windows_path", "query_run_id", "driver_peak_rss_bytes",
"python_peak_rss_bytes", "cpu_seconds", "events_per_cpu_second"}` plus `"check"` (`compare_to_expected`) with `--expected`.
"""

from __future__ import annotations

import json
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import click
import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from keyshift.data.ysb import WINDOW_MS
from keyshift.errors import DataError, StackError
from keyshift.names import REDIS_PREFIX, redis_ysb_ad_campaign_key

RECORD_SCHEMA = T.StructType(
    [
        T.StructField("event_id", T.LongType()),
        T.StructField("user_id", T.StringType()),
        T.StructField("page_id", T.StringType()),
        T.StructField("ad_id", T.StringType()),
        T.StructField("ad_type", T.StringType()),
        T.StructField("event_type", T.StringType()),
        T.StructField("event_time", T.LongType()),
        T.StructField("ip_address", T.StringType()),
    ]
)
"""The generator's ad event (`keyshift.data.ysb.RECORD_FIELDS`) as a user declares it for
`from_json`; `event_time` in epoch ms UTC."""

AD_CAMPAIGN_SCHEMA = T.StructType([T.StructField("ad_id", T.StringType(), False), T.StructField("campaign_id", T.StringType(), False)])
"""The join table: one row per ad."""

WINDOW = "10 seconds"
"""The YSB window (`keyshift.data.ysb.WINDOW_MS`), tumbling, epoch-aligned."""

BOUND = "1 minute"
"""The watermark delay: one that loses no view on a backfill of a generated topic.

Why it is enough. Each partition of a topic one generator run wrote is in event-time order, and
every partition's events are spread evenly over the run's event time (event n has time start +
n × 1000 / rate; its partition follows its campaign, which does not depend on n). Spark's Kafka
source splits `maxOffsetsPerTrigger` over the partitions in proportion to what each still holds,
so each batch moves every partition through the same share of its records: the partitions'
event-time frontiers stay together up to sampling noise, about D / √m for D seconds of event time
and m events in the smallest partition. Spark drops a view only when its window's end is at or
before the previous batch's watermark (max event time seen − bound), so the bound must cover that
spread. Simulated with the generator's own events and Spark's split rule
(`KafkaMicroBatchStream.rateLimit`), the bound a run needs: 1.3 s for the YSB job's integration
test (20,000 events at 100/s, seed 7, P = 4, 8,000 per trigger), 1.4 s for this module's (the same
with `--zipf 1.0`, 5,000 per trigger), 6.1 s at P = 8 with Zipf 1.0 and 1,000 per trigger, 0.1 to 0.2 s at 20,000 events/s over 60 s (P = 8), and at most 43 s over a
grid of 100 to 1,000 events/s, 50 to 600 s of event time, P = 4, 8, 16, uniform and Zipf 1.0
ads, 1,000 and 5,000 per trigger, seeds 0 and 7 (P ≤ 8: at most 11.6 s). One minute covers them
all. It is not a law: the need grows as D / √m, so a long, slow run (10 events/s over 2,000 s at
P = 8 with Zipf 1.0 needs about 90 s) or a topic several generator runs wrote (each partition no
longer in order) needs more; `dropped_by_watermark` > 0 in a run's figures says it happened.
The price: the last bound + one window of event time stays open at the end of a bounded run."""

LABEL_PREFIX = f"{REDIS_PREFIX}:plain-ysb"
"""Redis namespace of the plain job's windows: `<LABEL_PREFIX>:<label>:window:<campaign>:<start ms>`,
apart from keyshift's own keys (`keyshift.names`)."""


def redis_label_prefix(label: str) -> str:
    """The Redis key prefix of one run's windows, `keyshift:plain-ysb:<label>:`."""
    return f"{LABEL_PREFIX}:{label}:"


def redis_window_key(label: str, campaign_id: str, window_start_ms: int) -> str:
    """The Redis hash of one window of a run: `keyshift:plain-ysb:<label>:window:<campaign>:<start ms>`,
    fields `seen_count` (views) and `time_updated` (wall ms of the write), as the published job
    keeps per window."""
    return f"{redis_label_prefix(label)}window:{campaign_id}:{int(window_start_ms)}"


def _redis(redis_url: str):
    import redis

    client = redis.Redis.from_url(redis_url, decode_responses=True, socket_timeout=10.0, socket_connect_timeout=5.0)
    try:
        client.ping()
    except redis.RedisError as exc:
        raise StackError(f"Redis is not reachable ({type(exc).__name__}: {exc}); run `keyshift stack up`") from exc
    return client


def read_ad_campaign(spark: SparkSession, redis_url: str, topic: str) -> DataFrame:
    """The join table, read once: a static DataFrame of the ad -> campaign map the generator wrote
    for `topic` (HGETALL of `keyshift.names.redis_ysb_ad_campaign_key(topic)`).

    Args:
        spark: the session. redis_url: Redis (`Settings.redis_url`). topic: the input topic.

    Built from a pandas frame so that, with `spark.sql.execution.arrow.pyspark.enabled` (keyshift's
    sessions and `main` set it), it is a `LocalTableScan` held by the JVM, as Scala's
    `Seq(...).toDF` would be. A Python list would make it a scan of a Python RDD instead: a stream-static join
    plans its static side anew in every micro-batch, so each batch would re-run the broadcast
    through Python workers (measured: a small extra job per batch and Python workers the plain job
    otherwise never starts).

    Returns:
        A DataFrame `ad_id, campaign_id` (strings), one row per ad (1,000 by default).

    Raises:
        StackError: Redis unreachable or failing.
        DataError: no map for `topic` (no generator wrote it: `keyshift replay ysb --topic T`).
    """
    import redis

    client = _redis(redis_url)
    key = redis_ysb_ad_campaign_key(topic)
    try:
        mapping = client.hgetall(key)
    except redis.RedisError as exc:
        raise StackError(f"Redis failed reading {key}: {exc}") from exc
    finally:
        client.close()
    if not mapping:
        raise DataError(f"Redis holds no ad -> campaign map {key}: generate the topic first (`keyshift replay ysb --topic {topic}`)")
    table = pd.DataFrame(sorted(mapping.items()), columns=["ad_id", "campaign_id"])
    return spark.createDataFrame(table, AD_CAMPAIGN_SCHEMA)


def plain_ysb_windows(kafka_rows: DataFrame, ad_campaign: DataFrame, bound: str = BOUND, window: str = WINDOW) -> DataFrame:
    """The plain YSB query, from Kafka rows (`value` binary) to final window rows; no I/O.

    Args:
        kafka_rows: Kafka source rows (streaming).
        ad_campaign: the static join table `ad_id, campaign_id` (`read_ad_campaign`), broadcast.
        bound: the watermark delay (a Spark interval string; `BOUND`). window: the window size.

    Returns:
        A streaming DataFrame in append mode: campaign_id (string), window_start, window_end
        (timestamps, UTC), count (long: views of the campaign's ads in [start, end)). Records that
        do not parse, events other than views and views of ads not in the table are dropped.
    """
    events = kafka_rows.select(F.from_json(F.col("value").cast("string"), RECORD_SCHEMA).alias("e")).select("e.*")
    views = events.where(F.col("event_type") == "view").select("ad_id", "event_time")
    joined = views.join(F.broadcast(ad_campaign), "ad_id")
    timed = joined.withColumn("ts", F.timestamp_millis("event_time")).withWatermark("ts", bound)
    return (
        timed.groupBy(F.window("ts", window), F.col("campaign_id")).count()
        .select("campaign_id", F.col("window.start").alias("window_start"), F.col("window.end").alias("window_end"), "count")
    )


def write_redis_windows(client, label: str, windows: pd.DataFrame, now_ms: int | None = None) -> int:
    """Write windows to Redis as the published job does, one pipeline for all of them.

    Args:
        client: a `redis.Redis` client.
        label: the run's label (`redis_window_key`).
        windows: columns campaign_id, window_start_ms (int, epoch ms), count (views).
        now_ms: each window's `time_updated` (wall ms); default now.

    Returns:
        The windows written (one HSET of `seen_count` and `time_updated` each).

    Raises:
        StackError: Redis failed.
    """
    import redis

    if windows.empty:
        return 0
    now_ms = int(time.time() * 1000) if now_ms is None else int(now_ms)
    pipe = client.pipeline(transaction=False)
    for campaign, start, count in zip(windows["campaign_id"].astype(str), windows["window_start_ms"].astype("int64"),
                                      windows["count"].astype("int64")):
        pipe.hset(redis_window_key(label, campaign, int(start)), mapping={"seen_count": int(count), "time_updated": now_ms})
    try:
        pipe.execute()
    except redis.RedisError as exc:
        raise StackError(f"Redis failed writing {len(windows)} plain-ysb windows of {label}: {exc}") from exc
    return len(windows)


def read_redis_windows(client, label: str) -> pd.DataFrame:
    """Every window a run wrote to Redis (`redis_window_key`).

    Returns:
        A frame campaign_id (str), window_start_ms (int64, epoch ms), seen_count (int64),
        time_updated (int64, wall ms), sorted by campaign and start; empty when none.
    """
    prefix = f"{redis_label_prefix(label)}window:"
    keys = sorted(client.scan_iter(f"{prefix}*", count=1000))
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.hmget(key, "seen_count", "time_updated")
    rows = []
    for key, (seen, updated) in zip(keys, pipe.execute() if keys else []):
        campaign, start = key[len(prefix):].rsplit(":", 1)
        rows.append((campaign, int(start), int(seen), int(updated)))
    frame = pd.DataFrame(rows, columns=["campaign_id", "window_start_ms", "seen_count", "time_updated"])
    frame = frame.astype({"window_start_ms": "int64", "seen_count": "int64", "time_updated": "int64"})
    return frame.sort_values(["campaign_id", "window_start_ms"]).reset_index(drop=True)


def delete_redis_windows(client, label: str) -> int:
    """Delete every key of a run's label (`redis_label_prefix`). Returns the keys deleted."""
    keys = list(client.scan_iter(f"{redis_label_prefix(label)}*", count=1000))
    return int(client.delete(*keys)) if keys else 0


def run_plain_ysb(
    spark: SparkSession,
    bootstrap_servers: str,
    topic: str,
    out_dir: Path,
    max_offsets_per_trigger: int,
    redis_url: str,
    *,
    label: str | None = None,
    bound: str = BOUND,
) -> dict[str, Any]:
    """Run the plain YSB job over everything in `topic` now (availableNow) and return its figures.

    Args:
        spark: the session (shuffle partitions already P; UI on for the shuffle bytes).
        bootstrap_servers: Kafka's `host:port`. topic: a topic a YSB generator wrote (its map in Redis).
        out_dir: windows/ (Parquet, one file per batch with windows) and checkpoint/ go here
            (must not hold an earlier run).
        max_offsets_per_trigger: records per micro-batch at most.
        redis_url: Redis, for the join table and the windows (`Settings.redis_url`).
        label: the Redis namespace of this run's windows (`redis_label_prefix`); default
            `out_dir.name`. Keys left there by an earlier run of the same label are deleted first.
        bound: the watermark delay (`BOUND`).

    Returns:
        events (records read, every event type), batches, query_seconds (start to termination),
        first_batch_seconds (batch 0's duration), steady_events_per_second (records / duration
        of the batches after the first that read records), progress (per batch: batch_id,
        input_rows, batch_duration_ms) as `plain_job.run_plain_job`; plus shuffle_write_bytes
        (bytes this query's stages wrote to shuffle files, `keyshift.monitoring.shuffle`),
        windows (window rows written), views (Σ their counts), redis_windows (windows written to
        Redis), final_watermark_ms (the last batch's watermark, epoch ms; windows ending after it
        stay open; None if no batch set one), dropped_by_watermark (Σ of Spark's
        `numRowsDroppedByWatermark`: rows, after the partial aggregation, not events, that came
        later than the watermark; 0 when no view was lost), bound, label, windows_path,
        query_run_id (`StreamingQuery.runId`: its stages' descriptions carry it).

    Raises:
        StackError: Redis unreachable or failing. DataError: no ad -> campaign map for `topic`.
        JobError: the shuffle bytes could not be read (`keyshift.monitoring.shuffle`).
        pyspark's StreamingQueryException: the query failed.
    """
    from keyshift.monitoring.shuffle import shuffle_write_bytes

    label = label or out_dir.name
    windows_dir = out_dir / "windows"
    windows_dir.mkdir(parents=True, exist_ok=True)
    client = _redis(redis_url)
    delete_redis_windows(client, label)
    ad_campaign = read_ad_campaign(spark, redis_url, topic)
    written: dict[int, tuple[int, int, int]] = {}  # batch id -> (windows, views, redis windows): a replayed batch counts once

    def write(batch: DataFrame, batch_id: int) -> None:
        frame = batch.select("campaign_id", "window_start", "window_end", "count",
                             F.unix_millis("window_start").alias("window_start_ms")).toPandas()
        if not frame.empty:
            frame.to_parquet(windows_dir / f"part-{batch_id:08d}.parquet", index=False)
        written[batch_id] = (len(frame), int(frame["count"].sum()) if len(frame) else 0, write_redis_windows(client, label, frame))

    source = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap_servers)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", max_offsets_per_trigger)
        .load()
    )
    started = time.monotonic()
    try:
        query = (
            plain_ysb_windows(source, ad_campaign, bound).writeStream.outputMode("append").foreachBatch(write)
            .option("checkpointLocation", str(out_dir / "checkpoint")).trigger(availableNow=True).start()
        )
        query.awaitTermination()
        query_seconds = time.monotonic() - started
        shuffle_bytes = shuffle_write_bytes(spark, query_run_id=str(query.runId))
    finally:
        client.close()
    progress = [json.loads(p.json) for p in query.recentProgress]
    batches = [{"batch_id": p["batchId"], "input_rows": int(p.get("numInputRows") or 0),
                "batch_duration_ms": int(p.get("batchDuration") or p["durationMs"].get("triggerExecution", 0))} for p in progress]
    reading = [b for b in batches if b["input_rows"] > 0]
    steady = reading[1:]
    steady_ms = sum(b["batch_duration_ms"] for b in steady)
    watermarks = [p.get("eventTime", {}).get("watermark") for p in progress]
    final_watermark = next((w for w in reversed(watermarks) if w), None)
    return {
        "events": sum(b["input_rows"] for b in batches),
        "batches": len(batches),
        "query_seconds": round(query_seconds, 3),
        "first_batch_seconds": round(reading[0]["batch_duration_ms"] / 1000, 3) if reading else None,
        "steady_events_per_second": round(sum(b["input_rows"] for b in steady) / steady_ms * 1000, 1) if steady_ms else None,
        "progress": batches,
        "shuffle_write_bytes": shuffle_bytes,
        "windows": sum(w for w, _, _ in written.values()),
        "views": sum(v for _, v, _ in written.values()),
        "redis_windows": sum(r for _, _, r in written.values()),
        "final_watermark_ms": _iso_to_ms(final_watermark) if final_watermark else None,
        "dropped_by_watermark": sum(int(op.get("numRowsDroppedByWatermark") or 0) for p in progress for op in p.get("stateOperators", [])),
        "bound": bound,
        "label": label,
        "windows_path": str(windows_dir),
        "query_run_id": str(query.runId),
    }


def _iso_to_ms(text: str) -> int:
    """Epoch ms of an ISO-8601 UTC time as Spark reports it (`2023-11-14T22:13:20.000Z`)."""
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


def _start_ms(windows: pd.DataFrame) -> pd.Series:
    """Window starts in epoch ms (int64) from `window_start_ms`, or from a `window_start`
    timestamp column (naive = UTC, as Spark writes it with a UTC session)."""
    if "window_start_ms" in windows.columns:
        return windows["window_start_ms"].astype("int64")
    starts = pd.to_datetime(windows["window_start"])
    if starts.dt.tz is not None:
        starts = starts.dt.tz_convert("UTC").dt.tz_localize(None)
    return ((starts - pd.Timestamp(0)) // pd.Timedelta(milliseconds=1)).astype("int64")


def compare_to_expected(windows: pd.DataFrame, expected_views_path: Path | str, *, watermark_ms: int | None = None) -> dict[str, Any]:
    """Check a run's windows against the generator's record, on the windows the run closed.

    Args:
        windows: the run's windows: campaign_id and the window's start, as `window_start_ms`
            (int, epoch ms) or `window_start` (timestamp, naive = UTC), and the views in `count`
            (or `seen_count`, as `read_redis_windows` returns them); e.g. the Parquet files of
            `windows_path`.
        expected_views_path: the generator's `runs/ysb-<run_id>/expected_views.parquet`
            (campaign_id, window_start_ms, views: one row per campaign and 10-second window with
            at least one view).
        watermark_ms: the run's final watermark (epoch ms, `final_watermark_ms`): the windows it
            closed are those whose end (start + 10 s) is at or before it. None: taken as the
            latest window end in `windows` (then a run that lost its last closed windows cannot
            be told from one whose watermark stopped earlier; pass it when known).

    Returns:
        {"windows": rows of `windows` (closed ones), "expected_windows": expected rows the
        watermark closed, "mismatched": windows in both with another count, "missing": expected
        closed windows the run lacks, "unexpected": run windows the record lacks or that are
        not closed, "duplicated": (campaign, start) pairs the run has more than once,
        "watermark_ms": the watermark used, "identical": all four counts 0 and both sides the
        same size}.

    Raises:
        DataError: the expected file is missing or lacks its columns; `windows` lacks its columns.
    """
    path = Path(expected_views_path)
    try:
        expected = pd.read_parquet(path, columns=["campaign_id", "window_start_ms", "views"])
    except (OSError, KeyError, ValueError) as exc:
        raise DataError(f"cannot read the generator's record {path}: {exc}") from exc
    count_column = "count" if "count" in windows.columns else "seen_count"
    if "campaign_id" not in windows.columns or count_column not in windows.columns or not (
        {"window_start_ms", "window_start"} & set(windows.columns)
    ):
        raise DataError(f"windows need campaign_id, window_start_ms or window_start, and count; got {list(windows.columns)}")
    ours = pd.DataFrame({"campaign_id": windows["campaign_id"].astype(str), "window_start_ms": _start_ms(windows),
                         "count": windows[count_column].astype("int64")})
    if watermark_ms is None:
        watermark_ms = int(ours["window_start_ms"].max()) + WINDOW_MS if len(ours) else 0
    expected = expected.assign(campaign_id=expected["campaign_id"].astype(str), window_start_ms=expected["window_start_ms"].astype("int64"))
    expected = expected[expected["window_start_ms"] + WINDOW_MS <= watermark_ms]
    duplicated = int(ours.duplicated(["campaign_id", "window_start_ms"]).sum())
    both = ours.merge(expected, on=["campaign_id", "window_start_ms"], how="outer", indicator=True)
    in_both = both[both["_merge"] == "both"]
    mismatched = int((in_both["count"] != in_both["views"]).sum())
    missing = int((both["_merge"] == "right_only").sum())
    unexpected = int((both["_merge"] == "left_only").sum())
    return {
        "windows": len(ours),
        "expected_windows": len(expected),
        "mismatched": mismatched,
        "missing": missing,
        "unexpected": unexpected,
        "duplicated": duplicated,
        "watermark_ms": int(watermark_ms),
        "identical": mismatched == missing == unexpected == duplicated == 0 and len(ours) == len(expected),
    }


@click.command()
@click.option("--topic", required=True, help="Input topic a YSB generator wrote (read from the earliest offset to its end now).")
@click.option("--partitions", type=click.IntRange(min=1), required=True, help="spark.sql.shuffle.partitions = P.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True, help="Folder for windows/ and checkpoint/ (new).")
@click.option("--max-offsets-per-trigger", type=click.IntRange(min=1), default=250_000, show_default=True)
@click.option("--bound", default=BOUND, show_default=True, help="Watermark delay (a Spark interval).")
@click.option("--label", default=None,
              help="Redis namespace keyshift:plain-ysb:<label>: of the windows [default: the --out folder's name].")
@click.option("--expected", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
              help="The generator's expected_views.parquet: add the check of the closed windows as \"check\".")
def main(
    topic: str, partitions: int, out: Path, max_offsets_per_trigger: int, bound: str, label: str | None, expected: Path | None
) -> None:
    """Run the plain YSB job once and print its figures as one JSON line."""
    from keyshift.bench.plain_job import baseline_session, run_measured
    from keyshift.monitoring.shuffle import RETAINED_STAGES_CONF
    from keyshift.settings import Settings

    settings = Settings()
    # Arrow on: the join table built from pandas is a JVM-local relation (`read_ad_campaign`)
    spark = baseline_session(f"plain-ysb-{out.name}", partitions, settings,
                             {"spark.sql.execution.arrow.pyspark.enabled": "true", **RETAINED_STAGES_CONF})
    result = run_measured(spark, lambda: run_plain_ysb(spark, settings.bootstrap_servers, topic, out, max_offsets_per_trigger,
                                                       settings.redis_url, label=label, bound=bound))
    if expected is not None:
        parts = sorted(Path(result["windows_path"]).glob("*.parquet"))
        windows = pd.concat([pd.read_parquet(p) for p in parts]) if parts else pd.DataFrame(columns=["campaign_id", "window_start_ms", "count"])
        result["check"] = compare_to_expected(windows, expected, watermark_ms=result["final_watermark_ms"])
    spark.stop()
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
