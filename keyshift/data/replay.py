"""Replay the flights into Kafka in event-time order, one JSON record per flight, keyed by origin.

Record format (one per row of flights-3m, in file order, which is event-time order, or in arrival
order under disorder, below):

* key: the origin airport code, UTF-8 (e.g. `b"ORD"`);
* value: compact JSON `{"event_id": int, "origin": str, "destination": str, "delay_min": int,
  "distance_mi": int, "event_time": int}` where `event_id` is the row number in the file
  (0..2,999,999, stable across replays) and `event_time` is the flight's `date` in epoch
  milliseconds UTC (the file's naive timestamps are UTC);
* partition: the slot the placement strategy gives the record, set explicitly on every record:
  the key's slot (`hash`: Kafka's murmur2 default), or, for a key that a hot_split assignment
  spreads over k slots, `slots[event_id % k]` (per event; the job uses the same rule, so each
  record lands in the Kafka partition equal to its Spark slot);
* Kafka timestamp: the producer's wall clock (CreateTime). Event time travels in the value only:
  2001 timestamps as record timestamps would make the broker's time-based retention (7 days by
  default) delete the data at once.

Disorder (`disorder` > 0; paper 000 Table 10): whole sources (origins) are made late by
`keyshift.data.disorder.plan_disorder`, so that the fraction asked of the events arrives out of
event-time order while every origin keeps its own order. Records are then produced in arrival
order (each partition's records in arrival order; `--rate` paces the arrival order) and a late
origin with a skewed clock writes `event_time` = its true time + its clock offset (ms). The plan
(late origins with their delay and offset, the achieved out-of-order fraction) is stored in the
replay's Redis record, so the true times and the arrival order can be recomputed from what Kafka
holds. Without disorder nothing changes: file order, true times, the code path of before.

Throughput: kafka-python spends tens of microseconds of Python per `send`, so the replayer
(1) builds all JSON values of a batch with Arrow string kernels instead of `json.dumps` per row
(about 8x faster), (2) places rows with one lookup per distinct key (split keys: one numpy
gather per batch over the event ids), (3) compresses batches with
zstd (kafka-python checksums each batch in pure Python unless the `crc32c` package is installed;
compression shrinks what it has to checksum), turns producer metrics off, and (4) splits the
partitions over worker processes, each producing its own partitions in file order (arrival
order under disorder), so order within a partition is kept. With `rate` set, a token bucket holds
each worker to its share of the rate.
"""

from __future__ import annotations

import json
import logging
import os
import queue as queue_module
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import redis
from kafka import KafkaProducer
from kafka.errors import KafkaError
from tqdm import tqdm

from keyshift.data.disorder import (
    DEFAULT_SOURCE_DELAY_S,
    DisorderPlan,
    encode_sources,
    plan_disorder,
    validate_disorder,
)
from keyshift.data.flights import FLIGHTS_3M, flights_path
from keyshift.errors import ConfigurationError, DataError, PlacementError, StackError
from keyshift.names import redis_replay_key
from keyshift.placement.learning import LEARNED_STRATEGIES, published_assignment
from keyshift.placement.strategies import SlotCache, Strategy, place_events, strategy_by_name
from keyshift.settings import Settings
from keyshift.topics import TopicInfo, count_end_of_input_markers, describe_topics, end_offsets, kafka_config

log = logging.getLogger(__name__)

RECORD_FIELDS = ("event_id", "origin", "destination", "delay_min", "distance_mi", "event_time")
"""Fields of a flight record's JSON value, in the order they are written."""

PRODUCER_CONFIG: dict[str, object] = {
    "acks": "all",
    "enable_idempotence": True,  # a retried batch is never written twice
    "compression_type": "zstd",
    "linger_ms": 50,
    "batch_size": 512 * 1024,
    "max_request_size": 8 * 1024 * 1024,
    "metrics_enabled": False,
    "allow_auto_create_topics": False,
}
"""kafka-python producer settings of the replayer (measured; see the module docstring)."""

READ_BATCH_ROWS = 65_536
"""Rows read, encoded and sent per step (events)."""

_PROGRESS_EVERY = 8_192

DISORDER_TOLERANCE = 0.02
"""Largest miss |achieved - asked| of the out-of-order fraction a replay accepts (a fraction of the
events); a plan that misses by more is refused before anything is produced. On the flights the
miss is below 0.001 from about 50,000 flights on, with source delays of a minute or more."""


@dataclass(frozen=True)
class ReplayResult:
    """What one replay produced.

    Attributes:
        topic: the topic written.
        strategy: name of the placement strategy; epoch: its assignment epoch.
        partitions: P, partitions of the topic.
        events_produced: records acknowledged by the broker (events).
        per_partition: partition -> records produced to it by this replay (events).
        end_offsets: partition -> end offset after the replay (records in the partition).
        seconds: wall time from the first send to the last acknowledgement (s).
        workers: producer processes used.
        split_keys: key -> its slots, for the keys placed per event (`slots[event_id % k]`;
            hot_split only, else empty).
        disorder: the disorder plan the replay followed (late origins, their delays and clock
            offsets, the achieved out-of-order fraction); None without disorder (file order).
    """

    topic: str
    strategy: str
    epoch: int
    partitions: int
    events_produced: int
    per_partition: dict[int, int]
    end_offsets: dict[int, int]
    seconds: float
    workers: int
    split_keys: dict[str, list[int]] = field(default_factory=dict)
    disorder: DisorderPlan | None = None

    @property
    def events_per_s(self) -> float:
        """Throughput of the replay (events/s); 0 when nothing was produced."""
        return self.events_produced / self.seconds if self.seconds > 0 else 0.0


class TokenBucket:
    """Token bucket holding a sender to `rate` events/s on average, with bursts up to `burst`.

    `take(n)` spends n tokens and sleeps while the balance is negative, so over any long span
    at most `rate * span + burst` events pass.

    Args:
        rate: events/s, > 0.
        burst: bucket size (events), >= 1; default a tenth of a second of events.
        clock, sleep: time source (s) and sleeper, injectable for tests.

    Raises:
        ConfigurationError: if rate <= 0 or burst < 1.
    """

    def __init__(
        self,
        rate: float,
        burst: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not rate > 0:
            raise ConfigurationError(f"rate must be > 0 events/s, got {rate!r}")
        self.rate = float(rate)
        self.burst = float(burst) if burst is not None else max(1.0, self.rate / 10)
        if self.burst < 1:
            raise ConfigurationError(f"burst must be >= 1 event, got {burst!r}")
        self._clock, self._sleep = clock, sleep
        self._tokens = self.burst
        self._last = clock()

    def take(self, n: int) -> None:
        """Spend `n` tokens (events); sleep until the bucket is no longer in debt."""
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate) - n
        self._last = now
        if self._tokens < 0:
            self._sleep(-self._tokens / self.rate)


def event_time_ms(dates: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Event times as epoch milliseconds UTC (int64), floored, from an Arrow timestamp column.

    Naive timestamps are taken as UTC; zoned ones are stored as UTC by Arrow already.

    Raises:
        DataError: if `dates` is not a timestamp column.
    """
    if not pa.types.is_timestamp(dates.type):
        raise DataError(f"event time column must be a timestamp, got {dates.type}")
    micros = pc.cast(dates, pa.timestamp("us", tz=dates.type.tz)).cast(pa.int64())
    return np.floor_divide(micros.to_numpy(), 1000)


def json_strings(column: pa.Array) -> pa.Array:
    """Each string as a JSON string literal (quoted, escaped), escaping each distinct value once."""
    encoded = pc.dictionary_encode(column)
    if isinstance(encoded, pa.ChunkedArray):
        encoded = encoded.combine_chunks()
    literals = pa.array([json.dumps(s) for s in encoded.dictionary.to_pylist()], pa.string())
    return literals.take(encoded.indices)


def json_objects(columns: list[tuple[str, pa.Array]]) -> list[bytes]:
    """Compact JSON objects, one per row, from columns of JSON literals (Arrow kernels, no per-row Python).

    Args:
        columns: (field name, its values as JSON text: `json_strings(...)` for strings,
            `pc.cast(ints, pa.string())` for integers), in the order the fields are written;
            every array of the same length.

    Returns:
        UTF-8 bytes per row, e.g. `b'{"event_id":0,"origin":"LAS"}'`.
    """
    parts: list[object] = []
    for index, (name, literals) in enumerate(columns):
        parts += [("{" if index == 0 else ",") + json.dumps(name) + ":", literals]
    return pc.binary_join_element_wise(*parts, "}", "").cast(pa.binary()).to_pylist()


def encode_values(
    batch: pa.RecordBatch | pa.Table, event_ids: np.ndarray, event_times: np.ndarray | None = None
) -> list[bytes]:
    """The JSON value of each flight in `batch`, as UTF-8 bytes, vectorized with Arrow kernels.

    Args:
        batch: rows with columns date (timestamp), delay (int, minutes), distance (int, miles),
            origin (str), destination (str).
        event_ids: the event id of each row (int64, same length as `batch`).
        event_times: the `event_time` to write per row (int64 epoch ms, same length as
            `batch`), e.g. times stamped by a skewed clock; None = the date column's
            (`event_time_ms`).

    Returns:
        One compact JSON object per row, fields in `RECORD_FIELDS` order, e.g.
        `b'{"event_id":0,"origin":"LAS","destination":"PHL","delay_min":33,"distance_mi":2176,'
        b'"event_time":978307260000}'`.

    Raises:
        DataError: if a column is missing, holds nulls, or `event_ids` has another length.
    """
    if len(event_ids) != batch.num_rows:
        raise DataError(f"{len(event_ids)} event ids for {batch.num_rows} rows")
    if event_times is not None and len(event_times) != batch.num_rows:
        raise DataError(f"{len(event_times)} event times for {batch.num_rows} rows")
    for name in FLIGHTS_3M.columns:
        if name not in batch.schema.names:
            raise DataError(f"flights batch lacks column {name!r} (has {batch.schema.names})")
        if batch.column(name).null_count:
            raise DataError(f"flights column {name!r} holds {batch.column(name).null_count} nulls")
    if batch.num_rows == 0:
        return []
    times = event_time_ms(batch.column("date")) if event_times is None else np.asarray(event_times, dtype=np.int64)
    return json_objects([
        ("event_id", pa.array(np.asarray(event_ids, dtype=np.int64)).cast(pa.string())),
        ("origin", json_strings(batch.column("origin"))),
        ("destination", json_strings(batch.column("destination"))),
        ("delay_min", pc.cast(batch.column("delay"), pa.int64()).cast(pa.string())),
        ("distance_mi", pc.cast(batch.column("distance"), pa.int64()).cast(pa.string())),
        ("event_time", pa.array(times).cast(pa.string())),
    ])


def iter_flight_batches(
    path: Path, limit: int | None = None, batch_rows: int = READ_BATCH_ROWS
) -> Iterator[tuple[int, pa.RecordBatch]]:
    """Read the flights file in file order: (event id of the first row, batch) pairs.

    The file is sorted by `date`; this checks it stays so (each date >= the previous one) and
    stops after `limit` rows.

    Raises:
        DataError: if the rows are not in event-time order.
    """
    first = 0
    last_ms: int | None = None
    parquet = pq.ParquetFile(path)
    for batch in parquet.iter_batches(batch_size=batch_rows, columns=list(FLIGHTS_3M.columns)):
        if limit is not None and first + batch.num_rows > limit:
            batch = batch.slice(0, limit - first)
        if batch.num_rows == 0:
            return
        times = event_time_ms(batch.column("date"))
        if (last_ms is not None and times[0] < last_ms) or bool(np.any(np.diff(times) < 0)):
            raise DataError(f"{path} is not sorted by date near row {first}; replay needs event-time order")
        last_ms = int(times[-1])
        yield first, batch
        first += batch.num_rows
        if limit is not None and first >= limit:
            return


def plan_slots(path: Path, strategy: Strategy, limit: int | None = None) -> tuple[dict[str, int], np.ndarray]:
    """Place every distinct origin once and count the events each slot will get (key-affine only).

    Returns:
        (origin -> slot, events per slot as an int64 array of length P).

    Raises:
        PlacementError: if the strategy cannot place a key (e.g. it is not key-affine).
    """
    origins = pq.read_table(path, columns=["origin"]).column("origin")
    if limit is not None:
        origins = origins.slice(0, limit)
    cache = SlotCache(strategy)
    counts = np.zeros(strategy.partitions, dtype=np.int64)
    slot_by_key: dict[str, int] = {}
    for entry in pc.value_counts(origins).to_pylist():
        slot = slot_by_key[entry["values"]] = cache.slot_of(entry["values"])
        counts[slot] += entry["counts"]
    return slot_by_key, counts


@dataclass(frozen=True)
class PlacementPlan:
    """Where a replay sends each record, decided once before producing.

    Attributes:
        slot_by_key: origin -> its slot (a split key's first slot).
        split_by_key: origin -> its slots (piece i on element i), only keys spread over two
            slots or more; their records go to `slots[event_id % k]` (`event_slots`).
        counts: events per slot (int64 array of length P), counted per event for split keys.
    """

    slot_by_key: dict[str, int]
    split_by_key: dict[str, tuple[int, ...]]
    counts: np.ndarray


def event_slots(
    keys: list[str], codes: np.ndarray, event_ids: np.ndarray, slot_by_key: dict[str, int], split_by_key: dict
) -> np.ndarray:
    """The slot of each event: the key's slot, or `slots[event_id % k]` for a split key
    (`keyshift.placement.strategies.place_events`, the rule the job applies too).

    Args:
        keys: the distinct keys of a batch (a dictionary). codes: int array, each event's index
            into `keys`. event_ids: int64 array, each event's id (its row number in the file).
        slot_by_key: key -> slot, for every key in `keys`.
        split_by_key: key -> its slots (sequence of >= 2 ints), for the split keys only.

    Returns:
        int64 array of slots, one per event.

    Raises:
        KeyError: a key of `keys` missing from `slot_by_key`.
    """
    key_slots = np.fromiter((slot_by_key[k] for k in keys), dtype=np.int64, count=len(keys))
    pieces = {code: split_by_key[k] for code, k in enumerate(keys) if k in split_by_key}
    return place_events(codes, event_ids, key_slots, pieces)


def place_keys(strategy: Strategy, keys: Iterable[str]) -> tuple[dict[str, int], dict[str, tuple[int, ...]]]:
    """Place each distinct key once: its slot, and its slots when the strategy spreads it.

    A key-affine strategy places per key (`SlotCache`). A strategy with `slots_of(key)`
    (hot_split, round_robin, or a `CachedAssignment` of a published hot_split assignment) gives
    each key's slots; a key with k >= 2 slots is then placed per event, `slots[event_id % k]`
    (`event_slots`).

    Args:
        strategy: the placer. keys: the distinct keys (str), each placed once, in this order.

    Returns:
        (key -> its slot, the first of its slots when spread; key -> its slots, for the keys
        spread over two slots or more only).

    Raises:
        PlacementError: a strategy that is neither key-affine nor able to list a key's slots,
            or a slot outside [0, P - 1].
    """
    partitions = strategy.partitions
    if strategy.key_affine:
        cache = SlotCache(strategy)
        return {key: cache.slot_of(key) for key in keys}, {}
    slots_of = getattr(strategy, "slots_of", None)
    if slots_of is None:
        raise PlacementError(
            f"strategy {strategy.name!r} is not key-affine and cannot list a key's slots; the replay cannot place it"
        )
    slot_by_key: dict[str, int] = {}
    split_by_key: dict[str, tuple[int, ...]] = {}
    for key in keys:
        slots = tuple(int(slot) for slot in slots_of(key))
        if not slots or any(not 0 <= slot < partitions for slot in slots):
            raise PlacementError(
                f"strategy {strategy.name!r} placed key {key!r} on slots {list(slots)}, outside 0..{partitions - 1}"
            )
        slot_by_key[key] = slots[0]
        if len(slots) > 1:
            split_by_key[key] = slots
    return slot_by_key, split_by_key


def plan_placement(path: Path, strategy: Strategy, limit: int | None = None) -> PlacementPlan:
    """Place every distinct origin once (all its slots when split) and count each slot's events.

    A key-affine strategy places per key (`SlotCache`, as `plan_slots`). A strategy with
    `slots_of(key)` (hot_split: `HotSplitStrategy`, or a `CachedAssignment` of a published
    hot_split assignment) gives each key's slots; a key with k >= 2 slots is placed per event,
    `slots[event_id % k]`, where event_id is the row number in the file (as the replay numbers
    events), and its events are counted per slot with numpy over those ids.

    Args:
        path: the flights file. strategy: the placer. limit: first N flights (events), None = all.

    Returns:
        A `PlacementPlan`.

    Raises:
        PlacementError: a strategy that is neither key-affine nor able to list a key's slots,
            or a slot outside [0, P - 1].
    """
    if strategy.key_affine:
        slot_by_key, counts = plan_slots(path, strategy, limit)
        return PlacementPlan(slot_by_key, {}, counts)
    origins = pq.read_table(path, columns=["origin"]).column("origin")
    if limit is not None:
        origins = origins.slice(0, limit)
    partitions = strategy.partitions
    counts = np.zeros(partitions, dtype=np.int64)
    entries = pc.value_counts(origins).to_pylist()
    slot_by_key, split_by_key = place_keys(strategy, [entry["values"] for entry in entries])
    for entry in entries:
        key, events = entry["values"], entry["counts"]
        slots = split_by_key.get(key)
        if slots is None:
            counts[slot_by_key[key]] += events
            continue
        ids = np.flatnonzero(pc.equal(origins, key).to_numpy(zero_copy_only=False))
        counts += np.bincount(np.asarray(slots, dtype=np.int64)[ids % len(slots)], minlength=partitions)
    return PlacementPlan(slot_by_key, split_by_key, counts)


def split_partitions(counts: np.ndarray, workers: int) -> list[tuple[int, ...]]:
    """Share partitions among workers so their event counts are as even as greedy allows.

    Longest-processing-time-first: partitions by descending count, each to the worker with the
    fewest events so far. Each partition goes to exactly one worker (keeps its order).

    Returns:
        One sorted tuple of partition ids per worker; workers left without events are dropped.
    """
    loads = [0] * workers
    shares: list[list[int]] = [[] for _ in range(workers)]
    for partition in sorted(range(len(counts)), key=lambda p: (-counts[p], p)):
        worker = min(range(workers), key=lambda w: (loads[w], w))
        shares[worker].append(partition)
        loads[worker] += int(counts[partition])
    return [tuple(sorted(share)) for share, load in zip(shares, loads) if load > 0]


@dataclass(frozen=True)
class _Job:
    """One worker's part of a replay; travels to a worker process as JSON."""

    kafka: dict[str, object]
    path: str
    topic: str
    limit: int | None
    slot_by_key: dict[str, int]
    partitions: int
    mine: tuple[int, ...]
    rate: float | None
    producer_config: dict[str, object] = field(default_factory=lambda: dict(PRODUCER_CONFIG))
    split_by_key: dict[str, list[int]] = field(default_factory=dict)
    disorder: dict[str, object] | None = None  # a DisorderPlan's to_json(); None = file order

    def to_json(self) -> str:
        """The job as one JSON document."""
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> _Job:
        """The job from `to_json`'s output."""
        fields = json.loads(text)
        fields["mine"] = tuple(fields["mine"])
        return cls(**fields)


def open_producer(kafka: dict[str, object], config: dict[str, object] | None = None) -> KafkaProducer:
    """A kafka-python producer with the client settings `kafka` (`kafka_config`) and the
    replayer's producer settings (`PRODUCER_CONFIG` unless `config` is given).

    Raises:
        StackError: the producer could not connect (the message names the bootstrap servers).
    """
    try:
        return KafkaProducer(**kafka, **(PRODUCER_CONFIG if config is None else config))
    except KafkaError as exc:
        raise StackError(f"cannot start a Kafka producer for {kafka['bootstrap_servers']}: {exc}") from exc


def pacing(rate: float | None) -> tuple[TokenBucket | None, int]:
    """(token bucket, step) for sending at `rate` events/s (None: no bucket, as fast as possible).

    The step is how many records `send_placed` sends per `take` and per progress report: about
    1/20 s of events at `rate`, at most 8,192 (events).

    Raises:
        ConfigurationError: if rate <= 0.
    """
    if not rate:
        return None, _PROGRESS_EVERY
    return TokenBucket(rate), max(1, min(_PROGRESS_EVERY, int(rate / 20)))


def send_placed(
    send: Callable[..., object],
    topic: str,
    keys: list[bytes],
    values: list[bytes],
    slots: list[int],
    bucket: TokenBucket | None,
    step: int,
    report: Callable[[int], None],
) -> None:
    """Send records to `topic` in order, each to its explicit partition, paced by `bucket`.

    Record i has key `keys[i]`, value `values[i]` and partition `slots[i]` (the slot its
    placement gave it). Records go in steps of `step` (events): before each step `bucket.take`
    spends its tokens (None: no pacing), after it `report(n)` counts the events sent.

    Args:
        send: the producer's `send(topic, value=, key=, partition=)`. keys, values: UTF-8 bytes,
            one per record. slots: int partitions in [0, P - 1], one per record. step: >= 1.

    Raises:
        KafkaError: from `send` (the caller turns it into a StackError).
    """
    for start in range(0, len(values), step):
        stop = min(start + step, len(values))
        if bucket is not None:
            bucket.take(stop - start)
        for key, value, slot in zip(keys[start:stop], values[start:stop], slots[start:stop]):
            send(topic, value=value, key=key, partition=slot)
        report(stop - start)


def _produce(job: _Job, report: Callable[[int], None]) -> dict[int, int]:
    """Send this job's records in file order (arrival order under disorder); return records sent
    per partition (after flush)."""
    producer = open_producer(job.kafka, job.producer_config)
    bucket, step = pacing(job.rate)
    mine = np.zeros(job.partitions, dtype=bool)
    mine[list(job.mine)] = True
    sent = np.zeros(job.partitions, dtype=np.int64)
    send, topic = producer.send, job.topic
    try:
        if job.disorder is not None:
            sent = _produce_in_arrival_order(job, send, bucket, step, mine, report)
            producer.flush()
            return {p: int(sent[p]) for p in job.mine}
        for first, batch in iter_flight_batches(Path(job.path), job.limit):
            origins = pc.dictionary_encode(batch.column("origin"))
            keys = origins.dictionary.to_pylist()
            codes = origins.indices.to_numpy()
            ids = np.arange(first, first + batch.num_rows, dtype=np.int64)
            slots = event_slots(keys, codes, ids, job.slot_by_key, job.split_by_key)
            keep = mine[slots]
            if not keep.all():
                batch, ids, codes, slots = batch.filter(pa.array(keep)), ids[keep], codes[keep], slots[keep]
            values = encode_values(batch, ids)
            key_bytes = [k.encode("utf-8") for k in keys]
            row_keys = [key_bytes[c] for c in codes.tolist()]
            send_placed(send, topic, row_keys, values, slots.tolist(), bucket, step, report)
            sent += np.bincount(slots, minlength=job.partitions)
        producer.flush()
    finally:
        producer.close()
    return {p: int(sent[p]) for p in job.mine}


def _produce_in_arrival_order(
    job: _Job,
    send: Callable[..., object],
    bucket: TokenBucket | None,
    step: int,
    mine: np.ndarray,
    report: Callable[[int], None],
) -> np.ndarray:
    """Send this job's records in the arrival order of `job.disorder`; return sent per partition.

    Reads the (first `job.limit`) flights whole, recomputes the arrival order and written event
    times from the plan (`DisorderPlan.apply`, the same pure function the parent measured), keeps
    the events of this job's partitions in that order and sends them in steps of `step` (each
    `bucket.take`n first), encoding `READ_BATCH_ROWS` at a time.
    """
    plan = DisorderPlan.from_json(job.disorder)
    table = _read_flights(Path(job.path), job.limit, list(FLIGHTS_3M.columns))
    times = event_time_ms(table.column("date"))
    codes, keys = encode_sources(table.column("origin"))
    ids = np.arange(table.num_rows, dtype=np.int64)
    slots = event_slots(keys, codes, ids, job.slot_by_key, job.split_by_key)
    order, written = plan.apply(times, codes, keys)
    order = order[mine[slots[order]]]
    key_bytes = [k.encode("utf-8") for k in keys]
    sent = np.zeros(job.partitions, dtype=np.int64)
    topic = job.topic
    for first in range(0, order.size, READ_BATCH_ROWS):
        chunk = order[first : first + READ_BATCH_ROWS]
        values = encode_values(table.take(chunk), chunk, event_times=written[chunk])
        row_keys = [key_bytes[c] for c in codes[chunk].tolist()]
        send_placed(send, topic, row_keys, values, slots[chunk].tolist(), bucket, step, report)
        sent += np.bincount(slots[chunk], minlength=job.partitions)
    return sent


def _worker_main() -> None:
    """Worker process (`python -m keyshift.data.replay`): job JSON on stdin, reports on stdout.

    Protocol, one line each: `progress <events>` now and then, then `done <JSON counts>`; on
    failure `error <message>` and exit status 1 (the traceback goes to stderr).
    """
    out = sys.stdout
    pending = 0

    def report(n: int) -> None:
        nonlocal pending
        pending += n
        if pending >= 65_536:
            out.write(f"progress {pending}\n")
            out.flush()
            pending = 0

    try:
        counts = _produce(_Job.from_json(sys.stdin.read()), report)
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which raises
        traceback.print_exc()
        out.write("error " + f"{type(exc).__name__}: {exc}".replace("\n", " ") + "\n")
        out.flush()
        sys.exit(1)
    out.write(f"progress {pending}\ndone {json.dumps(counts)}\n")
    out.flush()


def _run_workers(jobs: list[_Job], bar: tqdm) -> dict[int, int]:
    """Run one worker process per job; return merged per-partition counts, or raise the first error.

    Workers are started as `python -m keyshift.data.replay` with this interpreter, so they do not
    depend on how the caller was started (no re-import of the caller's `__main__`).
    """
    lines: queue_module.Queue[tuple[int, str | None]] = queue_module.Queue()
    processes = []
    for index, job in enumerate(jobs):
        process = subprocess.Popen(
            [sys.executable, "-m", "keyshift.data.replay"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        processes.append(process)
        threading.Thread(target=_pump, args=(index, process, job, lines), daemon=True).start()
    counts: dict[int, int] = {}
    finished = 0
    try:
        while finished < len(processes):
            index, line = lines.get()
            if line is None:
                if processes[index].wait() != 0:
                    raise StackError(f"replay worker {index} exited with status {processes[index].returncode}")
                finished += 1
            elif line.startswith("progress "):
                bar.update(int(line.split()[1]))
            elif line.startswith("done "):
                counts.update({int(p): c for p, c in json.loads(line[5:]).items()})
            elif line.startswith("error "):
                raise StackError(f"replay worker {index} failed: {line[6:].strip()}")
    finally:
        for process in processes:
            if process.poll() is None and finished < len(processes):
                process.terminate()
            process.wait(timeout=60)
    return counts


def _pump(index: int, process: subprocess.Popen, job: _Job, lines: queue_module.Queue) -> None:
    """Feed a worker its job, then forward its stdout lines; `None` marks its end."""
    try:
        process.stdin.write(job.to_json())
        process.stdin.close()
        for line in process.stdout:
            lines.put((index, line))
    except (OSError, ValueError):
        pass
    finally:
        lines.put((index, None))


def _redis(settings: Settings) -> redis.Redis:
    from keyshift.runs import redis_client

    return redis_client(settings, decode_responses=False)


def read_replay_record(settings: Settings, topic: str) -> dict[str, object] | None:
    """The last replay's record for `topic` from Redis, decoded; None if there is none.

    Raises:
        StackError: if Redis does not answer.
    """
    raw = _redis(settings).hgetall(redis_replay_key(topic))
    if not raw:
        return None
    record: dict[str, object] = {k.decode(): v.decode() for k, v in raw.items()}
    for name in ("end_offsets", "per_partition"):
        if name in record:
            record[name] = {int(p): o for p, o in json.loads(record[name]).items()}
    if "split_keys" in record:
        record["split_keys"] = json.loads(record["split_keys"])
    if "late_sources" in record:
        record["late_sources"] = json.loads(record["late_sources"])
    for name in ("events_produced", "partitions", "epoch", "workers", "out_of_order_events"):
        if name in record:
            record[name] = int(record[name])
    for name in ("disorder", "out_of_order"):
        if name in record:
            record[name] = float(record[name])
    for name, kind in (("source_delay_s", float), ("clock_skew_s", float), ("seed", int)):
        if name in record:
            record[name] = kind(record[name]) if record[name] else None
    return record


def disorder_record(plan: DisorderPlan | None) -> dict[str, object]:
    """The disorder fields of a replay's Redis record (all of them, so a replay without disorder
    overwrites those of an earlier one with disorder).

    Fields: `disorder` (target fraction; 0 = file order), `source_delay_s`, `clock_skew_s` (s of
    event time) and `seed` ("" without disorder), `out_of_order` (achieved fraction),
    `out_of_order_events`, `late_sources` (JSON origin -> {"delay_ms", "offset_ms"}: the written
    event_time of a late origin's flight is its true time + offset_ms; it arrived as if at true
    time + delay_ms, so sorting by (true time + delay_ms, event_id) gives the arrival order).
    """
    if plan is None:
        return {
            "disorder": 0.0, "source_delay_s": "", "clock_skew_s": "", "seed": "",
            "out_of_order": 0.0, "out_of_order_events": 0, "late_sources": "{}",
        }
    return {
        "disorder": repr(plan.fraction),
        "source_delay_s": repr(plan.source_delay_s),
        "clock_skew_s": repr(plan.clock_skew_s),
        "seed": plan.seed,
        "out_of_order": repr(plan.out_of_order),
        "out_of_order_events": plan.out_of_order_events,
        "late_sources": json.dumps(
            {s: {"delay_ms": plan.delay_ms[s], "offset_ms": plan.offset_ms[s]} for s in plan.late_sources}
        ),
    }


def resolve_placer(
    settings: Settings, topic: str, strategy: str | Strategy, partitions: int | None = None
) -> tuple[TopicInfo, Strategy]:
    """The topic a replay writes and the strategy that places its records, checked against each other.

    Args:
        settings: broker and Redis locations.
        topic: an existing topic.
        strategy: a name or a `Strategy`. A learned name (least_key, least_count, hot_split) is
            the assignment published in Redis under `topic`; another name builds its rule here
            (`strategy_by_name`) for the topic's P.
        partitions: P expected; None = the topic's.

    Returns:
        (the topic's `TopicInfo`, the placer).

    Raises:
        ConfigurationError: a missing topic, P differing from the topic's partition count, a
            strategy over another P, or a learned strategy with no matching assignment published
            under `topic` (the message names the command that publishes one).
        PlacementError: an unknown strategy name.
        StackError: Kafka (or, for a learned strategy, Redis) unreachable.
    """
    info = describe_topics(settings, [topic]).get(topic)
    if info is None:
        raise ConfigurationError(f"topic {topic!r} does not exist; create it with `keyshift topics create {topic}`")
    if partitions is not None and partitions != info.partitions:
        raise ConfigurationError(
            f"topic {topic!r} has {info.partitions} partitions, not {partitions}; "
            f"recreate it with `keyshift topics create --partitions {partitions} --recreate {topic}`"
        )
    if isinstance(strategy, str) and strategy in LEARNED_STRATEGIES:
        placer = published_assignment(settings, topic, strategy, info.partitions)
    elif isinstance(strategy, str):
        placer = strategy_by_name(strategy, info.partitions)
    else:
        placer = strategy
    if placer.partitions != info.partitions:
        raise ConfigurationError(
            f"strategy {placer.name!r} places over {placer.partitions} slots but topic {topic!r} has {info.partitions}"
        )
    return info, placer


def check_growth(
    topic: str, before: dict[int, int], after: dict[int, int], sent: dict[int, int], settings: Settings | None = None
) -> None:
    """Check that each partition's end offset grew by exactly the records a replay sent to it.

    A bounded run reading the topic while it is written (issue 33) writes its end-of-input
    markers (`keyshift.names.END_OF_INPUT_PREFIX`) into the same partitions once its limit's
    offsets are there, so a partition may grow by more than the replay sent. When `settings` is
    given and a partition grew by more, the extra range is read back and its markers are not
    counted as another writer's records.

    Args:
        topic: the topic (for the message). before, after: partition -> end offset around the
            replay. sent: partition -> records sent (events), every partition of the topic.
        settings: broker location for reading markers back; None = count every record.

    Raises:
        StackError: some partition grew by another count than its records and markers (another
            writer, or lost records).
    """
    grown = {p: after.get(p, 0) - before.get(p, 0) for p in sent}
    if grown == sent:
        return
    more = {p: (before.get(p, 0), after.get(p, 0)) for p in sent if grown[p] > sent[p]}
    if settings is not None and more:
        markers = count_end_of_input_markers(settings, topic, more)
        if any(markers.values()):
            log.info("%s: %d end-of-input marker(s) of a bounded run were written while replaying (%s)",
                     topic, sum(markers.values()), {p: n for p, n in markers.items() if n})
        grown = {p: grown[p] - markers.get(p, 0) for p in sent}
    if grown != sent:
        raise StackError(
            f"end offsets of {topic!r} grew by {grown} records (end-of-input markers not counted) but the replay sent "
            f"{sent}; another producer wrote to the topic, or records were lost"
        )


def replay_record_fields(
    result: ReplayResult, before: dict[int, int], started_at: datetime, rate: float | None
) -> dict[str, object]:
    """The fields every replay stores in its Redis record (`redis_replay_key(topic)`), as strings
    and ints: `events_produced`, `start_offsets` and `end_offsets` (JSON partition -> offset),
    `per_partition` (JSON), `finished_at` and `started_at` (ISO 8601 UTC), `seconds`,
    `events_per_s`, `strategy`, `epoch`, `partitions`, `workers`, `rate` (events/s; "" =
    unlimited), `split_keys` (JSON key -> slots)."""
    return {
        "events_produced": result.events_produced,
        "start_offsets": json.dumps(before),
        "end_offsets": json.dumps(result.end_offsets),
        "per_partition": json.dumps(result.per_partition),
        "finished_at": datetime.now(UTC).isoformat(),
        "started_at": started_at.isoformat(),
        "seconds": f"{result.seconds:.3f}",
        "events_per_s": f"{result.events_per_s:.0f}",
        "strategy": result.strategy,
        "epoch": result.epoch,
        "partitions": result.partitions,
        "workers": result.workers,
        "rate": "" if rate is None else rate,
        "split_keys": json.dumps(result.split_keys),
    }


def replay_flights(
    settings: Settings,
    topic: str,
    limit: int | None = None,
    rate: float | None = None,
    strategy: str | Strategy = "hash",
    partitions: int | None = None,
    progress: bool = True,
    workers: int | None = None,
    disorder: float = 0.0,
    source_delay: float = DEFAULT_SOURCE_DELAY_S,
    clock_skew: float = 0.0,
    seed: int = 0,
) -> ReplayResult:
    """Produce the flights to `topic` in event-time order, placed by a keyshift strategy.

    Each flight becomes one record (format in the module docstring) with an explicit partition
    from the strategy. The replay checks Redis first, produces, flushes (acks=all, idempotent),
    then compares each partition's end-offset growth with the records it sent, and stores its
    record in the Redis hash `keyshift.names.redis_replay_key(topic)`: `events_produced`,
    `end_offsets` (JSON), `per_partition` (JSON), `finished_at` (ISO 8601 UTC), `started_at`,
    `seconds`, `events_per_s`, `strategy`, `epoch`, `partitions`, `workers`, `limit`, `rate`,
    `split_keys` (JSON key -> slots), and the disorder fields of `disorder_record`.

    With `disorder` > 0, the replay first plans which origins are late
    (`keyshift.data.disorder.plan_disorder` over the replayed flights: about 0.5 s for all
    3,000,000), then every worker produces its partitions in that plan's arrival order, late
    origins' event times shifted by their clock offsets (module docstring).

    Args:
        settings: broker, Redis and cache locations.
        topic: an existing topic (create it with `keyshift topics create`).
        limit: replay only the first `limit` flights (events, >= 0); None = all 3,000,000.
        rate: events/s across all workers (token bucket); None = as fast as possible.
        strategy: a strategy name or a `Strategy`; its P must equal the topic's partition count.
            A learned name (least_key, least_count, hot_split) uses the assignment published in
            Redis under `topic` (`keyshift topics create --strategy NAME` publishes it); other
            names build the rule here (`strategy_by_name`). A `Strategy` must be key-affine or
            list a key's slots (`slots_of`: hot_split, whose split keys are placed per event).
        partitions: P expected; None = read from the topic's metadata.
        progress: show a tqdm progress bar (stderr).
        workers: producer processes; None = 1 when `rate` is set, else min(CPUs, P, 4).
        disorder: target fraction of the events out of event-time order, in [0, 1) (paper 000
            Table 10: 0.25, 0.5, 0.75); 0 = file order, exactly as without it.
        source_delay: D, seconds of event time (> 0): each late origin arrives d in [D / 2, D]
            late.
        clock_skew: K, seconds of event time, in [0, D / 2]: each late origin's clock is off by
            o in [-K, +K] (its written event_time shifted by o); must be 0 when disorder is 0.
        seed: int >= 0; the same seed and flights give the same late origins, delays and offsets.

    Returns:
        A `ReplayResult`.

    Raises:
        DataError: flights file missing or corrupt (run `keyshift data fetch flights`), or out
            of event-time order.
        ConfigurationError: bad limit, rate, workers, disorder settings (or a disorder no plan
            reaches within `DISORDER_TOLERANCE`), a missing topic, P differing from the
            topic's partition count, or a learned strategy with no matching assignment published
            under `topic` (the message names the command that publishes one).
        PlacementError: unknown strategy, or one the replay cannot place.
        StackError: Kafka or Redis unreachable, a worker failed, or the topic's end offsets did
            not grow by exactly the records sent (another writer, or lost records).
    """
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ConfigurationError(f"limit must be an int >= 0 events, got {limit!r}")
    if rate is not None and not rate > 0:
        raise ConfigurationError(f"rate must be > 0 events/s, got {rate!r}")
    if workers is not None and (not isinstance(workers, int) or workers < 1):
        raise ConfigurationError(f"workers must be an int >= 1, got {workers!r}")
    validate_disorder(disorder, source_delay, clock_skew, seed)
    path = flights_path(settings)
    store = _redis(settings)
    info, placer = resolve_placer(settings, topic, strategy, partitions)

    plan = plan_placement(path, placer, limit)
    late = _plan_disorder(path, limit, disorder, source_delay, clock_skew, seed) if disorder > 0 else None
    planned = plan.counts
    total = int(planned.sum())
    if workers is None:
        workers = 1 if rate is not None else max(1, min(os.cpu_count() or 1, info.partitions, 4))
    shares = split_partitions(planned, workers) or [tuple(range(info.partitions))]
    kafka = kafka_config(settings, "keyshift-replay")
    jobs = [
        _Job(
            kafka=kafka,
            path=str(path),
            topic=topic,
            limit=limit,
            slot_by_key=plan.slot_by_key,
            partitions=info.partitions,
            mine=share,
            rate=None if rate is None else rate * max(1, int(planned[list(share)].sum())) / max(1, total),
            split_by_key={key: list(slots) for key, slots in plan.split_by_key.items()},
            disorder=None if late is None else late.to_json(),
        )
        for share in shares
    ]
    before = end_offsets(settings, topic)
    log.info(
        "replaying %s flights from %s to %s (P=%d, strategy %s epoch %d, %d split key(s), %d worker(s), rate %s)",
        f"{total:,}", path.name, topic, info.partitions, placer.name, placer.epoch, len(plan.split_by_key),
        len(jobs), "unlimited" if rate is None else f"{rate:,.0f} events/s",
    )
    started_at = datetime.now(UTC)
    started = time.perf_counter()
    bar = tqdm(total=total, unit="ev", unit_scale=True, desc=f"replay {topic}", disable=not progress, mininterval=0.5)
    with bar:
        try:
            if len(jobs) == 1:
                sent = _produce(jobs[0], bar.update)
            else:
                sent = _run_workers(jobs, bar)
        except KafkaError as exc:
            raise StackError(
                f"Kafka failed while replaying to {topic!r} at {settings.bootstrap_servers}: {exc}"
            ) from exc
    seconds = time.perf_counter() - started
    after = end_offsets(settings, topic)
    per_partition = {p: int(sent.get(p, 0)) for p in range(info.partitions)}
    check_growth(topic, before, after, per_partition, settings)
    result = ReplayResult(
        topic=topic,
        strategy=placer.name,
        epoch=placer.epoch,
        partitions=info.partitions,
        events_produced=sum(per_partition.values()),
        per_partition=per_partition,
        end_offsets=after,
        seconds=seconds,
        workers=len(jobs),
        split_keys={key: list(slots) for key, slots in sorted(plan.split_by_key.items())},
        disorder=late,
    )
    store.hset(
        redis_replay_key(topic),
        mapping={
            **replay_record_fields(result, before, started_at, rate),
            "limit": "" if limit is None else limit,
            "source": str(path),
            **disorder_record(late),
        },
    )
    log.info(
        "produced %s events to %s in %.1f s (%s events/s, %d worker(s))",
        f"{result.events_produced:,}", topic, seconds, f"{result.events_per_s:,.0f}", result.workers,
    )
    return result


def _read_flights(path: Path, limit: int | None, columns: list[str]) -> pa.Table:
    """The first `limit` flights (all when None) as one table of `columns`, reading no more row
    groups than needed."""
    batches, rows = [], 0
    parquet = pq.ParquetFile(path)
    for batch in parquet.iter_batches(batch_size=READ_BATCH_ROWS, columns=columns):
        if limit is not None and rows + batch.num_rows >= limit:
            batches.append(batch.slice(0, limit - rows))
            break
        batches.append(batch)
        rows += batch.num_rows
    schema = pa.schema([parquet.schema_arrow.field(name) for name in columns])
    return pa.Table.from_batches(batches, schema=schema).combine_chunks()


def _plan_disorder(
    path: Path, limit: int | None, fraction: float, source_delay: float, clock_skew: float, seed: int
) -> DisorderPlan:
    """The disorder plan of the first `limit` flights (all when None), logged.

    Raises:
        ConfigurationError: the plan misses `fraction` by more than `DISORDER_TOLERANCE`.
        DataError: the flights are out of event-time order.
    """
    table = _read_flights(path, limit, ["date", "origin"])
    codes, names = encode_sources(table.column("origin"))
    late = plan_disorder(event_time_ms(table.column("date")), codes, names, fraction, source_delay, clock_skew, seed)
    if abs(late.out_of_order - fraction) > DISORDER_TOLERANCE:
        raise ConfigurationError(
            f"disorder {fraction:g} cannot be reached on these {late.events:,} flights: the best plan puts "
            f"{late.out_of_order:.4f} of them out of order ({len(late.delay_ms)} of {len(names)} origins late, "
            f"source delay {source_delay:g} s, seed {seed}); the flights' event times are whole minutes, so "
            "delays under a minute disorder nothing: raise --source-delay, replay more flights (--limit), or "
            "ask for another fraction"
        )
    log.info(
        "disorder %.4g: %d of %d origins late (delay %s s, clock skew %s s, seed %d): %.4f of %s events out of order",
        fraction, len(late.delay_ms), len(names), f"{source_delay:g}", f"{clock_skew:g}", seed, late.out_of_order,
        f"{late.events:,}",
    )
    return late


if __name__ == "__main__":
    _worker_main()
