"""A run's progress records and summary: what each batch did, and what the run did.

Progress records go to `progress.jsonl` and Redis as batches complete (`publish_progress`); task
times come from Spark's REST API (`TaskTimeRecorder`); the summary (`build_summary`, with
`attempts_summary` and `task_time_summary`) is `summary.json`. Split out of `keyshift.runtime.driver`.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import Any

import requests
from pyspark.sql import SparkSession

from keyshift.errors import ConfigurationError, JobError
from keyshift.monitoring.balance import balance_degree
from keyshift.monitoring.spark_tasks import after_warmup, keyed_stage_task_seconds, makespan_ratio
from keyshift.processing.job_config import JobConfig
from keyshift.processing.job_record import Segment
from keyshift.runtime.resources import ResourceSampler, events_per_cpu_second
from keyshift.processing.outputs.clocked_batches import partition_clock_summary
from keyshift.processing.outputs.sinks import KeyedWindowSink
from keyshift.processing.outputs.key_window_sink import KeyWindowSink, native_window_rows
from keyshift.runs import RunRecorder, attempt_figures, read_jsonl
from keyshift.names import RunDir


log = logging.getLogger(__name__)

class TaskTimeRecorder(threading.Thread):
    """Writes `runs/<run_id>/task_seconds.json` while the run goes on, every `interval_s` seconds.

    Per batch (run-wide id), the per-slot executor seconds of the source and stateful stages
    (`keyshift.monitoring.spark_tasks`), so the balance monitor's flow network
    (`keyshift.monitoring.flow`) can learn stage capacities from a running job. Each refresh asks
    Spark's REST API only for batches not read yet. `follow(query_name, batch_base, partitions,
    stateful_partitions, source_tasks)` points it at a new segment's query.
    """

    def __init__(self, spark: SparkSession, run_dir: Path, interval_s: float = 30.0) -> None:
        super().__init__(daemon=True, name="task-times")
        self._ui = spark.sparkContext.uiWebUrl
        self._app = spark.sparkContext.applicationId
        self._path = RunDir(Path(run_dir)).task_seconds
        self._interval_s = interval_s
        self._stop_event = threading.Event()
        self._query: tuple[str, int, int, int | None, int | None] | None = None
        self._finished: list[tuple[str, int, int, int | None, int | None]] = []  # queries left, read once more
        self._lock = threading.Lock()  # one refresh at a time
        self._queries_lock = threading.Lock()  # `_query` and `_finished`: `follow` never waits for a refresh
        self._read: dict[str, set[int]] = {}
        self.times: dict[str, dict[str, list[float]]] = {"source": {}, "stateful": {}}
        if self._path.exists():
            try:
                self.times = json.loads(self._path.read_text())
            except ValueError:
                pass

    def follow(self, query_name: str, batch_base: int, partitions: int, stateful_partitions: int | None = None,
               source_tasks: int | None = None) -> None:
        """Read the stages of `query_name` from now on (its batch b is run-wide batch_base + b;
        S = `stateful_partitions` stateful tasks, None: S = P; `source_tasks` ingest tasks,
        None: P). The query followed until now has its last stages read by the next refresh,
        not here: a switch calls this as its new query starts, and reading Spark's REST API
        (0.5 s or more) then competed with the new query's first batch, inside the switch's pause."""
        with self._queries_lock:
            if self._query is not None:
                self._finished.append(self._query)
            self._query = (query_name, batch_base, partitions, stateful_partitions, source_tasks)

    def refresh(self) -> None:
        """Read the batches not read yet of the followed query and of the queries followed
        before it, and rewrite the file (atomically); never raises."""
        if not self._ui:
            return
        with self._lock:
            with self._queries_lock:
                current = self._query
                queries, self._finished = [*self._finished, *([current] if current else [])], []
            if not queries:
                return
            unread = [q for q in queries if not self._read_query(*q) and q is not current]  # REST failed: next refresh
            with self._queries_lock:
                self._finished = unread + self._finished
            partial = self._path.with_suffix(".tmp")
            partial.write_text(json.dumps(self.times, indent=1))
            partial.replace(self._path)

    def _read_query(self, name: str, base: int, partitions: int, stateful_partitions: int | None,
                    source_tasks: int | None) -> bool:
        """Fold query `name`'s stages not read yet into `times`; False when Spark's REST API failed."""
        seen = self._read.setdefault(name, set())
        try:
            timed = keyed_stage_task_seconds(self._ui, self._app, name, partitions, skip=frozenset(seen),
                                             stateful_partitions=stateful_partitions, source_tasks=source_tasks)
        except (requests.RequestException, ValueError) as exc:
            log.debug("task times not read (%s)", exc)
            return False
        for stage, per_batch in (("source", timed.source), ("stateful", timed.stateful)):
            for batch, seconds in per_batch.items():
                self.times[stage][str(base + batch)] = seconds
        seen.update(timed.stateful)
        return True

    def run(self) -> None:
        """The recording thread: `refresh` every interval until stopped."""
        while not self._stop_event.wait(self._interval_s):
            self.refresh()

    def stop(self) -> None:
        """Stop refreshing (after one last refresh)."""
        self._stop_event.set()
        self.refresh()


def driver_jvm_pid(spark: SparkSession) -> int:
    """The pid of the driver's JVM: the gateway pyspark launched, or, under spark-submit (which
    starts the JVM first and this Python process as its child), the parent of this process."""
    process = getattr(spark.sparkContext._gateway, "proc", None)
    return process.pid if process is not None else os.getppid()


def iso_to_ms(text: str | None) -> int | None:
    """An ISO 8601 time as Spark's progress writes it (`2026-11-28T12:00:00.000Z`) in ms since
    the epoch; None for None or empty."""
    if not text:
        return None
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


def source_end_offsets(progress: dict[str, Any], topic: str) -> dict[int, int]:
    """partition -> end offset of `topic` in a Spark progress record (`sources[].endOffset`, a
    JSON text or object); {} when the record has none for the topic."""
    for source in progress.get("sources", []):
        end = source.get("endOffset")
        if isinstance(end, str):
            end = json.loads(end)
        if isinstance(end, dict) and topic in end:
            return {int(p): int(o) for p, o in end[topic].items()}
    return {}


def publish_progress(query, sink: KeyedWindowSink, recorder: RunRecorder, config: JobConfig,
                      segment: Segment, state: dict[str, Any], seen: set[int]) -> bool:
    """Publish a progress record for each batch of `query` not in `seen` (query batch ids);
    returns whether there was one. Updates `state`: batches, records read, consumed offsets,
    watermark, last batch time."""
    base = segment.batch_base
    new = False
    # polled ten times a second: ask for the last progress only (one record over py4j), and for
    # every retained one (up to spark.sql.streaming.numRecentProgressUpdates) only when a batch
    # was missed in between
    latest = query.lastProgress
    if latest is None or latest.batchId in seen:
        return False
    progresses = [latest] if latest.batchId - 1 in seen or latest.batchId == 0 else query.recentProgress
    for progress in progresses:
        record = json.loads(progress.json)
        batch_id = record["batchId"]
        if batch_id in seen:
            continue
        seen.add(batch_id)
        new = True
        state["last_batch_at"] = time.monotonic()
        state["batches"] += 1
        state["records_read"] += int(record.get("numInputRows", 0))
        state["consumed"] = source_end_offsets(record, config.input.topic) or state["consumed"]
        state["watermark_ms"] = iso_to_ms(record.get("eventTime", {}).get("watermark"))
        recorder.progress(
            {
                "run_id": config.run_id,
                "batch_id": base + batch_id,
                "attempt": recorder.attempt,
                "written_at": round(time.time(), 3),
                "segment": segment.index,
                "epoch": config.placement.epoch,
                "strategy": config.placement.strategy,
                "input_rows": int(record.get("numInputRows", 0)),
                "processed_rows_per_slot": sink.batch_slot_events.get(base + batch_id, [0] * config.placement.partitions),
                "offsets": {str(p): o for p, o in sorted(state["consumed"].items())},
                "watermark_ms": state["watermark_ms"],
                "timestamp_ms": iso_to_ms(record.get("timestamp")),
                "batch_duration_ms": record.get("durationMs", {}).get("triggerExecution"),
                # Spark's own split of the trigger: latestOffset, queryPlanning, addBatch, walCommit, commitOffsets, ...
                "duration_ms": record.get("durationMs", {}),
                "events_read": sink.counters.processed_events,
                "events_accounted": sink.counters.accounted_events,
                "late_events": sink.counters.late_events,
                "dead_letters": sink.counters.dead_letters,
                # the stateful operator as Spark reports it: numRowsTotal, memoryUsedBytes (RocksDB)
                "state_store": {"rows": (record.get("stateOperators") or [{}])[0].get("numRowsTotal"),
                                "memory_bytes": (record.get("stateOperators") or [{}])[0].get("memoryUsedBytes")},
            }
        )
    return new


def shuffle_write_bytes(spark: SparkSession) -> int | None:
    """Bytes the run's stages wrote to shuffle files (Spark's shuffle write metrics over the
    application the driver started), None when the monitoring API could not say."""
    from keyshift.monitoring.shuffle import shuffle_write_bytes

    try:
        return shuffle_write_bytes(spark)
    except (ConfigurationError, JobError) as exc:
        log.warning("shuffle write bytes not measured: %s", exc)
        return None


def task_time_summary(times: dict[str, dict[str, list[float]]], partitions: int, stateful_partitions: int | None = None,
                       source_tasks: int | None = None) -> dict[str, Any]:
    """Per-task task seconds (Σ over batches) and makespan ratios of the source and stateful stages.

    `times` is `TaskTimeRecorder.times` (stage -> run-wide batch id -> seconds per task, also in
    `runs/<run_id>/task_seconds.json`). `per_slot_task_seconds` and `stateful_makespan_ratio` are
    the stateful stage's, per stateful partition (S of them, `stateful_partitions`, None: P; a
    partition holds the slots of `keyshift.placement.tokens.stateful_partition_of_slot`, one
    when S = P); the source stage's are `per_slot_source_task_seconds` (per ingest task,
    `source_tasks` of them, None: P; per slot with one task per Kafka partition) and
    `source_makespan_ratio`; `makespan_ratio_after_warmup` gives both without batch 0 (see
    `after_warmup`). A run whose switch changed P sums each task over the batches that had it.
    """
    source = {int(b): v for b, v in times.get("source", {}).items()}
    stateful = {int(b): v for b, v in times.get("stateful", {}).items()}
    if not stateful:
        return dict.fromkeys(("per_slot_task_seconds", "stateful_makespan_ratio", "per_slot_source_task_seconds",
                              "source_makespan_ratio", "makespan_ratio_after_warmup"))  # all None: not timed

    def totals(per_batch: dict[int, list[float]], tasks: int) -> list[float]:
        width = max([tasks, *(len(v) for v in per_batch.values())])
        return [round(sum(batch[slot] for batch in per_batch.values() if slot < len(batch)), 3) for slot in range(width)]

    return {
        "per_slot_task_seconds": totals(stateful, partitions if stateful_partitions is None else stateful_partitions),
        "stateful_makespan_ratio": makespan_ratio(stateful),
        "stateful_batches_timed": len(stateful),
        "per_slot_source_task_seconds": totals(source, partitions if source_tasks is None else source_tasks),
        "source_makespan_ratio": makespan_ratio(source),
        "source_batches_timed": len(source),
        "makespan_ratio_after_warmup": {
            "source": makespan_ratio(after_warmup(source)),
            "stateful": makespan_ratio(after_warmup(stateful)),
        },
    }


def build_summary(
    config: JobConfig,
    replay: dict[str, str],
    sink: KeyedWindowSink,
    watch: dict[str, Any],
    wall_seconds: float,
    sampler: ResourceSampler,
    pending: int = 0,
) -> dict[str, Any]:
    """The run's summary: counts (events), balance, speed (events/s) and memory (bytes).

    `replay` is the topic's replay record as read when the run started (its events_produced);
    `pending` the events still in open windows in the state (`pending_events`).
    """
    counters = sink.counters
    events_read = counters.processed_events
    summary = {
        "run_id": config.run_id,
        "strategy": config.placement.strategy,
        "partitions": config.placement.partitions,
        "epoch": config.placement.epoch,
        "topic": config.input.topic,
        "bound_ms": config.event_time.bound_ms,
        "watermark": config.event_time.mode,
        "watermark_policy": asdict(config.event_time.policy),
        "window_ms": config.window_ms,
        "max_offsets_per_trigger": config.input.max_offsets_per_trigger,
        "partition_drift_bound_ms": config.event_time.max_partition_drift_ms,
        "events_produced": int(replay["events_produced"]) if replay.get("events_produced") else None,
        "records_read": watch["records_read"],
        "events_read": events_read,
        "windows_emitted": counters.windows_emitted,
        "sum_window_counts": counters.sum_window_counts,
        "alerts": counters.alerts,
        "late_events": counters.late_events,
        "dead_letters": counters.dead_letters,
        "filtered_events": counters.filtered_events,
        "dead_letters_by_reason": dict(sorted(counters.dead_letters_by_reason.items())),
        "split_keys": {key: list(slots) for key, slots in sorted((config.placement.split or {}).items())},
        "merged_window_pieces": counters.merged_window_pieces,
        "pending_events": pending,
        "reconciled": events_read == counters.accounted_events + pending,
        "per_slot_events": counters.per_slot_events,
        "balance_degree": balance_degree(counters.per_slot_events),
        "batches": watch["batches"],
        "final_watermark_ms": watch["watermark_ms"],
        **partition_clock_summary(Path(sink.windows_dir).parent),
        "wall_seconds": round(wall_seconds, 3),
        "events_per_second": round(events_read / wall_seconds, 1) if wall_seconds > 0 else None,
        "driver_peak_rss_bytes": sampler.peak_rss_bytes,
        "python_workers_peak_rss_bytes": sampler.peak_children_rss_bytes,
        "cpu_seconds": sampler.cpu_seconds().as_dict(),
        "events_per_cpu_second": events_per_cpu_second(events_read, sampler.cpu_seconds()),
        "windows_path": str(sink.windows_dir),
        "end_offsets": {str(p): o for p, o in sorted((config.input.end_offsets or {}).items())} or None,
        "job": config.job,
        "window": config.spec.window,
    }
    if config.spec.key_windows:
        summary.update(key_window_summary(config, sink))
    return summary


def attempts_summary(recorder: RunRecorder, events_read: int, seconds: float) -> dict[str, Any]:
    """The summary's speed over the whole run and per attempt (`keyshift.runs.attempt_figures`).

    `attempts`: each attempt's own events, seconds and events/s; `wall_seconds` and
    `events_per_second`: the run's events over its whole processing time (the attempts' seconds
    summed), so a resumed run reports what it achieved, not all its events over the last
    attempt's seconds; `attempt_events_per_second`: this attempt's own rate. A run never resumed
    has one attempt and the same figures as before attempts were recorded.

    Args:
        recorder: the run's recorder (its folder's `attempts.jsonl` and `progress.jsonl`).
        events_read: the run's events (all attempts).
        seconds: this attempt's processing seconds (Spark up to its last batch).
    """
    attempts = attempt_figures(read_jsonl(recorder.attempts_path), read_jsonl(recorder.progress_path),
                               {"attempt": recorder.attempt, "events": events_read, "seconds": seconds})
    if not attempts:  # the query never started a batch in this attempt
        return {"attempts": []}
    total = sum(a["seconds"] for a in attempts)
    return {"attempts": attempts, "wall_seconds": round(total, 3),
            "events_per_second": round(events_read / total, 1) if total > 0 else None,
            "attempt_events_per_second": attempts[-1]["events_per_second"]}


def key_window_summary(config: JobConfig, sink: KeyWindowSink) -> dict[str, Any]:
    """A key-window run's own figures: the slide (ms), updates emitted, events retired (the
    ledger's `sum_window_counts`), and the rows Spark's native sliding-window aggregation gives for
    the same results (`native_window_rows` over the key_windows table), with their ratio."""
    import pandas as pd

    spec = config.spec
    files = sorted(sink.windows_dir.glob("part-*.parquet"))
    table = pd.read_parquet(files, columns=[spec.key, "start_ms", "count"]) if files else pd.DataFrame(columns=[spec.key, "start_ms", "count"])
    native = native_window_rows(table, spec.key, spec.slide_ms)
    updates = sink.counters.windows_emitted
    return {
        "slide_ms": spec.slide_ms,
        "key_window_updates": updates,
        "events_retired": sink.counters.sum_window_counts,
        "native_window_rows": native,
        "updates_per_native_row": round(updates / native, 4) if native else None,
        "key_windows_path": str(sink.windows_dir),
    }
