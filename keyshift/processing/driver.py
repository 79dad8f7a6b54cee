"""Run the flight delay job: Kafka source -> pipeline -> sink, watched until drained or stopped.

`run_flight_delays` is the one entry point (the CLI, spark_jobs/flight_delays.py and the Airflow
DAG all call it). A bounded run (`config.limit`) starts its query at once and reads records as
they arrive; its input ends at the topic's end offsets at the moment the topic first holds `limit`
records past the run's start (`InputEnd`; with `wait_for_input`, the query starts only then). It
drains them, writes an end-of-input marker to every partition so the watermark passes the last
windows, waits until every event read is accounted for (Σ window counts + late + dead letters),
stops and writes `runs/<run_id>/summary.json`. A continuous run goes on until SIGTERM or Ctrl-C
(SIGINT), then stops at a batch boundary and writes its summary (`StopSignals`).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from dataclasses import asdict, fields, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import requests
from kafka import KafkaProducer
from pyspark.sql import SparkSession

from keyshift import runlog
from keyshift.console import STEP, EventsBar
from keyshift.errors import ConfigurationError, JobError
from keyshift.eventtime.key_windows import SlidingWindow
from keyshift.names import ALERTS_TOPIC, DEAD_LETTER_TOPIC, LATE_TOPIC, SINK_COMMITS_TOPIC
from keyshift.kafka_clients import client_options, spark_options
from keyshift.monitoring.balance import balance_degree
from keyshift.monitoring.spark_tasks import after_warmup, keyed_stage_task_seconds, makespan_ratio
from keyshift.processing.flight_delays import LEARNED_STRATEGIES, FlightDelayJobConfig, check_job_strategy, flight_delay_stream
from keyshift.processing.processor import PENDING_STATE_NAME, state_variables, unpack_pending
from keyshift.processing.failpoints import FAILPOINT_ENV, InjectedFailure, armed, fail_here
from keyshift.processing.records import end_of_input_marker
from keyshift.processing.resources import ResourceSampler, events_per_cpu_second
from keyshift.processing.warmup import start_python_workers
from keyshift.processing.session import build_spark_session, job_spark_conf
from keyshift.processing.side_outputs import TransactionalSideOutputs
from keyshift.processing.pieces import PieceAssembler
from keyshift.processing.clocked_batches import ClockedBatches, partition_clock_summary
from keyshift.processing.sinks import KeyedWindowSink, stop_at_batch_boundary
from keyshift.processing.key_window_sink import KeyWindowSink, kept_events, native_window_rows
from keyshift.runs import RunRecorder, attempt_figures, read_jsonl
from keyshift.settings import Settings

log = logging.getLogger(__name__)

END_OF_INPUT_EVENT_TIME_MS = 253_402_300_799_000
"""9999-12-31T23:59:59Z: the event time of an end-of-input marker, past every real event."""


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
        self._path = run_dir / "task_seconds.json"
        self._interval_s = interval_s
        self._stop_event = threading.Event()
        self._query: tuple[str, int, int, int | None, int | None] | None = None
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
        None: P)."""
        self.refresh()
        self._query = (query_name, batch_base, partitions, stateful_partitions, source_tasks)

    def refresh(self) -> None:
        """Read the batches not read yet and rewrite the file (atomically); never raises."""
        if self._query is None or not self._ui:
            return
        name, base, partitions, stateful_partitions, source_tasks = self._query
        seen = self._read.setdefault(name, set())
        try:
            timed = keyed_stage_task_seconds(self._ui, self._app, name, partitions, skip=frozenset(seen),
                                             stateful_partitions=stateful_partitions, source_tasks=source_tasks)
        except (requests.RequestException, ValueError) as exc:
            log.debug("task times not read (%s)", exc)
            return
        for stage, per_batch in (("source", timed.source), ("stateful", timed.stateful)):
            for batch, seconds in per_batch.items():
                self.times[stage][str(base + batch)] = seconds
        seen.update(timed.stateful)
        partial = self._path.with_suffix(".tmp")
        partial.write_text(json.dumps(self.times, indent=1))
        partial.replace(self._path)

    def run(self) -> None:
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


def pending_events(spark: SparkSession, checkpoint: Path, batch_id: int | None = None, aggregates: int = 2) -> int:
    """Events held in open windows in the run's state at its last committed batch (or `batch_id`).

    Read with Spark's state data source (`statestore`, state variable `pending_windows`), so
    it is an independent count: a stopped continuous run reconciles as events read =
    Σ window counts + late + dead letters + pending; a drained bounded run has none pending.
    Returns 0 when the query committed no batch. `aggregates`: the job spec's number of
    aggregates (the pending windows' packed layout; 2 for the flights).
    """
    state = read_state_variable(spark, checkpoint, PENDING_STATE_NAME, batch_id)
    if state is None:
        return 0
    partials = state.select("user_map_value.partials").toPandas()["partials"]
    return int(sum(unpack_pending(blob, aggregates)[1].sum() for blob in partials))


def read_state_variable(spark: SparkSession, checkpoint: Path, name: str, batch_id: int | None = None):
    """One state variable of a query's checkpoint, read with Spark's state data source at its last
    committed batch (or `batch_id`): a DataFrame (MapState flattened to `key`/`user_map_key`/
    `user_map_value` rows), or None when the query committed no batch."""
    if not (checkpoint / "commits").exists() or not any((checkpoint / "commits").iterdir()):
        return None
    spark.streams.active  # noqa: B018 - creates the state store coordinator the reader's tasks ask for
    reader = spark.read.format("statestore").option("path", str(checkpoint)).option("stateVarName", name)
    if batch_id is not None:
        reader = reader.option("batchId", int(batch_id))
    return reader.load()


def _iso_to_ms(text: str | None) -> int | None:
    if not text:
        return None
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


def _source_end_offsets(progress: dict[str, Any], topic: str) -> dict[int, int]:
    for source in progress.get("sources", []):
        end = source.get("endOffset")
        if isinstance(end, str):
            end = json.loads(end)
        if isinstance(end, dict) and topic in end:
            return {int(p): int(o) for p, o in end[topic].items()}
    return {}


def _covers(consumed: dict[int, int], target: dict[int, int]) -> bool:
    return all(consumed.get(partition, -1) >= offset for partition, offset in target.items())


def _input_reached(target: dict[int, int], consumed: dict[int, int], planned: dict[int, int], room: int | None = 0) -> bool:
    """Whether the consumed or the planned offsets (partition -> next offset) reach `target`, or
    leave at most `room` records of it (summed over partitions) for the next batch; an empty map
    reaches nothing. `room` None: any remainder fits the next batch (no `maxOffsetsPerTrigger`)."""
    for offsets in (consumed, planned):
        if not offsets:
            continue
        remaining = sum(max(0, end - offsets.get(p, 0)) for p, end in target.items())
        if remaining == 0 or (room is None or remaining <= room):
            return True
    return False


def _marker_room(max_offsets_per_trigger: int | None, partitions: int) -> int | None:
    """Records of the run's input that may still be unread when its end-of-input markers go out:
    as many as the next batch takes beside the markers (one per partition), so that the batch
    reading the last records reads the markers too and the run needs no batch of markers alone
    (`maxOffsetsPerTrigger` counts the markers). None: no limit per batch."""
    if max_offsets_per_trigger is None:
        return None
    return max(0, int(max_offsets_per_trigger) - int(partitions))


def _kafka_offsets(settings: Settings, topic: str) -> tuple[dict[int, int], dict[int, int]]:
    """(beginning, end) offsets per partition of `topic`."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=settings.bootstrap_servers, client_id="keyshift-offsets", **client_options(settings))
    try:
        partitions = consumer.partitions_for_topic(topic)
        if not partitions:
            raise JobError(f"topic {topic!r} does not exist; run `keyshift topics create`")
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        begin = {tp.partition: o for tp, o in consumer.beginning_offsets(tps).items()}
        end = {tp.partition: o for tp, o in consumer.end_offsets(tps).items()}
        return begin, end
    finally:
        consumer.close()


def starting_offsets(replay: dict[str, str], topic: str, mode: str) -> dict[int, int] | str:
    """Where a run starts reading: `earliest`, `latest`, or `replay`: the offsets at which the
    replay recorded in `replay` (the topic's Redis replay record) began (so a bounded run reads exactly that replay's
    events even if the topic holds earlier ones), falling back to `earliest`.

    Returns:
        `"earliest"`, `"latest"` or a dict partition -> offset.
    """
    if mode != "replay":
        return mode
    if replay.get("start_offsets"):
        return {int(p): int(o) for p, o in json.loads(replay["start_offsets"]).items()}
    log.info("no replay record for %s: starting at the earliest offsets", topic)
    return "earliest"


def _wait_for_records(
    settings: Settings, topic: str, limit: int, start: dict[int, int], timeout_s: float, stop_requested: threading.Event,
    run_id: str,
) -> dict[int, int]:
    """`--wait-for-input`: wait until `topic` holds >= `limit` records past `start` (concrete
    offsets); return its end offsets then.

    Raises:
        JobError: fewer than `limit` records after `timeout_s` seconds, or a stop was asked for
            (SIGTERM, Ctrl-C) before the query started: nothing was read.
    """
    end = InputEnd(settings, topic, limit, start, None, timeout_s)
    while not end.poll():
        if stop_requested.wait(2):
            raise JobError(f"run {run_id} stopped before its query started (it was waiting for {limit} records in {topic}); "
                           "nothing was read")
    return end.offsets


class InputEnd:
    """A bounded run's input end: the topic's end offsets at the moment it first holds `limit`
    records past the run's start, learned before or while the query runs.

    A bounded run reads records as they arrive; the driver polls the topic (`poll`) until it holds
    `limit` records past `start`, then fixes the end (at least `limit` records: every record
    written by then) and the run ends there: its end-of-input markers go out once a planned batch
    reaches it (`_input_reached`). The end is fixed in the job record (a resume keeps it) and in
    each later batch's partition clocks (`PartitionClocks.end_offsets`), so the ingest tasks drop
    the records past it, the same way on a replay.

    Args:
        settings: the stack (Kafka's address).
        topic: the input topic.
        limit: events the run reads (`--limit`); 0 or None: no end (a continuous run).
        start: partition -> the run's first offset.
        offsets: the end if already known (a resume, or a topic that held the records at start).
        timeout_s: seconds without a new record in the topic, while the end is unknown, after
            which `poll` gives up (JobError).
    """

    POLL_INTERVAL_S = 2.0

    def __init__(self, settings: Settings, topic: str, limit: int | None, start: dict[int, int],
                 offsets: dict[int, int] | None, timeout_s: float) -> None:
        self.settings, self.topic, self.limit = settings, topic, int(limit or 0)
        self.start = {int(p): int(o) for p, o in start.items()}
        self.offsets = None if offsets is None else {int(p): int(o) for p, o in offsets.items()}
        self.timeout_s = float(timeout_s)
        self._available = -1
        self._grew_at = time.monotonic()
        self._next_poll = 0.0

    @property
    def bounded(self) -> bool:
        """Whether the run has an end at all (`--limit`)."""
        return self.limit > 0

    def events_target(self) -> int | None:
        """Records between the start and the end (events), None while unknown or unbounded."""
        return None if self.offsets is None else sum(o - self.start.get(p, 0) for p, o in self.offsets.items())

    def poll(self, force: bool = True) -> bool:
        """Look at the topic (at most every `POLL_INTERVAL_S` unless `force`) and fix the end once
        it holds `limit` records past the start; True when the end is known.

        Raises:
            JobError: the end is still unknown and no record arrived for `timeout_s` seconds.
            StackError: Kafka unreachable.
        """
        if self.offsets is not None or not self.bounded:
            return self.offsets is not None
        now = time.monotonic()
        if not force and now < self._next_poll:
            return False
        self._next_poll = now + self.POLL_INTERVAL_S
        end = _kafka_offsets(self.settings, self.topic)[1]
        available = sum(max(0, o - self.start.get(p, 0)) for p, o in end.items())
        if available >= self.limit:
            self.offsets = end
            log.info("topic %s holds %d records past the run's start (limit %d): the run's input ends at %s", self.topic,
                     available, self.limit, {p: o for p, o in sorted(end.items())}, extra=STEP)
            return True
        if available > self._available:
            log.info("topic %s holds %d of the run's %d records; reading them as they arrive", self.topic, available, self.limit,
                     extra=STEP if self._available < 0 else None)
            self._available, self._grew_at = available, now
        elif now - self._grew_at > self.timeout_s:
            raise JobError(f"topic {self.topic!r} holds {available} records past the run's start, fewer than the limit "
                           f"{self.limit}, and none arrived for {self.timeout_s:.0f} s; was the replay run?")
        return False


def send_end_of_input(settings: Settings, topic: str, run_id: str) -> dict[int, int]:
    """Write one end-of-input marker of `run_id` to every partition; return the end offsets after."""
    producer = KafkaProducer(bootstrap_servers=settings.bootstrap_servers, acks="all", client_id=f"keyshift-eoi-{run_id}", **client_options(settings))
    try:
        for partition in sorted(producer.partitions_for(topic)):
            producer.send(topic, value=end_of_input_marker(run_id, END_OF_INPUT_EVENT_TIME_MS), partition=partition)
        producer.flush()
    finally:
        producer.close()
    return _kafka_offsets(settings, topic)[1]


JOB_RECORD_FILE = "job.json"
"""`runs/<run_id>/job.json`: what a run was started with (its config, concrete start offsets and
the replay record it read), written before its query starts; `--resume` runs from it."""


def save_job_record(
    run_dir: Path, config: FlightDelayJobConfig, start: dict[int, int], replay: dict[str, str], segments: list[dict[str, Any]] | None = None
) -> Path:
    """Write the run's job record atomically (see `JOB_RECORD_FILE`); returns its path.

    `segments` are the run's queries in order (`first_segment`; a switch appends one); None
    keeps the record's current segments (or makes the first one for a new record). A bounded
    run's input end (`config.end_offsets`), once in the record, is kept when `config` has none
    (`InputEnd` fixes it while the query runs).
    """
    path = run_dir / JOB_RECORD_FILE
    if segments is None:
        segments = load_segments(run_dir) if path.exists() else [first_segment(config, start)]
    if config.end_offsets is None and path.exists():  # a bounded run's end, once fixed (`InputEnd`), stays
        known = json.loads(path.read_text())["config"].get("end_offsets")
        if known is not None:
            config = replace(config, end_offsets={int(p): int(o) for p, o in known.items()})
    record = {"config": asdict(config), "start_offsets": {str(p): o for p, o in sorted(start.items())}, "replay": replay,
              "segments": segments}
    partial = path.with_suffix(".tmp")
    partial.write_text(json.dumps(record, indent=1, sort_keys=True))
    partial.replace(path)
    return path


def first_segment(config: FlightDelayJobConfig, start: dict[int, int]) -> dict[str, Any]:
    """The run's first segment: one streaming query, its checkpoint and what it places with.

    A segment is what one query of the run does: `checkpoint` (folder name under the run),
    `strategy`, `partitions`, `stateful_partitions` (S, the query's `spark.sql.shuffle.partitions`;
    absent in runs from before it: S = P), `epoch`, `assignment`, `split`, `topic`,
    `start_offsets` (partition -> offset, as text keys), `batch_base` (the run-wide id of its batch 0),
    `watermark_floor_ms`, `initial_state` (the migrated state's file under the run, or None) and
    `switch_id` (the switch that started it). A switch (`keyshift.migration.switch`) ends a
    segment at a batch boundary and appends the next; the run's ledger, windows table and
    reconciliation span them all.
    """
    return {
        "index": 0, "checkpoint": "checkpoint", "strategy": config.strategy, "partitions": config.partitions,
        "stateful_partitions": config.stateful_partitions, "epoch": config.epoch, "assignment": config.assignment,
        "split": {k: list(v) for k, v in (config.split or {}).items()} or None, "topic": config.topic,
        "start_offsets": {str(p): o for p, o in sorted(start.items())}, "batch_base": 0, "watermark_floor_ms": 0,
        "initial_state": None, "switch_id": None,
    }


def load_segments(run_dir: Path) -> list[dict[str, Any]]:
    """The segments of a started run, oldest first (a record from before switches: one segment
    made from its config and start offsets).

    Raises:
        ConfigurationError: the run has no job record.
    """
    path = run_dir / JOB_RECORD_FILE
    if not path.exists():
        raise ConfigurationError(f"run folder {run_dir} has no {JOB_RECORD_FILE}: there is no started run there")
    record = json.loads(path.read_text())
    if record.get("segments"):
        return record["segments"]
    config, start, _ = load_job_record(run_dir)
    return [first_segment(config, start)]


def segment_config(config: FlightDelayJobConfig, segment: dict[str, Any]) -> FlightDelayJobConfig:
    """The run's config with the placement of `segment` (strategy, P, S, epoch, assignment, split)."""
    split = {k: tuple(v) for k, v in (segment.get("split") or {}).items()} or None
    stateful = segment.get("stateful_partitions")
    return replace(config, strategy=segment["strategy"], partitions=int(segment["partitions"]),
                   max_stateful_partitions=int(stateful) if stateful is not None else None, epoch=int(segment["epoch"]),
                   assignment=segment.get("assignment"), split=split)


def segment_start(segment: dict[str, Any]) -> dict[int, int]:
    """Where `segment`'s query starts reading, partition -> offset."""
    return {int(p): int(o) for p, o in segment["start_offsets"].items()}


def _marker_floor(segment: dict[str, Any]) -> dict[int, int]:
    """`segment`'s marker floor, partition -> offset (empty for a run's first segment): the
    run's end-of-input markers below it are ignored by its query."""
    return {int(p): int(o) for p, o in (segment.get("marker_floor") or {}).items()}


def load_job_record(run_dir: Path) -> tuple[FlightDelayJobConfig, dict[int, int], dict[str, str]]:
    """(config, start offsets partition -> offset, replay record) of a started run.

    Raises:
        ConfigurationError: the run has no job record (it never started, or is not a run of
            this keyshift version).
    """
    path = run_dir / JOB_RECORD_FILE
    if not path.exists():
        raise ConfigurationError(f"run folder {run_dir} has no {JOB_RECORD_FILE}: there is no started run to resume there")
    record = json.loads(path.read_text())
    known = {f.name for f in fields(FlightDelayJobConfig)}
    raw = {k: v for k, v in record["config"].items() if k in known}
    if raw.get("end_offsets") is not None:
        raw["end_offsets"] = {int(p): int(o) for p, o in raw["end_offsets"].items()}
    if raw.get("split") is not None:
        raw["split"] = {key: tuple(slots) for key, slots in raw["split"].items()}
    start = {int(p): int(o) for p, o in record["start_offsets"].items()}
    return FlightDelayJobConfig(**raw), start, record.get("replay") or {}


def committed_batches(checkpoint: Path, topic: str) -> tuple[list[int], dict[int, int]]:
    """The batch ids Spark committed in `checkpoint`, and the Kafka offsets of `topic` after the
    last of them (partition -> next offset to read); ([], {}) for a checkpoint without commits.

    Read from Spark's checkpoint files: `commits/<id>` exists once batch id is committed, and
    `offsets/<id>` holds, after a version line and the batch metadata, one JSON line per source.
    """
    commits = checkpoint / "commits"
    ids = sorted(int(p.name) for p in commits.iterdir() if p.name.isdigit()) if commits.exists() else []
    if not ids:
        return [], {}
    for line in (checkpoint / "offsets" / str(ids[-1])).read_text().splitlines()[2:]:
        offsets = json.loads(line) if line.startswith("{") else {}
        if topic in offsets:
            return ids, {int(p): int(o) for p, o in offsets[topic].items()}
    return ids, {}


def planned_offsets(checkpoint: Path, topic: str) -> dict[int, int]:
    """The Kafka offsets of `topic` at the end of the newest micro-batch Spark has planned in
    `checkpoint` (partition -> first offset past it), committed or not; {} before the first.

    Spark writes `offsets/<id>` when it plans batch id, before running it, and never reads past
    those offsets in that batch; so a record written at or past them is read by a later batch.
    """
    offsets_dir = checkpoint / "offsets"
    ids = sorted((int(p.name) for p in offsets_dir.iterdir() if p.name.isdigit()), reverse=True) if offsets_dir.exists() else []
    for batch_id in ids[:1]:
        try:
            lines = (offsets_dir / str(batch_id)).read_text().splitlines()[2:]
        except OSError:  # being written: the next look finds it
            return {}
        for line in lines:
            offsets = json.loads(line) if line.startswith("{") else {}
            if topic in offsets:
                return {int(p): int(o) for p, o in offsets[topic].items()}
    return {}


def concrete_offsets(settings: Settings, topic: str, start: dict[int, int] | str) -> dict[int, int]:
    """`start` (`earliest`, `latest`, or offsets of some partitions) as an offset for every
    partition of `topic` now, so a run records exactly where it began (records read = offsets
    consumed past it) and a resume does not depend on what the topic holds later."""
    begin, end = _kafka_offsets(settings, topic)
    if start == "earliest":
        return begin
    if start == "latest":
        return end
    return {p: int(start.get(p, begin[p])) for p in end}


def ensure_side_output_topics(settings: Settings, partitions: int, topics=None) -> None:
    """Create the side-output topics (alerts, late, dead letters: P partitions; the flights' or
    those of `topics`, a job's `JobTopics`, its alerts topic only when it has one) and the sink's
    commit topic (one partition) where they are missing; existing ones are left as they are."""
    from keyshift.topics import create_topics, describe_topics

    side = (ALERTS_TOPIC, LATE_TOPIC, DEAD_LETTER_TOPIC) if topics is None else tuple(t for t in (topics.alerts, topics.late, topics.dead_letter) if t)
    existing = describe_topics(settings, [*side, SINK_COMMITS_TOPIC])
    missing = [t for t in side if t not in existing]
    if missing:
        create_topics(settings, missing, partitions)
    if SINK_COMMITS_TOPIC not in existing:
        create_topics(settings, [SINK_COMMITS_TOPIC], 1)


FETCH_MAX_WAIT_MS = 10
"""`fetch.max.wait.ms` of the Kafka source's consumers, in milliseconds (Kafka's default: 500).

A task that reads a partition up to the end of its log waited this long once per partition, on a
fetch that finds no more data: the last batch of a backfill. (A job that keeps up with a live
stream reads to the tail in every batch; there new records end the wait sooner; not measured.)
A coalesced ingest task reads P/S partitions one after the other, so with the default the batch
reading the tail of 32 partitions on 2 cores took 9.3 to 9.6 s for 224 to 288 records
(`keyshift bench throughput`, 2026-11-27). A batch read of the last 6 records of each of 32
partitions in 2 tasks took 8.96 s at 500 ms, 2.94 s at 100, 2.10 s at 50, 1.53 to 1.73 s at 10.
Reads in the middle of the log are not affected: there the broker answers at once. Kafka's classic
consumer, which Spark's source uses, fetches only inside `poll`, so between tasks it sends no
more requests than before."""


def read_kafka(spark: SparkSession, settings: Settings, topic: str, start: dict[int, int] | str, max_offsets_per_trigger: int | None):
    """The Kafka source of `topic` from `start` (a streaming DataFrame of Kafka rows), with
    `kafka.max.poll.records` 20,000 and `kafka.fetch.max.wait.ms` `FETCH_MAX_WAIT_MS`."""
    starting = start if isinstance(start, str) else json.dumps({topic: {str(p): o for p, o in start.items()}})
    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", settings.bootstrap_servers)
        .options(**spark_options(settings))
        .option("subscribe", topic)
        .option("startingOffsets", starting)
        .option("failOnDataLoss", "false")
        # the consumer's default of 500 records per poll costs ~12 % of read speed here
        .option("kafka.max.poll.records", "20000")
        .option("kafka.fetch.max.wait.ms", str(FETCH_MAX_WAIT_MS))
    )
    if max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(max_offsets_per_trigger))
    return reader.load()


def run_flight_delays(
    settings: Settings,
    config: FlightDelayJobConfig,
    starting: str = "replay",
    spark: SparkSession | None = None,
    wait_timeout_s: float = 600.0,
    resume: bool = False,
    driver_log: bool = False,
    progress: bool = False,
    wait_for_input: bool = False,
) -> dict[str, Any]:
    """Run the flight delay job, or resume a crashed run, and return its summary (also written
    to summary.json).

    Args:
        settings: the stack's addresses and the runs folder.
        config: the run (strategy, P, bound, limit ...). With `resume`, only `config.run_id`
            counts: the rest comes from the run's job record (`runs/<run_id>/job.json`).
        starting: `replay` (default: where the last replay into the topic began), `earliest` or
            `latest`; resolved to concrete offsets at start and recorded.
        spark: an existing session (tests); by default one is built with the connector jars.
        wait_timeout_s: seconds a bounded run goes on without a new record in the topic while the
            topic holds fewer than `limit` records past its start (then JobError).
        resume: continue run `config.run_id` from its checkpoint after its driver died: Spark
            replays the batch that was running (same offsets, same watermark), the sink's
            ledger and side-output transactions make that replay count and send nothing twice,
            and the summary covers the whole run, as if it had never crashed.
        driver_log: send this process's log lines, and, when this call starts the driver JVM,
            Spark's log and the Python workers' output, to `runs/<run_id>/driver.log`
            (`keyshift.runlog`; from the moment the run's folder is made, after the checks that
            need no folder). The run record's `log_path` names the driver log in use, if any.
        progress: show a progress bar on stderr of the events accounted for (in windows, late,
            dead letters) against the events a bounded run reads (`keyshift.console.EventsBar`).
        wait_for_input: a bounded run starts its query only once the topic holds `limit` records
            past its start (a backfill read in full batches); by default it starts at once and
            reads records as they arrive (`InputEnd`).

    Stopping: SIGTERM or Ctrl-C (SIGINT) stops the run at the next batch boundary with its
    summary (state `stopped`); a second Ctrl-C stops at once, like a crash (`StopSignals`). Either
    way `--resume` continues it exactly.

    Returns:
        The summary dict (see `build_summary`).

    Raises:
        JobError: the query failed, stalled for `config.idle_timeout_s`, the counts do not
            reconcile (events read != Σ window counts + late + dead letters + pending), a bounded
            run's topic stopped growing short of `limit` records, or a stop came before the query
            started (`wait_for_input`).
        KeyboardInterrupt: a second Ctrl-C (the run stopped at once; resume it).
        ConfigurationError: a new run whose `runs/<run_id>/checkpoint` already exists (resume it
            instead), a resume of a run without checkpoint or job record, or a strategy the job
            cannot place with (`JOB_STRATEGIES`).
        StackError: Kafka or Redis is not reachable.
    """
    from keyshift.stack import require

    run_dir = settings.runs_dir / config.run_id
    checkpoint = run_dir / "checkpoint"
    has_checkpoint = (checkpoint / "offsets").exists()
    if resume and not has_checkpoint:
        raise ConfigurationError(f"run {config.run_id!r} has no checkpoint at {checkpoint} to resume from; start it without --resume")
    if not resume and has_checkpoint:
        raise ConfigurationError(
            f"run {config.run_id!r} already has a checkpoint at {checkpoint}; resume it with --resume {config.run_id}"
            " or choose another --run-id"
        )
    if resume:
        config, start, replay = load_job_record(run_dir)
    check_job_strategy(config.strategy)
    config.check_exchange()
    require(settings, "kafka", "redis")  # one line naming the fix, before anything starts
    if not resume:
        _kafka_offsets(settings, config.topic)  # a missing topic: one line naming the fix
    recorder = RunRecorder(settings, config.run_id)
    if driver_log:
        log.info("run %s: log lines go to %s", config.run_id, runlog.attach(runlog.driver_log_path(recorder.run_dir)), extra=STEP)
    recorder.start(strategy=config.strategy, partitions=config.partitions, epoch=config.epoch, topic=config.topic,
                   log_path=runlog.active())
    if resume:
        resumes = recorder.count_resume()
        recorder.attempt = resumes
        log.info("run %s: resuming from its checkpoint (resume %d)", config.run_id, resumes, extra=STEP)
    stop_signals = StopSignals(config.run_id)
    stop_requested = stop_signals.event
    stop_signals.install()
    bar = EventsBar(f"job {config.run_id}", enabled=progress)
    try:
        if not resume:
            replay = recorder.replay_record(config.topic)  # read now: a later replay overwrites it
            start = concrete_offsets(settings, config.topic, starting_offsets(replay, config.topic, starting))
            if config.limit and wait_for_input:
                config = replace(config, end_offsets=_wait_for_records(settings, config.topic, config.limit, start, wait_timeout_s,
                                                                       stop_requested, config.run_id))
            elif config.limit:
                end = InputEnd(settings, config.topic, config.limit, start, None, wait_timeout_s)
                end.poll()
                config = replace(config, end_offsets=end.offsets)
            if config.strategy in LEARNED_STRATEGIES:
                config = _with_learned_assignment(settings, config)
            if config.max_stateful_partitions is None:
                config = _with_default_stateful_partitions(config, spark, settings.spark_master)
            save_job_record(run_dir, config, start, replay)
        input_end = InputEnd(settings, config.topic, config.limit, start, config.end_offsets if config.limit else None,
                             wait_timeout_s)
        recorder.on_progress = lambda record: bar({**record, "events_target": input_end.events_target()})
        ensure_side_output_topics(settings, config.partitions, config.spec.topics)
        own_session = spark is None
        archive = None
        if spark is None:
            conf, archive = job_spark_conf(settings, config.stateful_partitions)
            log.info("run %s: starting Spark (%s)", config.run_id, settings.spark_master, extra=STEP)
            spark = build_spark_session(f"keyshift-flight-delays-{config.run_id}", settings.spark_master, conf,
                                        output=runlog.active() if driver_log else None)
            start_python_workers(spark)  # meanwhile the driver sets up the query; batch 0 then finds them started
        stop_signals.install()  # again: making the SparkContext installed pyspark's SIGINT handler (it cancels every job)
        sampler = ResourceSampler(driver_jvm_pid(spark))
        sampler.start()
        task_times = TaskTimeRecorder(spark, run_dir)
        task_times.start()
        side_outputs = TransactionalSideOutputs(settings.bootstrap_servers, config.run_id, client_options(settings))
        started = time.monotonic()
        recorder.attempt_started_at = time.time()
        bar.start(input_end.events_target())
        try:
            segments, watch, sink = _run_segments(spark, settings, config, run_dir, recorder, input_end, stop_requested, side_outputs,
                                                  task_times)
            if watch.get("outcome") == "done":
                bar.finish()
        finally:
            sampler.stop()
            task_times.stop()
            side_outputs.close()
            bar.close()
        last = segments[-1]
        checkpoint = run_dir / last["checkpoint"]
        wall_seconds = watch["last_batch_at"] - started if watch["last_batch_at"] else time.monotonic() - started
        if config.spec.key_windows:
            pending = kept_events(spark, checkpoint)
        elif config.exchange == "global_merge":
            pending = _global_merge_state(settings, config).pending_events()
        else:
            pending = pending_events(spark, checkpoint, aggregates=len(config.spec.aggregates)) + (sink.pieces.held_events() if sink.pieces is not None else 0)
        _, consumed = committed_batches(checkpoint, config.topic)
        consumed = consumed or segment_start(last)
        watch["records_read"] = sum(o - start.get(p, 0) for p, o in consumed.items())
        config = replace(segment_config(config, last), end_offsets=input_end.offsets)
        summary = build_summary(config, replay, sink, watch, wall_seconds, sampler, pending)
        summary.update(_attempts_summary(recorder, summary["events_read"], wall_seconds))
        summary.update(_task_time_summary(task_times.times, config.partitions, config.stateful_partitions, config.source_tasks))
        summary["stateful_partitions"] = config.stateful_partitions
        summary["source_tasks"] = config.source_tasks
        summary["shuffle_write_bytes"] = _shuffle_write_bytes(spark) if own_session else None
        summary["exchange"], summary["emit"] = config.exchange, config.emit
        summary["driver_class_archive"] = archive.mode if archive else None
        summary["start_offsets"] = {str(p): o for p, o in sorted(start.items())}
        summary["resumes"] = recorder.resumes()
        summary["segments"] = len(segments)
        summary["switches"] = [s["switch_id"] for s in segments if s.get("switch_id")]
        summary["outcome"] = watch.get("outcome")  # done: drained to its end; stopped: SIGTERM or Ctrl-C
        if config.limit and not summary["reconciled"]:
            recorder.finish(summary, state="failed")
            raise JobError(
                f"run {config.run_id} does not reconcile: events read {summary['events_read']} != "
                f"windows {summary['sum_window_counts']} + late {summary['late_events']} + dead letters {summary['dead_letters']}"
                f" + filtered {summary['filtered_events']} + pending {summary['pending_events']}"
            )
        recorder.finish(summary, state="succeeded" if watch.get("outcome") == "done" else "stopped")
        return summary
    except BaseException as exc:
        recorder.fail(f"{type(exc).__name__}: {exc}")
        raise
    finally:
        bar.close()
        stop_signals.restore()


def _run_segments(spark, settings: Settings, config: FlightDelayJobConfig, run_dir: Path, recorder: RunRecorder, input_end: InputEnd,
                  stop_requested, side_outputs: TransactionalSideOutputs, task_times: TaskTimeRecorder):
    """Run the run's segments: the last one's query, then, whenever a switch is asked for, cut,
    migrate and go on with the next (`keyshift.migration`), until the run is done or stopped.

    Returns:
        (segments, the watch state, the last segment's sink).
    """
    from keyshift.migration import in_driver
    from keyshift.migration.state import initial_state_frame
    from keyshift.migration.switch import SwitchControl, step_index
    spec = config.spec
    variables = state_variables(spec)  # the job's declared state, for the switch

    start, replay = load_job_record(run_dir)[1:]
    segments = load_segments(run_dir)

    def save_segments(new_segments):
        nonlocal segments
        segments = new_segments
        save_job_record(run_dir, config, start, replay, new_segments)

    control = SwitchControl.from_settings(settings, config.run_id)
    record = control.pending()
    if record is not None and (spec.key_windows or config.exchange == "global_merge"):
        record = _refuse_switch(control, record, spec.name, config.exchange)
    if record is not None and step_index(record["step"]) < step_index("segment"):
        # a switch asked for, or cut short before its commit point: the old checkpoint is at
        # rest and nothing is published, so do it now, before the old query starts again
        log.info("run %s: carrying out switch %s (left at step %s) before starting", config.run_id, record["switch_id"], record["step"],
                 extra=STEP)
        segments = in_driver.migrate(spark, settings, run_dir, segments, record, control, variables, save_segments, time.time(),
                                     config.max_stateful_partitions)
        record = control.current()
    elif record is not None and step_index(record["step"]) < step_index("published"):
        in_driver.publish(settings, record)
        record = control.advance(record, "published", None)
    watch: dict[str, Any] | None = None
    while True:
        segment = segments[-1]
        seg_config = segment_config(config, segment)
        if seg_config.assignment is not None:
            seg_config = replace(seg_config, redis_url=settings.redis_url)
        checkpoint = run_dir / segment["checkpoint"]
        recorder.update(strategy=seg_config.strategy, partitions=seg_config.partitions, epoch=seg_config.epoch, segment=segment["index"])
        spark.conf.set("spark.sql.shuffle.partitions", str(seg_config.stateful_partitions))
        if spec.key_windows:
            sink = KeyWindowSink(spec, SlidingWindow(seg_config.window_ms, spec.slide_ms), run_dir, config.run_id, seg_config.epoch,
                                 seg_config.partitions, side_outputs, batch_base=int(segment["batch_base"]))
        else:
            pieces = PieceAssembler(spec, run_dir / "pieces", seg_config.split, int(segment["batch_base"])) \
                if config.watermark_policy.per_key else None
            sink = KeyedWindowSink(spec, run_dir, config.run_id, seg_config.epoch, seg_config.partitions,
                                   side_outputs, batch_base=int(segment["batch_base"]), pieces=pieces)
        initial = initial_state_frame(spark, run_dir / segment["initial_state"], variables) if segment.get("initial_state") else None
        stream = flight_delay_stream(
            read_kafka(spark, settings, config.topic, segment_start(segment), config.max_offsets_per_trigger), seg_config,
            checkpoint_dir=checkpoint, initial_state=initial, watermark_floor_ms=int(segment.get("watermark_floor_ms") or 0),
            marker_floor=segment.get("marker_floor"), clocks_dir=run_dir, batch_base=int(segment["batch_base"]),
        )
        query_name = f"flight_delays_{config.run_id}_{segment['index']}".replace("-", "_")
        batch_function = sink
        if config.exchange == "global_merge":
            from keyshift.placement.tokens import slot_tokens
            from keyshift.processing.global_merge import GlobalMergeSink

            state = _global_merge_state(settings, config)
            if not (checkpoint / "offsets").exists():
                state.clear()  # a new run: nothing of an earlier run under this id may count
            batch_function = GlobalMergeSink(sink, state, settings.redis_url, checkpoint, config.watermark_policy.spark_delay_ms,
                                             seg_config.window_ms, slot_tokens(seg_config.partitions, seg_config.stateful_partitions),
                                             int(segment.get("watermark_floor_ms") or 0))
        batch_function = ClockedBatches(batch_function, run_dir, checkpoint, int(segment["batch_base"]), config.partition_idle_timeout_s,
                                        lambda: input_end.offsets)
        query = stream.writeStream.foreachBatch(batch_function).queryName(query_name).option("checkpointLocation", str(checkpoint)).start()
        task_times.follow(query_name, int(segment["batch_base"]), seg_config.partitions, seg_config.stateful_partitions,
                          seg_config.source_tasks)
        if record is not None and record.get("switch_id") == segment.get("switch_id") and record.get("state") not in ("done", "failed", "rolled_back"):
            record["query_started_at"] = time.time()
            if record.get("published_at"):
                record.setdefault("step_seconds", {})["start_query"] = round(record["query_started_at"] - float(record["published_at"]), 3)
            control.save(record)
        log.info("run %s: query started: %s (strategy %s, P=%d on %d stateful partitions, epoch %d, %s watermark, bound %d ms, "
                 "batch base %d)", config.run_id, query_name, seg_config.strategy, seg_config.partitions, seg_config.stateful_partitions,
                 seg_config.epoch, config.watermark, config.bound_ms, int(segment["batch_base"]), extra=STEP)
        switching = record if record is not None and record.get("state") not in ("done", "failed", "rolled_back") \
            and record.get("switch_id") == segment.get("switch_id") else None

        def finish_switch(rec, first_commit_at=None, segment=segment, sink=sink):
            """Verify switch `rec` once this segment's query committed a batch (at `first_commit_at`,
            epoch seconds; default now), and finish it."""
            return in_driver.verify_and_finish(spark, settings, run_dir, segment, rec, control, variables,
                                               first_commit_at or time.time(), _conservation(spark, run_dir, segments, sink))
        try:
            if switching is not None:
                try:
                    fail_here("switch.new_query", in_driver.switch_number(segments[:-1], switching))
                except InjectedFailure as exc:
                    raise JobError(f"the new query failed: {exc}") from exc
            _hold_new_query_batch(sink, segment, switching)
            watch = _watch(query, sink, recorder, settings, seg_config, input_end, stop_requested, checkpoint, segment, control, watch,
                           switching, finish_switch, lambda: save_job_record(run_dir, replace(config, end_offsets=input_end.offsets),
                                                                             start, replay))
            while (spec.key_windows or config.exchange == "global_merge") and watch.get("outcome") == "switch":  # refused; goes on
                _refuse_switch(control, watch.pop("switch_record"), spec.name, config.exchange)
                watch = _watch(query, sink, recorder, settings, seg_config, input_end, stop_requested, checkpoint, segment, control,
                               watch, None, None, lambda: save_job_record(run_dir, replace(config, end_offsets=input_end.offsets),
                                                                          start, replay))
        except JobError as exc:
            sink.close_barrier()  # nothing more of this query reaches the outputs
            query.stop()
            if switching is None:
                raise
            if committed_batches(checkpoint, config.topic)[0]:
                # its outputs are written: going back to the old checkpoint would count them twice
                control.conclude(switching, "failed", error=str(exc))
                raise
            segments = in_driver.roll_back(settings, segments, switching, control, save_segments, str(exc))
            record = None
            continue
        watch["query_name"] = query_name
        if watch.get("outcome") == "done":  # its last batch is committed
            query.stop()
            return segments, watch, sink
        stop_at = time.time()
        stop_at_batch_boundary(query, sink, checkpoint)
        _publish_progress(query, sink, recorder, seg_config, segment, watch, watch["seen"])  # batches up to the cut
        if watch.get("outcome") == "stopped":
            if switching is not None:
                _settle_switch_at_stop(control, switching, checkpoint, config, finish_switch)
            return segments, watch, sink
        record = watch.pop("switch_record")
        segments = in_driver.migrate(spark, settings, run_dir, segments, record, control, variables, save_segments, stop_at,
                                     config.max_stateful_partitions)
        record = control.current()


def _shuffle_write_bytes(spark: SparkSession) -> int | None:
    """Bytes the run's stages wrote to shuffle files (Spark's shuffle write metrics over the
    application the driver started), None when the monitoring API could not say."""
    from keyshift.monitoring.shuffle import shuffle_write_bytes

    try:
        return shuffle_write_bytes(spark)
    except (ConfigurationError, JobError) as exc:
        log.warning("shuffle write bytes not measured: %s", exc)
        return None


def _global_merge_state(settings: Settings, config: FlightDelayJobConfig):
    """The run's `keyshift.processing.global_merge.GlobalMergeState`."""
    import redis

    from keyshift.processing.global_merge import GlobalMergeState

    return GlobalMergeState(redis.Redis.from_url(settings.redis_url, decode_responses=True, socket_timeout=60), config.run_id, config.spec)


def _refuse_switch(control, record: dict[str, Any], job: str, exchange: str = "local_merge") -> None:
    """End a switch asked of a key-window job or of a `global_merge` run as failed, with the
    reason; returns None (no switch). A global_merge run keeps its windows in Redis whatever the
    placement, so there is no state to move: restart its producers with the new strategy instead.

    Key windows have no switch yet: `KeyWindowProcessor` declares its state
    (`KEY_WINDOW_STATE_VARIABLES`) and restores it from `initialState`, but the switch's
    conservation check and pending count read the tumbling state. `keyshift.migration.switch.
    request_switch` refuses such a run up front (ConfigurationError); this catches a request
    written to Redis by other means."""
    if exchange == "global_merge":
        reason = (f"run of job {job} uses the global_merge exchange: its windows are in Redis whatever the placement, so a switch "
                  "has no state to move (re-place the producers instead)")
    else:
        reason = f"job {job} computes key windows; switching a key-window job is not supported (restart it with another strategy instead)"
    log.warning("run %s: switch %s refused: %s", control.run_id, record.get("switch_id"), reason)
    control.conclude(record, "failed", error=reason)
    return None


def _conservation(spark, run_dir: Path, segments: list[dict[str, Any]], sink: KeyedWindowSink):
    """The flight job's check that a switch conserved its events: pending events at the cut +
    events processed in the new query's first batch - events that batch accounted for (windows,
    late, dead letters) = pending events after it."""
    def check() -> dict[str, Any]:
        old, new = segments[-2], segments[-1]
        first = int(new["batch_base"])
        held = sink.pieces.held_events if sink.pieces is not None else (lambda batch_id: 0)
        aggregates = len(sink.spec.aggregates)
        before = pending_events(spark, run_dir / old["checkpoint"], aggregates=aggregates) + held(first - 1)
        after = pending_events(spark, run_dir / new["checkpoint"], batch_id=0, aggregates=aggregates) + held(first)
        batch = next((b for b in sink.ledger.batches() if b.batch_id == int(new["batch_base"])), None)
        processed = batch.processed_events if batch else 0
        accounted = batch.accounted_events if batch else 0
        return {"pending_before": before, "processed_first_batch": processed, "accounted_first_batch": accounted,
                "pending_after": after, "ok": before + processed - accounted == after}

    return check


def _publish_progress(query, sink: KeyedWindowSink, recorder: RunRecorder, config: FlightDelayJobConfig,
                      segment: dict[str, Any], state: dict[str, Any], seen: set[int]) -> bool:
    """Publish a progress record for each batch of `query` not in `seen` (query batch ids);
    returns whether there was one. Updates `state`: batches, records read, consumed offsets,
    watermark, last batch time."""
    base = int(segment["batch_base"])
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
        state["consumed"] = _source_end_offsets(record, config.topic) or state["consumed"]
        state["watermark_ms"] = _iso_to_ms(record.get("eventTime", {}).get("watermark"))
        recorder.progress(
            {
                "run_id": config.run_id,
                "batch_id": base + batch_id,
                "attempt": recorder.attempt,
                "written_at": round(time.time(), 3),
                "segment": segment["index"],
                "epoch": config.epoch,
                "strategy": config.strategy,
                "input_rows": int(record.get("numInputRows", 0)),
                "processed_rows_per_slot": sink.batch_slot_events.get(base + batch_id, [0] * config.partitions),
                "offsets": {str(p): o for p, o in sorted(state["consumed"].items())},
                "watermark_ms": state["watermark_ms"],
                "timestamp_ms": _iso_to_ms(record.get("timestamp")),
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


def _watch(
    query, sink: KeyedWindowSink, recorder: RunRecorder, settings: Settings, config: FlightDelayJobConfig, input_end: InputEnd,
    stop_requested, checkpoint: Path, segment: dict[str, Any], control, state: dict[str, Any] | None,
    switching: dict[str, Any] | None, finish_switch, save_end,
) -> dict[str, Any]:
    """Follow the query batch by batch, publish progress, and decide when a run is done.

    A resumed run starts from what its checkpoint committed (batch ids, consumed offsets), so
    that a run whose crash came after its last batch still sees itself drained and flushed.
    Progress records carry run-wide batch ids (the segment's `batch_base` + the query's id).
    Returns the watch state with `outcome`: `done`, `stopped`, or `switch` (with the request in
    `switch_record`) when a switch of this run is asked for in Redis. `switching`: a switch
    whose new query this is; `finish_switch(record)` verifies it after the first commit. A
    bounded run whose input end is not known yet polls the topic for it (`InputEnd.poll`) and
    `save_end()` records it in the job record once found.
    """
    base = int(segment["batch_base"])
    committed, consumed = committed_batches(checkpoint, config.topic)
    consumed = consumed or segment_start(segment)
    seen: set[int] = set(committed)
    if state is None:  # this attempt's first query
        state = {"records_read": 0, "last_batch_at": None, "markers_end": None, "batches": 0, "watermark_ms": None}
        state["batches"] = len(sink.ledger.batches())
        recorder.start_attempt(recorder.attempt_started_at or time.time(), sink.counters.processed_events)
    state["outcome"] = None
    if state["markers_end"] is not None and _covers(segment_start(segment), state["markers_end"]):
        # a switch cut the run after the batch that read its end-of-input markers, before the
        # windows they close were emitted: this query starts past them, so it gets markers of its own
        log.info("run %s: the end-of-input markers were read before this segment's start; writing them again", config.run_id)
        state["markers_end"] = None
    elif state["markers_end"] is not None and _covers(_marker_floor(segment), state["markers_end"]):
        # a switch cut the run before the batch that read them: they sit among this query's input
        # (alone in a partition added for a larger P, read before other partitions' last events),
        # so this query ignores them (`IngestContext.marker_floor`) and gets markers of its own
        log.info("run %s: the end-of-input markers were written before this segment and not read; "
                 "it ignores them and writes its own", config.run_id)
        state["markers_end"] = None
    state["seen"] = seen
    state["consumed"] = consumed
    _hold_markers_batch(sink, segment, config, input_end.offsets, checkpoint)
    last_activity = time.monotonic()
    next_poll = 0.0
    if switching is not None and committed:
        finish_switch(switching)  # died after the new query's first commit, before the check
        switching = None
    while True:
        error = query.exception()
        if error is not None:
            raise JobError(f"the streaming query failed: {error}")
        if _publish_progress(query, sink, recorder, config, segment, state, seen):
            last_activity = state["last_batch_at"]
            consumed = state["consumed"] or consumed
            if switching is not None:
                finish_switch(switching)
                switching = None
        if input_end.bounded and input_end.offsets is None and input_end.poll(force=False):
            save_end()
            last_activity = time.monotonic()
        target = input_end.offsets
        if target is not None:
            # The markers go out as soon as a planned batch leaves no more of the input than the
            # next batch takes beside them, while that batch still runs: they land past every
            # offset of the input, so the batch reading the last records reads them too (after
            # every event of the run) instead of a batch of their own after a drain.
            room = _marker_room(config.max_offsets_per_trigger, config.partitions)
            if state["markers_end"] is None and _input_reached(target, consumed, planned_offsets(checkpoint, config.topic), room):
                log.info("run %s: input planned to its end %s; writing end-of-input markers", config.run_id, target)
                state["markers_end"] = send_end_of_input(settings, config.topic, config.run_id)
                last_activity = time.monotonic()
            elif state["markers_end"] is not None and _covers(consumed, state["markers_end"]):
                counters = sink.counters
                # stop only once the batch that emitted the last windows is committed (its
                # progress is reported after the commit); stopping earlier leaves the state store
                # at the previous version and the batch would run again on a restart
                committed_ok = base + max(seen, default=-1) >= sink.last_batch_id
                if counters.accounted_events == counters.processed_events and committed_ok and switching is None:
                    log.info("run %s: all %d events accounted for; stopping", config.run_id, counters.processed_events,
                             extra=STEP)
                    state["outcome"] = "done"
                    return state
        if stop_requested.is_set():
            log.info("run %s: stop requested; stopping at the batch boundary", config.run_id, extra=STEP)
            state["outcome"] = "stopped"
            return state
        if switching is None and time.monotonic() >= next_poll:
            next_poll = time.monotonic() + 0.25
            try:
                request = control.pending()
            except Exception as exc:  # Redis restarting: switches wait, the job goes on
                log.warning("run %s: cannot read switch requests (%s)", config.run_id, exc)
                request = None
            if request is not None and request.get("step") == "requested" and _switch_held_for_markers(segment, state):
                request = None  # a test's failpoint: the switch waits until a batch has read the markers
            if request is not None and request.get("step") == "requested":
                log.info("run %s: switch %s requested: %s/P=%d -> %s/P=%s", config.run_id, request["switch_id"],
                         config.strategy, config.partitions, request["strategy_to"], request["partitions_to"], extra=STEP)
                state["outcome"] = "switch"
                state["switch_record"] = request
                return state
        if target is not None and time.monotonic() - last_activity > config.idle_timeout_s:
            raise JobError(f"no batch completed for {config.idle_timeout_s:.0f} s (consumed {consumed}, target {target})")
        time.sleep(0.1)


def _switch_held_for_markers(segment: dict[str, Any], state: dict[str, Any]) -> bool:
    """True while a test's failpoint holds the run's n-th switch (n = this segment's index + 1).

    `switch.after_markers_read@n`: until a completed batch has read the end-of-input markers, so
    that the next segment starts past them (`_watch` then writes markers again). Merely planned
    is not enough: a switch stops the query before a planned batch's sink runs, and the new query
    reads that batch's records again. `switch.before_markers_batch@n`: until the markers are
    written (`_hold_markers_batch` holds the batch planned to the input's end at the sink until
    the switch refuses it), so that the next segment finds them among its input and ignores
    them (`IngestContext.marker_floor`). Always False outside tests
    (`keyshift.processing.failpoints`)."""
    if FAILPOINT_ENV not in os.environ:
        return False
    number = int(segment["index"]) + 1
    if armed() == ("switch.after_markers_read", number):
        return state["markers_end"] is None or not _covers(state["consumed"], state["markers_end"])
    if armed() == ("switch.before_markers_batch", number):
        return state["markers_end"] is None
    return False


def _settle_switch_at_stop(control, switching: dict[str, Any], checkpoint: Path, config: FlightDelayJobConfig,
                           finish_switch) -> None:
    """A run stopped while switch `switching`'s new query ran: finish the switch if that query
    committed a batch and the switch was not verified yet; else leave it at step `published`,
    which the run finishes when it resumes (`_watch`), and say so.

    The stop waits for the batch in the sink (`stop_at_batch_boundary`), so a stop during the new
    query's first batch leaves that batch committed, and the switch can be verified now instead
    of staying unfinished while the run is stopped (a `keyshift switch` or DAG waiting on it would
    wait in vain). Redis unreachable at that moment (a restart) leaves the switch to the resumed
    run as well; the stop itself stands.

    Raises:
        JobError: the verification failed (`in_driver.verify_and_finish`; the switch is `failed`).
    """
    import redis

    from keyshift.migration.switch import FINAL_STATES

    try:
        record = control.current()
        if record is None or record.get("switch_id") != switching.get("switch_id") or record.get("state") in FINAL_STATES:
            return  # verified while the query ran
        committed = committed_batches(checkpoint, config.topic)[0]
        if not committed:
            log.warning("run %s: stopped before switch %s's new query committed a batch; the switch stays at step %s and "
                        "completes when the run resumes (keyshift job run ... --resume)", config.run_id, record["switch_id"],
                        record.get("step"))
            return
        log.info("run %s: stopped after switch %s's new query committed its first batch; verifying the switch",
                 config.run_id, record["switch_id"], extra=STEP)
        # the pause (the cost_aware trigger's migration cost) ends at that commit, not at the stop
        finish_switch(record, (checkpoint / "commits" / str(committed[0])).stat().st_mtime)
    except redis.RedisError as exc:
        log.warning("run %s: switch %s not verified at the stop (Redis: %s); it completes when the run resumes",
                    config.run_id, switching.get("switch_id"), exc)


def _hold_new_query_batch(sink, segment: dict[str, Any], switching: dict[str, Any] | None) -> None:
    """Failpoint `switch.hold_first_batch@n` (n = this segment's index, the run's n-th switch): the
    sink holds the first batch of switch n's new query for `HOLD_SECONDS` after its outputs, so
    that a stop asked meanwhile comes before the switch is verified. A no-op outside tests."""
    if FAILPOINT_ENV in os.environ and switching is not None and armed() == ("switch.hold_first_batch", int(segment["index"])):
        sink.hold_after_outputs_of = int(segment["batch_base"])


def _hold_markers_batch(sink, segment: dict[str, Any], config: FlightDelayJobConfig, target: dict[int, int] | None,
                        checkpoint: Path) -> None:
    """Failpoint `switch.before_markers_batch@n` (n = this segment's index + 1): the sink holds
    the batch planned to the input's end (the one after which the driver writes the markers)
    until switch n's barrier refuses it, so that the cut comes right before it. A no-op outside
    tests and in runs without `--limit`."""
    if FAILPOINT_ENV not in os.environ or target is None or armed() != ("switch.before_markers_batch", int(segment["index"]) + 1):
        return
    room = _marker_room(config.max_offsets_per_trigger, config.partitions)
    sink.hold_until_barrier = lambda: _input_reached(target, {}, planned_offsets(checkpoint, config.topic), room)


def _with_default_stateful_partitions(config: FlightDelayJobConfig, spark: SparkSession | None, master: str) -> FlightDelayJobConfig:
    """`config` with `max_stateful_partitions` = `default_max_stateful_partitions` of the engine's
    cores: the session's default parallelism when it runs already, else a local master's
    (`local_master_cores`). On a cluster master not started yet the cap stays None (S = P)."""
    from keyshift.placement.tokens import default_max_stateful_partitions
    from keyshift.stack.spark import local_master_cores

    cores = spark.sparkContext.defaultParallelism if spark is not None else local_master_cores(master)
    if cores is None:
        return config
    config = replace(config, max_stateful_partitions=default_max_stateful_partitions(cores))
    log.info("run %s: %d slots on %d stateful partitions (at most %d: %d per core of %d)", config.run_id, config.partitions,
             config.stateful_partitions, config.max_stateful_partitions, config.max_stateful_partitions // cores, cores, extra=STEP)
    return config


def _with_learned_assignment(settings: Settings, config: FlightDelayJobConfig) -> FlightDelayJobConfig:
    """`config` with the assignment and epoch published in Redis under the input topic's name.

    Raises:
        ConfigurationError: the published assignment is another strategy's, for another P, or
            per bucket (the job places keys).
        PlacementError: nothing is published under the topic's name.
    """
    from keyshift.placement.assignment_store import AssignmentStore

    snapshot = AssignmentStore.from_settings(settings, config.topic).snapshot()
    if snapshot["strategy"] != config.strategy or snapshot["partitions"] != config.partitions or snapshot["buckets"]:
        raise ConfigurationError(
            f"the assignment published for {config.topic!r} is {snapshot['strategy']} over {snapshot['partitions']} slots"
            f" (buckets {snapshot['buckets']}); the job asks for {config.strategy} over {config.partitions} slots per key"
        )
    split = {key: tuple(slots) for key, slots in (snapshot.get("split") or {}).items()}
    log.info(
        "run %s: %s assignment of %d keys (%d split: %s), epoch %d, from Redis",
        config.run_id, config.strategy, len(snapshot["mapping"]), len(split),
        ", ".join(f"{key} on {list(slots)}" for key, slots in sorted(split.items())) or "none", snapshot["epoch"],
    )
    return replace(
        config, assignment=dict(snapshot["mapping"]), epoch=int(snapshot["epoch"]), redis_url=settings.redis_url,
        split=split or None,
    )


def _task_time_summary(times: dict[str, dict[str, list[float]]], partitions: int, stateful_partitions: int | None = None,
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
    config: FlightDelayJobConfig,
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
        "strategy": config.strategy,
        "partitions": config.partitions,
        "epoch": config.epoch,
        "topic": config.topic,
        "bound_ms": config.bound_ms,
        "watermark": config.watermark,
        "watermark_policy": asdict(config.watermark_policy),
        "window_ms": config.window_ms,
        "max_offsets_per_trigger": config.max_offsets_per_trigger,
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
        "split_keys": {key: list(slots) for key, slots in sorted((config.split or {}).items())},
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
        "end_offsets": {str(p): o for p, o in sorted((config.end_offsets or {}).items())} or None,
        "job": config.job,
        "window": config.spec.window,
    }
    if config.spec.key_windows:
        summary.update(_key_window_summary(config, sink))
    return summary


def _attempts_summary(recorder: RunRecorder, events_read: int, seconds: float) -> dict[str, Any]:
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


def _key_window_summary(config: FlightDelayJobConfig, sink: KeyWindowSink) -> dict[str, Any]:
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


class StopSignals:
    """How a run's driver answers SIGTERM and Ctrl-C (SIGINT): stop at the next batch boundary.

    The first SIGTERM or SIGINT sets `event`; the run's watch loop then stops the query at a batch
    boundary and writes the summary (state `stopped`, exit status 0), as Spark's
    `StreamingQuery.stop` after a completed batch would. A second SIGINT stops at once, saying so:
    it raises KeyboardInterrupt in the main thread, the process ends like a crash and `--resume`
    continues the run exactly (the checkpoint, ledger and side-output transactions hold). A
    second SIGTERM changes nothing (a supervisor repeating its request).

    pyspark installs a SIGINT handler of its own whenever a SparkContext is made (it cancels every
    running job: the batch in flight fails mid-way), so `install` is called again right after the
    session is built; the driver JVM runs in its own process group, so a terminal's Ctrl-C reaches
    this process only (`keyshift.processing.session.build_spark_session`). Handlers can only be
    set from the main thread: elsewhere (a test's thread) `install` does nothing.

    Args:
        run_id: named in the log lines.
    """

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.event = threading.Event()
        self._previous: dict[int, Any] | None = None

    def install(self) -> None:
        """Make this object the SIGTERM and SIGINT handler (again); the first call remembers the
        handlers it replaces, for `restore`."""
        if threading.current_thread() is not threading.main_thread():
            return
        previous = {sig: signal.signal(sig, self._handle) for sig in (signal.SIGTERM, signal.SIGINT)}
        if self._previous is None:
            self._previous = previous

    def restore(self) -> None:
        """Put back the handlers `install` replaced first."""
        for sig, handler in (self._previous or {}).items():
            signal.signal(sig, handler)
        self._previous = None

    def _handle(self, signum: int, frame) -> None:
        name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
        if not self.event.is_set():
            self.event.set()
            log.warning("run %s: %s: stopping at the next batch boundary (the summary follows)%s", self.run_id, name,
                        "; Ctrl-C again stops at once" if signum == signal.SIGINT else "")
            return
        if signum == signal.SIGINT:
            log.warning("run %s: Ctrl-C again: stopping at once, without a summary; continue the run with "
                        "`keyshift job run --resume %s`", self.run_id, self.run_id)
            raise KeyboardInterrupt
