"""A run's Kafka input: where it starts, where a bounded run ends, its end-of-input markers, the source.

The driver resolves the start offsets (`starting_offsets`, `concrete_offsets`), learns a bounded
run's end (`InputEnd`; `wait_for_records` with `--wait-for-input`), writes the end-of-input markers
once a planned batch reaches that end (`input_reached`, `send_end_of_input`) and builds the Kafka
source (`read_kafka`). Split out of `keyshift.runtime.driver`.
"""

from __future__ import annotations

import json
import logging
import threading
import time

from kafka import KafkaProducer
from pyspark.sql import SparkSession

from keyshift.console import STEP
from keyshift.errors import JobError
from keyshift.names import ALERTS_TOPIC, DEAD_LETTER_TOPIC, LATE_TOPIC, SINK_COMMITS_TOPIC
from keyshift.kafka_clients import client_options, spark_options
from keyshift.topics import end_of_input_marker
from keyshift.settings import Settings


log = logging.getLogger(__name__)

END_OF_INPUT_EVENT_TIME_MS = 253_402_300_799_000
"""9999-12-31T23:59:59Z: the event time of an end-of-input marker, past every real event."""


def covers(consumed: dict[int, int], target: dict[int, int]) -> bool:
    """Whether `consumed` (partition -> next offset to read) reaches every offset of `target`
    (partition -> offset); a partition missing from `consumed` reaches nothing."""
    return all(consumed.get(partition, -1) >= offset for partition, offset in target.items())


def input_reached(target: dict[int, int], consumed: dict[int, int], planned: dict[int, int], room: int | None = 0) -> bool:
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


def marker_room(max_offsets_per_trigger: int | None, partitions: int) -> int | None:
    """Records of the run's input that may still be unread when its end-of-input markers go out:
    as many as the next batch takes beside the markers (one per partition), so that the batch
    reading the last records reads the markers too and the run needs no batch of markers alone
    (`maxOffsetsPerTrigger` counts the markers). None: no limit per batch."""
    if max_offsets_per_trigger is None:
        return None
    return max(0, int(max_offsets_per_trigger) - int(partitions))


def kafka_offsets(settings: Settings, topic: str) -> tuple[dict[int, int], dict[int, int]]:
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


def wait_for_records(
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
    reaches it (`input_reached`). The end is fixed in the job record (a resume keeps it) and in
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
        end = kafka_offsets(self.settings, self.topic)[1]
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
    return kafka_offsets(settings, topic)[1]


def concrete_offsets(settings: Settings, topic: str, start: dict[int, int] | str) -> dict[int, int]:
    """`start` (`earliest`, `latest`, or offsets of some partitions) as an offset for every
    partition of `topic` now, so a run records exactly where it began (records read = offsets
    consumed past it) and a resume does not depend on what the topic holds later."""
    begin, end = kafka_offsets(settings, topic)
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


def read_kafka(spark: SparkSession, settings: Settings, topic: str, start: dict[int, int] | str, max_offsets_per_trigger: int | None,
               max_partition_drift_ms: int | None = None, event_time_field: str = "event_time"):
    """The Kafka source of `topic` from `start` (a streaming DataFrame of Kafka rows).

    Spark's Kafka source with `kafka.max.poll.records` 20,000 and `kafka.fetch.max.wait.ms`
    `FETCH_MAX_WAIT_MS`; with `max_partition_drift_ms` keyshift's aligned Kafka source
    (`keyshift.processing.sources.aligned_kafka`, the same rows and offsets), which pauses partitions that
    run more than that ahead in event time (read from the records' `event_time_field`, ms).

    Raises:
        JobError: `max_partition_drift_ms` with a `start` that is not concrete offsets.
    """
    if max_partition_drift_ms is not None:
        from keyshift.kafka_clients import client_options
        from keyshift.processing.sources.aligned_kafka import FORMAT, AlignedKafkaSource

        if isinstance(start, str):
            raise JobError(f"the aligned Kafka source starts at concrete offsets, not {start!r} (see concrete_offsets)")
        spark.dataSource.register(AlignedKafkaSource)
        reader = (
            spark.readStream.format(FORMAT)
            .option("bootstrap", settings.bootstrap_servers)
            .option("client", json.dumps(client_options(settings)))
            .option("topic", topic)
            .option("startingOffsets", json.dumps({str(p): o for p, o in start.items()}))
            .option("maxPartitionDriftMs", str(int(max_partition_drift_ms)))
            .option("eventTimeField", event_time_field)
        )
        if max_offsets_per_trigger:
            reader = reader.option("maxOffsetsPerTrigger", str(max_offsets_per_trigger))
        return reader.load()
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
