"""The aligned Kafka source: Kafka rows whose micro-batches keep partitions within a drift in event time.

Spark's Kafka source plans a micro-batch's offsets in proportion to each partition's remaining
records and takes no per-partition limit, so it cannot pause a partition that runs ahead in event
time. With `--max-partition-drift-ms D` keyshift reads its input with this source instead: a
streaming Python data source (Spark 4.2, `pyspark.sql.datasource.DataSourceStreamReader` with
admission control) registered as `keyshift_kafka`, which plans each batch's end offsets by
`keyshift.eventtime.alignment.aligned_ends` (Flink's watermark alignment, FLIP-182) and reads
them with kafka-python.

It gives the same rows as Spark's Kafka source (`key`, `value`, `topic`, `partition`, `offset`,
`timestamp`, `timestampType`) and the same offset JSON (`{topic: {"<partition>": offset}}`), so
Spark's offset log, the run's records read, its end-of-input markers and the switch's start
offsets read it unchanged; a replayed batch reads the offsets Spark logged for it. One task reads
one partition's slice of a batch.

Costs (measured by `keyshift bench drift`): planning probes the event time at a few dozen offsets
per partition and batch (`KafkaProbe`, one fetch each, cached per batch), and the rows are
decoded by kafka-python in the Python workers instead of Spark's JVM consumer.

The planner (`latestOffset`) runs in a Python worker that Spark starts beside the driver for the
query's life; it logs each plan to that worker's stderr.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

from keyshift.eventtime.alignment import aligned_ends

log = logging.getLogger(__name__)

FORMAT = "keyshift_kafka"
"""The short name the aligned source is registered under (`spark.readStream.format(FORMAT)`)."""

KAFKA_SCHEMA = "key binary, value binary, topic string, partition int, offset long, timestamp timestamp, timestampType int"
"""The rows of Spark's Kafka source, which this source gives too."""

ARROW_SCHEMA = pa.schema([
    pa.field("key", pa.binary()), pa.field("value", pa.binary()), pa.field("topic", pa.string()),
    pa.field("partition", pa.int32()), pa.field("offset", pa.int64()), pa.field("timestamp", pa.timestamp("us", tz="UTC")),
    pa.field("timestampType", pa.int32()),
])

ROWS_PER_ARROW_BATCH = 10_000
"""Rows per Arrow batch a read task yields (Spark's `maxRecordsPerBatch` default)."""


def event_time_of(value: bytes | None, field: str) -> int | None:
    """The event time (ms) in a JSON record's `field`, None when the record has no integer there
    (not JSON, a control record, a bad value)."""
    if not value:
        return None
    try:
        record = json.loads(value)
    except (ValueError, UnicodeDecodeError):
        return None
    t = record.get(field) if isinstance(record, dict) else None
    return t if isinstance(t, int) and not isinstance(t, bool) and t >= 0 else None


class KafkaProbe:
    """`time_at` for `aligned_ends` on a Kafka topic: the event time at an offset, by one fetch.

    A fetch at offset o returns a run of records from o (up to `max_poll_records`); the event times
    of all of them are cached until `clear`, so the probes of a binary search that land in a
    fetched run cost nothing.

    Args:
        consumer: a kafka-python `KafkaConsumer` without a group (the planner's own).
        topic: the topic. field: the records' event-time field (JSON name).
    """

    def __init__(self, consumer, topic: str, field: str) -> None:
        self.consumer, self.topic, self.field = consumer, topic, field
        self.cache: dict[tuple[int, int], int | None] = {}
        self.fetches = 0

    def clear(self) -> None:
        """Forget the cached event times (before planning the next batch)."""
        self.cache.clear()

    def __call__(self, partition: int, offset: int) -> int | None:
        key = (partition, offset)
        if key not in self.cache:
            self._fetch(partition, offset)
        return self.cache.get(key)

    def _fetch(self, partition: int, offset: int) -> None:
        from kafka import TopicPartition

        tp = TopicPartition(self.topic, partition)
        self.consumer.assign([tp])
        self.consumer.seek(tp, offset)
        self.fetches += 1
        for _ in range(50):
            records = self.consumer.poll(timeout_ms=200, max_records=100).get(tp, [])
            if records:
                for record in records:
                    self.cache[(partition, record.offset)] = event_time_of(record.value, self.field)
                # a compacted or deleted offset: it has no record, so no event time
                self.cache.setdefault((partition, offset), None)
                return
        self.cache[(partition, offset)] = None


@dataclass(frozen=True)
class PartitionSlice(InputPartition):
    """One task of a batch: records [start, end) of one Kafka partition."""

    topic: str
    partition: int
    start: int
    end: int


def consumer_options(options: Mapping[str, str]) -> dict:
    """kafka-python `KafkaConsumer` arguments from the source's options: `bootstrap` and the
    security options (`client`, a JSON object of `keyshift.kafka_clients.client_options`)."""
    return {"bootstrap_servers": options["bootstrap"], "enable_auto_commit": False, **json.loads(options.get("client", "{}"))}


class AlignedKafkaReader(DataSourceStreamReader):
    """The stream reader of `AlignedKafkaSource` (module docstring).

    Options (strings): `bootstrap`, `client` (see `consumer_options`), `topic`,
    `startingOffsets` (a JSON object partition -> offset; partitions not in it start at their
    beginning), `maxOffsetsPerTrigger` (records per batch, optional), `maxPartitionDriftMs` (ms of
    event time), `eventTimeField` (the records' JSON field of event time in ms).
    """

    def __init__(self, options: Mapping[str, str]) -> None:
        # Spark's data source options are case-insensitive: it hands them over in lower case
        self.options = {str(k).lower(): v for k, v in dict(options).items()}
        self.topic = self.options["topic"]
        self.max_drift_ms = int(self.options["maxpartitiondriftms"])
        self.max_records = int(self.options["maxoffsetspertrigger"]) if self.options.get("maxoffsetspertrigger") else None
        self._consumer = None
        self._probe: KafkaProbe | None = None

    def __getstate__(self) -> dict:
        # the reader is pickled to the read tasks; the planner's consumer stays behind
        return {**self.__dict__, "_consumer": None, "_probe": None}

    def _client(self):
        if self._consumer is None:
            from kafka import KafkaConsumer

            self._consumer = KafkaConsumer(client_id="keyshift-aligned-planner", max_poll_records=100, fetch_max_wait_ms=10,
                                           max_partition_fetch_bytes=32 << 10,
                                           **consumer_options(self.options))
            self._probe = KafkaProbe(self._consumer, self.topic, self.options["eventtimefield"])
        return self._consumer

    def _offsets(self) -> tuple[dict[int, int], dict[int, int]]:
        from kafka import TopicPartition

        consumer = self._client()
        partitions = consumer.partitions_for_topic(self.topic) or set()
        tps = [TopicPartition(self.topic, p) for p in sorted(partitions)]
        begin = {tp.partition: o for tp, o in consumer.beginning_offsets(tps).items()}
        end = {tp.partition: o for tp, o in consumer.end_offsets(tps).items()}
        return begin, end

    def _wrap(self, offsets: Mapping[int, int]) -> dict:
        return {self.topic: {str(p): int(o) for p, o in sorted(offsets.items())}}

    def _unwrap(self, offsets: Mapping) -> dict[int, int]:
        return {int(p): int(o) for p, o in offsets.get(self.topic, {}).items()}

    def initialOffset(self) -> dict:
        """The run's start: `startingOffsets`, the beginning for partitions it does not list."""
        begin, _ = self._offsets()
        given = {int(p): int(o) for p, o in json.loads(self.options.get("startingoffsets", "{}")).items()}
        return self._wrap({p: given.get(p, o) for p, o in begin.items()})

    def getDefaultReadLimit(self):
        """`maxOffsetsPerTrigger` as Spark's `ReadMaxRows`, or all available."""
        from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

        return ReadMaxRows(self.max_records) if self.max_records else ReadAllAvailable()

    def latestOffset(self, start: dict, limit) -> dict:
        """The batch's end offsets: `aligned_ends` of the records available now, within `limit`."""
        from pyspark.sql.streaming.datasource import ReadMaxRows

        import time

        began = time.monotonic()
        begin, latest = self._offsets()
        first = self._unwrap(start)
        first = {p: first.get(p, begin.get(p, 0)) for p in latest}
        max_records = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        self._probe.clear()
        fetches = self._probe.fetches
        ends, frontier = aligned_ends(first, latest, max_records, self.max_drift_ms, self._probe)
        paused = sorted(p for p in first if ends[p] == first[p] < latest[p])
        log.info("aligned batch of %s: %d records, slowest partition at %s ms, paused %s, %d probes in %.2f s", self.topic,
                 sum(ends[p] - first[p] for p in first), frontier, paused, self._probe.fetches - fetches, time.monotonic() - began)
        return self._wrap(ends)

    def reportLatestOffset(self) -> dict | None:
        """The topic's end offsets now (Spark's progress `latestOffset`)."""
        return self._wrap(self._offsets()[1])

    def partitions(self, start: dict, end: dict) -> list[PartitionSlice]:
        """One `PartitionSlice` per partition with records in [start, end)."""
        first, last = self._unwrap(start), self._unwrap(end)
        return [PartitionSlice(self.topic, p, first.get(p, 0), o) for p, o in sorted(last.items()) if o > first.get(p, 0)]

    def read(self, partition: PartitionSlice) -> Iterator[pa.RecordBatch]:
        """The records of one slice, in offset order, as Arrow batches of `ARROW_SCHEMA`.

        Raises:
            RuntimeError: the slice's records are not in Kafka (deleted by retention since the
                batch was planned): the batch cannot be read as planned.
        """
        from kafka import KafkaConsumer, TopicPartition

        tp = TopicPartition(partition.topic, partition.partition)
        consumer = KafkaConsumer(client_id="keyshift-aligned-reader", max_poll_records=20_000, fetch_max_wait_ms=10,
                                 max_partition_fetch_bytes=8 << 20, **consumer_options(self.options))
        try:
            consumer.assign([tp])
            consumer.seek(tp, partition.start)
            position, idle = partition.start, 0
            rows: dict[str, list] = {name: [] for name in ARROW_SCHEMA.names}
            while position < partition.end:
                records = consumer.poll(timeout_ms=500).get(tp, [])
                if not records:
                    idle += 1
                    if idle > 120:
                        raise RuntimeError(f"{partition.topic}[{partition.partition}]: no records at offset {position} "
                                           f"(planned up to {partition.end}) for 60 s")
                    continue
                idle = 0
                for record in records:
                    if record.offset >= partition.end:
                        break
                    rows["key"].append(record.key)
                    rows["value"].append(record.value)
                    rows["offset"].append(record.offset)
                    rows["timestamp"].append(record.timestamp * 1000)
                    rows["timestampType"].append(record.timestamp_type)
                    position = record.offset + 1
                    if len(rows["offset"]) >= ROWS_PER_ARROW_BATCH:
                        yield _arrow_batch(rows, partition)
                        rows = {name: [] for name in ARROW_SCHEMA.names}
            if rows["offset"]:
                yield _arrow_batch(rows, partition)
        finally:
            consumer.close()

    def commit(self, end: dict) -> None:
        """Nothing to do: Spark's checkpoint holds the offsets."""

    def stop(self) -> None:
        """Close the planner's consumer."""
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None


def _arrow_batch(rows: dict[str, list], partition: PartitionSlice) -> pa.RecordBatch:
    n = len(rows["offset"])
    return pa.RecordBatch.from_arrays([
        pa.array(rows["key"], pa.binary()), pa.array(rows["value"], pa.binary()),
        pa.array([partition.topic] * n, pa.string()), pa.array([partition.partition] * n, pa.int32()),
        pa.array(rows["offset"], pa.int64()), pa.array(rows["timestamp"], pa.timestamp("us", tz="UTC")),
        pa.array(rows["timestampType"], pa.int32()),
    ], schema=ARROW_SCHEMA)


class AlignedKafkaSource(DataSource):
    """The `keyshift_kafka` streaming data source (module docstring); register it with
    `spark.dataSource.register(AlignedKafkaSource)`."""

    @classmethod
    def name(cls) -> str:
        """`FORMAT`."""
        return FORMAT

    def schema(self) -> str:
        """`KAFKA_SCHEMA`."""
        return KAFKA_SCHEMA

    def streamReader(self, schema) -> AlignedKafkaReader:
        """An `AlignedKafkaReader` with the source's options."""
        return AlignedKafkaReader(self.options)
