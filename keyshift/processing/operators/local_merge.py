"""Local Merge: partial window aggregates per (key, window, slot) before the shuffle.

Paper 000 §4.3 (Local Merge) pre-aggregates on the sending side so that the keyed exchange
carries partials instead of events. Here it also decides each row's slot token, so the events
cross into Python once before the shuffle instead of twice. It matters because pyspark 4.2's
transformWithStateInPandas rebuilds its input row by row in Python: its cost grows with the rows
it receives, and a micro-batch of 250,000 flights becomes about 40,000 partials.

Every event stays traceable: a partial carries the event ids, times, Kafka offsets and the
payload fields of its events as lists (`<column>_list`; flights: destination, delay_min,
distance_mi), which the processor unpacks only when the partial turns out to be late (its
window already closed) or holds a duplicate. Dead letters pass through one row each. A key split
by hot_split yields one partial per (window, piece), each with its piece's slot token. The
columns come from the job's spec (`keyshift.jobs.spec.JobSpec`).

A spec with `keep`: the records its rule left out (reason `FILTERED`) become one row per Kafka
partition of the chunk, `count` = how many, in the dead-letter lane (reason `filtered`, first
offset), so the processor counts them as processed and the sink as filtered, without one row per
record crossing the shuffle. A spec with `key_lookup`: the key has been looked up before
(`keyshift.processing.operators.ingest`, with `keyshift.processing.operators.key_lookup`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import types as T

from keyshift.eventtime.windows import window_starts_ms
from keyshift.placement.spark_tokens import assignment_token_lookup, token_lookup
from keyshift.placement.strategies import place_events
from keyshift.processing.operators.exchange import Emit, merge_segments
from keyshift.processing.operators.records import FILTERED, parsed_columns
from keyshift.jobs.spec import JobSpec, list_column
from keyshift.deferred_import import deferred_module

pd = deferred_module("pandas")  # not imported by the pre-init process (keyshift.deferred_import)

EMIT_BATCH = Emit("batch")
"""Local Merge's default emit mode: a task's whole slice of the micro-batch at once."""


def partial_schema(spec: JobSpec) -> T.StructType:
    """Rows sent to the stateful processor: a partial (count events of a key in a window, with
    each aggregate of the spec) or, when `dead_letter_reason` is set, one dead letter (count 1,
    `kafka_offsets` and the raw payload `raw_value`, `raw_encoding`, `raw_key_base64` of
    `keyshift.processing.operators.records` set)."""
    return T.StructType(
        [
            T.StructField("token", T.IntegerType(), False),
            T.StructField(spec.key, T.StringType(), True),
            T.StructField("window_start_ms", T.LongType(), True),
            T.StructField("count", T.LongType(), False),
            *[T.StructField(a.name, T.LongType(), True) for a in spec.aggregates],
            T.StructField("event_ids", T.ArrayType(T.LongType()), True),
            T.StructField("event_times_ms", T.ArrayType(T.LongType()), True),
            *[T.StructField(list_column(f.col), T.ArrayType(f.spark_type), True) for f in spec.payload],
            T.StructField("kafka_offsets", T.ArrayType(T.LongType()), True),
            T.StructField("kafka_partition", T.IntegerType(), True),
            T.StructField("dead_letter_reason", T.StringType(), True),
            T.StructField("raw_value", T.StringType(), True),
            T.StructField("raw_encoding", T.StringType(), True),
            T.StructField("raw_key_base64", T.StringType(), True),
        ]
    )


def input_columns(spec: JobSpec) -> tuple[str, ...]:
    """Columns `partials_of` reads (`keyshift.processing.operators.records.parsed_columns` without the
    control columns)."""
    return tuple(c for c in parsed_columns(spec) if c not in ("is_control", "control_run_id"))


def row_tokens(
    key_codes: np.ndarray,
    key_names: Sequence[str],
    event_ids: np.ndarray,
    token_of,
    split_tokens: Mapping[str, np.ndarray] | None = None,
) -> np.ndarray:
    """The slot token of every event: its key's token, or for a split key the token of its piece.

    A split key (hot_split) with slots (s_0, ..., s_{k-1}) sends event `event_id` to slot
    s_(event_id mod k) (`keyshift.placement.strategies.place_events`, the rule the replay places
    Kafka records by), so a split key's records reach the stateful slot of the partition they
    were written to (Ahead KeyBy).

    Args:
        key_codes: int array, one code per event, indexing `key_names` (`pd.factorize`).
        key_names: the distinct keys.
        event_ids: int64 array of the events' ids (>= 0).
        token_of: key -> slot token for a key placed whole.
        split_tokens: split key -> int32 array of its slots' tokens (piece i on element i), or None.

    Returns:
        An int32 array of tokens, one per event.
    """
    per_key = np.array([token_of(name) for name in key_names], dtype=np.int32)
    pieces = {code: split_tokens[name] for code, name in enumerate(key_names) if name in (split_tokens or {})}
    return place_events(key_codes, event_ids, per_key, pieces)


def per_kafka_partition(segments: np.ndarray | None, kafka_partitions: np.ndarray) -> np.ndarray | None:
    """Merge segments that never span a Kafka partition: `segments` refined by each event's
    Kafka partition, so a partial's events share one `kafka_partition` and its `kafka_offsets`
    say exactly where they were read (late events and dead letters keep their coordinates).

    A task of the coalesced ingest stage (`JobConfig.source_tasks` < P) reads several
    Kafka partitions; under Ahead KeyBy (a key-affine topic) a key is in one of them, so this
    adds no partial there; on a `round_robin` topic it keeps one partial per (key, window,
    token, Kafka partition), as one task per Kafka partition made.

    Args:
        segments: int64 array of merge segments, one per event (`merge_segments`), or None (one).
        kafka_partitions: int array, each event's Kafka partition.

    Returns:
        `segments` unchanged when every event is of one Kafka partition; else an int64 array
        that differs between two events iff their segment or Kafka partition differs.
    """
    if len(kafka_partitions) == 0 or (kafka_partitions == kafka_partitions[0]).all():
        return segments
    partitions = np.asarray(kafka_partitions, dtype=np.int64)
    if segments is None:
        return partitions
    return partitions * (int(segments.max()) + 1) + segments


def partial_groups(key_codes: np.ndarray, starts: np.ndarray, event_tokens: np.ndarray,
                   segments: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """How events fall into partials: one partial per (key, window start, token), and per merge
    segment when `segments` is given (`keyshift.processing.operators.exchange.merge_segments`).

    Args:
        key_codes, starts, event_tokens: one int array each, one element per event (key index,
            window start in ms of event time, slot token).
        segments: int array of each event's merge segment, or None (one segment).

    Returns:
        (order: the events sorted by key code, segment, window start, token; boundary: positions
        in `order` where a new partial begins, the first excluded; first: every partial's first
        position, 0 included).
    """
    if segments is None:
        order = np.lexsort((event_tokens, starts, key_codes))
    else:
        order = np.lexsort((event_tokens, starts, segments, key_codes))
    codes, begins, tokens = key_codes[order], starts[order], event_tokens[order]
    change = (np.diff(codes) != 0) | (np.diff(begins) != 0) | (np.diff(tokens) != 0)
    if segments is not None:
        change |= np.diff(segments[order]) != 0
    boundary = np.flatnonzero(change) + 1
    return order, boundary, np.concatenate(([0], boundary))


def partials_of(
    events: pd.DataFrame,
    spec: JobSpec,
    token_of,
    tokens: np.ndarray,
    window_ms: int,
    split_tokens: Mapping[str, np.ndarray] | None = None,
) -> pd.DataFrame:
    """Partial aggregates of one chunk of parsed records.

    Args:
        events: `input_columns(spec)` of valid and rejected records of one Spark partition.
        spec: the job (key, aggregates, payload fields).
        token_of: key -> slot token (`keyshift.placement.spark_tokens.token_lookup`).
        tokens: slot -> token array; a dead letter goes to `tokens[kafka_partition mod P]`.
        window_ms: tumbling window size, ms of event time.
        split_tokens: hot_split's split keys -> their slots' tokens (see `row_tokens`); a split
            key gets one partial per (window, piece), each on its piece's slot.

    Returns:
        A frame of `partial_schema(spec)` columns: one row per (key, window start, token, Kafka
        partition) present, with count, each aggregate, and the lists of its events' fields,
        plus one row
        per dead letter. Σ `count` = rows of `events`.
    """
    columns_out = partial_schema(spec).fieldNames()
    rejected = events["dead_letter_reason"].notna().to_numpy()
    frames = []
    filtered = (events["dead_letter_reason"] == FILTERED).to_numpy()
    if filtered.any():
        partitions, first = np.unique(events["kafka_partition"].to_numpy(np.int64)[filtered], return_index=True)
        counts = np.bincount(np.searchsorted(partitions, events["kafka_partition"].to_numpy(np.int64)[filtered]))
        nothing = [None] * len(partitions)
        columns = {name: nothing for name in columns_out}
        columns.update(
            token=tokens[partitions % len(tokens)].astype(np.int32),
            count=counts.astype(np.int64),
            kafka_offsets=[[int(o)] for o in events["kafka_offset"].to_numpy(np.int64)[filtered][first]],
            kafka_partition=partitions.astype(np.int32),
            dead_letter_reason=[FILTERED] * len(partitions),
        )
        frames.append(pd.DataFrame(columns, columns=columns_out))
    dead_rows = rejected & ~filtered
    if dead_rows.any():
        dead = events[dead_rows]
        partitions = dead["kafka_partition"].to_numpy(np.int64)
        nothing = [None] * len(dead)  # None, not NaN: Spark reads NaN in a list column as a value
        columns = {name: nothing for name in columns_out}
        columns.update(
            token=tokens[partitions % len(tokens)].astype(np.int32),
            count=np.ones(len(dead), dtype=np.int64),
            kafka_offsets=[[int(o)] for o in dead["kafka_offset"]],
            kafka_partition=partitions.astype(np.int32),
            dead_letter_reason=dead["dead_letter_reason"].to_numpy(),
            raw_value=dead["raw_value"].to_numpy(),
            raw_encoding=dead["raw_encoding"].to_numpy(),
            raw_key_base64=dead["raw_key_base64"].to_numpy(),
        )
        frames.append(pd.DataFrame(columns, columns=columns_out))
    valid = events[~rejected]
    if len(valid):
        keys = valid[spec.key].to_numpy()
        starts = window_starts_ms(valid[spec.event_time].to_numpy(np.int64), window_ms)
        key_codes, key_names = pd.factorize(keys)
        event_ids = valid[spec.event_id].to_numpy(np.int64)
        event_tokens = row_tokens(key_codes, key_names, event_ids, token_of, split_tokens)
        segments = per_kafka_partition(None, valid["kafka_partition"].to_numpy(np.int64))
        order, boundary, first = partial_groups(key_codes, starts, event_tokens, segments)
        codes_sorted, starts_sorted, tokens_sorted = key_codes[order], starts[order], event_tokens[order]

        def lists(values: np.ndarray) -> list[np.ndarray]:
            return np.split(values[order], boundary)

        data = {
            "token": tokens_sorted[first],
            spec.key: key_names[codes_sorted[first]],
            "window_start_ms": starts_sorted[first],
            "count": np.diff(np.concatenate((first, [len(order)]))),
        }
        for aggregate in spec.aggregates:
            values = valid[aggregate.field].to_numpy(np.int64)[order]
            data[aggregate.name] = aggregate.merge.reduceat(values, first)
        data["event_ids"] = lists(event_ids)
        data["event_times_ms"] = lists(valid[spec.event_time].to_numpy(np.int64))
        for f in spec.payload:
            data[list_column(f.col)] = lists(valid[f.col].to_numpy(np.int64 if f.dtype == "long" else object))
        data["kafka_offsets"] = lists(valid["kafka_offset"].to_numpy(np.int64))
        data["kafka_partition"] = valid["kafka_partition"].to_numpy(np.int32)[order][first]
        for name in ("dead_letter_reason", "raw_value", "raw_encoding", "raw_key_base64"):
            data[name] = [None] * len(first)
        frames.append(pd.DataFrame(data, columns=columns_out))
    if not frames:
        return pd.DataFrame({name: [] for name in columns_out})
    return frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)


def partials_function(
    spec: JobSpec,
    strategy_name: str,
    partitions: int,
    window_ms: int,
    assignment: dict[str, int] | None = None,
    store: tuple[str, str] | None = None,
    split: Mapping[str, Sequence[int]] | None = None,
    emit: Emit | None = EMIT_BATCH,
    stateful_partitions: int | None = None,
):
    """Local Merge as the engine's ingest stage runs it (`keyshift.processing.operators.ingest`): a
    function from one Spark partition's ingested events (a table of `input_columns(spec)`) to
    its partials (`partials_arrow`, a table of `arrow_partial_schema(spec)`).

    A Spark partition holds the micro-batch's slice of one Kafka partition, or of a range of
    them when the ingest stage is coalesced (`JobConfig.source_tasks`); every event
    of a partial shares its `kafka_partition` (`per_kafka_partition`), and the slice (at most
    `maxOffsetsPerTrigger` records) is aggregated at once. The processor merges partials of the
    same window from different micro-batches, so how input is cut changes speed, never results.

    With `assignment` (key -> slot, a learned strategy's map read from Redis at job start) and
    `store` ((redis_url, assignment name) for keys it lacks), slots come from that shared
    assignment instead of a rule the executor computes itself; the lookup is built on the
    worker, at the first call. With `split` (hot_split: key -> its slots, two or more), a split
    key's events are spread over its slots by `row_tokens`; the sink merges the key's windows
    from those slots before writing them. `emit` is the emit mode (`keyshift.processing.operators.exchange`;
    default `batch`, the whole slice at once); None is the `plain` exchange: one partial per event.
    `stateful_partitions` is S, the query's stateful partitions the slot tokens steer to
    (`keyshift.placement.tokens.slot_tokens`; None: S = P).
    """
    placement: list = []
    schema = arrow_partial_schema(spec)

    def merge(events: pa.Table) -> pa.Table:
        if not placement:
            if assignment is not None:
                token_of, tokens = assignment_token_lookup(assignment, partitions, *store, stateful_partitions)
            else:
                token_of, tokens = token_lookup(strategy_name, partitions, stateful_partitions)
            placement.append((token_of, tokens, {key: tokens[list(slots)] for key, slots in (split or {}).items()}))
        token_of, tokens, split_tokens = placement[0]
        return partials_arrow(events, spec, token_of, tokens, window_ms, split_tokens, schema, emit)

    return merge


def arrow_partial_schema(spec: JobSpec) -> pa.Schema:
    """`partial_schema(spec)` as the Arrow schema a `mapInArrow` function must return."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(partial_schema(spec))


def _list_array(offsets: pa.Array, values: pa.Array) -> pa.ListArray:
    return pa.ListArray.from_arrays(offsets, values)


def _filtered_arrow(filtered: pa.Table, tokens: np.ndarray, schema: pa.Schema) -> pa.Table:
    """One `FILTERED` row per Kafka partition of `filtered` (records the spec's `keep` left out):
    count = its records, kafka_offsets = [its first record's offset], token of slot
    partition mod P; every other column NULL."""
    all_partitions = filtered.column("kafka_partition").to_numpy().astype(np.int64)
    partitions, first, counts = np.unique(all_partitions, return_index=True, return_counts=True)
    n = len(partitions)
    offsets = filtered.column("kafka_offset").to_numpy().astype(np.int64)[first]
    arrays = {field.name: pa.nulls(n, field.type) for field in schema}
    arrays.update(
        token=pa.array(tokens[partitions % len(tokens)].astype(np.int32)),
        count=pa.array(counts.astype(np.int64)),
        kafka_offsets=_list_array(pa.array(np.arange(n + 1, dtype=np.int32)), pa.array(offsets)),
        kafka_partition=pa.array(partitions.astype(np.int32)),
        dead_letter_reason=pa.array([FILTERED] * n, pa.string()),
    )
    return pa.table([arrays[f.name].cast(f.type) for f in schema], schema=schema)


def partials_arrow(
    events: pa.Table,
    spec: JobSpec,
    token_of,
    tokens: np.ndarray,
    window_ms: int,
    split_tokens: Mapping[str, np.ndarray] | None = None,
    schema: pa.Schema | None = None,
    emit: Emit | None = EMIT_BATCH,
) -> pa.Table:
    """`partials_of` on Arrow data: the same rows (in the same order), built without pandas.

    The event lists are Arrow list arrays over the sorted columns (one `take` per column and an
    offsets array), not one Python object per partial, which is what made Local Merge cost about
    as much as parsing. Used by `partials_function`; `partials_of` stays the readable
    definition both are tested against.

    Args:
        events: a table of `input_columns(spec)` (one Spark partition's slice).
        spec, token_of, tokens, window_ms, split_tokens: as `partials_of`.
        schema: `arrow_partial_schema(spec)` (computed when None).
        emit: the emit mode (`keyshift.processing.operators.exchange.Emit`, default `batch`); None: one
            partial per event (the `plain` exchange). Only `batch` matches `partials_of`.

    Returns:
        A table of `schema`: the valid events' partials, sorted by (key code, window start,
        token) as `partials_of` sorts them (with a merge segment after the key code for other
        emit modes or a slice of several Kafka partitions, `per_kafka_partition`), after the
        dead letters (one row each). Σ `count` = rows of `events`.
    """
    schema = schema or arrow_partial_schema(spec)
    reasons = events.column("dead_letter_reason")
    rejected = np.asarray(reasons.is_valid(), dtype=bool) if reasons.null_count < len(reasons) else np.zeros(len(reasons), bool)
    pieces = []
    dead_rows = rejected
    if spec.keep is not None and rejected.any():
        filtered = np.asarray(pc.fill_null(pc.equal(reasons, FILTERED), False), dtype=bool)
        if filtered.any():
            pieces.append(_filtered_arrow(events.filter(pa.array(filtered)), tokens, schema))
            dead_rows = rejected & ~filtered
    if dead_rows.any():
        dead = events.filter(pa.array(dead_rows))
        n = dead.num_rows
        partitions = dead.column("kafka_partition").to_numpy().astype(np.int64)
        arrays = {field.name: pa.nulls(n, field.type) for field in schema}
        arrays.update(
            token=pa.array(tokens[partitions % len(tokens)].astype(np.int32)),
            count=pa.array(np.ones(n, dtype=np.int64)),
            kafka_offsets=_list_array(pa.array(np.arange(n + 1, dtype=np.int32)), dead.column("kafka_offset").combine_chunks()),
            kafka_partition=pa.array(partitions.astype(np.int32)),
        )
        for name in ("dead_letter_reason", "raw_value", "raw_encoding", "raw_key_base64"):
            arrays[name] = dead.column(name).combine_chunks().cast(schema.field(name).type)
        pieces.append(pa.table([arrays[f.name] for f in schema], schema=schema))
    valid = events.filter(pa.array(~rejected)) if rejected.any() else events
    n = valid.num_rows
    if n:
        encoded = valid.column(spec.key).combine_chunks().dictionary_encode()
        key_codes = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        key_names = encoded.dictionary
        times = valid.column(spec.event_time).to_numpy().astype(np.int64)
        event_ids = valid.column(spec.event_id).to_numpy().astype(np.int64)
        starts = window_starts_ms(times, window_ms)
        event_tokens = row_tokens(key_codes, key_names.to_pylist(), event_ids, token_of, split_tokens)
        segments = per_kafka_partition(merge_segments(emit, key_codes, starts),
                                       valid.column("kafka_partition").to_numpy().astype(np.int64))
        order, boundary, first = partial_groups(key_codes, starts, event_tokens, segments)
        codes_sorted, starts_sorted, tokens_sorted = key_codes[order], starts[order], event_tokens[order]
        offsets = pa.array(np.concatenate((first, [n])).astype(np.int32))
        take = pa.array(order)
        m = len(first)

        def sorted_list(column: str) -> pa.ListArray:
            return _list_array(offsets, valid.column(column).combine_chunks().take(take))

        arrays = {
            "token": pa.array(tokens_sorted[first].astype(np.int32)),
            spec.key: key_names.take(pa.array(codes_sorted[first])).cast(schema.field(spec.key).type),
            "window_start_ms": pa.array(starts_sorted[first]),
            "count": pa.array(np.diff(np.concatenate((first, [n]))).astype(np.int64)),
            "event_ids": _list_array(offsets, pa.array(event_ids[order])),
            "event_times_ms": _list_array(offsets, pa.array(times[order])),
            "kafka_offsets": sorted_list("kafka_offset"),
            "kafka_partition": pa.array(valid.column("kafka_partition").to_numpy().astype(np.int32)[order][first]),
        }
        for aggregate in spec.aggregates:
            values = valid.column(aggregate.field).to_numpy().astype(np.int64)[order]
            arrays[aggregate.name] = pa.array(aggregate.merge.reduceat(values, first))
        for f in spec.payload:
            arrays[list_column(f.col)] = sorted_list(f.col)
        for name in ("dead_letter_reason", "raw_value", "raw_encoding", "raw_key_base64"):
            arrays[name] = pa.nulls(m, schema.field(name).type)
        pieces.append(pa.table([arrays[f.name].cast(f.type) for f in schema], schema=schema))
    if not pieces:
        return schema.empty_table()
    return pieces[0] if len(pieces) == 1 else pa.concat_tables(pieces)
