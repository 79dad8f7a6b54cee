"""Watermark benchmark: the job's watermark modes on real flights made out of order by whole sources.

`keyshift bench watermark --out FILE.json` runs the flight delay job (`keyshift.runtime.driver.
run_job`, in this process, one Spark job at a time) on the first N real flights, hash
placement over P slots, hourly windows per origin, for every disorder level x configuration:

* **disorder** FRACTION (default 0, 0.25, 0.5, 0.75; paper 000 Table 10): the replay makes whole
  origins late (`keyshift.data.disorder`, `keyshift replay flights --disorder FRACTION
  --source-delay 86400 --seed S`), so that FRACTION of the events arrive after an event with a
  later event time while **every origin keeps its own order** (no clock skew: the written event
  times are the true ones). Each row carries the out-of-order fraction the replay achieved.
  Late origins arrive 12 to 24 hours of event time late by default (`--source-delay`, seconds):
  the flights hold about 16,500 events a day, so a paced micro-batch of a few seconds spans hours
  to days of event time, and a delay of minutes (the replay's default, 600 s) is smaller than the
  span of one batch: it crosses a batch boundary so rarely that a query-wide watermark hardly ever
  sees it. A delay of a day stays below the per-key modes' idle lag (two days), so it cannot make
  a key's own events late through the fallback either.
* **configurations** (`--modes`): `global`, `key`, `nkey` (64 groups), `dynamic` (maximum bound
  M), all with the same bound B (`--bound-ms`, default one minute), and `global_lossless`: the
  job's `global` mode with the bound it needs to lose nothing (below).

Each configuration runs twice on each level (once without the backfill, `BenchSettings.backfill`):

1. **paced run** (every figure but the throughput): a fresh topic of P partitions; the job is
   started on it as a continuous run (`limit=None`, reading from the earliest offsets); one
   foreign end-of-input marker per partition makes it run its first micro-batch (Python workers,
   state stores) before any flight arrives; then `keyshift replay flights --rate RATE` (a
   subprocess, one producer, partitions fed in arrival order) produces the N flights at RATE
   events/s; when it has ended the bench writes the run's end-of-input markers (so every window
   closes), waits until every event read is accounted for (windows, late, dead letters), and
   stops the run at a batch boundary with SIGTERM, as a user stops a continuous run (the bench
   sends it to its own process; it must run in the main thread).
2. **backfill run** (events per second): a topic filled with the same N flights in the same
   arrival order before the job starts (as fast as the replay can, one topic per level), read by
   a bounded run in micro-batches of `per_trigger` records (default N/10, so that nine
   micro-batches after the first are measured).

Before the first configuration one bounded warm-up run (key mode, min(N, 20,000) flights, not
reported) takes the JVM's first-query costs out of the first measured run.

Definitions (every figure of a row is of its paced run unless said otherwise):

* **events**: events read by the job (`summary.json` `events_read`), = N.
* **late fraction** = late events / events; late events are those the job sent to the late topic
  (`flights-late`) and counted (`late_events`).
* **events per second** (backfill run): events of the micro-batches after the first one that
  read any, divided by those batches' durations (`progress.jsonl` `input_rows` /
  `batch_duration_ms`): what the job sustains once its Python workers and state stores are up.
  The first batch (about 20 s of one-off start-up here, whatever the mode) is left out;
  `events_per_second_whole_run` is the summary's figure (events read / seconds from the query's
  start to its last batch), start-up included. `backfill_late_events` are the backfill run's
  late events (a backfill is read partition by partition at different event-time speeds, so
  `global` loses more there than on the paced feed). Each level's backfill runs come in
  `backfill_repeats` rounds (default 3), each round running every configuration once in turn, so
  a slow spell of the machine falls on all configurations alike; a row reports the median of its
  configuration's runs, `backfill.repeats` lists them all and `backfill.events_per_second_range`
  their min and max. (Two runs of one configuration differed by up to 20 % on this 2-core
  machine, more than the modes differ, so one run or the fastest of two cannot rank them.) The
  goal "key >= global" is judged paired by round (`paired_ratio`: the median over rounds of
  key's events/s over global's in the same round), since the medians of the two modes come from
  different rounds; the unpaired comparison of the medians is reported beside it.
* **output latency** of a window (origin o, [start, end)):
  - W, when it was written: the modification time of the windows file of the micro-batch that
    emitted it (`runs/<run_id>/windows/part-<batch>.parquet`, written by the sink before the
    batch commits), wall clock;
  - F, when its end became final in event time: the Kafka CreateTime of the first record of
    origin o (its source), in production order, whose event time is >= end; the bench reads the
    paced topic back with kafka-python after the run (the replay's kafka-python producer stamps
    each record with the wall time of its `send`, the time the replay produced it);
  - latency = W - F, seconds. p50 and p95 are over the run's windows that have an F; a window
    whose origin never produced a record at or past its end (its origin's last windows, closed by
    the end-of-input markers) has none and is excluded, counted in `windows_without_final_time`.
    W - F < 0 means the window was emitted before its own source had passed its end (a query-wide
    watermark driven by other, faster sources): counted in `windows_emitted_before_final`, kept
    in p50/p95, taken as 0 in E.
  The paced replay compresses event time: the flights hold about 16,500 events a day, so at RATE
  = 5,000 events/s a day of event time passes in about 3.3 s of wall time (an hour in 0.14 s),
  and latencies are dominated by the micro-batch cadence and by bounds of hours or more.
* **state bytes**: the peak, over sampled micro-batches of the paced run, of the bytes of the
  job's state rows read back with Spark's state data source (`format("statestore")`, `batchId`
  = the sampled batch) for both declared state variables, `pending_windows` (origin -> the open
  windows' partials, the ids of their events and, in `key` and `dynamic` mode, the key's
  watermark clock) and `key_clocks` (`nkey` mode's group clocks; empty in other modes): per row, the grouping key (token, 4 bytes) + the map
  key + the map value, strings and binaries at their length in bytes, longs 8, ints 4 (the
  logical size, not RocksDB's on-disk or in-memory size; timers, one per open window end per
  slot, are not counted). Sampled batches: up to `state_samples` evenly spaced among the batches
  that read flights, plus the one with the most state rows. `state_rows_peak` and
  `state_memory_bytes_peak` are the peaks over every batch of the stateful operator's
  `numRowsTotal` and `memoryUsedBytes` as Spark reports them (progress records' `state_store`);
  RocksDB's memory figure grows with its block cache and does not follow the state's size.
* **performance ratio E** (paper 004 eq. 6, `keyshift.eventtime.disorder.performance_ratio`) =
  mean events per window / mean latency (s), over the windows with a latency (negative ones as
  0): events per second, higher is better.
* **windows_equal_reference**: the run's windows table equals pandas' windows of the same flights
  (`keyshift.quality.reference.reference_windows`) without the run's late events (their ids read
  from the late topic, from its end offsets before the run, filtered by run id).
* **global_lossless bound**: from the `global` paced run of the same level, the bound it needed,
  B + max over its late events of (the watermark the event missed - its window's end) + 1 ms,
  times `LOSSLESS_MARGIN` (the paced feed's micro-batches are cut elsewhere in every run), rounded
  up to a minute; B when `global` lost nothing; two days when `global` is not among the modes.
  If the paced `global_lossless` run still loses events, the bound is recomputed the same way from
  its own late events and the run repeated, up to `LOSSLESS_ATTEMPTS` runs; `lossless_attempts`
  lists them. The row's `bound_ms` is the last one.

Targets (`targets` in the JSON, printed by the CLI): key mode's late fraction is 0 at every
disorder level; `global` with the same bound loses events at every level > 0; key mode's events
per second >= global's at every level; dynamic mode's latency p95 <= `global_lossless`'s at every
level.

The plot (`out` with suffix `.png`): per mode against the disorder, the late fraction (paced; the
backfill's dashed), events per second, latency p50 (dashed) and p95, state bytes, E and the bound.
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from keyshift.errors import ConfigurationError, JobError
from keyshift.settings import Settings

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

FLIGHTS = 200_000
"""Default N: the first N flights each run reads."""

RATE = 5_000.0
"""Default rate of the paced replay, events/s."""

PARTITIONS = 8
"""Default P: partitions of every topic = slots = shuffle partitions."""

BOUND_MS = 60_000
"""Default watermark bound B, ms of event time (one minute; dynamic mode's maximum M)."""

DISORDERS = (0.0, 0.25, 0.5, 0.75)
"""Default disorder levels: fractions of the events out of order (paper 000 Table 10, and 0)."""

MODES = ("global", "key", "nkey", "dynamic", "global_lossless")
"""The configurations, in the order they run on each level (`global` before `global_lossless`,
which takes its bound from it)."""

SOURCE_DELAY_S = 86_400.0
"""Default source delay D, s of event time: a late origin arrives d in [D/2, D] late (12 to 24 h;
module docstring)."""

SEED = 0
"""Default seed of the disorder (which origins are late, and by how much)."""

PACED_PER_TRIGGER = 250_000
"""Records per micro-batch at most in a paced run (a cap the feed never reaches: batches are what
arrived while the previous one ran)."""

LOSSLESS_MARGIN = 2.0
"""Factor on the bound `global` needed in one paced run, for the next run's other batch cuts."""

LOSSLESS_ATTEMPTS = 3
"""Paced `global_lossless` runs at most per level (each one after a lossy one with a larger bound)."""

FALLBACK_LOSSLESS_BOUND_MS = 2 * 86_400_000
"""`global_lossless` bound when `global` is not run: two days (what a plain Spark job needs on a
backfill of the flights, DESIGN.md)."""

STATE_SAMPLES = 3
"""Micro-batches of a paced run whose state is read back (evenly spaced), besides the one with
the most state rows."""

BACKFILL_REPEATS = 3
"""Backfill rounds per level (every configuration once per round); a row reports its median."""

WARMUP_FLIGHTS = 20_000
"""Flights of the warm-up run (at most N)."""

MINUTE_MS = 60_000


@dataclass(frozen=True)
class BenchSettings:
    """What one bench run does (see the module docstring).

    Attributes:
        flights: N >= 1. rate: events/s > 0 of the paced replay. partitions: P >= 1.
        disorders: fractions in [0, 1). modes: a subset of `MODES`. bound_ms: B >= 0.
        seed: >= 0. source_delay_s: D > 0. per_trigger: records per backfill micro-batch.
        state_samples: >= 1. warmup: run the warm-up first. keep_topics: keep the bench's topics.
        backfill: also run each configuration on a backfill (events per second); without it the
            rows' throughput fields are None.
        backfill_repeats: backfill rounds per level (>= 1); a row reports the median of its runs.
    """

    flights: int = FLIGHTS
    rate: float = RATE
    partitions: int = PARTITIONS
    disorders: tuple[float, ...] = DISORDERS
    modes: tuple[str, ...] = MODES
    bound_ms: int = BOUND_MS
    seed: int = SEED
    source_delay_s: float = SOURCE_DELAY_S
    per_trigger: int | None = None
    state_samples: int = STATE_SAMPLES
    warmup: bool = True
    keep_topics: bool = False
    backfill: bool = True
    backfill_repeats: int = BACKFILL_REPEATS

    @property
    def backfill_per_trigger(self) -> int:
        """Records per micro-batch of a backfill run: `per_trigger`, or N/10 (at least 1)."""
        return self.per_trigger or max(1, self.flights // 10)

    def check(self) -> None:
        """Raise ConfigurationError for a value out of range, an unknown mode or a bad disorder."""
        from keyshift.data.disorder import validate_disorder

        if self.flights < 1 or not self.rate > 0 or self.partitions < 1 or self.bound_ms < 0 or self.state_samples < 1 \
                or self.backfill_repeats < 1:
            raise ConfigurationError(f"flights, rate, partitions and state_samples must be >= 1 (rate > 0) and bound_ms >= 0; got "
                                     f"{self.flights}, {self.rate}, {self.partitions}, {self.state_samples}, {self.bound_ms}")
        if self.per_trigger is not None and self.per_trigger < 1:
            raise ConfigurationError(f"per_trigger must be >= 1, got {self.per_trigger}")
        unknown = [m for m in self.modes if m not in MODES]
        if unknown or not self.modes:
            raise ConfigurationError(f"unknown mode(s) {', '.join(unknown) or '(none given)'}; use some of {', '.join(MODES)}")
        if not self.disorders:
            raise ConfigurationError("give at least one disorder level")
        for fraction in self.disorders:
            validate_disorder(fraction, self.source_delay_s, 0.0, self.seed)


def ordered_modes(modes: Sequence[str]) -> list[str]:
    """`modes` without repeats in `MODES` order (`global` before `global_lossless`)."""
    return [m for m in MODES if m in set(modes)]


def watermark_of(mode: str) -> str:
    """The job's watermark mode of a configuration (`global_lossless` is `global`)."""
    return "global" if mode == "global_lossless" else mode


def parse_modes(text: str) -> tuple[str, ...]:
    """Modes from `global,key,...`.

    Raises:
        ConfigurationError: an unknown or no mode.
    """
    modes = tuple(m.strip() for m in text.split(",") if m.strip())
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        raise ConfigurationError(f"unknown mode(s) {', '.join(unknown) or '(none given)'} in {text!r}; use some of {', '.join(MODES)}")
    return modes


# --- measuring a finished run ------------------------------------------------------------------


def read_progress(run_dir: Path) -> list[dict[str, Any]]:
    """The run's progress records, one per batch id (the last written wins), by batch id."""
    from keyshift.bench.switch import read_progress as read

    return read(run_dir)


def steady_throughput(progress: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Events per second of the batches after the first that read rows (module docstring).

    Returns:
        `events_per_second` (None without such a batch), `batches`, `events`, `busy_seconds`.
    """
    rows = [r for r in progress if int(r.get("input_rows") or 0) > 0 and r.get("batch_duration_ms") is not None][1:]
    events = sum(int(r["input_rows"]) for r in rows)
    busy_ms = sum(int(r["batch_duration_ms"]) for r in rows)
    return {"events_per_second": round(events / busy_ms * 1000, 1) if busy_ms > 0 else None, "batches": len(rows),
            "events": events, "busy_seconds": round(busy_ms / 1000, 3)}


def read_source_records(settings: Settings, topic: str, timeout_s: float = 300.0) -> pd.DataFrame:
    """Every flight record of `topic` with its produce time, read back with kafka-python.

    Returns:
        A frame with `origin` (str), `event_time_ms` (int64, the record's written event time),
        `create_ms` (int64, the record's Kafka CreateTime), `partition`, `offset`, sorted by
        (create_ms, partition, offset): production order. Records without a key (end-of-input
        markers) are left out.

    Raises:
        JobError: the topic does not use CreateTime, or was not read to its end in `timeout_s`.
    """
    import numpy as np
    import pandas as pd
    from kafka import KafkaConsumer, TopicPartition

    from keyshift.kafka_clients import client_options
    from keyshift.topics import end_offsets

    ends = end_offsets(settings, topic)
    consumer = KafkaConsumer(bootstrap_servers=settings.bootstrap_servers, enable_auto_commit=False, group_id=None,
                             max_partition_fetch_bytes=16 * 1024 * 1024, fetch_max_bytes=64 * 1024 * 1024,
                             max_poll_records=100_000, **client_options(settings))
    origins: list[str] = []
    times: list[int] = []
    created: list[int] = []
    partitions: list[int] = []
    offsets: list[int] = []
    try:
        assigned = [TopicPartition(topic, p) for p, end in ends.items() if end > 0]
        consumer.assign(assigned)
        consumer.seek_to_beginning(*assigned)
        deadline = time.monotonic() + timeout_s
        while any(consumer.position(tp) < ends[tp.partition] for tp in assigned):
            if time.monotonic() > deadline:
                raise JobError(f"could not read {topic} to its end offsets {ends} in {timeout_s:.0f} s")
            for batch in consumer.poll(timeout_ms=1000).values():
                for record in batch:
                    if record.key is None or record.offset >= ends[record.partition]:
                        continue
                    if record.timestamp_type != 0:
                        raise JobError(f"topic {topic} stamps records with LogAppendTime, not the producer's CreateTime")
                    value = json.loads(record.value)
                    origins.append(value["origin"])
                    times.append(int(value["event_time"]))
                    created.append(int(record.timestamp))
                    partitions.append(record.partition)
                    offsets.append(record.offset)
    finally:
        consumer.close()
    frame = pd.DataFrame({"origin": origins, "event_time_ms": np.asarray(times, np.int64), "create_ms": np.asarray(created, np.int64),
                          "partition": np.asarray(partitions, np.int64), "offset": np.asarray(offsets, np.int64)})
    return frame.sort_values(["create_ms", "partition", "offset"], kind="stable").reset_index(drop=True)


def read_windows_written(windows_dir: Path) -> pd.DataFrame:
    """The run's windows with the wall time each was written.

    Returns:
        A frame with `origin`, `window_end_ms` (int64), `count`, `written_s` (float, the
        modification time of its batch's Parquet file, seconds since the epoch), `batch_id`.
    """
    import numpy as np
    import pandas as pd
    import pyarrow.parquet as pq

    parts = []
    for path in sorted(windows_dir.glob("part-*.parquet")):
        table = pq.read_table(path, columns=["origin", "window_end", "count"]).to_pandas()
        table["window_end_ms"] = table["window_end"].astype("datetime64[ms, UTC]").astype("int64")
        table["written_s"] = path.stat().st_mtime_ns / 1e9
        table["batch_id"] = int(path.stem.split("-")[1])
        parts.append(table.drop(columns=["window_end"]))
    if not parts:
        return pd.DataFrame({"origin": [], "window_end_ms": np.empty(0, np.int64), "count": np.empty(0, np.int64),
                             "written_s": np.empty(0), "batch_id": np.empty(0, np.int64)})
    return pd.concat(parts, ignore_index=True)


def final_times(windows: pd.DataFrame, records: pd.DataFrame) -> np.ndarray:
    """F of each window (module docstring), ms since the epoch; NaN where its origin never
    produced a record with event time >= the window's end.

    Args:
        windows: `read_windows_written` rows (`origin`, `window_end_ms`).
        records: `read_source_records` rows, in production order.

    Returns:
        float64 array, one per window row.
    """
    import numpy as np

    result = np.full(len(windows), np.nan)
    if not len(windows) or not len(records):
        return result
    by_origin = {origin: (np.maximum.accumulate(group["event_time_ms"].to_numpy(np.int64)), group["create_ms"].to_numpy(np.int64))
                 for origin, group in records.groupby("origin", sort=False)}
    ends = windows["window_end_ms"].to_numpy(np.int64)
    for origin, rows in windows.groupby("origin", sort=False).indices.items():
        if origin not in by_origin:
            continue
        running_max, created = by_origin[origin]
        first = np.searchsorted(running_max, ends[rows], side="left")  # first record whose time reaches the end
        found = first < running_max.size
        result[rows[found]] = created[first[found]]
    return result


def latency_figures(windows: pd.DataFrame, records: pd.DataFrame) -> dict[str, Any]:
    """Latency p50/p95/mean (s), E and the window counts of a run (module docstring)."""
    import numpy as np

    from keyshift.eventtime.disorder import performance_ratio

    final_ms = final_times(windows, records)
    has = ~np.isnan(final_ms)
    latency = windows["written_s"].to_numpy(float)[has] - final_ms[has] / 1000
    counts = windows["count"].to_numpy(np.int64)[has]
    figures: dict[str, Any] = {
        "latency_windows": int(has.sum()),
        "windows_without_final_time": int((~has).sum()),
        "windows_emitted_before_final": int((latency < 0).sum()),
        "latency_p50_s": None, "latency_p95_s": None, "latency_mean_s": None, "latency_max_s": None,
        "mean_events_per_window": None, "performance_ratio_E": None,
    }
    if latency.size:
        figures.update(
            latency_p50_s=round(float(np.percentile(latency, 50)), 3), latency_p95_s=round(float(np.percentile(latency, 95)), 3),
            latency_mean_s=round(float(latency.mean()), 3), latency_max_s=round(float(latency.max()), 3),
            mean_events_per_window=round(float(counts.mean()), 3),
        )
        clipped = np.clip(latency, 0, None)
        if clipped.sum() > 0:
            figures["performance_ratio_E"] = round(performance_ratio(counts, clipped), 3)
    return figures


def _field_bytes(column, data_type):
    """A Spark column expression: the bytes of a state row's field (module docstring)."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    if isinstance(data_type, T.StructType):
        parts = [_field_bytes(column.getField(f.name), f.dataType) for f in data_type.fields]
        return sum(parts[1:], parts[0]) if parts else F.lit(0)
    if isinstance(data_type, (T.StringType, T.BinaryType)):
        return F.coalesce(F.octet_length(column), F.lit(0))
    fixed = {T.LongType: 8, T.IntegerType: 4, T.DoubleType: 8, T.FloatType: 4, T.BooleanType: 1, T.ShortType: 2, T.ByteType: 1}
    return F.lit(fixed.get(type(data_type), 8))


def state_bytes_at(spark: SparkSession, checkpoint: Path, batch_id: int) -> dict[str, int]:
    """Rows and bytes of each declared state variable at `batch_id`, read with the state data source.

    Returns:
        {variable: rows, f"{variable}_bytes": bytes, ...} and `bytes`, the sum of the variables' bytes.
    """
    from pyspark.sql import functions as F

    from keyshift.processing.operators.processor import CLOCK_STATE_NAME, PENDING_STATE_NAME

    spark.streams.active  # noqa: B018 - the state store coordinator the reader's tasks ask for
    result: dict[str, int] = {"bytes": 0}
    for name in (PENDING_STATE_NAME, CLOCK_STATE_NAME):
        frame = (spark.read.format("statestore").option("path", str(checkpoint)).option("stateVarName", name)
                 .option("batchId", int(batch_id)).load())
        columns = [c for c in ("key", "user_map_key", "user_map_value", "value") if c in frame.columns]
        size = sum((_field_bytes(F.col(c), frame.schema[c].dataType) for c in columns[1:]), _field_bytes(F.col(columns[0]), frame.schema[columns[0]].dataType))
        row = frame.agg(F.count(F.lit(1)).alias("rows"), F.coalesce(F.sum(size), F.lit(0)).alias("bytes")).collect()[0]
        result[name] = int(row["rows"])
        result[f"{name}_bytes"] = int(row["bytes"])
        result["bytes"] += int(row["bytes"])
    return result


def sample_batches(progress: Sequence[Mapping[str, Any]], samples: int) -> list[int]:
    """Batch ids whose state is read: up to `samples` evenly spaced among the batches that read
    flights (events_read grew), plus the one with the most state rows (`state_store.rows`)."""
    reading, previous = [], 0
    for record in progress:
        read = int(record.get("events_read") or 0)
        if read > previous:
            reading.append(int(record["batch_id"]))
        previous = max(previous, read)
    if not reading:
        return []
    if len(reading) <= samples:
        chosen = set(reading)
    else:
        chosen = {reading[round(i * (len(reading) - 1) / (samples - 1))] for i in range(samples)} if samples > 1 else {reading[len(reading) // 2]}
    rows = [(int((r.get("state_store") or {}).get("rows") or 0), int(r["batch_id"])) for r in progress]
    if rows and max(rows)[0] > 0:
        chosen.add(max(rows)[1])
    return sorted(chosen)


def peak_state_store(progress: Sequence[Mapping[str, Any]]) -> dict[str, int | None]:
    """Peaks over the run of Spark's `numRowsTotal` and `memoryUsedBytes` (progress `state_store`)."""
    rows = [(r.get("state_store") or {}).get("rows") for r in progress]
    memory = [(r.get("state_store") or {}).get("memory_bytes") for r in progress]
    rows = [int(v) for v in rows if v is not None]
    memory = [int(v) for v in memory if v is not None]
    return {"state_rows_peak": max(rows) if rows else None, "state_memory_bytes_peak": max(memory) if memory else None}


def read_late_records(settings: Settings, start: Mapping[int, int], run_id: str, timeout_s: float = 120.0) -> list[dict[str, Any]]:
    """The late-topic records of `run_id` written after `start` (the topic's end offsets before the
    run), read committed."""
    from kafka import KafkaConsumer, TopicPartition

    from keyshift.kafka_clients import client_options
    from keyshift.names import LATE_TOPIC
    from keyshift.topics import end_offsets

    ends = end_offsets(settings, LATE_TOPIC)
    consumer = KafkaConsumer(bootstrap_servers=settings.bootstrap_servers, enable_auto_commit=False, group_id=None,
                             isolation_level="read_committed", max_poll_records=50_000, **client_options(settings))
    found: list[dict[str, Any]] = []
    try:
        assigned = [TopicPartition(LATE_TOPIC, p) for p, end in ends.items() if end > int(start.get(p, 0))]
        if not assigned:
            return found
        consumer.assign(assigned)
        for tp in assigned:
            consumer.seek(tp, int(start.get(tp.partition, 0)))
        deadline = time.monotonic() + timeout_s
        while any(consumer.position(tp) < ends[tp.partition] for tp in assigned):
            if time.monotonic() > deadline:
                raise JobError(f"could not read {LATE_TOPIC} to its end offsets in {timeout_s:.0f} s")
            for batch in consumer.poll(timeout_ms=1000).values():
                for record in batch:
                    value = json.loads(record.value)
                    if value.get("run_id") == run_id:
                        found.append(value)
    finally:
        consumer.close()
    return found


def needed_bound_ms(bound_ms: int, late: Sequence[Mapping[str, Any]]) -> int:
    """The bound under which none of `late` (late-topic records of a `global` run with `bound_ms`)
    would have been late with the same micro-batches: B + max(watermark missed - window end) + 1."""
    if not late:
        return int(bound_ms)
    return int(bound_ms) + max(int(r["watermark_ms"]) - int(r["window_end_ms"]) for r in late) + 1


def lossless_bound_ms(needed_ms: int) -> int:
    """`needed_ms` times `LOSSLESS_MARGIN`, rounded up to a whole minute."""
    return int(math.ceil(needed_ms * LOSSLESS_MARGIN / MINUTE_MS) * MINUTE_MS)


# --- running ----------------------------------------------------------------------------------


class SelfStop:
    """Stops a continuous run in this process as a user does: SIGTERM, which `run_job`
    turns into a stop at the next batch boundary (its own handler, installed while it runs).

    While the bench runs, its own SIGTERM handler stands in between runs: a stop the bench sent
    after its run had already ended is ignored; any other SIGTERM interrupts the bench.

    Raises:
        ConfigurationError: on entry outside the main thread (signal handlers live there).
    """

    def __init__(self) -> None:
        self._sent = threading.Event()
        self._previous = None

    def __enter__(self) -> SelfStop:
        if threading.current_thread() is not threading.main_thread():
            raise ConfigurationError("run the watermark bench in the main thread: it stops each paced run with SIGTERM")
        self._previous = signal.signal(signal.SIGTERM, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        signal.signal(signal.SIGTERM, self._previous)

    def _handle(self, signum, frame) -> None:
        if self._sent.is_set():
            self._sent.clear()
            return
        raise KeyboardInterrupt("SIGTERM")

    def stop_run(self) -> None:
        """Send the stop (from any thread)."""
        self._sent.set()
        os.kill(os.getpid(), signal.SIGTERM)

    def reset(self) -> None:
        """Forget a stop the run consumed (call after the run returned)."""
        self._sent.clear()


def _keyshift() -> str:
    return str(Path(sys.executable).with_name("keyshift"))


class _Conductor(threading.Thread):
    """Drives a paced run from beside it: warm-up batch, feed, end-of-input markers, stop."""

    def __init__(self, settings: Settings, stopper: SelfStop, run_id: str, topic: str, feed: list[str], flights: int,
                 timeout_s: float) -> None:
        super().__init__(name=f"bench-wm-{run_id}", daemon=True)
        self.settings, self.stopper, self.run_id, self.topic, self.feed, self.flights = settings, stopper, run_id, topic, feed, flights
        self.timeout_s = timeout_s
        self.run_dir = settings.runs_dir / run_id
        self.abort = threading.Event()
        self.error: str | None = None
        self.feed_started_at: float | None = None
        self.feed_seconds: float | None = None
        self._process: subprocess.Popen | None = None

    def _wait(self, predicate: Callable[[], Any], what: str, timeout_s: float) -> Any:
        deadline = time.monotonic() + timeout_s
        while not self.abort.is_set():
            value = predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                raise JobError(f"timed out after {timeout_s:.0f} s waiting for {what} (run {self.run_id})")
            time.sleep(0.25)
        raise JobError("aborted")

    def run(self) -> None:
        from keyshift.runs import run_record
        from keyshift.processing.sources.kafka_input import send_end_of_input

        try:
            self._wait(lambda: getattr(run_record(self.settings, self.run_id), "segment", None) is not None, "the query to start", 600)
            send_end_of_input(self.settings, self.topic, f"{self.run_id}-warmup")  # another run's markers: a batch, no event
            self._wait(lambda: read_progress(self.run_dir), "the warm-up batch", 600)
            self.run_dir.mkdir(parents=True, exist_ok=True)
            with (self.run_dir / "bench-feed.log").open("ab") as out:
                self.feed_started_at = time.time()
                self._process = subprocess.Popen(self.feed, stdout=out, stderr=subprocess.STDOUT)
            status = self._wait(lambda: self._process.poll() is not None, "the paced replay", self.timeout_s)
            self.feed_seconds = time.time() - self.feed_started_at
            if status is not True or self._process.returncode != 0:
                raise JobError(f"the paced replay into {self.topic} failed ({self._process.returncode}); see {self.run_dir / 'bench-feed.log'}")
            markers = send_end_of_input(self.settings, self.topic, self.run_id)

            def drained() -> bool:
                rows = read_progress(self.run_dir)
                if not rows:
                    return False
                last = rows[-1]
                offsets = {int(p): int(o) for p, o in (last.get("offsets") or {}).items()}
                covered = all(offsets.get(p, -1) >= end for p, end in markers.items())
                return covered and last.get("events_accounted") == last.get("events_read") and int(last.get("events_read") or 0) >= self.flights

            self._wait(drained, "every event accounted for after the end-of-input markers", self.timeout_s)
        except JobError as exc:
            if not self.abort.is_set():
                self.error = str(exc)
        except Exception as exc:  # noqa: BLE001 - reported by the main thread
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            if self._process is not None and self._process.poll() is None:
                self._process.kill()
                self._process.wait()
            if not self.abort.is_set():
                self.stopper.stop_run()


class WatermarkBench:
    """One bench run: its settings, Spark session, topics and reference (see `run_watermark_bench`)."""

    def __init__(self, settings: Settings, config: BenchSettings, spark: SparkSession, stopper: SelfStop,
                 say: Callable[[str], None]) -> None:
        from keyshift.data.flights import flights_path
        from keyshift.quality.reference import reference_windows

        self.settings, self.config, self.spark, self.stopper, self.say = settings, config, spark, stopper, say
        self.tag = uuid.uuid4().hex[:6]
        self.flights_file = flights_path(settings)
        self.reference = reference_windows(self.flights_file, limit=config.flights)
        self.topics: list[str] = []

    def _name(self, *parts: str) -> str:
        return "-".join(("bench-wm", self.tag, *parts))

    def _topic(self, name: str) -> str:
        from keyshift.topics import create_topics

        create_topics(self.settings, [name], self.config.partitions)
        self.topics.append(name)
        return name

    def drop_topics(self) -> None:
        """Delete the bench's input topics (unless `keep_topics`)."""
        from keyshift.topics import delete_topics

        if self.topics and not self.config.keep_topics:
            try:
                delete_topics(self.settings, self.topics)
            except Exception as exc:  # noqa: BLE001 - cleanup only
                log.warning("could not delete the bench topics %s: %s", self.topics, exc)
            self.topics = []

    def _job_config(self, run_id: str, topic: str, mode: str, bound_ms: int, limit: int | None, per_trigger: int):
        from keyshift.processing.job_config import JobConfig

        return JobConfig.from_options(run_id=run_id, strategy="hash", partitions=self.config.partitions, topic=topic, bound_ms=bound_ms,
                                    watermark=watermark_of(mode), max_offsets_per_trigger=per_trigger, limit=limit)

    def backfill_topic(self, disorder: float, flights: int | None = None, label: str = "backfill") -> str:
        """A topic filled with the flights in the level's arrival order, before any job reads it."""
        from keyshift.data.replay import replay_flights

        c = self.config
        topic = self._topic(self._name(f"d{round(disorder * 100):02d}", label))
        replay_flights(self.settings, topic, limit=flights or c.flights, strategy="hash", partitions=c.partitions, progress=False,
                       disorder=disorder, source_delay=c.source_delay_s, seed=c.seed)
        return topic

    def warm_up(self) -> None:
        """A bounded key-mode run on a small backfill, not reported."""
        from keyshift.runtime.driver import run_job

        flights = min(self.config.flights, WARMUP_FLIGHTS)
        topic = self.backfill_topic(0.0, flights, "warmup")
        config = self._job_config(self._name("warmup"), topic, "key", self.config.bound_ms, flights, max(1, flights // 2))
        started = time.monotonic()
        run_job(self.settings, config, starting="replay", spark=self.spark)
        self.say(f"warm-up run ({flights:,} flights) done in {time.monotonic() - started:.0f} s")

    def backfill_run(self, topic: str, mode: str, disorder: float, bound_ms: int, repeat: int = 1) -> dict[str, Any]:
        """A backfill run of a configuration: its throughput figures."""
        from keyshift.runtime.driver import run_job

        c = self.config
        run_id = self._name(mode.replace("_", ""), f"d{round(disorder * 100):02d}", "backfill" if repeat == 1 else f"backfill{repeat}")
        summary = run_job(self.settings, self._job_config(run_id, topic, mode, bound_ms, c.flights, c.backfill_per_trigger),
                                    starting="replay", spark=self.spark)
        steady = steady_throughput(read_progress(self.settings.runs_dir / run_id))
        return {"run_id": run_id, "events_per_second": steady["events_per_second"], "steady": steady,
                "events_per_second_whole_run": summary.get("events_per_second"), "late_events": summary["late_events"],
                "events_per_cpu_second": summary.get("events_per_cpu_second"), "cpu_seconds": summary.get("cpu_seconds"),
                "events": summary["events_read"], "reconciled": summary["reconciled"]}

    def paced_run(self, mode: str, disorder: float, bound_ms: int, attempt: int = 1) -> dict[str, Any]:
        """The paced run of a configuration and everything measured on it (module docstring).

        Raises:
            JobError: the run failed, did not drain, or does not reconcile.
        """
        from keyshift.data.replay import read_replay_record
        from keyshift.names import LATE_TOPIC
        from keyshift.runtime.driver import run_job
        from keyshift.topics import end_offsets

        c = self.config
        run_id = self._name(mode.replace("_", ""), f"d{round(disorder * 100):02d}", "paced" if attempt == 1 else f"paced{attempt}")
        topic = self._topic(run_id)
        late_start = end_offsets(self.settings, LATE_TOPIC)
        feed = [_keyshift(), "replay", "flights", "--topic", topic, "--limit", str(c.flights), "--rate", repr(float(c.rate)),
                "--strategy", "hash", "--partitions", str(c.partitions), "--workers", "1", "--disorder", repr(float(disorder)),
                "--source-delay", repr(float(c.source_delay_s)), "--seed", str(c.seed), "--no-progress"]
        conductor = _Conductor(self.settings, self.stopper, run_id, topic, feed, c.flights, timeout_s=c.flights / c.rate * 4 + 900)
        load = round(os.getloadavg()[0], 2)
        started = time.monotonic()
        conductor.start()
        try:
            summary = run_job(self.settings, self._job_config(run_id, topic, mode, bound_ms, None, PACED_PER_TRIGGER),
                                        starting="earliest", spark=self.spark)
        except BaseException:
            conductor.abort.set()
            raise
        finally:
            conductor.join(timeout=120)
            self.stopper.reset()
        wall = time.monotonic() - started
        if conductor.error:
            raise JobError(f"paced run {run_id}: {conductor.error}")
        if not summary["reconciled"] or summary["pending_events"] or summary["events_read"] != c.flights:
            raise JobError(f"paced run {run_id} read {summary['events_read']} events of {c.flights}, pending {summary['pending_events']},"
                           f" reconciled {summary['reconciled']}")
        run_dir = self.settings.runs_dir / run_id
        progress = read_progress(run_dir)
        windows = read_windows_written(run_dir / "windows")
        records = read_source_records(self.settings, topic)
        figures = latency_figures(windows, records)
        state = {batch: state_bytes_at(self.spark, run_dir / "checkpoint", batch) for batch in sample_batches(progress, c.state_samples)}
        late = read_late_records(self.settings, late_start, run_id) if summary["late_events"] else []
        if len(late) != summary["late_events"]:
            raise JobError(f"paced run {run_id}: {summary['late_events']} late events counted, {len(late)} found in {LATE_TOPIC}")
        comparison = self._compare(run_dir / "windows", {int(r["event_id"]) for r in late})
        replay = read_replay_record(self.settings, topic) or {}
        return {
            "run_id": run_id, "topic": topic, "bound_ms": bound_ms, "events": summary["events_read"], "late_events": summary["late_events"],
            "late_fraction": round(summary["late_events"] / summary["events_read"], 6) if summary["events_read"] else None,
            "windows": summary["windows_emitted"], "windows_equal_reference": comparison["equal"], "reference": comparison,
            **figures,
            "state_bytes": max((s["bytes"] for s in state.values()), default=None),
            "state_bytes_by_batch": {str(b): s for b, s in state.items()},
            **peak_state_store(progress),
            "batches": len(progress), "paced_wall_seconds": round(wall, 1),
            "feed_seconds": round(conductor.feed_seconds, 1) if conductor.feed_seconds else None,
            "disorder_achieved": replay.get("out_of_order"), "late_sources": len(replay.get("late_sources") or {}),
            "needed_bound_ms": needed_bound_ms(bound_ms, late) if watermark_of(mode) == "global" else None,
            "load_average_1min": load,
        }

    def _compare(self, windows_dir: Path, late_ids: set[int]) -> dict[str, Any]:
        from keyshift.quality.reference import compare_to_reference, reference_windows

        reference = self.reference if not late_ids else reference_windows(self.flights_file, limit=self.config.flights,
                                                                          drop_event_ids=late_ids)
        return compare_to_reference(windows_dir, reference)


_THROUGHPUT_FIELDS = ("events_per_second", "events_per_second_whole_run", "events_per_cpu_second", "backfill_late_events",
                      "backfill_late_fraction", "backfill")
"""A row's fields measured on the backfill runs (`_row`)."""


def _row(mode: str, disorder: float, paced: Mapping[str, Any], backfill: Mapping[str, Any] | None) -> dict[str, Any]:
    """A report row: the issue's fields first, then the rest."""
    row = {
        "mode": mode, "disorder": disorder,
        "events_per_second": backfill["events_per_second"] if backfill else None,
        "late_fraction": paced["late_fraction"], "latency_p50_s": paced["latency_p50_s"], "latency_p95_s": paced["latency_p95_s"],
        "state_bytes": paced["state_bytes"], "performance_ratio_E": paced["performance_ratio_E"],
        "bound_ms": paced["bound_ms"], "events": paced["events"], "late_events": paced["late_events"], "windows": paced["windows"],
        "windows_equal_reference": paced["windows_equal_reference"],
        "events_per_second_whole_run": backfill["events_per_second_whole_run"] if backfill else None,
        "events_per_cpu_second": backfill.get("events_per_cpu_second_median") if backfill else None,
        "backfill_late_events": backfill["late_events"] if backfill else None,
        "backfill_late_fraction": round(backfill["late_events"] / backfill["events"], 6) if backfill and backfill["events"] else None,
    }
    row.update({k: v for k, v in paced.items() if k not in row})
    if backfill:
        row["backfill"] = {k: v for k, v in backfill.items() if k not in ("events_per_second", "events_per_second_whole_run")}
    return row


def run_configuration(bench: WatermarkBench, mode: str, disorder: float, global_row: Mapping[str, Any] | None) -> dict[str, Any]:
    """The paced run of one (mode, level), as a report row without throughput (`add_backfill`
    fills it in); for `global_lossless` the paced run is repeated with a larger bound while it
    loses events (module docstring)."""
    c = bench.config
    attempts: list[dict[str, Any]] = []
    if mode != "global_lossless":
        bound, source = c.bound_ms, "--bound-ms"
    elif global_row is None:
        bound, source = FALLBACK_LOSSLESS_BOUND_MS, "two days (no global run to measure from)"
    else:
        needed = int(global_row["needed_bound_ms"])
        bound = c.bound_ms if needed <= c.bound_ms else lossless_bound_ms(needed)
        source = (f"global lost nothing with {c.bound_ms} ms" if needed <= c.bound_ms
                  else f"global's late events needed {needed} ms; x{LOSSLESS_MARGIN:g}, rounded up to a minute")
    while True:
        bench.say(f"  {mode} disorder {disorder:g}: paced run (bound {bound:,} ms, {c.flights:,} flights at {c.rate:,.0f} events/s)")
        paced = bench.paced_run(mode, disorder, bound, attempt=len(attempts) + 1)
        attempts.append({"bound_ms": bound, "late_events": paced["late_events"], "run_id": paced["run_id"]})
        if mode != "global_lossless" or paced["late_events"] == 0 or len(attempts) >= LOSSLESS_ATTEMPTS:
            break
        bound = max(lossless_bound_ms(int(paced["needed_bound_ms"])), 2 * bound)
        bench.say(f"  global_lossless lost {paced['late_events']:,} events; again with {bound:,} ms")
    row = _row(mode, disorder, paced, None)
    if mode == "global_lossless":
        row.update(bound_source=source, lossless_attempts=attempts, lossless=paced["late_events"] == 0)
    return row


def backfill_rounds(bench: WatermarkBench, rows: Sequence[Mapping[str, Any]], disorder: float, topic: str) -> dict[str, list[dict[str, Any]]]:
    """The backfill runs of one level: `backfill_repeats` rounds, each running every
    configuration once in the rows' order (so a slow spell of the machine falls on all of them,
    not on one configuration's repeats), each with the bound of its paced run.

    Returns:
        mode -> its backfill runs, in round order (`WatermarkBench.backfill_run` results).
    """
    c = bench.config
    runs: dict[str, list[dict[str, Any]]] = {row["mode"]: [] for row in rows}
    for repeat in range(1, c.backfill_repeats + 1):
        for row in rows:
            bench.say(f"  {row['mode']} disorder {disorder:g}: backfill run {repeat}/{c.backfill_repeats}")
            runs[row["mode"]].append(bench.backfill_run(topic, row["mode"], disorder, row["bound_ms"], repeat))
    return runs


def median_run(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The run whose steady events per second is the median of `runs` (the lower middle one of
    an even count; runs without a figure are left out, or the first run when none has one), with
    `repeats` (every run's figures) and `events_per_second_range` ([min, max]) added."""
    measured = sorted((r for r in runs if r["events_per_second"] is not None), key=lambda r: r["events_per_second"])
    chosen = dict(measured[(len(measured) - 1) // 2] if measured else runs[0])
    chosen["repeats"] = [{k: r.get(k) for k in ("run_id", "events_per_second", "events_per_second_whole_run", "events_per_cpu_second", "late_events")}
                         for r in runs]
    chosen["events_per_second_range"] = [measured[0]["events_per_second"], measured[-1]["events_per_second"]] if measured else None
    per_cpu = [r["events_per_cpu_second"] for r in runs if r.get("events_per_cpu_second") is not None]
    chosen["events_per_cpu_second_median"] = statistics.median(per_cpu) if per_cpu else None
    return chosen


def add_backfill(row: Mapping[str, Any], runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """`row` (from `run_configuration`) with the throughput of its backfill runs (`median_run`)."""
    paced = {k: v for k, v in row.items() if k not in _THROUGHPUT_FIELDS}
    return _row(row["mode"], row["disorder"], paced, median_run(runs))


def paired_ratio(key_row: Mapping[str, Any], global_row: Mapping[str, Any]) -> dict[str, Any]:
    """Key mode's backfill throughput against global mode's, paired by round.

    `backfill_rounds` runs every configuration once per round, so a slow spell of the machine
    falls on both runs of a round; comparing within a round cancels it, where comparing the two
    modes' medians (taken from different rounds) does not. With rounds r = 1..n:
    ratio_r = key events/s in round r / global events/s in round r, and the paired ratio is the
    median of the ratio_r (the lower middle one of an even count) over rounds where both were
    measured.

    Args:
        key_row, global_row: report rows of one disorder level (`add_backfill`), whose
            `backfill.repeats` list each round's run in round order.

    Returns:
        {"round_ratios": [ratio_r, ...] (rounded to 4 places), "paired_ratio": the median, or
        None when no round measured both}.
    """
    def per_round(row: Mapping[str, Any]) -> list[float | None]:
        return [r.get("events_per_second") for r in ((row.get("backfill") or {}).get("repeats") or [])]

    ratios = [k / g for k, g in zip(per_round(key_row), per_round(global_row)) if k is not None and g]
    ordered = sorted(ratios)
    return {"round_ratios": [round(r, 4) for r in ratios],
            "paired_ratio": round(ordered[(len(ordered) - 1) // 2], 4) if ordered else None}


def evaluate_targets(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The issue's goals: each `{"target", "value", "met"}` (`met` None when not measured)."""
    by = {(r["mode"], r["disorder"]): r for r in rows}
    levels = sorted({r["disorder"] for r in rows})

    def per_level(mode: str, field: str) -> dict[str, Any]:
        return {f"{d:g}": by[(mode, d)][field] for d in levels if (mode, d) in by}

    targets = []
    key = per_level("key", "late_fraction")
    targets.append({"target": "key late fraction 0 at every disorder", "value": key,
                    "met": (all(v == 0 for v in key.values()) if key else None)})
    lossy = {f"{d:g}": by[("global", d)]["late_events"] for d in levels if d > 0 and ("global", d) in by}
    targets.append({"target": "global with the same bound loses events at every disorder > 0", "value": lossy,
                    "met": (all(v > 0 for v in lossy.values()) if lossy else None),
                    "at_disorder_0": by[("global", 0.0)]["late_events"] if ("global", 0.0) in by else None,
                    "backfill_late_events": per_level("global", "backfill_late_events"),
                    "key_backfill_late_events": per_level("key", "backfill_late_events")})
    pairs = {f"{d:g}": {"key": by[("key", d)]["events_per_second"], "global": by[("global", d)]["events_per_second"],
                        **paired_ratio(by[("key", d)], by[("global", d)])}
             for d in levels if ("key", d) in by and ("global", d) in by}
    measured = [p for p in pairs.values() if p["paired_ratio"] is not None]
    targets.append({"target": "key events per second >= global's at every disorder (paired by round: the median over rounds "
                              "of key's events/s over global's in the same round >= 1)", "value": pairs,
                    "met": (all(p["paired_ratio"] >= 1 for p in measured) if measured and len(measured) == len(pairs) else None),
                    "unpaired_medians_met": (all(p["key"] >= p["global"] for p in measured) if measured and len(measured) == len(pairs) else None)})
    per_cpu = {f"{d:g}": {"key": by[("key", d)].get("events_per_cpu_second"), "global": by[("global", d)].get("events_per_cpu_second")}
               for d in levels if ("key", d) in by and ("global", d) in by}
    measured = [p for p in per_cpu.values() if p["key"] is not None and p["global"] is not None]
    targets.append({"target": "key events per CPU second >= global's at every disorder (the same goal, measured so that "
                              "other processes on the machine do not decide it)", "value": per_cpu,
                    "met": (all(p["key"] >= p["global"] for p in measured) if measured and len(measured) == len(per_cpu) else None)})
    latency = {f"{d:g}": {"dynamic": by[("dynamic", d)]["latency_p95_s"], "global_lossless": by[("global_lossless", d)]["latency_p95_s"],
                          "global_lossless_bound_ms": by[("global_lossless", d)]["bound_ms"],
                          "global_lossless_lost_nothing": by[("global_lossless", d)]["late_events"] == 0}
               for d in levels if ("dynamic", d) in by and ("global_lossless", d) in by}
    measured = [p for p in latency.values() if p["dynamic"] is not None and p["global_lossless"] is not None]
    targets.append({"target": "dynamic latency p95 <= global_lossless latency p95 at every disorder", "value": latency,
                    "met": (all(p["dynamic"] <= p["global_lossless"] for p in measured) if measured and len(measured) == len(latency) else None)})
    return targets


def plot_rows(rows: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """Per mode against the disorder: late fraction (the backfill's dashed), events/s, latency p50
    (dashed) and p95, state bytes, E, the bound; PNG at `path` (matplotlib, Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (("late_fraction", "late fraction (paced; backfill dashed)", False), ("events_per_second", "events/s (backfill, after batch 0)", False),
              ("latency_p95_s", "output latency p95 (s; p50 dashed)", False), ("state_bytes", "state bytes (peak of samples)", True),
              ("performance_ratio_E", "performance ratio E (events/s)", False), ("bound_ms", "watermark bound (ms)", True))
    figure, axes = plt.subplots(2, 3, figsize=(15, 8))
    colors = plt.get_cmap("tab10")
    modes = [m for m in MODES if any(r["mode"] == m for r in rows)]
    for axis, (field, label, log_scale) in zip(axes.flat, panels):
        for index, mode in enumerate(modes):
            mine = sorted((r for r in rows if r["mode"] == mode), key=lambda r: r["disorder"])
            points = [(r["disorder"], r[field]) for r in mine if r.get(field) is not None]
            if points:
                axis.plot(*zip(*points), marker="o", color=colors(index), label=mode)
            dashed = {"latency_p95_s": "latency_p50_s", "late_fraction": "backfill_late_fraction"}.get(field)
            if dashed:
                second = [(r["disorder"], r[dashed]) for r in mine if r.get(dashed) is not None]
                if second:
                    axis.plot(*zip(*second), linestyle="--", color=colors(index), linewidth=1)
        if log_scale:
            axis.set_yscale("log")
        axis.set_title(label, fontsize=10)
        axis.set_xlabel("disorder (fraction of events out of order)")
        axis.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=8)
    figure.suptitle("Watermark modes on real flights made out of order by whole sources (each source in order)")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def run_watermark_bench(
    settings: Settings,
    out: Path,
    config: BenchSettings | None = None,
    spark: SparkSession | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Run every (disorder, configuration) twice (paced and backfill), write the report and plot.

    Args:
        settings: the stack (Kafka, Redis, the runs folder).
        out: the JSON file; the PNG goes to `out` with suffix `.png`.
        config: sizes, levels, modes (`BenchSettings`; its defaults when None).
        spark: a session to run the job in (tests); by default one is built with the connector
            jars (and stopped at the end if this call created it).
        progress: print a line per run (stderr).

    Returns:
        The report (also written to `out`): `rows` (one per level x configuration, module
        docstring), `targets`, `settings`, `definitions`, `plot`, `wall_seconds`, `machine`.

    Raises:
        ConfigurationError: a bad setting, or not in the main thread. JobError: a run failed.
        StackError: Kafka or Redis unreachable.
    """
    from pyspark.sql import SparkSession

    from keyshift import stack
    from keyshift.processing.sources.kafka_input import ensure_side_output_topics

    config = config or BenchSettings()
    config.check()
    stack.require(settings, "kafka", "redis")
    started = time.monotonic()
    load_before = os.getloadavg()

    def say(message: str) -> None:
        log.info("%s", message)
        if progress:
            print(f"[{time.monotonic() - started:7.0f} s] {message}", file=sys.stderr, flush=True)

    owned = spark is None and SparkSession.getActiveSession() is None
    if spark is None:
        from keyshift.runtime.session import build_spark_session, spark_conf
        from keyshift.stack.spark import connector_jars

        spark = build_spark_session("keyshift-bench-watermark", settings.spark_master, spark_conf(config.partitions, jars=connector_jars(settings)))
    modes = ordered_modes(config.modes)
    rows: list[dict[str, Any]] = []
    total = len(config.disorders) * len(modes)
    bench = None
    try:
        with SelfStop() as stopper:
            ensure_side_output_topics(settings, config.partitions)
            bench = WatermarkBench(settings, config, spark, stopper, say)
            say(f"bench-wm-{bench.tag}: {len(config.disorders)} disorder level(s) x {len(modes)} configuration(s), "
                f"{config.flights:,} flights, P={config.partitions}, bound {config.bound_ms:,} ms")
            if config.warmup:
                bench.warm_up()
            for disorder in config.disorders:
                topic = bench.backfill_topic(disorder) if config.backfill else None
                level: list[dict[str, Any]] = []
                for mode in modes:
                    say(f"configuration {len(rows) + len(level) + 1}/{total}: {mode}, disorder {disorder:g} (paced run)")
                    global_row = next((r for r in level if r["mode"] == "global"), None)
                    level.append(run_configuration(bench, mode, disorder, global_row))
                    partial = rows + level
                    out.parent.mkdir(parents=True, exist_ok=True)  # what is measured so far survives a later failure
                    out.write_text(json.dumps({"rows": partial, "partial": True}, indent=1, default=str) + "\n")
                if topic is not None:
                    runs = backfill_rounds(bench, level, disorder, topic)
                    level = [add_backfill(row, runs[row["mode"]]) for row in level]
                for row in level:
                    say(f"  {row['mode']} disorder {disorder:g} -> late {row['late_events']:,} ({row['late_fraction']:.4f}; backfill "
                        f"{row['backfill_late_events']}), {row['events_per_second']} events/s (median of {config.backfill_repeats}), latency p50 "
                        f"{row['latency_p50_s']} s p95 {row['latency_p95_s']} s, state {row['state_bytes']} B, E {row['performance_ratio_E']},"
                        f" windows equal to pandas: {row['windows_equal_reference']}")
                rows.extend(level)
                out.write_text(json.dumps({"rows": rows, "partial": True}, indent=1, default=str) + "\n")
                bench.drop_topics()
    finally:
        if bench is not None:
            bench.drop_topics()
        if owned:
            spark.stop()
    report = {
        "rows": rows,
        "targets": evaluate_targets(rows),
        "settings": {"flights": config.flights, "rate_events_per_s": config.rate, "partitions": config.partitions,
                     "disorders": list(config.disorders), "modes": modes, "bound_ms": config.bound_ms, "seed": config.seed,
                     "source_delay_s": config.source_delay_s, "clock_skew_s": 0.0, "backfill_per_trigger": config.backfill_per_trigger,
                     "paced_per_trigger": PACED_PER_TRIGGER, "state_samples": config.state_samples, "backfill": config.backfill,
                     "backfill_repeats": config.backfill_repeats,
                     "warmup": config.warmup, "nkey_groups": 64,
                     "dynamic_history": 32, "idle_lag_ms": 2 * 86_400_000, "strategy": "hash", "window_ms": 3_600_000},
        "definitions": {
            "latency": "W - F: W = mtime of the window's runs/<run_id>/windows/part-<batch>.parquet; F = Kafka CreateTime of the first "
                       "record of the window's origin, in production order, with event time >= window end (topic read back with "
                       "kafka-python); windows without F excluded and counted (windows_without_final_time)",
            "state_bytes": "peak over sampled batches of the state rows' bytes read with the statestore reader (pending_windows + "
                           "key_clocks: grouping key + map key + map value; strings/binaries at length, longs 8, ints 4; timers not counted)",
            "events_per_second": "backfill runs (median of backfill_repeats rounds, each round running every configuration "
                                 "once): input rows / batch durations over the batches after the first that read rows",
            "performance_ratio_E": "sum of window counts / sum of latencies (negative as 0), over windows with a latency",
            "late_fraction": "late events (to flights-late, counted) / events read, paced run",
        },
        "wall_seconds": round(time.monotonic() - started, 1),
        "machine": {"cpus": os.cpu_count(), "load_average_1_5_15_min_before": [round(x, 2) for x in load_before],
                    "load_average_1_5_15_min_after": [round(x, 2) for x in os.getloadavg()]},
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    report["plot"] = str(plot_rows(rows, out.with_suffix(".png")))
    out.write_text(json.dumps(report, indent=1, default=str) + "\n")
    say(f"report -> {out} ({report['wall_seconds']:.0f} s)")
    return report
