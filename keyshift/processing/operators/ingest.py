"""Ingest: raw Kafka records -> validated events or Local Merge partials, in one Python pass.

The engine's source stage is one `mapInArrow` over the Kafka source's `key`, `value`,
`partition` and `offset` columns (`ingest_function`). A task reads one Kafka partition's slice
of the micro-batch, or, with the ingest stage coalesced, the slices of a range of them one after
the other; the records are cut into chunks of one Kafka partition each, `chunk_records`
(`spark.sql.execution.arrow.maxRecordsPerBatch`, 10,000 by default) counted from the start of
the partition's slice, as Spark cuts a task of one Kafka partition (`kafka_partition_chunks`).
For each chunk it:

1. keeps the run's own records (`keep_own_records`): its events below the run's end offsets and
   its own end-of-input markers (`keyshift.names.END_OF_INPUT_PREFIX`); other runs'
   markers and records past the end (a later replay into the same topic) are dropped uncounted;
2. validates every record by the rules of `keyshift.processing.operators.records` (module docstring, rules
   1 to 7, same reasons in the same order): a record in the spec's canonical shape (the fields in
   the spec's order, each once, integers of at most 18 digits, strings without escapes: what
   keyshift's producers write) is recognized by one RE2 regular expression (`canonical_pattern`,
   pyarrow's `match_substring_regex`), its values are taken from fixed pieces of it split at its
   double quotes (`canonical_fields`), and it is judged by the value rules 6 and 7 vectorized; every other record takes the strict path, `keyshift.processing.operators.strict_records`;
3. applies the spec's `keep` rule (`FILTERED`);
4. judges event-time plausibility (`keyshift.eventtime.plausibility.implausible_reasons`) over
   the chunk's valid events, against the chunk's own Kafka partition's clock and the batch's
   timestamp (`IngestContext.partition_reference`), and adds the chunk to the task's report of
   that partition (records, largest valid event time, marker), which the task writes for the
   driver (`keyshift.eventtime.partition_clocks`).

After the last chunk of a Spark partition, a spec with `key_lookup` looks its keys up
(`keyshift.processing.operators.key_lookup`); every dead letter gets its payload (`raw_value` as text when
the bytes are UTF-8, else base64; `raw_encoding`; `raw_key_base64`); then, for a tumbling spec,
Local Merge cuts the partials (`keyshift.processing.operators.local_merge.partials_arrow`), or, for a
key-window spec, the events pass one row each. Either way each row carries `event_ts`, the
largest event time it holds (paper 000 §4.3: a merged record carries the largest event time of
what it merged; NULL for a dead letter or a filtered row), and the run's own markers pass as
rows with `is_control` set, so that Spark's watermark, taken over `event_ts` after this stage,
is exactly the one it would take over the events themselves (max over partials of their max =
max over events), and the markers still move it. In every watermark mode but `global` each row's
`event_ts` is then capped at its partition's M(p), the minimum of the other active partitions'
clocks (`capped_event_times`), so that Spark's watermark follows the slowest active partition
(`keyshift.eventtime.partition_clocks`).

This replaces a chain of Spark expressions (`from_json`, the variant parse, a CASE of the rules,
a regular expression), a pandas UDF for plausibility and a second `mapInArrow` for Local Merge:
the records cross from the JVM into Python once, as raw bytes, and the JVM does not parse JSON
at all (issue 11's profile: those expressions took about half the job's JVM CPU time).
`keyshift.processing.operators.records.validate_records` stays the reference definition of the rules in
Spark expressions; `tests/unit/test_ingest.py` checks this module against it record by record.

One difference with the Spark chain: a record that the key lookup rejects (`unknown ad_id`, a key
that does not match) no longer moves the watermark, since the watermark is now taken after the
lookup; as for every other dead letter, its event time is not trusted.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import types as T

from keyshift.eventtime.batch_channel import task_batch
from keyshift.eventtime.partition_clocks import PartitionClocks, SliceReport, cap_event_times
from keyshift.eventtime.plausibility import BatchReference, PlausibilityLimits, implausible_reasons
from keyshift.processing.operators.records import (
    FILTERED, MAX_CODE_BYTES, key_mismatch, record_columns,
)
from keyshift.jobs.spec import JobSpec
from keyshift.names import END_OF_INPUT_PREFIX
from keyshift.processing.operators.handover import barrier_rows, handover_requested
from keyshift.processing.operators.strict_records import control_marker, java_utf8_decode, strict_record

EVENT_TS_COLUMN = "event_ts"
"""The column Spark's watermark is taken over: the largest event time a row holds (timestamp)."""
CONTROL_COLUMN = "is_control"
"""True for an end-of-input marker row (dropped after the watermark operator)."""

_WS = r"[ \t\r\n]*"
_RE2_VALUE = {
    # a JSON integer of at most 18 digits: always inside the 64-bit range (`-0` takes the strict path)
    "long": r"0|-?[1-9][0-9]{0,17}",
    # the inside of a JSON string without escapes or control characters (RFC 8259 §7)
    "string": r'[^"\\\x00-\x1F]*',
}
_RAW_COLUMNS = ("raw_value_bytes", "raw_key_bytes")


def canonical_pattern(spec: JobSpec) -> str:
    """An RE2 pattern (pyarrow's `match_substring_regex`) that matches exactly the records in the
    spec's canonical shape: one JSON object with exactly the spec's fields in the spec's order,
    each once, a long as an integer of at most 18 digits, a string without escape sequences or
    control characters, JSON whitespace where RFC 8259 allows it, nothing after the object but
    whitespace. The same shape as `keyshift.processing.operators.records.canonical_record_pattern` (the
    Java one).

    Every record it matches passes rules 1 to 5 of `keyshift.processing.operators.records`, and its field
    values are where `canonical_fields` finds them (a string field's text is its value as it
    is, an integer fits a signed 64-bit long), so only the value rules 6 and 7 remain.
    """
    members = f"{_WS},{_WS}".join(
        f'"{_re2_escape(f.name)}"{_WS}:{_WS}' + (f'"{_RE2_VALUE["string"]}"' if f.dtype == "string" else f"(?:{_RE2_VALUE['long']})")
        for f in spec.fields
    )
    return rf"^{_WS}\{{{_WS}{members}{_WS}\}}{_WS}$"


def canonical_piece_positions(spec: JobSpec) -> dict[str, int]:
    """Where each field's value is among the pieces of a canonical record split at its double
    quotes (`canonical_fields`): field column -> piece index.

    A canonical record has a double quote only around names and string values, so the pieces
    are, in order: what precedes the first name; then per field its name and, for a string field,
    the text between name and value (`:` and whitespace), the value itself and the text up to the
    next name (`,` and whitespace, or the closing `}`); for a long field, one piece holding `:`,
    the integer and what follows up to the next name (`,` or `}`, whitespace).
    """
    positions, at = {}, 1
    for f in spec.fields:
        if f.dtype == "string":
            positions[f.col], at = at + 2, at + 4
        else:
            positions[f.col], at = at + 1, at + 2
    return positions


_INTEGER_FRAME = " \t\r\n:,}"
"""What surrounds an integer in its piece of a canonical record (`canonical_piece_positions`)."""


def canonical_fields(text: pa.Array, spec: JobSpec, columns: Sequence[str]) -> dict[str, pa.Array]:
    """The values of `columns` (field columns of `spec`) of canonical records.

    Args:
        text: a string array of records that all match `canonical_pattern(spec)`.
        spec: the job. columns: the field columns wanted.

    Returns:
        Column -> an array of the field's values, one per record: int64 for a long field,
        string for a string field.

    Splitting at the double quotes and taking fixed pieces costs a fraction of a regular
    expression with a capture group per field (RE2's submatch search is its slow path).
    """
    positions = canonical_piece_positions(spec)
    pieces = pc.split_pattern(text, '"')
    flat = pc.list_flatten(pieces)
    starts = pieces.offsets.to_numpy()[:-1].astype(np.int64)
    dtypes = {f.col: f.dtype for f in spec.fields}
    values = {}
    for column in columns:
        piece = flat.take(pa.array(starts + positions[column]))
        values[column] = pc.cast(pc.utf8_trim(piece, _INTEGER_FRAME), pa.int64()) if dtypes[column] == "long" else piece
    return values


def _re2_escape(text: str) -> str:
    return "".join(c if c.isalnum() or c == "_" else "\\" + c for c in text)


def ingest_columns(spec: JobSpec) -> tuple[str, ...]:
    """Columns of a chunk after ingest (`ingest_chunk`), in order: the record's columns
    (`keyshift.processing.operators.records.record_columns`, NULL for a rejected record),
    `dead_letter_reason`, `kafka_partition`, `kafka_offset` and the raw `raw_value_bytes`,
    `raw_key_bytes` that a dead letter's payload is made of."""
    return (*record_columns(spec), "dead_letter_reason", "kafka_partition", "kafka_offset", *_RAW_COLUMNS)


def ingest_schema(spec: JobSpec) -> pa.Schema:
    """Arrow schema of `ingest_columns(spec)`."""
    types = {f.col: (pa.int64() if f.dtype == "long" else pa.string()) for f in spec.fields}
    types[spec.key] = pa.string()
    fields = [pa.field(c, types[c]) for c in record_columns(spec)]
    fields += [pa.field("dead_letter_reason", pa.string()), pa.field("kafka_partition", pa.int32()),
               pa.field("kafka_offset", pa.int64()), pa.field("raw_value_bytes", pa.binary()),
               pa.field("raw_key_bytes", pa.binary())]
    return pa.schema(fields)


@dataclass(frozen=True)
class Marker:
    """One of the run's own end-of-input markers: its Kafka partition and offset and its event
    time (ms)."""

    partition: int
    offset: int
    event_time_ms: int


DEFAULT_CHUNK_RECORDS = 10_000
"""Spark's default `spark.sql.execution.arrow.maxRecordsPerBatch`: records per ingest chunk."""


def kafka_partition_chunks(batches: Iterable[pa.RecordBatch], chunk_records: int) -> Iterator[pa.RecordBatch]:
    """Re-cut a task's Arrow batches into chunks of one Kafka partition each.

    The plausibility rule judges an event against the median of the events near it in its
    Kafka partition's offset order (`keyshift.eventtime.plausibility`, "the chunk"). A coalesced
    ingest task reads several Kafka partitions' slices one after the other, and Spark's Arrow
    batches run across their boundaries: a block would then mix the end of one partition's
    slice with the start of the next, weeks of event time apart in a backfill (the first bench
    with coalescing made 1,493 dead letters per batch that way). Cut here, every chunk holds
    records of one Kafka partition, at most `chunk_records`, counted from the start of that
    partition's slice in the task: exactly the chunks Spark hands a task of one Kafka partition
    with `maxRecordsPerBatch` = `chunk_records`.

    Args:
        batches: Arrow batches with an int `partition` column; each Kafka partition's records
            contiguous (a coalesced task reads its partitions one after another).
        chunk_records: records per chunk at most, >= 1.

    Yields:
        Non-empty Arrow record batches of the same schema, in input order.
    """
    pending: list[pa.RecordBatch] = []
    pending_rows, current = 0, None

    def flush() -> pa.RecordBatch:
        return pending[0] if len(pending) == 1 else pa.concat_batches(pending)

    for batch in batches:
        if not batch.num_rows:
            continue
        partitions = batch.column("partition").to_numpy(zero_copy_only=False)
        cuts = (np.flatnonzero(partitions[1:] != partitions[:-1]) + 1).tolist()
        for start, end in zip([0, *cuts], [*cuts, len(partitions)]):
            piece = batch.slice(start, end - start)
            if partitions[start] != current:
                if pending:
                    yield flush()
                pending, pending_rows, current = [], 0, partitions[start]
            while piece.num_rows:
                take = min(chunk_records - pending_rows, piece.num_rows)
                pending.append(piece.slice(0, take))
                pending_rows += take
                piece = piece.slice(take)
                if pending_rows == chunk_records:
                    yield flush()
                    pending, pending_rows = [], 0
    if pending:
        yield flush()


@dataclass(frozen=True)
class IngestContext:
    """What ingest needs of the run besides the spec.

    Attributes:
        run_id: the run whose markers are kept (others' are dropped).
        end_offsets: partition -> first offset past the run's input, or None to keep every
            event (`keyshift.processing.job_query.JobConfig.end_offsets`).
        bound_ms: the Spark watermark's delay B, ms of event time.
        limits: the plausibility limits.
        watermark_floor_ms: W never counts as lower than this (after a switch), ms of event time.
        chunk_records: records per chunk at most (`kafka_partition_chunks`); the session's
            `spark.sql.execution.arrow.maxRecordsPerBatch`, so a task of one Kafka partition
            keeps the chunks Spark hands it.
        marker_floor: partition -> offset; the run's end-of-input markers below it were written
            for an earlier segment (before a switch) and are dropped like another run's, so
            that the query reads only the markers written for it, after all of its input
            (`keyshift.runtime.driver._watch`). None or a missing partition: offset 0.
        batch_channel: the Redis URL of the run's batch channel
            (`keyshift.eventtime.batch_channel`), where the driver publishes each batch's partition
            clocks in force and plausibility reference (Spark's watermark and batch timestamp from
            the offset log) and the tasks report what they read; None outside a streaming query
            of the driver (no partition clocks; plausibility without a watermark or batch time).
        batch_base: the run-wide id of the query's batch 0 (a switch's segments number on).
        query: the query's name in the task reports (its checkpoint folder's name).
        cap_event_time: cap each row's `event_ts` at its partition's M(p)
            (`keyshift.eventtime.partition_clocks.cap_event_times`): every watermark mode but `global`.
    """

    run_id: str
    end_offsets: Mapping[int, int] | None
    bound_ms: int
    limits: PlausibilityLimits
    watermark_floor_ms: int = 0
    chunk_records: int = DEFAULT_CHUNK_RECORDS
    marker_floor: Mapping[int, int] | None = None
    batch_channel: str | None = None
    batch_base: int = 0
    query: str = "query"
    cap_event_time: bool = False

    def running_batch(self):
        """(channel, run-wide batch id, partition clocks in force, batch reference) of the
        running batch (`keyshift.eventtime.batch_channel.task_batch`); None without a channel or
        outside a streaming query.

        Raises:
            JobError, StackError: the batch's context is not in Redis, or Redis failed.
        """
        return task_batch(self.batch_channel, self.run_id, self.batch_base) if self.batch_channel is not None else None

    def partition_clocks(self) -> tuple[int, PartitionClocks] | None:
        """(run-wide batch id, the partition clocks in force) of the running batch; None without
        a channel or outside a streaming query."""
        found = self.running_batch()
        return None if found is None else (found[1], found[2])

    def input_end(self) -> Mapping[int, int] | None:
        """The run's input end for the running batch: the one fixed in its partition clocks
        (`PartitionClocks.end_offsets`: a bounded run on a live feed learns its end while it
        runs), else `end_offsets`; None keeps every record."""
        found = self.partition_clocks()
        if found is not None and found[1].end_offsets is not None:
            return found[1].end_offsets
        return self.end_offsets

    def partition_reference(self, partition: int) -> BatchReference:
        """The plausibility reference of a chunk of Kafka partition `partition`: W = its own
        clock - `bound_ms` (0 before its first event: the chunk's medians judge), and the batch's
        timestamp (`keyshift.eventtime.plausibility`). Without partition clocks: `reference()`."""
        found = self.running_batch()
        if found is None:
            return self.reference()
        clock = found[2].event_time_ms(partition)
        return BatchReference(max(clock - self.bound_ms, 1) if clock is not None else 0, found[3].timestamp_ms)

    def reference(self) -> BatchReference:
        """The running batch's reference (Spark's watermark and batch timestamp), floored at
        `watermark_floor_ms`; without a channel, none (W = 0, no batch time)."""
        found = self.running_batch()
        reference = found[3] if found is not None else BatchReference()
        if self.watermark_floor_ms > reference.watermark_ms:
            return BatchReference(self.watermark_floor_ms, reference.timestamp_ms)
        return reference


def keep_own_records(partitions: np.ndarray, offsets: np.ndarray, is_control: np.ndarray, own_marker: np.ndarray,
                     end_offsets: Mapping[int, int] | None) -> np.ndarray:
    """Which records belong to the run (module docstring, step 1).

    Args:
        partitions, offsets: int arrays, each record's Kafka partition and offset.
        is_control: bool array, the record is an end-of-input marker (any run's).
        own_marker: bool array, the record is a marker of this run.
        end_offsets: partition -> first offset past the run's input; None keeps every event.

    Returns:
        A bool array: this run's markers, and its events (below the end offset of their partition;
        a partition missing from `end_offsets` has none).
    """
    events = ~is_control
    if end_offsets:
        ends = np.array([end_offsets.get(int(p), 0) for p in range(int(partitions.max()) + 1)], dtype=np.int64)
        events &= offsets < ends[partitions]
    return own_marker | events


def _utf8_text(values: pa.Array) -> pa.Array:
    """The values as a string array, NULL where absent or not UTF-8 (such a value never becomes
    a string: the strict path gives it its reason, `invalid UTF-8`)."""
    text = pc.cast(values, options=pc.CastOptions(pa.string(), allow_invalid_utf8=True))
    try:
        text.validate(full=True)
        return text
    except pa.ArrowInvalid:
        ok = pa.array([v is None or _is_utf8(v) for v in values.to_pylist()], pa.bool_())
        return pc.if_else(ok, text, pa.scalar(None, pa.string()))


def _claimed_keys(keys: pa.Array) -> pa.Array:
    """Kafka keys as text (a `key_lookup` spec's claimed key): UTF-8, a key that is not UTF-8
    decoded as the strict path and Spark's cast decode it (U+FFFD for its bad bytes, so it
    matches no looked-up key), NULL for none."""
    text = pc.cast(keys, options=pc.CastOptions(pa.string(), allow_invalid_utf8=True))
    try:
        text.validate(full=True)
        return text
    except pa.ArrowInvalid:
        return pa.array([k if k is None else java_utf8_decode(k) for k in keys.to_pylist()], pa.string())


def _is_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


class RecordIngest:
    """The per-chunk work of ingest for one spec (module docstring, steps 1 to 4).

    Built once per Python worker function; `chunk` is called per Arrow chunk.
    """

    def __init__(self, spec: JobSpec, context: IngestContext) -> None:
        self.spec = spec
        self.context = context
        self.schema = ingest_schema(spec)
        self.pattern = canonical_pattern(spec)
        self.columns = record_columns(spec)
        self.index = {f.col: i for i, f in enumerate(spec.fields)}
        self.key_field = None if spec.key_lookup is not None else next(f for f in spec.fields if f.col == spec.key)
        self.keep_values = pa.array(spec.keep.values, pa.string()) if spec.keep is not None else None
        self.keep_col = next(f.col for f in spec.fields if f.name == spec.keep.field) if spec.keep is not None else None
        self.reports: dict[int, SliceReport] = {}
        """Kafka partition -> what this task's chunks read of it (`SliceReport`)."""

    def chunk(self, batch: pa.RecordBatch) -> tuple[pa.Table, list[Marker]]:
        """Ingest one chunk of Kafka rows (`key`, `value` binary; `partition` int; `offset` long).

        Returns:
            (a table of `ingest_schema(spec)`: one row per record of the run that is not a
            marker, in offset order; the run's markers in the chunk).
        """
        n = batch.num_rows
        values, keys = batch.column("value"), batch.column("key")
        partitions = batch.column("partition").to_numpy(zero_copy_only=False).astype(np.int64)
        offsets = batch.column("offset").to_numpy(zero_copy_only=False).astype(np.int64)
        text = _utf8_text(values)
        is_control = np.asarray(pc.fill_null(pc.starts_with(text, END_OF_INPUT_PREFIX), False), dtype=bool)
        markers: list[Marker] = []
        own_marker = np.zeros(n, bool)
        if is_control.any():
            floor = self.context.marker_floor or {}
            for i in np.flatnonzero(is_control):
                marker = control_marker(self.spec, values[i].as_py())
                # a marker of this run without a readable event time cannot move the watermark,
                # and one below the marker floor was written for an earlier segment: both are
                # dropped like another run's
                if marker is not None and marker[0] == self.context.run_id and marker[1] is not None \
                        and offsets[i] >= floor.get(int(partitions[i]), 0):
                    own_marker[i] = True
                    markers.append(Marker(int(partitions[i]), int(offsets[i]), int(marker[1])))
        keep = keep_own_records(partitions, offsets, is_control, own_marker, self.context.input_end()) & ~is_control
        if not keep.all():
            rows = pa.array(keep)
            values, keys, text = values.filter(rows), keys.filter(rows), text.filter(rows)
            partitions, offsets = partitions[keep], offsets[keep]
        columns, reasons = self._validate(keys, values, text)
        partition = int(partitions[0]) if len(partitions) else (markers[0].partition if markers else None)
        self._judge_plausibility(columns, reasons, partition)
        self._report(partition, n, columns, reasons, bool(markers))
        arrays = [columns[c] for c in self.columns]
        arrays += [pa.array(reasons, pa.string()), pa.array(partitions.astype(np.int32)), pa.array(offsets), values, keys]
        return pa.Table.from_arrays(arrays, schema=self.schema), markers

    def _validate(self, keys: pa.Array, values: pa.Array, text: pa.Array) -> tuple[dict[str, pa.Array], np.ndarray]:
        """Rules 1 to 7 and `keep` (module docstring): the record columns (NULL for a rejected
        record) and an object array of reasons (None for a valid record)."""
        spec, n = self.spec, len(values)
        canonical = np.asarray(pc.fill_null(pc.match_substring_regex(text, self.pattern), False), dtype=bool)
        wanted = [f.col for f in spec.fields
                  if f.col in self.columns or f.non_empty or f.non_negative or f.col == self.keep_col or f is self.key_field]
        if canonical.all():
            columns = canonical_fields(text, spec, wanted)
        else:  # the canonical records' values, NULL for the others (the strict path fills them)
            found = canonical_fields(text.filter(pa.array(canonical)), spec, wanted)
            at = pa.array(np.cumsum(canonical) - 1, mask=~canonical)
            columns = {c: values.take(at) for c, values in found.items()}
        reasons = np.full(n, None, dtype=object)
        self._value_rules(columns, keys, reasons)
        if spec.key_lookup is not None:  # the key the producer claims, checked after the lookup
            columns[spec.key] = _claimed_keys(keys)
        if not canonical.all():
            columns = self._strict(columns, keys, values, canonical, reasons)
        if self.keep_values is not None:
            kept = np.asarray(pc.fill_null(pc.is_in(columns[self.keep_col], value_set=self.keep_values), False), dtype=bool)
            reasons[(reasons == None) & ~kept] = FILTERED  # noqa: E711 (elementwise on an object array)
        rejected = pa.array(reasons != None)  # noqa: E711
        nothing = {c: pa.scalar(None, columns[c].type) for c in self.columns}
        return {c: pc.if_else(rejected, nothing[c], columns[c]) for c in self.columns}, reasons

    def _value_rules(self, columns: dict[str, pa.Array], keys: pa.Array, reasons: np.ndarray) -> None:
        """Rules 6 and 7 on the captured fields, into `reasons` (NULL captures are skipped: those
        records take the strict path, which sets their reason)."""
        spec = self.spec
        rules: list[tuple[str, pa.Array]] = []
        for f in spec.fields:
            if f.non_empty:
                column = columns[f.col]
                rules.append((f"empty {f.name}", pc.equal(pc.utf8_trim(column, " "), "")))
                rules.append((f"{f.name} over {MAX_CODE_BYTES} bytes", pc.greater(pc.binary_length(column), MAX_CODE_BYTES)))
        for f in spec.fields:
            if f.non_negative:
                rules.append((f"negative {f.name}", pc.less(columns[f.col], 0)))
        if self.key_field is not None:
            field_bytes = pc.cast(columns[self.key_field.col], pa.binary())
            differs = pc.or_kleene(pc.is_null(keys), pc.invert(pc.fill_null(pc.equal(keys, field_bytes), False)))
            rules.append((key_mismatch(spec), pc.and_(differs, pc.is_valid(field_bytes))))
        for reason, broken in reversed(rules):  # the first rule broken wins
            reasons[np.asarray(pc.fill_null(broken, False), dtype=bool)] = reason

    def _strict(self, columns: dict[str, pa.Array], keys: pa.Array, values: pa.Array,
                canonical: np.ndarray, reasons: np.ndarray) -> dict[str, pa.Array]:
        """The records that are not canonical, by `keyshift.processing.operators.strict_records`: their
        reasons into `reasons` and their fields into the columns (returned)."""
        spec = self.spec
        rows = np.flatnonzero(~canonical)
        key_list, value_list = keys.take(pa.array(rows)).to_pylist(), values.take(pa.array(rows)).to_pylist()
        found: dict[str, list] = {c: [None] * len(rows) for c in columns}
        for j, (key, raw) in enumerate(zip(key_list, value_list)):
            reason, fields = strict_record(spec, key, raw)
            reasons[rows[j]] = reason
            if fields is not None:
                for c in found:
                    found[c][j] = fields.get(c)
        positions = np.full(len(canonical), -1, dtype=np.int64)
        positions[rows] = np.arange(len(rows))
        mask = pa.array(~canonical)
        merged = {}
        for c, column in columns.items():
            strict_values = pa.array(found[c], column.type).take(pa.array(np.maximum(positions, 0)))
            merged[c] = pc.if_else(mask, strict_values, column)
        return merged

    def _report(self, partition: int | None, records: int, columns: dict[str, pa.Array], reasons: np.ndarray, marker: bool) -> None:
        """Add the chunk to the task's report of its Kafka partition (`reports`): records, the
        largest event time of a valid event (after plausibility), the run's marker."""
        if partition is None:
            return
        valid = reasons == None  # noqa: E711
        top = None
        if valid.any():
            times = pc.fill_null(columns[self.spec.event_time], 0).to_numpy(zero_copy_only=False).astype(np.int64)
            top = int(times[valid].max())
        piece = SliceReport(int(records), top, marker)
        self.reports[partition] = self.reports[partition].merge(piece) if partition in self.reports else piece

    def _judge_plausibility(self, columns: dict[str, pa.Array], reasons: np.ndarray, partition: int | None = None) -> None:
        """Step 4: the plausibility rule over the chunk's valid events, into `reasons`, against
        the chunk's own Kafka partition (`IngestContext.partition_reference`)."""
        checked = reasons == None  # noqa: E711
        if not checked.any():
            return
        times = pc.fill_null(columns[self.spec.event_time], 0).to_numpy().astype(np.float64)
        reference = self.context.partition_reference(partition) if partition is not None else self.context.reference()
        found = implausible_reasons(times, checked, reference, self.context.bound_ms, self.context.limits)
        judged = found != None  # noqa: E711
        if judged.any():
            reasons[judged] = found[judged]
            rejected = pa.array(judged)
            for c in self.columns:
                columns[c] = pc.if_else(rejected, pa.scalar(None, columns[c].type), columns[c])


def with_payload(events: pa.Table) -> pa.Table:
    """Replace the raw bytes of ingested rows by a dead letter's payload.

    Args:
        events: a table of `ingest_columns(spec)` (after any key lookup).

    Returns:
        The table without `raw_value_bytes` and `raw_key_bytes` and with `raw_value` (the value
        as text when it is UTF-8, else its base64; NULL for a tombstone), `raw_encoding`
        (`utf-8`, `base64` or NULL) and `raw_key_base64` (NULL without a key) set for every
        rejected row but the filtered ones, NULL elsewhere; i.e.
        `keyshift.processing.operators.local_merge.input_columns(spec)`.
    """
    reasons = events.column("dead_letter_reason").combine_chunks()
    payload = pc.fill_null(pc.not_equal(reasons, FILTERED), False)
    rows = np.flatnonzero(np.asarray(payload, dtype=bool))
    n = events.num_rows
    raw_value, raw_encoding, raw_key = [None] * n, [None] * n, [None] * n
    if len(rows):
        values = events.column("raw_value_bytes").combine_chunks().take(pa.array(rows)).to_pylist()
        keys = events.column("raw_key_bytes").combine_chunks().take(pa.array(rows)).to_pylist()
        for row, value, key in zip(rows, values, keys):
            if value is not None:
                try:
                    raw_value[row], raw_encoding[row] = value.decode("utf-8"), "utf-8"
                except UnicodeDecodeError:
                    raw_value[row], raw_encoding[row] = base64.b64encode(value).decode("ascii"), "base64"
            if key is not None:
                raw_key[row] = base64.b64encode(key).decode("ascii")
    names = [c for c in events.column_names if c not in _RAW_COLUMNS]
    at = names.index("dead_letter_reason") + 1
    columns = [events.column(c) for c in names]
    extra = [pa.array(raw_value, pa.string()), pa.array(raw_encoding, pa.string()), pa.array(raw_key, pa.string())]
    return pa.Table.from_arrays(columns[:at] + extra + columns[at:],
                                names=names[:at] + ["raw_value", "raw_encoding", "raw_key_base64"] + names[at:])


def max_event_times(event_times: pa.Array) -> pa.Array:
    """The largest element of each list of `event_times` (a list<int64> array; a NULL or empty
    list gives NULL), as an int64 array of ms."""
    lengths = pc.fill_null(pc.list_value_length(event_times), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    has = lengths > 0
    result = np.zeros(len(lengths), dtype=np.int64)
    if has.any():
        flat = pc.list_flatten(event_times).to_numpy(zero_copy_only=False).astype(np.int64)
        starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
        result[has] = np.maximum.reduceat(flat, starts[has])
    return pa.array(result, mask=~has)


def event_times_of_partials(partials: pa.Table) -> pa.Array:
    """The largest event time (ms, int64) of each of Local Merge's partials; NULL for a dead
    letter or a filtered row."""
    return max_event_times(partials.column("event_times_ms").combine_chunks())


def event_times_of_events(spec: JobSpec) -> Callable[[pa.Table], pa.Array]:
    """For rows that are events (a key-window spec): each row's event time (ms, int64; NULL for
    a dead letter, whose fields are all NULL)."""

    def event_times(events: pa.Table) -> pa.Array:
        return events.column(spec.event_time).combine_chunks()

    return event_times


def events_schema(spec: JobSpec) -> T.StructType:
    """The Spark schema of ingested events with their payload
    (`keyshift.processing.operators.local_merge.input_columns(spec)`), the rows of a key-window spec."""
    from keyshift.processing.operators.local_merge import input_columns

    types = {f.col: f.spark_type for f in spec.fields}
    types.update({spec.key: T.StringType(), "kafka_partition": T.IntegerType(), "kafka_offset": T.LongType()})
    return T.StructType([T.StructField(c, types.get(c, T.StringType()), True) for c in input_columns(spec)])


def stage_schema(row_schema: T.StructType) -> T.StructType:
    """The ingest stage's output: `row_schema` plus `event_ts` (timestamp) and `is_control`."""
    return T.StructType([*row_schema.fields, T.StructField(EVENT_TS_COLUMN, T.TimestampType(), True),
                         T.StructField(CONTROL_COLUMN, T.BooleanType(), False)])


def _timestamps(ms: pa.Array, arrow_type: pa.DataType) -> pa.Array:
    return pc.multiply(ms, 1000).cast(pa.timestamp("us")).cast(arrow_type)


def ingest_function(
    spec: JobSpec,
    context: IngestContext,
    rows_of: Callable[[pa.Table], pa.Table] | None,
    row_schema: T.StructType,
    event_times_of: Callable[[pa.Table], pa.Array],
    lookup: tuple[str, str] | None = None,
    barrier_tokens: Sequence[int] | None = None,
):
    """The `mapInArrow` function of the engine's source stage (module docstring).

    Args:
        spec: the job.
        context: the run (`IngestContext`).
        rows_of: one Spark partition's ingested events (`input_columns(spec)`, after the key
            lookup and the payload) -> the stage's rows (Local Merge's partials,
            `keyshift.processing.operators.local_merge.partials_function`); None: the events themselves.
        row_schema: the Spark schema of the stage's rows (without `event_ts`, `is_control`).
        event_times_of: the rows -> the largest event time (ms, int64; NULL for none) of each.
        lookup: (redis_url, input topic) for a spec with `key_lookup`: the worker's cached copy
            of the map (`keyshift.processing.operators.key_lookup.worker_cache`).
        barrier_tokens: the slot tokens of a keyed window job's stateful processor: in a
            switch's barrier batch each task adds one barrier row per token
            (`keyshift.processing.operators.handover.barrier_rows`); None: never.

    Returns:
        A function: iterator of Arrow batches of Kafka rows -> iterator of Arrow batches of
        `stage_schema(row_schema)`.

    Raises:
        ConfigurationError: a `key_lookup` spec without `lookup`.
    """
    if spec.key_lookup is not None and lookup is None:
        from keyshift.errors import ConfigurationError

        raise ConfigurationError(f"job {spec.name} looks its key up in Redis: ingest needs (redis_url, topic)")
    from pyspark.sql.pandas.types import to_arrow_schema

    out_schema = to_arrow_schema(stage_schema(row_schema), timezone="UTC")  # any zone: the values are UTC micros

    def ingest(chunks: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        ingest_chunk = RecordIngest(spec, context)
        tables, markers = [], []
        for chunk in kafka_partition_chunks(chunks, context.chunk_records):
            if chunk.num_rows:
                table, found = ingest_chunk.chunk(chunk)
                if table.num_rows:
                    tables.append(table)
                markers += found
        pieces = []
        if tables:
            events = pa.concat_tables(tables)
            if spec.key_lookup is not None:
                from keyshift.processing.operators.key_lookup import lookup_keys, worker_cache

                events = lookup_keys(events, spec, worker_cache(lookup[0], spec.key_lookup, lookup[1]))
            rows = with_payload(events)
            rows = rows_of(rows) if rows_of is not None else rows.cast(to_arrow_schema(row_schema))
            if rows.num_rows:
                stamps = _timestamps(capped_event_times(rows, event_times_of(rows), context), out_schema.field(EVENT_TS_COLUMN).type)
                pieces.append(pa.Table.from_arrays(
                    [*rows.columns, stamps, pa.array(np.zeros(rows.num_rows, bool))], schema=out_schema))
        if markers:
            m = len(markers)
            arrays = {field.name: pa.nulls(m, field.type) for field in out_schema}
            arrays[CONTROL_COLUMN] = pa.array(np.ones(m, bool))
            arrays[EVENT_TS_COLUMN] = _timestamps(pa.array([k.event_time_ms for k in markers], pa.int64()),
                                                  out_schema.field(EVENT_TS_COLUMN).type)
            if "token" in arrays:  # Local Merge's partials (non-nullable token and count): any value,
                # since markers are dropped after the watermark, before the shuffle
                arrays["token"] = pa.array(np.zeros(m, np.int32))
                arrays["count"] = pa.array(np.zeros(m, np.int64))
            arrays["kafka_partition"] = pa.array([k.partition for k in markers], pa.int32())
            pieces.append(pa.Table.from_arrays([arrays[f.name].cast(f.type) for f in out_schema], schema=out_schema))
        if barrier_tokens and handover_requested():
            pieces.append(barrier_rows(out_schema, barrier_tokens, CONTROL_COLUMN))
        if ingest_chunk.reports:
            write_task_report(context, ingest_chunk.reports)
        for piece in pieces:
            yield from piece.to_batches()

    return ingest


def capped_event_times(rows: pa.Table, event_times: pa.Array, context: IngestContext) -> pa.Array:
    """The `event_ts` (ms) of the stage's rows: each row's largest event time, capped at its
    Kafka partition's M(p) when `context.cap_event_time` (per-partition watermarks,
    `keyshift.eventtime.partition_clocks`); NULL where the cap is -inf (a partition without a
    clock yet holds the watermark). Unchanged in `global` mode or outside a streaming query."""
    if not context.cap_event_time:
        return event_times
    found = context.partition_clocks()
    if found is None:
        return event_times
    clocks = found[1]
    valid = np.asarray(event_times.is_valid(), dtype=bool)
    if not valid.any():
        return event_times
    times = pc.fill_null(event_times, 0).to_numpy(zero_copy_only=False).astype(np.int64)
    parts = pc.fill_null(rows.column("kafka_partition").combine_chunks(), -1).to_numpy(zero_copy_only=False).astype(np.int64)
    size = max(int(parts.max()) + 1, max(clocks.clocks, default=-1) + 1, 1)
    capped, keeps = cap_event_times(times, np.maximum(parts, 0), clocks.caps_ms(size))
    return pa.array(capped, pa.int64(), mask=~(valid & keeps))


def write_task_report(context: IngestContext, reports: Mapping[int, SliceReport]) -> None:
    """Send this ingest task's per-partition report of the running batch to the driver
    (`keyshift.eventtime.batch_channel.BatchChannel.report`); nothing outside a streaming query
    or without a channel."""
    found = context.running_batch()
    if found is None:
        return
    from pyspark import TaskContext

    found[0].report(found[1], context.query, TaskContext.get().partitionId(), reports)
