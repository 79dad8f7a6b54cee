"""The baseline of `keyshift bench throughput`: the plain Spark job a user would write instead.

Hourly windows per origin with Spark's built-in streaming aggregation, written the way a data
engineer writes it from the Structured Streaming guide, and nothing more:

    Kafka source (`startingOffsets` earliest, `maxOffsetsPerTrigger`)
    -> `from_json(value, <record schema>)` -> drop rows with a NULL origin or event time
    -> `withWatermark(ts, "48 hours")` -> `groupBy(window(ts, "1 hour"), origin)`
       .agg(count, sum(delay_min), max(delay_min))
    -> Parquet sink, append mode, `trigger(availableNow=True)`

Set up as well as a user would, and as DESIGN.md measured it: `spark.sql.shuffle.partitions` =
P (not the default 200), the RocksDB state store with changelog checkpointing (what Databricks'
guide recommends for every stateful query), a 4 GB driver (twice keyshift's default heap: the
baseline is not held to keyshift's memory) and the connector jars of keyshift's job. It has no
dead-letter output, no late output, no accounting, no placement and no migratable state: what
keyshift adds must not cost throughput against this (issue "Throughput").

Run as a process of its own (`python -m keyshift.bench.plain_job --topic T --partitions P
--out DIR`), so the bench times it like keyshift's job, JVM start included; it prints one JSON
line: `{"events", "batches", "query_seconds", "first_batch_seconds", "steady_events_per_second",
"driver_peak_rss_bytes", "python_peak_rss_bytes", "progress": [...]}`.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from collections.abc import Callable, Mapping
from typing import Any

import click
from pyspark.sql import SparkSession

from keyshift.processing.builtin import plain_windows

# the query itself (`plain_windows`) is in keyshift.processing.builtin: the demo runs it too

def run_plain_job(spark: SparkSession, bootstrap_servers: str, topic: str, out_dir: Path, max_offsets_per_trigger: int) -> dict[str, Any]:
    """Run the plain job over everything in `topic` now (availableNow) and return its figures.

    Args:
        spark: the session (shuffle partitions already P).
        bootstrap_servers: Kafka's `host:port`. topic: the input topic.
        out_dir: windows/ and checkpoint/ are written here (must not hold an earlier run).
        max_offsets_per_trigger: records per micro-batch at most.

    Returns:
        events (rows read), batches, query_seconds (start to termination), first_batch_seconds
        (batch 0's trigger execution), steady_events_per_second (rows / trigger execution time of
        the batches after the first that read rows), progress (per batch: batch_id, input_rows,
        batch_duration_ms).
    """
    source = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap_servers)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", max_offsets_per_trigger)
        .load()
    )
    started = time.monotonic()
    query = (
        plain_windows(source).writeStream.format("parquet").outputMode("append")
        .option("path", str(out_dir / "windows")).option("checkpointLocation", str(out_dir / "checkpoint"))
        .trigger(availableNow=True).start()
    )
    query.awaitTermination()
    query_seconds = time.monotonic() - started
    progress = [json.loads(p.json) for p in query.recentProgress]
    batches = [{"batch_id": p["batchId"], "input_rows": int(p.get("numInputRows") or 0),
                "batch_duration_ms": int(p.get("batchDuration") or p["durationMs"].get("triggerExecution", 0))} for p in progress]
    reading = [b for b in batches if b["input_rows"] > 0]
    steady = reading[1:]
    steady_ms = sum(b["batch_duration_ms"] for b in steady)
    return {
        "events": sum(b["input_rows"] for b in batches),
        "batches": len(batches),
        "query_seconds": round(query_seconds, 3),
        "first_batch_seconds": round(reading[0]["batch_duration_ms"] / 1000, 3) if reading else None,
        "steady_events_per_second": round(sum(b["input_rows"] for b in steady) / steady_ms * 1000, 1) if steady_ms else None,
        "progress": batches,
    }


@click.command()
@click.option("--topic", required=True, help="Input topic (read from the earliest offset to its end now).")
@click.option("--partitions", type=click.IntRange(min=1), required=True, help="spark.sql.shuffle.partitions = P.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True, help="Folder for windows/ and checkpoint/ (new).")
@click.option("--max-offsets-per-trigger", type=click.IntRange(min=1), default=250_000, show_default=True)
def main(topic: str, partitions: int, out: Path, max_offsets_per_trigger: int) -> None:
    """Run the plain job once and print its figures as one JSON line."""
    from keyshift.settings import Settings

    settings = Settings()
    spark = baseline_session(f"plain-job-{out.name}", partitions, settings)
    result = run_measured(spark, lambda: run_plain_job(spark, settings.bootstrap_servers, topic, out, max_offsets_per_trigger))
    spark.stop()
    sys.stdout.write(json.dumps(result) + "\n")


def baseline_conf(partitions: int, settings, extra_conf: Mapping[str, str] | None = None) -> dict[str, str]:
    """The Spark configuration a baseline job runs with, set up as a user would and as keyshift's
    job is: `spark.sql.shuffle.partitions` = P, the RocksDB state store with changelog
    checkpointing (`keyshift.runtime.session.STATE_STORE_CONF`, as recommended for stateful
    queries), UTC, 4 GB driver (keyshift's jobs run 2 GB, `keyshift.settings.DEFAULT_DRIVER_MEMORY`),
    the connector jars (paths from `settings`); `extra_conf` adds or overrides settings. Nothing of keyshift's own (no Arrow, no Python worker settings)."""
    from keyshift.runtime.session import STATE_STORE_CONF
    from keyshift.stack.spark import connector_jars

    return {
        "spark.sql.shuffle.partitions": str(partitions),
        **STATE_STORE_CONF,
        "spark.sql.session.timeZone": "UTC",
        "spark.driver.memory": "4g",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.streaming.numRecentProgressUpdates": "1000",
        "spark.jars": ",".join(str(j) for j in connector_jars(settings)),
        **(extra_conf or {}),
    }


def baseline_session(name: str, partitions: int, settings, extra_conf: Mapping[str, str] | None = None) -> SparkSession:
    """The session a baseline job runs in (`baseline_conf`), log level ERROR."""
    from keyshift.runtime.session import build_spark_session

    spark = build_spark_session(name, settings.spark_master, baseline_conf(partitions, settings, extra_conf))
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def run_measured(spark: SparkSession, run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """`run()`'s figures plus what the driver JVM and its Python workers used meanwhile:
    `driver_peak_rss_bytes`, `python_peak_rss_bytes` (bytes), `cpu_seconds` (user + system s by
    process group) and `events_per_cpu_second` (the figures' `events` over all CPU seconds)."""
    from keyshift.runtime.run_summary import driver_jvm_pid
    from keyshift.runtime.resources import ResourceSampler, events_per_cpu_second

    sampler = ResourceSampler(driver_jvm_pid(spark))
    sampler.start()
    try:
        result = run()
    finally:
        sampler.stop()
    result["driver_peak_rss_bytes"] = sampler.peak_rss_bytes
    result["python_peak_rss_bytes"] = sampler.peak_children_rss_bytes
    result["cpu_seconds"] = sampler.cpu_seconds().as_dict()
    result["events_per_cpu_second"] = events_per_cpu_second(result["events"], sampler.cpu_seconds())
    return result


if __name__ == "__main__":
    main()
