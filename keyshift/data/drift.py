"""Flights whose Kafka partitions drift apart in event time: input a user might really have.

Two ways to make a topic whose partitions, read from earliest, do not advance together in event
time, both built from the flights-3m file (`keyshift.data.flights`) and written the plain way a
user would write it (`write_plain`: kafka-python, no explicit partition, Kafka's default
partitioner picks by key):

* `popularity`: half-way through the data a few busy origins and a few quiet ones swap names, so
  a key that was busy turns quiet and a quiet one turns busy (the load per partition shifts while
  the job runs);
* `partition_offsets`: each flight's event time is shifted by 30 days times the Kafka partition of
  its key, so whole partitions start months apart.

The frame `shifted_flights` returns is the truth of what goes to Kafka:
`keyshift.quality.reference.reference_of` computes the windows a correct run over that topic must
produce (the same table as `reference_windows`, so `compare_to_reference` checks a run against it
unchanged).

Record format written by `write_plain` (as `keyshift.data.replay`'s, but with `json.dumps`'
default separators and no explicit partition):

* key: the origin, UTF-8;
* value: `json.dumps({"event_id": int, "origin": str, "destination": str, "delay_min": int,
  "distance_mi": int, "event_time": int}).encode()`, e.g.
  `b'{"event_id": 0, "origin": "LAS", "destination": "PHL", "delay_min": 33, "distance_mi": 2176,
  "event_time": 978307260000}'`;
* partition: none given; Kafka's default partitioner puts the record on
  `to_positive(murmur2(key)) % P`;
* Kafka timestamp: the producer's wall clock (CreateTime).

Throughput: kafka-python spends tens of microseconds of Python per `send`, plus a few for
`json.dumps`, so one process writes some tens of thousands of records/s. `write_plain` can split
the KEYS (never the rows) over producers, one in the calling process and the others in worker
processes (`python -m keyshift.data.drift`), each writing its keys' records in frame order, so
every key's records keep their order in its partition, but a partition is then out of event-time
order across keys (by default one producer writes, so it is in order). Measured on a 2-CPU host with the broker
on it (300,000 rows, idle host): 1 process ~37,000 records/s, 2 processes ~42,000 records/s
(json.dumps alone: ~220,000 rows/s; the rest is kafka-python's `send`).
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import KafkaError

from keyshift.data.replay import RECORD_FIELDS, event_time_ms
from keyshift.errors import ConfigurationError, DataError, StackError
from keyshift.placement.murmur2 import murmur2, to_positive

log = logging.getLogger(__name__)

VARIANTS = ("popularity", "partition_offsets")
"""The drift variants `shifted_flights` makes."""

QUIET_MIN_FLIGHTS = 300
"""Fewest flights (in the selected rows) an origin needs to be chosen as a quiet origin of the
popularity variant: quiet, not empty, so that after the swap the busy key still has some events."""

OFFSET_DAYS_PER_PARTITION = 30
"""Days of event time between the starts of consecutive partitions (partition_offsets variant)."""

DAY_MS = 86_400_000
"""One day in milliseconds."""

FRAME_COLUMNS = RECORD_FIELDS
"""Columns of a drift frame, in order: event_id, origin, destination, delay_min, distance_mi,
event_time (the record's JSON fields)."""

PLAIN_PRODUCER_CONFIG: dict[str, object] = {
    "acks": "all",
    "linger_ms": 50,
    "batch_size": 512 * 1024,
    "compression_type": "zstd",
}
"""The producer settings of `write_plain`: what a user would set; everything else is
kafka-python's default (idempotence on, so retries keep order)."""

_SOURCE_COLUMNS = ["date", "delay", "distance", "origin", "destination"]
_META_KEY = b"keyshift.drift.job"


def offset_days(partition: int) -> int:
    """Event-time shift of a partition in the partition_offsets variant: `partition * 30` days.

    Args:
        partition: a Kafka partition id, >= 0.

    Returns:
        The shift in days (int, >= 0); multiply by `DAY_MS` for milliseconds.

    Raises:
        ConfigurationError: if `partition` is not an int >= 0.
    """
    if isinstance(partition, bool) or not isinstance(partition, (int, np.integer)) or partition < 0:
        raise ConfigurationError(f"partition must be an int >= 0, got {partition!r}")
    return int(partition) * OFFSET_DAYS_PER_PARTITION


def default_partition(key: str, partitions: int) -> int:
    """The partition Kafka's default partitioner gives a record with key `key.encode("utf-8")`.

    `to_positive(murmur2(key_bytes)) % partitions` (Java's and kafka-python's rule).

    Args:
        key: the key as text (an origin code). partitions: P >= 1.

    Returns:
        A partition id in [0, P - 1].

    Raises:
        ConfigurationError: if `partitions` is not an int >= 1.
    """
    _check_partitions(partitions)
    return to_positive(murmur2(key.encode("utf-8"))) % partitions


def swap_pairs(counts: pd.Series | Mapping[str, int], swapped: int) -> list[tuple[str, str]]:
    """Which busy origin swaps names with which quiet origin (popularity variant).

    Rule (deterministic): rank all origins by count, descending, ties by name ascending (rank 0
    is the busiest; n origins). The busy origins are ranks 0..swapped-1. The eligible quiet
    origins are the others with at least `QUIET_MIN_FLIGHTS` flights, in rank order. The quiet
    origins are `swapped` consecutive eligible ones: starting at the first eligible origin whose
    rank is >= n // 2 (the busiest at or below the median), moved up the ranking as far as needed
    to fit (so when no eligible origin sits at or below the median, the `swapped` least busy
    eligible ones). Busy origin i (i-th busiest) is paired with quiet origin i (i-th busiest of
    the quiet ones).

    Args:
        counts: origin -> flights (int >= 0), e.g. `frame["origin"].value_counts()`.
        swapped: pairs wanted, int >= 1.

    Returns:
        `swapped` pairs (busy origin, quiet origin), busiest first; 2 * swapped distinct names.

    Raises:
        ConfigurationError: if `swapped` is not an int >= 1.
        DataError: if there are fewer than `swapped` eligible quiet origins besides the busy ones.
    """
    if isinstance(swapped, bool) or not isinstance(swapped, (int, np.integer)) or swapped < 1:
        raise ConfigurationError(f"swapped must be an int >= 1, got {swapped!r}")
    ranked = sorted(((str(k), int(v)) for k, v in dict(counts).items()), key=lambda kv: (-kv[1], kv[0]))
    busy = ranked[:swapped]
    eligible = [(rank, name) for rank, (name, count) in enumerate(ranked)
                if rank >= swapped and count >= QUIET_MIN_FLIGHTS]
    if len(busy) < swapped or len(eligible) < swapped:
        raise DataError(
            f"cannot swap {swapped} busy origins with {swapped} quiet ones: {len(ranked)} origins, of which "
            f"{len(eligible)} outside the busiest {swapped} have >= {QUIET_MIN_FLIGHTS} flights; "
            "use more rows (limit) or a smaller swapped"
        )
    median = len(ranked) // 2
    start = next((i for i, (rank, _) in enumerate(eligible) if rank >= median), len(eligible))
    start = min(start, len(eligible) - swapped)
    quiet = eligible[start : start + swapped]
    return [(b, q) for (b, _), (_, q) in zip(busy, quiet)]


def shifted_flights(
    path: Path,
    limit: int | None = None,
    swapped: int = 10,
    variant: str = "popularity",
    partitions: int = 8,
) -> pd.DataFrame:
    """The first `limit` flights as records, with drift between keys or partitions built in.

    Reads the flights Parquet file (columns date: naive timestamp, UTC; delay: int minutes;
    distance: int miles; origin, destination: str), keeps the first `limit` rows in file order
    and returns one row per flight, event id = row number in the file.

    Variant `"popularity"` (`partitions` unused): origins are counted over the selected rows and
    `swap_pairs(counts, swapped)` names `swapped` (busy, quiet) pairs. The midpoint is
    `t_min + (t_max - t_min) // 2` of the selected rows' event times (ms). Every flight with
    event_time >= midpoint whose origin is busy origin i gets quiet origin i's name, and vice
    versa; flights before the midpoint and other origins keep their origin. Destination, delay,
    distance, event time and event id are never changed.

    Variant `"partition_offsets"`: no renaming; every flight's event_time is increased by
    `offset_days(p) * DAY_MS` ms, where p = `default_partition(origin, partitions)` is the
    partition Kafka's default partitioner gives its key on a topic of `partitions` partitions.
    Partition p's events then span [first flight + 30 p days, last flight + 30 p days]; rows stay
    in file order (so each key, and each partition, stays in event-time order, but the frame as a
    whole does not).

    Args:
        path: the flights Parquet file (`keyshift.data.flights.flights_path(settings)`).
        limit: rows to take from the start of the file, int >= 1; None: all (3,000,000).
        swapped: pairs of origins swapped (popularity), int >= 1.
        variant: `"popularity"` or `"partition_offsets"`.
        partitions: P, partitions of the topic the frame will be written to (partition_offsets),
            int >= 1.

    Returns:
        A frame of n = min(limit, rows in file) rows in file order, index 0..n-1, columns
        event_id (int64, row number), origin (str, object dtype), destination (str),
        delay_min (int64, minutes), distance_mi (int64, miles), event_time (int64, epoch ms UTC,
        floored from the file's microseconds; shifted in partition_offsets).

    Raises:
        ConfigurationError: unknown `variant`, `limit` < 1, `swapped` < 1 or `partitions` < 1.
        DataError: the file lacks a column, holds nulls or selects no rows, or (popularity) has
            too few origins to choose from (`swap_pairs`).
        OSError: the file cannot be read.
    """
    if variant not in VARIANTS:
        raise ConfigurationError(f"unknown drift variant {variant!r}; use one of {', '.join(VARIANTS)}")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, (int, np.integer)) or limit < 1):
        raise ConfigurationError(f"limit must be None or an int >= 1, got {limit!r}")
    if variant == "partition_offsets":
        _check_partitions(partitions)
    frame = _read_frame(Path(path), limit)
    if variant == "popularity":
        return _swap_popularity(frame, swapped)
    return _offset_partitions(frame, partitions)


def plain_flights(path: Path, limit: int | None = None) -> pd.DataFrame:
    """The first `limit` flights as records of `FRAME_COLUMNS`, without any drift built in (the
    undrifted baseline of `keyshift bench drift`): event id = row number, event_time in ms UTC.

    Raises:
        DataError: the file lacks a column, holds nulls or has no rows.
    """
    return _read_frame(path, limit)


def _read_frame(path: Path, limit: int | None) -> pd.DataFrame:
    """The first `limit` flights of the file as a frame of `FRAME_COLUMNS`, unshifted."""
    try:
        table = pq.read_table(path, columns=_SOURCE_COLUMNS)
    except (KeyError, pa.ArrowInvalid) as exc:
        raise DataError(f"{path} lacks a flights column ({', '.join(_SOURCE_COLUMNS)}): {exc}") from exc
    if limit is not None:
        table = table.slice(0, limit)
    if table.num_rows == 0:
        raise DataError(f"{path} has no rows to shift")
    for name in _SOURCE_COLUMNS:
        if table.column(name).null_count:
            raise DataError(f"{path} column {name!r} holds {table.column(name).null_count} nulls")
    return pd.DataFrame({
        "event_id": np.arange(table.num_rows, dtype=np.int64),
        "origin": table.column("origin").to_pandas(),
        "destination": table.column("destination").to_pandas(),
        "delay_min": table.column("delay").to_numpy().astype(np.int64),
        "distance_mi": table.column("distance").to_numpy().astype(np.int64),
        "event_time": event_time_ms(table.column("date")).astype(np.int64),
    })


def _swap_popularity(frame: pd.DataFrame, swapped: int) -> pd.DataFrame:
    pairs = swap_pairs(frame["origin"].value_counts(), swapped)
    times = frame["event_time"].to_numpy()
    midpoint = int(times.min()) + (int(times.max()) - int(times.min())) // 2
    rename = {busy: quiet for busy, quiet in pairs} | {quiet: busy for busy, quiet in pairs}
    late = times >= midpoint
    origins = frame["origin"].to_numpy(dtype=object).copy()
    origins[late] = pd.Series(origins[late]).replace(rename).to_numpy(dtype=object)
    log.info("popularity drift: %s swap names from event time %d ms on", pairs, midpoint)
    return frame.assign(origin=origins)


def _offset_partitions(frame: pd.DataFrame, partitions: int) -> pd.DataFrame:
    codes, keys = pd.factorize(frame["origin"])
    shifts = np.array([offset_days(default_partition(k, partitions)) * DAY_MS for k in keys], dtype=np.int64)
    return frame.assign(event_time=frame["event_time"].to_numpy() + shifts[codes])


def record_value(event_id: int, origin: str, destination: str, delay_min: int, distance_mi: int,
                 event_time: int) -> bytes:
    """One record's value: `json.dumps` of the fields in `RECORD_FIELDS` order, default separators.

    Args:
        event_id, delay_min (minutes), distance_mi (miles), event_time (epoch ms UTC): Python ints.
        origin, destination: airport codes (str).

    Returns:
        UTF-8 bytes, e.g. `b'{"event_id": 0, "origin": "LAS", "destination": "PHL", "delay_min": 33,
        "distance_mi": 2176, "event_time": 978307260000}'`.

    Raises:
        TypeError: a value JSON cannot encode (e.g. a numpy integer).
    """
    return json.dumps({
        "event_id": event_id,
        "origin": origin,
        "destination": destination,
        "delay_min": delay_min,
        "distance_mi": distance_mi,
        "event_time": event_time,
    }).encode()


def partition_counts(frame: pd.DataFrame, partitions: int) -> dict[int, int]:
    """Records per partition when `frame` is written with Kafka's default partitioner.

    Args:
        frame: rows with an origin column (str keys). partitions: P >= 1.

    Returns:
        partition -> records (int), for every partition 0..P-1 (0 for an empty one).

    Raises:
        ConfigurationError: `partitions` is not an int >= 1.
        DataError: the origin column is missing.
    """
    _check_partitions(partitions)
    _check_columns(frame, ["origin"])
    counts = np.zeros(partitions, dtype=np.int64)
    for key, n in frame["origin"].value_counts().items():
        counts[default_partition(str(key), partitions)] += int(n)
    return {p: int(counts[p]) for p in range(partitions)}


def split_keys(counts: pd.Series | Mapping[str, int], workers: int) -> list[list[str]]:
    """Share keys among workers so their record counts are as even as greedy allows.

    Longest-processing-time-first: keys by descending count (ties by name), each to the worker
    with the fewest records so far. Each key goes to exactly one worker, so its records keep
    their order.

    Args:
        counts: key -> records (int >= 0). workers: int >= 1.

    Returns:
        One list of keys per worker (sorted), workers without records dropped; at most
        `workers` lists.

    Raises:
        ConfigurationError: `workers` is not an int >= 1.
    """
    if isinstance(workers, bool) or not isinstance(workers, (int, np.integer)) or workers < 1:
        raise ConfigurationError(f"workers must be an int >= 1, got {workers!r}")
    loads = [0] * workers
    shares: list[list[str]] = [[] for _ in range(workers)]
    for key, n in sorted(((str(k), int(v)) for k, v in dict(counts).items()), key=lambda kv: (-kv[1], kv[0])):
        worker = min(range(workers), key=lambda w: (loads[w], w))
        shares[worker].append(key)
        loads[worker] += n
    return [sorted(share) for share, load in zip(shares, loads) if load > 0]


def write_plain(
    bootstrap_servers: str | Sequence[str],
    topic: str,
    frame: pd.DataFrame,
    partitions: int,
    *,
    workers: int = 1,
    client_options: Mapping[str, object] | None = None,
) -> dict[int, int]:
    """Write a drift frame to an existing topic the way an ordinary kafka-python user would.

    Each row becomes one record: key `origin.encode()`, value `record_value(...)` (json.dumps,
    default separators, fields in `RECORD_FIELDS` order), no explicit partition (Kafka's default
    partitioner picks `to_positive(murmur2(key)) % P`), from a
    `KafkaProducer(bootstrap_servers=..., acks="all", linger_ms=50, batch_size=512 * 1024,
    compression_type="zstd")` (`PLAIN_PRODUCER_CONFIG`; kafka-python's defaults otherwise,
    idempotence included), flushed at the end. Records of one key are sent in frame order by one
    producer, so they keep that order in their partition. With several workers, each producer
    (this process for the first share, a worker process for each other) writes the rows of its
    share of the keys (`split_keys`), so records of different keys in one partition interleave in
    an order that depends on timing.

    The call reads the topic's end offsets before and after, and checks that every partition grew
    by exactly the records computed for it (`partition_counts`); nobody else may write to the
    topic meanwhile.

    Args:
        bootstrap_servers: the broker(s), "host:port" or a list of them.
        topic: an existing topic (create it with `keyshift.topics.create_topics`).
        frame: rows with columns `RECORD_FIELDS` (e.g. from `shifted_flights`): event_id,
            delay_min, distance_mi, event_time ints; origin, destination str.
        partitions: P, the topic's partition count (checked against the broker's), int >= 1.
        workers: producers, int >= 1, one per process (this one and workers - 1 worker
            processes); fewer are used when there are fewer keys. Default 1: one ordinary
            producer, so every partition holds its records in the frame's (event-time) order.
            With more, each partition interleaves the producers' keys in timing order, so a
            partition is out of event-time order across keys by however far the producers drift
            apart (a topic several producers write; seen here: about 9 days of event time between
            two producers of the popularity frame). Per-partition clocks then run ahead of the
            slower producer's keys, and only the idle lag (`--idle-lag-ms`) covers that.
        client_options: extra kafka-python client settings (e.g. SASL,
            `keyshift.kafka_clients.client_options(settings)`); None: none. With more than one
            worker they travel to the workers as JSON, so they must be JSON values (no
            `ssl_context` objects).

    Returns:
        partition -> records written (int), for every partition 0..P-1.

    Raises:
        ConfigurationError: the topic does not exist or has another partition count than
            `partitions`; bad `partitions` or `workers`.
        DataError: the frame lacks a column or holds nulls.
        StackError: the broker is unreachable or refuses, a worker fails, or a partition did not
            grow by the records sent to it (lost or duplicated records, or another writer).
    """
    _check_partitions(partitions)
    if isinstance(workers, bool) or not isinstance(workers, (int, np.integer)) or workers < 1:
        raise ConfigurationError(f"workers must be an int >= 1, got {workers!r}")
    _check_columns(frame, list(RECORD_FIELDS))
    options = {"bootstrap_servers": bootstrap_servers, **dict(client_options or {})}
    expected = partition_counts(frame, partitions)
    before = _end_offsets(options, topic, partitions)
    key_counts = frame["origin"].value_counts()
    shares = split_keys(key_counts, workers) if len(frame) else []
    started = time.monotonic()
    if len(shares) <= 1:
        _produce(options, topic, frame)
    else:
        _run_workers(options, topic, frame, shares)
    seconds = time.monotonic() - started
    after = _end_offsets(options, topic, partitions)
    grown = {p: after[p] - before[p] for p in range(partitions)}
    if grown != expected:
        raise StackError(
            f"topic {topic!r} partitions grew by {grown}, expected {expected} from the records sent "
            "(lost or duplicated records, or another writer)"
        )
    log.info("wrote %d records to %s in %.1f s (%.0f records/s, %d process(es))",
             len(frame), topic, seconds, len(frame) / seconds if seconds > 0 else 0.0, max(1, len(shares)))
    return expected


def _produce(options: Mapping[str, object], topic: str, frame: pd.DataFrame) -> int:
    """Send every row of `frame` in order with one plain producer; flush; return the rows sent."""
    try:
        producer = KafkaProducer(**options, **PLAIN_PRODUCER_CONFIG)
    except KafkaError as exc:
        raise StackError(f"cannot start a Kafka producer for {options['bootstrap_servers']}: {exc}") from exc
    keys: dict[str, bytes] = {}
    try:
        columns = [frame[name].tolist() for name in RECORD_FIELDS]
        for event_id, origin, destination, delay_min, distance_mi, event_time in zip(*columns):
            key = keys.get(origin)
            if key is None:
                key = keys[origin] = origin.encode()
            value = record_value(event_id, origin, destination, delay_min, distance_mi, event_time)
            producer.send(topic, key=key, value=value)
        producer.flush()
    except KafkaError as exc:
        raise StackError(f"producing to {topic!r} failed: {exc}") from exc
    finally:
        producer.close()
    return len(frame)


def _run_workers(options: Mapping[str, object], topic: str, frame: pd.DataFrame, shares: list[list[str]]) -> None:
    """Write each share of keys from its own producer: the first share from this process, the
    others each from a worker process (`python -m keyshift.data.drift`), all at once.

    A worker gets its rows (frame order) as an Arrow IPC stream on stdin, the job (servers,
    topic, client options) in the schema metadata; its stderr goes to a temporary file quoted on
    failure. Workers still running when this process fails are killed.
    """
    processes: list[tuple[subprocess.Popen, object]] = []
    try:
        for keys in shares[1:]:
            rows = frame.loc[frame["origin"].isin(keys), list(RECORD_FIELDS)]
            table = pa.Table.from_pandas(rows, preserve_index=False)
            job = json.dumps({"options": dict(options), "topic": topic}).encode()
            table = table.replace_schema_metadata({**(table.schema.metadata or {}), _META_KEY: job})
            errors = tempfile.TemporaryFile()
            process = subprocess.Popen([sys.executable, "-m", "keyshift.data.drift"],
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors)
            processes.append((process, errors))
            try:
                with pa.ipc.new_stream(process.stdin, table.schema) as writer:
                    writer.write_table(table)
                process.stdin.close()
            except OSError:  # the worker died early; its status and stderr are reported below
                pass
        _produce(options, topic, frame.loc[frame["origin"].isin(shares[0])])
        failures = []
        for index, (process, errors) in enumerate(processes, start=1):
            process.stdout.read()
            if process.wait() != 0:
                errors.seek(0)
                tail = errors.read().decode("utf-8", "replace").strip().splitlines()[-5:]
                failures.append(f"worker {index} exited with status {process.returncode}: {' | '.join(tail)}")
        if failures:
            raise StackError(f"write_plain to {topic!r} failed: " + "; ".join(failures))
    finally:
        for process, errors in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
            errors.close()


def _worker_main() -> None:
    """Worker process: an Arrow IPC stream of rows on stdin (job in its schema metadata), writes
    them with `_produce`, prints `{"sent": n, "seconds": s}`; exit status 1 on failure."""
    table = pa.ipc.open_stream(sys.stdin.buffer).read_all()
    job = json.loads(table.schema.metadata[_META_KEY])
    started = time.monotonic()
    sent = _produce(job["options"], job["topic"], table.to_pandas())
    print(json.dumps({"sent": sent, "seconds": round(time.monotonic() - started, 3)}), flush=True)


def _end_offsets(options: Mapping[str, object], topic: str, partitions: int) -> dict[int, int]:
    """End offset per partition of `topic`, after checking it exists with `partitions` partitions."""
    try:
        consumer = KafkaConsumer(**options, enable_auto_commit=False, allow_auto_create_topics=False)
    except KafkaError as exc:
        raise StackError(f"no Kafka broker answers at {options['bootstrap_servers']}: {exc}") from exc
    try:
        found = consumer.partitions_for_topic(topic)
        if not found:
            raise ConfigurationError(f"topic {topic!r} does not exist; create it first (keyshift.topics.create_topics)")
        if sorted(found) != list(range(partitions)):
            raise ConfigurationError(f"topic {topic!r} has {len(found)} partitions, not {partitions}")
        offsets = consumer.end_offsets([TopicPartition(topic, p) for p in range(partitions)])
    except KafkaError as exc:
        raise StackError(f"cannot read end offsets of {topic!r}: {exc}") from exc
    finally:
        consumer.close()
    return {tp.partition: int(offset) for tp, offset in offsets.items()}


def _check_partitions(partitions: int) -> None:
    if isinstance(partitions, bool) or not isinstance(partitions, (int, np.integer)) or partitions < 1:
        raise ConfigurationError(f"partitions must be an int >= 1, got {partitions!r}")


def _check_columns(frame: pd.DataFrame, names: list[str]) -> None:
    missing = [n for n in names if n not in frame.columns]
    if missing:
        raise DataError(f"frame lacks columns {missing} (has {list(frame.columns)})")
    for name in names:
        nulls = int(frame[name].isna().sum())
        if nulls:
            raise DataError(f"frame column {name!r} holds {nulls} nulls")


if __name__ == "__main__":
    _worker_main()
